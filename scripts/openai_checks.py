"""The official OpenAI Python client against a server that serves the mock engine, alone
(the mocker's tests) or behind the endpoint picker (the e2e tests).

Chat and completions, whole and streamed, the model list, and the error answers to bad
requests (status and OpenAI error body). The mock engine writes one word per token.
Usage: python openai_checks.py BASE_URL MODEL
"""

import sys

import httpx
from openai import BadRequestError, NotFoundError, OpenAI

base_url, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)

whole = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Say hello"}],
    max_tokens=6,
)
assert whole.choices[0].finish_reason == "length", whole
assert whole.usage.completion_tokens == 6, whole.usage
assert len(whole.choices[0].message.content.split()) == 6, whole

pieces, usage = [], None
for chunk in client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Count to three"}],
    max_tokens=3,
    stream=True,
    stream_options={"include_usage": True},
):
    usage = chunk.usage or usage
    pieces += [c.delta.content for c in chunk.choices if c.delta.content]
assert len(pieces) == 3, pieces
assert usage is not None and usage.completion_tokens == 3, usage

completion = client.completions.create(model=model, prompt="Once upon a time", max_tokens=2)
assert completion.usage.completion_tokens == 2, completion

streamed = [
    c.choices[0].text
    for c in client.completions.create(model=model, prompt="Far away", max_tokens=4, stream=True)
    if c.choices and c.choices[0].text
]
assert len(streamed) == 4, streamed

assert [m.id for m in client.models.list()] == [model]

too_long = "word " * 200_000
for bad, error in [
    (dict(model="no-such-model", messages=[{"role": "user", "content": "x"}]), NotFoundError),
    (dict(model=model, messages=[]), BadRequestError),
    (dict(model=model, messages=[{"role": "user", "content": "x"}], max_tokens=-1), BadRequestError),
    (dict(model=model, messages=[{"role": "user", "content": too_long}]), BadRequestError),
]:
    try:
        client.chat.completions.create(**bad)
    except error as e:
        assert e.body and e.body.get("message"), e
    else:
        raise AssertionError(f"{bad} was accepted")

malformed = httpx.post(
    f"{base_url}/chat/completions",
    content=b'{"model": ',
    headers={"content-type": "application/json"},
)
assert malformed.status_code == 400, malformed.text
assert malformed.json()["error"]["message"], malformed.text

print("openai checks: ok")
