"""The official OpenAI Python client against the endpoint picker's frontend, in front of
mock engines that play a reasoning, tool-calling model (`--reasoning`,
`--tool-call-format hermes`) while the picker parses their answers
(`--tool-call-parser hermes`, `--reasoning-parser qwen3`).

An agent's turn: a tool call (whole and streamed alike), the tool's result sent back, an
answer; reasoning apart from content; embeddings; `n`, `stop` and `logprobs` honoured;
agent hints accepted, a misshapen one refused. Prints a JSON summary for the Rust test.
Usage: python openai_frontend.py BASE_URL MODEL
"""

import json
import sys

from openai import BadRequestError, OpenAI

base_url, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)

tools = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city", "days"],
            },
        },
    }
]
messages = [{"role": "user", "content": "What is the weather in Oslo this week?"}]
hints = {"nvext": {"agent_hints": {"osl": 64, "speculative_prefill": True},
                   "cache_control": {"type": "ephemeral", "ttl": "5m"}}}


def extra(obj, field):
    return (obj.model_extra or {}).get(field)


# A tool call, whole.
whole = client.chat.completions.create(
    model=model, messages=messages, tools=tools, seed=11, extra_body=hints
)
choice = whole.choices[0]
assert choice.finish_reason == "tool_calls", choice
assert choice.message.content is None, choice.message
assert extra(choice.message, "reasoning_content"), choice.message
(call,) = choice.message.tool_calls
assert call.type == "function" and call.id, call
assert call.function.name == "get_weather", call
arguments = json.loads(call.function.arguments)
assert isinstance(arguments["city"], str) and isinstance(arguments["days"], int), arguments

# The same, streamed: the same call and reasoning, the call in one delta.
reasoning, content, calls, finish = "", "", [], None
for chunk in client.chat.completions.create(
    model=model, messages=messages, tools=tools, seed=11, stream=True
):
    for c in chunk.choices:
        reasoning += extra(c.delta, "reasoning_content") or ""
        content += c.delta.content or ""
        calls += c.delta.tool_calls or []
        finish = c.finish_reason or finish
assert finish == "tool_calls", finish
assert reasoning == extra(choice.message, "reasoning_content"), (reasoning, choice.message)
assert content == "", content
assert [(c.index, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
    (0, "get_weather", arguments)
], calls

# The agent runs the tool and sends its result back; told not to call again, the model
# answers in words, after thinking.
followup = messages + [
    choice.message.model_dump(exclude_none=True),
    {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"},
]
answer = client.chat.completions.create(
    model=model, messages=followup, tools=tools, tool_choice="none", max_tokens=40
)
assert answer.choices[0].message.content, answer
assert not answer.choices[0].message.tool_calls, answer
assert extra(answer.choices[0].message, "reasoning_content"), answer

# Thinking turned off: no reasoning.
plain = client.chat.completions.create(
    model=model,
    messages=messages,
    max_tokens=6,
    extra_body={"chat_template_kwargs": {"enable_thinking": False}},
)
assert not extra(plain.choices[0].message, "reasoning_content"), plain
assert len(plain.choices[0].message.content.split()) == 6, plain

# Embeddings, forwarded to the engines.
embedded = client.embeddings.create(model=model, input=["a cat", "a dog"])
assert [len(e.embedding) for e in embedded.data] == [384, 384], embedded
assert len(client.embeddings.create(model=model, input="x", dimensions=16).data[0].embedding) == 16

# n, stop and logprobs, honoured end to end.
many = client.completions.create(model=model, prompt="Once upon", max_tokens=5, n=3, seed=2)
assert sorted(c.index for c in many.choices) == [0, 1, 2], many
assert len({c.text for c in many.choices}) == 3, many
assert many.usage.completion_tokens == 15, many.usage
first = client.completions.create(model=model, prompt="Far away", max_tokens=12, seed=4)
stop_word = first.choices[0].text.split()[5]
stopped = client.completions.create(
    model=model, prompt="Far away", max_tokens=12, seed=4, stop=[" " + stop_word]
)
assert stopped.choices[0].finish_reason == "stop", stopped
assert stop_word not in stopped.choices[0].text.split(), stopped
logged = client.chat.completions.create(
    model=model, messages=messages, max_tokens=4, logprobs=True, top_logprobs=3,
    extra_body={"chat_template_kwargs": {"enable_thinking": False}},
)
entries = logged.choices[0].logprobs.content
assert len(entries) == 4 and all(len(e.top_logprobs) == 3 for e in entries), entries
assert all(e.logprob <= 0 for e in entries), entries

# A misshapen hint is refused by name.
try:
    client.chat.completions.create(
        model=model, messages=messages, extra_body={"nvext": {"agent_hints": {"osl": "long"}}}
    )
except BadRequestError as e:
    assert "osl" in e.body["message"], e.body
else:
    raise AssertionError("a misshapen osl hint was accepted")

print(json.dumps({"call": arguments, "reasoning_words": len(reasoning.split())}))
