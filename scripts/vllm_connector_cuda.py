"""Checks our vLLM connector's GPU copy path on a machine with a GPU (CI has none): a
paged KV cache of CUDA tensors, in vLLM's own allocation (`allocate_kv_cache`, one
`[B, H, N, C]` view per layer), is offloaded to a real sidecar and onboarded into a
zeroed cache; the loaded blocks must be the saved ones byte for byte, and the copies go
through pinned host memory on the connector's own stream. Prints the throughput.

    VLLM_TARGET_DEVICE=cuda .cache/vllm/bin/python scripts/vllm_connector_cuda.py \\
        --sidecar target/release/dynamo-sidecar [--blocks 256]

Exits 2 without a GPU."""

import argparse
import os
import sys
import time
from types import SimpleNamespace

ROOT = os.path.join(os.path.dirname(__file__), "..")
sys.path[:0] = [os.path.join(ROOT, "connectors/python"), os.path.join(ROOT, "connectors/python/tests")]

import torch  # noqa: E402

from dynamo_kv.api import BlockApi  # noqa: E402
from dynamo_kv.blocks import Credential  # noqa: E402
from dynamo_kv.hashing import BlockHasher  # noqa: E402
from dynamo_kv.vllm.metadata import Load, Save, StepMetadata  # noqa: E402
from dynamo_kv.vllm.settings import Settings  # noqa: E402
from dynamo_kv.vllm.worker import WorkerSide  # noqa: E402
from sidecar import MODEL, Sidecar  # noqa: E402

LAYERS, HEADS, HEAD, BLOCK = 28, 8, 128, 16


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sidecar", required=True)
    parser.add_argument("--blocks", type=int, default=256)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no GPU here", file=sys.stderr)
        sys.exit(2)
    os.environ["DYNAMO_SIDECAR_BIN"] = args.sidecar
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
    from vllm.v1.kv_cache_layout import KVCacheLayout
    from vllm.v1.worker.utils import allocate_kv_cache

    num_blocks = args.blocks + 1
    names = [f"layer.{i}" for i in range(LAYERS)]
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.bfloat16)
    page = spec.page_size_bytes
    config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[KVCacheTensor(size=page * num_blocks * LAYERS, layers=names, layer_stride=page * num_blocks, block_stride=page)],
        kv_cache_groups=[KVCacheGroupSpec(names, spec)],
    )
    caches = allocate_kv_cache(config, torch.device("cuda"), KVCacheLayout.LBNHC)
    for t in caches.values():
        t.copy_(torch.randn(t.shape, device="cuda").to(t.dtype))
    ids = list(range(1, num_blocks))
    saved = [caches[n][ids].clone() for n in names]
    block_bytes = LAYERS * page
    with Sidecar("--kv-host-bytes", str(2 * args.blocks * block_bytes)) as sidecar:
        settings = Settings(block_api=sidecar.block_api, model_name=MODEL, token_file=sidecar.token_file, region_bytes=512 << 20, offload_queue_bytes=8 << 30, transfer_timeout_s=60.0)
        api = BlockApi(sidecar.block_api, Credential.read(sidecar.token_file))
        worker = WorkerSide(settings, api, SimpleNamespace(num_blocks=num_blocks, kv_cache_groups=config.kv_cache_groups), BLOCK)
        worker.register(caches)
        assert worker.kv.cuda and worker.kv.staging(1).is_pinned()
        chain = BlockHasher(BLOCK, MODEL).seq_hashes(list(range(args.blocks * BLOCK)))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        worker.save(StepMetadata(saves=[Save("s", [(h, chain[i - 1] if i else None, ids[i]) for i, h in enumerate(chain)])]))
        copied = time.perf_counter() - t0
        while worker._offloader.offloaded_blocks < args.blocks:
            time.sleep(0.001)
        offloaded = time.perf_counter() - t0
        for t in caches.values():
            t.zero_()
        t0 = time.perf_counter()
        worker.load(StepMetadata(loads=[Load("l", chain, None, ids)]))
        torch.cuda.synchronize()
        loaded = time.perf_counter() - t0
        assert worker.load_errors() == set(), "every block loaded"
        for name, before in zip(names, saved):
            assert torch.equal(caches[name][ids].view(torch.uint8), before.view(torch.uint8)), name
        worker.shutdown()
    mb = args.blocks * block_bytes / 1e6
    print(f"CUDA path byte-exact: {args.blocks} blocks of {block_bytes / (1 << 20):.2f} MiB")
    print(f"copy out of the GPU cache {mb / copied:.0f} MB/s; offload {mb / offloaded:.0f} MB/s; onboard {mb / loaded:.0f} MB/s")


if __name__ == "__main__":
    main()
