#!/usr/bin/env bash
# Two passes of one working set against a running graph's OpenAI API: PROMPTS chat
# prompts of WORDS words each, sent one after another, then the same prompts again.
# Prints each pass's mean latency and TTFT, and their ratios (second / first). With KV block
# tiers and a working set larger than the GPU blocks, the second pass onboards what
# the first evicted instead of recomputing it (docs/performance-tiers.md).
#
#   dynamo run -f config/samples/agg-mocker-kvbm.yaml --model-path .cache/models/qwen-mock &
#   scripts/kvbm_two_pass.sh            # URL=http://127.0.0.1:8000 PROMPTS=24 WORDS=1500
#
# Environment: URL, MODEL (Qwen/Qwen3-0.6B), PROMPTS (24), WORDS (1500), MAX_TOKENS (1:
# the prefill is what the tiers save, so the latency is the TTFT; each later token costs
# the same in both passes, so with longer answers compare the TTFT).
set -euo pipefail
export URL="${URL:-http://127.0.0.1:8000}" MODEL="${MODEL:-Qwen/Qwen3-0.6B}"
export PROMPTS="${PROMPTS:-24}" WORDS="${WORDS:-1500}" MAX_TOKENS="${MAX_TOKENS:-1}"
exec python3 - <<'PY'
import json, os, random, statistics, time, urllib.request

url, model = os.environ["URL"].rstrip("/"), os.environ["MODEL"]
prompts, words, max_tokens = (int(os.environ[k]) for k in ("PROMPTS", "WORDS", "MAX_TOKENS"))
vocab = ("time year people way day man thing woman life child world school state family "
         "student group country problem hand part place case week company system program "
         "question work government number night point home water room mother area money "
         "story fact month lot right study book eye job word business issue side kind head "
         "house service friend father power hour game line end member law car city name").split()

def prompt(i):
    # Seeded by the prompt's index: the second pass sends exactly the same text.
    rng = random.Random(i)
    return f"Document {i}: " + " ".join(rng.choice(vocab) for _ in range(words))

def send(text):
    """Streams one answer: (latency ms, time to first token ms, prompt tokens, cached)."""
    body = json.dumps({"model": model, "max_tokens": max_tokens, "stream": True,
                       "stream_options": {"include_usage": True},
                       "messages": [{"role": "user", "content": text}]}).encode()
    req = urllib.request.Request(f"{url}/v1/chat/completions", body,
                                 {"content-type": "application/json"})
    started = time.perf_counter()
    first, usage = None, {}
    with urllib.request.urlopen(req, timeout=120) as resp:
        for line in resp:
            data = line.decode().strip().removeprefix("data: ")
            if not data.startswith("{"):
                continue
            chunk = json.loads(data)
            usage = chunk.get("usage") or usage
            if first is None and any(c.get("delta", {}).get("content")
                                     for c in chunk.get("choices", [])):
                first = time.perf_counter()
    done = time.perf_counter()
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return ((done - started) * 1000, ((first or done) - started) * 1000,
            usage.get("prompt_tokens", 0), cached or 0)

texts = [prompt(i) for i in range(prompts)]
means, ttfts = [], []
for n in (1, 2):
    runs = [send(t) for t in texts]
    ms = [r[0] for r in runs]
    means.append(statistics.mean(ms))
    ttfts.append(statistics.mean(r[1] for r in runs))
    tokens, cached = sum(r[2] for r in runs), sum(r[3] for r in runs)
    print(f"pass {n}: mean {means[-1]:.1f} ms, p50 {statistics.median(ms):.1f} ms, "
          f"max {max(ms):.1f} ms, TTFT mean {ttfts[-1]:.1f} ms; {tokens} prompt tokens, "
          f"{cached} cached")
print(f"second / first: {means[1] / means[0]:.2f} (TTFT {ttfts[1] / ttfts[0]:.2f})")
PY
