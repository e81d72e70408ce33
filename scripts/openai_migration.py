"""Streams cut by a killed engine, seen by clients: the official OpenAI Python client
(chat and completions) and raw SSE over httpx, against a local graph of two mock engine
workers behind the endpoint picker in round-robin mode (the e2e test of request
migration, e2e/tests/migration.rs).

Streams start one after another (each once the previous one has its first token), so
round-robin puts about half of them on each worker (exactly half unless a pod failed a
request before answering, which the picker then avoids for a while). Once every stream
has MIN_PIECES tokens, the engine ENGINE_PID (serving at ENGINE_URL) is asked how many
requests it is running, then frozen with SIGSTOP: from then on none of its answers can
end. The streams it had answered whole still end (their bytes are on the way); those on
the other worker run to their end. What is left unfinished, with no piece since just after
the freeze (GRACE, SETTLE), is what the frozen engine holds, and exactly what the SIGKILL
that follows cuts. (Reading
the engine's count and killing at once would race a stream that ends in between: under
load the first streams are near their end by the time the last one starts.) Every request carries a seed, and the mock
engine's seeded answers are deterministic, so each stream's text is then compared with
the same request asked again, whole, afterwards.

Prints a JSON object: on_killed_engine (the streams the kill cut), running (the
engine's own count of its requests just before it was frozen, an upper bound), and
streams, a list of one object per stream: kind (raw, chat, completion), error (null,
or the exception's type and message), text, expected, pieces (chunks with text), usage,
ids (distinct chunk ids), roles (chunks carrying a role), finish, the last two data
payloads (raw streams), and the largest and the median gap between pieces (max_gap_ms,
itl_ms; the time the engine stood frozen is not counted in a gap).

Usage: python openai_migration.py BASE_URL MODEL ENGINE_PID ENGINE_URL STREAMS MAX_TOKENS
"""

import json
import os
import signal
import statistics
import sys
import threading
import time

import httpx
from openai import OpenAI

base_url, model = sys.argv[1], sys.argv[2]
pid, engine_url = int(sys.argv[3]), sys.argv[4]
streams, max_tokens = int(sys.argv[5]), int(sys.argv[6])
MIN_PIECES = 30
# A stream of the frozen engine gets no piece later than GRACE after the freeze (what was
# on its way by then); one of the live engine keeps getting them until it ends. A stream
# is counted held once SETTLE has passed since the freeze without such a later piece:
# the live engine would have to stall for all of SETTLE (hundreds of its inter-token
# latencies) to be taken for the frozen one, where a plain silence of SETTLE was enough
# on a loaded machine before.
GRACE = 1.0
SETTLE = 3.0
client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)


def kind(k):
    """Two raw streams (one per worker), then pairs of chat and completion streams, so
    that each worker serves both kinds."""
    if k < 2:
        return "raw"
    return "chat" if (k // 2) % 2 else "completion"


def request(k):
    body = dict(model=model, max_tokens=max_tokens, seed=100 + k)
    if kind(k) == "chat":
        body["messages"] = [{"role": "user", "content": f"stream {k}: tell a story"}]
    else:
        body["prompt"] = f"stream {k}: once upon a time"
    return body


results = [
    dict(kind=kind(k), error=None, pieces=0, times=[], text="", usage=None, ids=set(),
         roles=0, finish=None, last=[], ended=False)
    for k in range(streams)
]


def piece(r, text):
    if text:
        r["text"] += text
        r["pieces"] += 1
        r["times"].append(time.monotonic())


def stream_raw(r, body):
    with httpx.stream("POST", f"{base_url}/completions", timeout=120,
                      json={**body, "stream": True}) as answer:
        for line in answer.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[len("data:"):].strip()
            r["last"] = (r["last"] + [data])[-2:]
            if data == "[DONE]":
                continue
            event = json.loads(data)
            for choice in event.get("choices") or []:
                piece(r, choice.get("text"))
                r["finish"] = choice.get("finish_reason") or r["finish"]


def stream_openai(r, body):
    options = dict(stream=True, stream_options={"include_usage": True})
    if r["kind"] == "chat":
        chunks = client.chat.completions.create(**body, **options)
    else:
        chunks = client.completions.create(**body, **options)
    for chunk in chunks:
        r["ids"].add(chunk.id)
        r["usage"] = chunk.usage.model_dump() if chunk.usage else r["usage"]
        for choice in chunk.choices:
            if r["kind"] == "chat":
                r["roles"] += choice.delta.role is not None
                piece(r, choice.delta.content)
            else:
                piece(r, choice.text)
            r["finish"] = choice.finish_reason or r["finish"]


def run(k):
    r = results[k]
    try:
        (stream_raw if r["kind"] == "raw" else stream_openai)(r, request(k))
    except Exception as e:  # noqa: BLE001 - the test asserts on what was raised
        r["error"] = dict(type=type(e).__name__, message=str(e))
    r["ended"] = True


def running_on(engine):
    """vLLM's `vllm:num_requests_running` of the engine at `engine`, summed over labels."""
    text = httpx.get(f"{engine}/metrics", timeout=10).text
    name = "vllm:num_requests_running"
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.split("{")[0].split(" ")[0] == name)


def wait_for(cond, what, limit=60):
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > limit:
            sys.exit(f"timed out waiting for {what}: {results}")
        time.sleep(0.002)


threads = []
for k in range(streams):
    threads.append(threading.Thread(target=run, args=(k,)))
    threads[-1].start()
    wait_for(lambda: results[k]["pieces"] or results[k]["error"], f"stream {k} to start")
wait_for(lambda: all(r["pieces"] >= MIN_PIECES or r["error"] for r in results),
         f"{MIN_PIECES} tokens on every stream")
running = running_on(engine_url)
os.kill(pid, signal.SIGSTOP)
stopped = time.monotonic()


def held(r):
    """Unfinished, no piece since GRACE after the freeze, SETTLE after it: a stream of the
    frozen engine."""
    last = r["times"][-1] if r["times"] else stopped
    return (not r["ended"] and last <= stopped + GRACE
            and time.monotonic() - stopped >= SETTLE)


wait_for(lambda: all(r["ended"] or held(r) for r in results), "the streams to settle")
on_killed_engine = sum(not r["ended"] for r in results)
killed = time.monotonic()
os.kill(pid, signal.SIGKILL)
for t in threads:
    t.join(timeout=120)

for k, r in enumerate(results):
    body = request(k)
    if r["kind"] == "chat":
        r["expected"] = client.chat.completions.create(**body).choices[0].message.content
    else:
        r["expected"] = client.completions.create(**body).choices[0].text
    times = r.pop("times")
    gaps = [b - a - (killed - max(a, stopped) if a < killed < b else 0)
            for a, b in zip(times, times[1:])]
    r["max_gap_ms"] = max(gaps) * 1000 if gaps else None
    r["itl_ms"] = statistics.median(gaps) * 1000 if gaps else None
    r["ids"] = len(r["ids"])
print(json.dumps(dict(on_killed_engine=on_killed_engine, running=running, streams=results)))
