"""The block format of the KV block API (kvblocks/src/lib.rs, mac.rs, credential.rs): a
block's layout, its XXH3-64 checksum, and its MAC, keyed BLAKE3 under a key derived from
the graph's credential. A reader checks both before it uses a payload."""

import hmac
import os
import struct
from dataclasses import dataclass

import blake3
import xxhash

# Separates block MACs from any other use of the graph's secret (kvblocks/src/mac.rs).
_MAC_CONTEXT = "dynamo kvblocks 2026-11 block MAC v1"
MAC_BYTES = 32

# The environment variable naming the credential's file, for every process of a graph.
CREDENTIAL_FILE_ENV = "DYNAMO_BLOCK_API_TOKEN_FILE"


@dataclass(frozen=True)
class Layout:
    """How a payload is laid out; blocks of another layout are not interchangeable."""

    block_bytes: int
    block_size: int
    layers: int
    dtype: str


def checksum(payload) -> int:
    """XXH3-64, seed 0, of a payload (anything with the buffer protocol)."""
    return xxhash.xxh3_64_intdigest(payload)


class Credential:
    """The graph's block API credential: sent as `authorization: Bearer <token>`."""

    def __init__(self, token: str):
        if not token or not all(33 <= ord(c) <= 126 for c in token):
            raise ValueError("the block API credential is not one line of visible ASCII")
        self.header = f"Bearer {token}"

    @classmethod
    def read(cls, path: str) -> "Credential":
        with open(path, encoding="ascii") as f:
            return cls(f.read().strip())

    @classmethod
    def from_env(cls, path: str | None = None) -> "Credential | None":
        """The credential in `path`, else in the file the environment names, else none."""
        path = path or os.environ.get(CREDENTIAL_FILE_ENV)
        return cls.read(path) if path else None

    def __repr__(self) -> str:
        return "Credential(..)"

    def block_key(self) -> "BlockKey":
        return BlockKey(blake3.blake3(self.header.encode(), derive_key_context=_MAC_CONTEXT).digest())


class BlockKey:
    """The key a graph's blocks are MAC-ed with."""

    def __init__(self, key: bytes):
        self._key = key

    def __repr__(self) -> str:
        return "BlockKey(..)"

    def mac(self, hash_: int, parent: int | None, tokens: int, layout: Layout, payload) -> bytes:
        h = blake3.blake3(key=self._key)
        h.update(struct.pack("<Q", hash_))
        h.update(b"\0" if parent is None else b"\1" + struct.pack("<Q", parent))
        dtype = layout.dtype.encode()
        h.update(
            struct.pack(
                "<IQIIQ", tokens, layout.block_bytes, layout.block_size, layout.layers, len(dtype)
            )
        )
        h.update(dtype)
        h.update(payload)
        return h.digest()

    def admits(self, mac: bytes, hash_: int, parent, tokens, layout, payload) -> bool:
        return len(mac) == MAC_BYTES and hmac.compare_digest(
            mac, self.mac(hash_, parent, tokens, layout, payload)
        )
