"""The official OpenAI Python client against a server: chat, whole and streamed.

Usage: python openai_client.py BASE_URL MODEL
"""

import sys

from openai import BadRequestError, NotFoundError, OpenAI

base_url, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url, api_key="unused")

whole = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Say hello"}],
    max_tokens=6,
)
assert whole.choices[0].finish_reason == "length", whole
assert whole.usage.completion_tokens == 6, whole.usage
assert len(whole.choices[0].message.content.split()) == 6, whole

pieces = []
usage = None
for chunk in client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Count to three"}],
    max_tokens=3,
    stream=True,
    stream_options={"include_usage": True},
):
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        if choice.delta.content:
            pieces.append(choice.delta.content)
assert len(pieces) == 3, pieces
assert usage is not None and usage.completion_tokens == 3, usage

completion = client.completions.create(model=model, prompt="Once upon a time", max_tokens=2)
assert completion.usage.completion_tokens == 2, completion

assert [m.id for m in client.models.list()] == [model]

for bad, error in [
    (dict(model="no-such-model", messages=[{"role": "user", "content": "x"}]), NotFoundError),
    (dict(model=model, messages=[]), BadRequestError),
]:
    try:
        client.chat.completions.create(**bad)
    except error as e:
        assert e.body and e.body.get("message"), e
    else:
        raise AssertionError(f"{bad} was accepted")

print("openai client: ok")
