"""Workload B (issue #18) in both stacks' offline replays, on one trace: 32 prefixes x 2048
tokens + 256 unique, OSL 64, each prefix 13 times in a shuffled order, sent by 16 clients
in a closed loop to 4 engines x 640 blocks of 64 tokens. Writes the trace (Mooncake
format, 512-token hash blocks), then runs Dynamo 1.6.1's replay on it
(`dynamo.replay.run_trace_replay`, `replay_concurrency=16`) in `kv_router` and
`round_robin` modes. Ours: `dynamo-e2e replay --trace TRACE --concurrency 16 --workers 4
--num-gpu-blocks 640 --modes kv,round-robin`.

Usage (with the kit's Python, ../shared/reference/dynamo-1.6.1/install.sh):
  DYN_LOG=warn $DYNREF/.venv/bin/python scripts/workload_b_replay.py TRACE
"""

import json
import random
import sys

from dynamo.mocker.config import normalize_mocker_config
from dynamo.replay import run_trace_replay

trace = sys.argv[1]
order = [p for p in range(32) for _ in range(13)]
random.Random(7).shuffle(order)
with open(trace, "w") as f:
    for i, p in enumerate(order):
        # A prefix is 4 hash blocks of 512 tokens; the unique 256 tokens, one block of its own.
        hashes = [p * 4 + j for j in range(4)] + [100_000 + i]
        f.write(json.dumps(dict(timestamp=i, input_length=2304, output_length=64, hash_ids=hashes)) + "\n")

engine = normalize_mocker_config({"engine": dict(
    num_gpu_blocks=640, block_size=64, max_num_seqs=256, max_num_batched_tokens=8192,
    enable_prefix_caching=True, speedup_ratio=1.0)})
print("| Dynamo mode | TTFT p50 | TTFT p90 | TTFT p99 | hit rate | req/s |")
print("|---|---|---|---|---|---|")
for mode in ["kv_router", "round_robin"]:
    r = run_trace_replay(trace, extra_engine_args=engine, num_workers=4, router_mode=mode,
                         replay_concurrency=16, trace_block_size=512)
    s = r.summary
    print(f"| {mode} | {s['median_ttft_ms']:.1f} | {s['p90_ttft_ms']:.1f} | {s['p99_ttft_ms']:.1f} "
          f"| {100 * s['prefix_cache_reused_ratio']:.1f}% | {s['request_throughput_rps']:.2f} |")
