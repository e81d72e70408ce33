"""Measures TTFT and ITL of single streamed requests against a running mock engine and
compares them with its timing model (docs/mocker.md): prefill ms = 4.21e-7*T^2 +
0.01518*T + 16.5 for T uncached prompt tokens (prompts under 8192 tokens, so prefill is
one step); decode ms = -25.74*u^2 + 54.01*u + 5.74 at pool usage u.

Usage: python mocker_timing.py BASE_URL MODEL [REPEATS]
"""

import statistics
import sys
import time

import httpx

base_url, model = sys.argv[1], sys.argv[2]
repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 10


def model_prefill_ms(tokens):
    return 4.21e-7 * tokens**2 + 0.01518 * tokens + 16.5


def model_decode_ms(prompt_tokens, block_size=64, blocks=16384):
    # Pool usage of the one running request, mid-answer.
    u = (prompt_tokens + 20) / block_size / blocks
    return -25.74 * u * u + 54.01 * u + 5.74


with httpx.Client(base_url=base_url, timeout=60) as client:
    for words in (100, 1200):
        ttfts, itls, prompt_tokens = [], [], None
        for i in range(repeats):
            # A fresh prompt each time, so nothing is cached.
            prompt = " ".join(f"w{i}x{j}" for j in range(words))
            start = time.perf_counter()
            stamps = []
            with client.stream(
                "POST",
                "/v1/completions",
                json={"model": model, "prompt": prompt, "max_tokens": 40, "stream": True,
                      "stream_options": {"include_usage": True}},
            ) as resp:
                for line in resp.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    if '"usage":{' in line:
                        prompt_tokens = int(line.split('"prompt_tokens":')[1].split(",")[0])
                    elif '"text":""' not in line:
                        stamps.append(time.perf_counter())
            ttfts.append((stamps[0] - start) * 1000)
            itls.extend((b - a) * 1000 for a, b in zip(stamps, stamps[1:]))
        expected_ttft = model_prefill_ms(prompt_tokens)
        # Deliveries land on the timer's 1 ms ticks, so single gaps jitter by up to 1 ms
        # while the mean follows the engine's timeline.
        ttft, itl = statistics.median(ttfts), statistics.mean(itls)
        print(
            f"prompt {prompt_tokens} tokens: TTFT p50 {ttft:.2f} ms (model {expected_ttft:.2f}, "
            f"{100 * (ttft / expected_ttft - 1):+.1f}%), ITL mean {itl:.2f} ms "
            f"(model {model_decode_ms(prompt_tokens):.2f}, "
            f"{100 * (itl / model_decode_ms(prompt_tokens) - 1):+.1f}%)"
        )
