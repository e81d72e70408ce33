"""`stop`, `logprobs` and `n` through the official OpenAI Python client against the mock
engine: the client parses every shape, and the values keep their promises.
The mock engine writes one vocabulary word (a space and lower-case letters) per token.
Usage: python openai_sampling_checks.py BASE_URL MODEL
"""

import sys

from openai import BadRequestError, OpenAI

base_url, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
messages = [{"role": "user", "content": "Tell me a story"}]

# stop: the answer ends before the stop string, whole and streamed alike.
full = client.chat.completions.create(model=model, messages=messages, max_tokens=30, seed=4)
text = full.choices[0].message.content
stop = text.split()[8]
cut = text[: text.index(stop)]
stopped = client.chat.completions.create(
    model=model, messages=messages, max_tokens=30, seed=4, stop=[stop]
)
choice = stopped.choices[0]
assert choice.message.content == cut, (choice, cut)
assert choice.finish_reason == "stop", choice
assert choice.stop_reason == stop, choice  # vLLM's field, kept by the client
assert stopped.usage.completion_tokens < 30, stopped.usage
pieces = [
    c.choices[0].delta.content or ""
    for c in client.chat.completions.create(
        model=model, messages=messages, max_tokens=30, seed=4, stop=stop, stream=True
    )
    if c.choices
]
assert "".join(pieces) == cut, (pieces, cut)

# logprobs, chat: the sampled token first and most likely, distinct words after it.
answer = client.chat.completions.create(
    model=model, messages=messages, max_tokens=5, logprobs=True, top_logprobs=3
)
content = answer.choices[0].logprobs.content
assert len(content) == 5, content
assert "".join(t.token for t in content) == answer.choices[0].message.content
for t in content:
    assert t.logprob <= 0 and bytes(t.bytes) == t.token.encode(), t
    top = t.top_logprobs
    assert [x.token for x in top][:1] == [t.token] and top[0].logprob == t.logprob, t
    assert len({x.token for x in top}) == 3, t
    assert all(a.logprob > b.logprob for a, b in zip(top, top[1:])), t

streamed = []
for chunk in client.chat.completions.create(
    model=model, messages=messages, max_tokens=5, logprobs=True, top_logprobs=2, stream=True
):
    for c in chunk.choices:
        if c.logprobs and c.logprobs.content:
            assert "".join(t.token for t in c.logprobs.content) == c.delta.content, c
            streamed += c.logprobs.content
assert len(streamed) == 5, streamed

# logprobs, completions: parallel lists, the sampled token the first key of its map.
legacy = client.completions.create(model=model, prompt="Far away", max_tokens=4, logprobs=2)
lp = legacy.choices[0].logprobs
assert "".join(lp.tokens) == legacy.choices[0].text, lp
assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(4)], lp
for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
    assert list(top)[0] == token and top[token] == logprob <= 0 and len(top) == 2, top

# n: distinct answers indexed 0..n, usage summed; streamed, interleaved by index.
three = client.chat.completions.create(model=model, messages=messages, max_tokens=4, n=3)
assert [c.index for c in three.choices] == [0, 1, 2], three
assert len({c.message.content for c in three.choices}) == 3, three
assert three.usage.completion_tokens == 12, three.usage
texts, finished = {}, []
for chunk in client.completions.create(
    model=model, prompt="Far away", max_tokens=3, n=2, stream=True
):
    for c in chunk.choices:
        texts[c.index] = texts.get(c.index, "") + c.text
        if c.finish_reason:
            finished.append(c.index)
assert sorted(finished) == [0, 1] and len(texts[0].split()) == len(texts[1].split()) == 3, texts

for bad, param in [
    (dict(stop=["a", "b", "c", "d", "e"]), "stop"),
    (dict(top_logprobs=2), "top_logprobs"),
    (dict(n=0), "n"),
]:
    try:
        client.chat.completions.create(model=model, messages=messages, max_tokens=2, **bad)
    except BadRequestError as e:
        assert e.body and e.body.get("param") == param, e.body
    else:
        raise AssertionError(f"{bad} was accepted")

print("openai sampling checks: ok")
