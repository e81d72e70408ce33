"""The Python side of the sidecar's KV block API (kvblocks/proto): block identity, the
block format with its checksum and MAC, and a client. `dynamo_kv.vllm` is the vLLM KV
connector built on it."""

import os
import sys

try:
    import xxhash  # noqa: F401
except ImportError:
    # An engine image without xxhash: our image's init container writes a build of it for
    # each CPython it knows beside the package (`dynamo connector install`).
    _deps = os.path.join(os.path.dirname(__file__), "_deps", "cp%d%d" % sys.version_info[:2])
    if os.path.isdir(_deps):
        sys.path.append(_deps)
