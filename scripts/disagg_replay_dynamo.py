"""The brief's disaggregation workload (docs/performance-disagg.md, "Figures: the brief's
disaggregation workload") in Dynamo 1.6.1's offline replay, to set beside ours: ISL 3,000 /
OSL 150, 1,000 prompts that share nothing, Poisson arrivals at each rate, 4 engines of
16,384 blocks of 64 tokens, as 2P+2D, 3P+1D and 4 aggregated engines (round-robin).
Ours: `dynamo-e2e replay --topology agg:4,2p2d,3p1d --modes kv --prefixes 1000 --suffixes 1
--prefix-tokens 0 --unique-tokens 3000 --output-tokens 150 --request-rate R --kv-block-bytes 8MiB`.

Usage (with the kit's Python, ../shared/reference/dynamo-1.6.1/install.sh):
  DYN_LOG=warn $DYNREF/.venv/bin/python scripts/disagg_replay_dynamo.py DIR [RATES]
RATES is comma-separated req/s (default 8,28); the traces are written to DIR.
"""

import json
import os
import random
import sys

from dynamo.mocker.config import normalize_mocker_config
from dynamo.replay import run_trace_replay

out_dir = sys.argv[1]
rates = [float(r) for r in (sys.argv[2] if len(sys.argv) > 2 else "8,28").split(",")]
engine = dict(num_gpu_blocks=16384, block_size=64, max_num_seqs=256, max_num_batched_tokens=8192,
              enable_prefix_caching=True, speedup_ratio=1.0)


def role(worker_type=None):
    return normalize_mocker_config({"engine": dict(engine, worker_type=worker_type) if worker_type else engine})


def write_trace(rate, path):
    rng, t = random.Random(1), 0.0
    with open(path, "w") as f:
        for i in range(1000):
            t += rng.expovariate(rate) * 1000
            # 3,000 tokens are 6 hash blocks of 512 tokens, none shared with another prompt.
            f.write(json.dumps(dict(timestamp=int(t), input_length=3000, output_length=150,
                                    hash_ids=[i * 10 + j for j in range(6)])) + "\n")


print("| req/s | graph | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 |")
print("|---|---|---|---|---|---|")
for rate in rates:
    trace = os.path.join(out_dir, f"disagg-{rate:g}.jsonl")
    write_trace(rate, trace)
    runs = {
        "2P+2D": dict(prefill_engine_args=role("prefill"), decode_engine_args=role("decode"),
                      num_prefill_workers=2, num_decode_workers=2),
        "3P+1D": dict(prefill_engine_args=role("prefill"), decode_engine_args=role("decode"),
                      num_prefill_workers=3, num_decode_workers=1),
        "4 aggregated": dict(extra_engine_args=role(), num_workers=4),
    }
    for name, args in runs.items():
        s = run_trace_replay(trace, router_mode="round_robin", trace_block_size=512, **args).summary
        print(f"| {rate:g} | {name} | {s['median_ttft_ms']:.1f} | {s['p99_ttft_ms']:.1f} "
              f"| {s['median_itl_ms']:.1f} | {s['p99_itl_ms']:.1f} |")
