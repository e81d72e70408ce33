"""The official OpenAI Python client against the endpoint picker's frontend, in front of
mock engines that play a reasoning, tool-calling model (`--reasoning`,
`--tool-call-format hermes`) while the picker parses their answers
(`--tool-call-parser hermes`, `--reasoning-parser qwen3`).

An agent's turn: a tool call (whole and streamed alike), the tool's result sent back, an
answer; reasoning apart from content; embeddings; `n`, `stop` and `logprobs` honoured;
agent hints accepted, a misshapen one refused. The same turn through the Responses API
(`client.responses.create`), whole and streamed, and what it refuses. Prints a JSON
summary for the Rust test.
Usage: python openai_frontend.py BASE_URL MODEL
"""

import json
import sys

from openai import BadRequestError, OpenAI
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

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

# The Responses API, over the chat path: the same turn, tools in its flat shape.
flat_tools = [{"type": "function", **tools[0]["function"]}]
question = messages[0]["content"]
seeded = {"seed": 11}  # not a Responses field: it goes on to the chat request
first = client.responses.create(
    model=model, input=question, tools=flat_tools, instructions="Answer briefly.",
    extra_body=seeded,
)
assert first.object == "response" and first.id.startswith("resp_"), first
assert first.status == "completed" and first.incomplete_details is None, first
assert [o.type for o in first.output] == ["reasoning", "function_call"], first.output
thought, fcall = first.output
assert thought.content[0].type == "reasoning_text" and thought.content[0].text, thought
assert fcall.name == "get_weather" and fcall.call_id and fcall.status == "completed", fcall
r_arguments = json.loads(fcall.arguments)
assert isinstance(r_arguments["city"], str) and isinstance(r_arguments["days"], int), fcall
usage = first.usage
assert usage.input_tokens > 0 and usage.output_tokens > 0, usage
assert usage.total_tokens == usage.input_tokens + usage.output_tokens, usage
assert 0 < usage.output_tokens_details.reasoning_tokens < usage.output_tokens, usage
assert first.instructions == "Answer briefly." and first.tools[0].name == "get_weather", first
# The client does not validate what it reads; every required field is there all the same.
Response.model_validate(first.to_dict())

# Streamed: the events in order, numbered, adding up to the same response.
events = list(client.responses.create(
    model=model, input=question, tools=flat_tools, instructions="Answer briefly.",
    extra_body=seeded, stream=True,
))
event_type = TypeAdapter(ResponseStreamEvent)
for e in events:
    event_type.validate_python(e.to_dict())
kinds = [e.type for e in events]
assert kinds[:2] == ["response.created", "response.in_progress"], kinds
assert kinds[-1] == "response.completed", kinds
assert [e.sequence_number for e in events] == list(range(len(events))), events
streamed_thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
assert streamed_thought == thought.content[0].text, (streamed_thought, thought)
(arguments_done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
streamed_arguments = "".join(
    e.delta for e in events if e.type == "response.function_call_arguments.delta"
)
assert streamed_arguments == arguments_done.arguments, (streamed_arguments, arguments_done)
assert json.loads(arguments_done.arguments) == r_arguments, arguments_done
final = events[-1].response
assert [o.type for o in final.output] == ["reasoning", "function_call"], final.output
assert final.output[1].arguments == arguments_done.arguments, final
assert final.usage.output_tokens == usage.output_tokens, (final.usage, usage)

# The agent sends the output back with the call's result; told not to call again, the
# model thinks and answers in words, until the output limit.
followup = (
    [{"role": "user", "content": question}]
    + [o.model_dump(exclude_none=True) for o in first.output]
    + [{"type": "function_call_output", "call_id": fcall.call_id, "output": "Sunny, 21 C"}]
)
reply = client.responses.create(
    model=model, input=followup, tools=flat_tools, tool_choice="none", max_output_tokens=40
)
assert [o.type for o in reply.output] == ["reasoning", "message"], reply.output
assert reply.output_text and reply.output[1].content[0].type == "output_text", reply
assert reply.status == "incomplete", reply
assert reply.incomplete_details.reason == "max_output_tokens", reply
assert reply.usage.output_tokens == 40, reply.usage
Response.model_validate(reply.to_dict())

# Text streamed, thinking off: deltas that add up to the text, then `response.incomplete`.
plain_events = list(client.responses.create(
    model=model, input=question, max_output_tokens=6, stream=True,
    extra_body={"chat_template_kwargs": {"enable_thinking": False}},
))
plain_kinds = [e.type for e in plain_events]
assert "response.reasoning_text.delta" not in plain_kinds, plain_kinds
text = "".join(e.delta for e in plain_events if e.type == "response.output_text.delta")
(text_done,) = [e for e in plain_events if e.type == "response.output_text.done"]
assert text == text_done.text and len(text.split()) == 6, (text, text_done)
assert plain_kinds[-1] == "response.incomplete", plain_kinds
assert plain_events[-1].response.output_text == text, plain_events[-1]

# What needs server-side state or built-in tools is refused by name.
refusals = [
    ("previous_response_id", {"previous_response_id": first.id}),
    ("store", {"store": True}),
    ("tools[0].type", {"tools": [{"type": "web_search"}]}),
]
for param, fields in refusals:
    try:
        client.responses.create(model=model, input=question, **fields)
    except BadRequestError as e:
        assert e.body["param"] == param, e.body
    else:
        raise AssertionError(f"{param} was accepted")

print(json.dumps({
    "call": arguments,
    "reasoning_words": len(reasoning.split()),
    "responses": {
        "answered": len([first, final, reply, plain_events[-1].response]),
        "refused": len(refusals),
        "events": len(events),
    },
}))
