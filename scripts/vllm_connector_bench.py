"""Throughput of our vLLM KV connector's data path (connectors/python) against a real
sidecar: offload (copy the blocks out of the paged KV cache, checksum and MAC them, write
them through the shared region, the sidecar stores them in host memory) and onboard (the
reverse, every block checked before it is written into the cache), and the latency of the
lookup the scheduler waits for. CPU tensors here; docs/performance-tiers.md has the
figures.

    .cache/vllm/bin/python scripts/vllm_connector_bench.py \\
        --sidecar target/release/dynamo-sidecar [--blocks 256] [--rounds 5]

Blocks are Qwen3-0.6B's (28 layers, 8 KV heads of 128, 16 tokens, bfloat16: 1.75 MiB)."""

import argparse
import os
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

ROOT = os.path.join(os.path.dirname(__file__), "..")
sys.path[:0] = [os.path.join(ROOT, "connectors/python"), os.path.join(ROOT, "connectors/python/tests")]
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

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
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    os.environ["DYNAMO_SIDECAR_BIN"] = args.sidecar

    num_blocks = args.blocks + 1
    names = [f"layer.{i}" for i in range(LAYERS)]
    kv = {n: torch.randn((num_blocks, HEADS, BLOCK, 2 * HEAD)).to(torch.bfloat16) for n in names}
    config = SimpleNamespace(num_blocks=num_blocks, kv_cache_groups=[SimpleNamespace(layer_names=names)])
    block_bytes = LAYERS * HEADS * BLOCK * 2 * HEAD * 2
    rows = []
    with Sidecar("--kv-host-bytes", str(4 * args.rounds * args.blocks * block_bytes)) as sidecar:
        settings = Settings(block_api=sidecar.block_api, model_name=MODEL, token_file=sidecar.token_file, region_bytes=512 << 20, offload_queue_bytes=8 << 30, transfer_timeout_s=60.0)
        api = BlockApi(sidecar.block_api, Credential.read(sidecar.token_file))
        worker = WorkerSide(settings, api, config, BLOCK)
        worker.register(kv)
        offloader = worker._offloader
        hasher = BlockHasher(BLOCK, MODEL)
        ids = list(range(1, num_blocks))
        for r in range(args.rounds):
            tokens = [r * 1_000_003 + i for i in range(args.blocks * BLOCK)]
            chain = hasher.seq_hashes(tokens)
            save = Save(f"s{r}", [(h, chain[i - 1] if i else None, ids[i]) for i, h in enumerate(chain)])
            done = offloader.offloaded_blocks
            wall, cpu = time.perf_counter(), time.process_time()
            worker.save(StepMetadata(saves=[save]))
            copied = time.perf_counter() - wall
            while offloader.offloaded_blocks < done + args.blocks:
                time.sleep(0.001)
            offload = (time.perf_counter() - wall, time.process_time() - cpu, copied)
            for t in kv.values():
                t[1:].zero_()
            wall, cpu = time.perf_counter(), time.process_time()
            worker.load(StepMetadata(loads=[Load(f"l{r}", chain, None, ids)]))
            onboard = (time.perf_counter() - wall, time.process_time() - cpu)
            assert worker.load_errors() == set(), "every block loaded"
            lookups = []
            for _ in range(200):
                t0 = time.perf_counter()
                held = api.lookup(chain, timeout=10)
                lookups.append(time.perf_counter() - t0)
            assert len(held) == args.blocks
            rows.append((offload, onboard, sorted(lookups)))
        worker.shutdown()
    mib = args.blocks * block_bytes / (1 << 20)
    median = lambda xs: statistics.median(xs)  # noqa: E731
    print(f"{args.blocks} blocks of {block_bytes / (1 << 20):.2f} MiB ({mib:.0f} MiB) per round, {args.rounds} rounds, medians:")
    print("| direction | MB/s | CPU ms per block | of which: copied out of the cache (ms) |")
    print("|---|---|---|---|")
    off_wall = median([o[0] for o, _, _ in rows])
    print(f"| offload | {mib * 1.048576 / off_wall:.0f} | {median([o[1] for o, _, _ in rows]) * 1e3 / args.blocks:.2f} | {median([o[2] for o, _, _ in rows]) * 1e3:.0f} |")
    on_wall = median([n[0] for _, n, _ in rows])
    print(f"| onboard | {mib * 1.048576 / on_wall:.0f} | {median([n[1] for _, n, _ in rows]) * 1e3 / args.blocks:.2f} | |")
    p50 = median([lk[len(lk) // 2] for _, _, lk in rows]) * 1e6
    p99 = median([lk[int(len(lk) * 0.99)] for _, _, lk in rows]) * 1e6
    print(f"lookup of a {args.blocks}-block chain: p50 {p50:.0f} us, p99 {p99:.0f} us")


if __name__ == "__main__":
    tempfile.tempdir = tempfile.gettempdir()
    main()
