//! Dynamo's `speculative_prefill` hint (`nvext.agent_hints.speculative_prefill`; Dynamo's
//! docs, "Agent Hints"): once an answer is complete, the next turn's prefix (the
//! conversation with this answer appended) is sent as a one-token request and routed like
//! any other, so that when the client's next turn arrives a pod already holds its KV but
//! for the new message. An agent's next turn usually follows within moments; the pod
//! does the prefill it would have done then, earlier, off the client's critical path.

use serde_json::{Map, Value};

use crate::request::Api;

/// Fields that shape the answer, not the prompt: dropped from the prefill request, which
/// asks for one token and reads nothing of it.
const ANSWER_FIELDS: [&str; 13] = [
    "stream",
    "stream_options",
    "n",
    "max_completion_tokens",
    "min_tokens",
    "logprobs",
    "top_logprobs",
    "response_format",
    "stop",
    "echo",
    "suffix",
    "tool_choice",
    "continue_final_message",
];

/// The request that prefills the turn after `request`'s answer, `answer` being the
/// assistant message the client got (chat) or the answer's text (completions); `None`
/// when the next turn's prefix is not known from text (a prompt of token ids).
pub fn next_turn(
    api: Api,
    request: &Map<String, Value>,
    answer: Value,
) -> Option<Map<String, Value>> {
    let mut next = request.clone();
    for field in ANSWER_FIELDS {
        next.remove(field);
    }
    match api {
        Api::Chat => {
            let Some(Value::Array(messages)) = next.get_mut("messages") else {
                return None;
            };
            messages.push(answer);
            // The conversation ends with the answer's turn closed, as the next turn's
            // prompt has it before the new message.
            next.insert("add_generation_prompt".into(), false.into());
        }
        Api::Completions => {
            let (Some(Value::String(prompt)), Some(text)) =
                (next.get_mut("prompt"), answer.as_str())
            else {
                return None;
            };
            prompt.push_str(text);
        }
        Api::Embeddings => return None,
    }
    next.insert("max_tokens".into(), 1.into());
    if let Some(hints) = next
        .get_mut("nvext")
        .and_then(|n| n.get_mut("agent_hints"))
        .and_then(Value::as_object_mut)
    {
        hints.remove("speculative_prefill");
    }
    Some(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn a_chat_turn_is_followed_by_its_answer_closed_and_one_token_asked() {
        let request = map(json!({
            "model": "m", "stream": true, "max_completion_tokens": 100,
            "messages": [{"role": "user", "content": "weather?"}],
            "tools": [{"type": "function", "function": {"name": "w"}}],
            "tool_choice": "auto",
            "nvext": {"agent_hints": {"speculative_prefill": true, "osl": 9},
                      "cache_control": {"type": "ephemeral"}}
        }));
        let answer = json!({"role": "assistant", "content": null,
                            "tool_calls": [{"id": "c", "type": "function",
                                            "function": {"name": "w", "arguments": "{}"}}]});
        let next = next_turn(Api::Chat, &request, answer.clone()).unwrap();
        assert_eq!(next["messages"][1], answer);
        assert_eq!(next["max_tokens"], 1);
        assert_eq!(next["add_generation_prompt"], false);
        for gone in ["stream", "max_completion_tokens", "tool_choice"] {
            assert!(!next.contains_key(gone), "{gone}");
        }
        // What shapes the prompt stays; the hint does not repeat itself.
        assert_eq!(next["tools"], request["tools"]);
        assert_eq!(
            next["nvext"],
            json!({"agent_hints": {"osl": 9}, "cache_control": {"type": "ephemeral"}})
        );
    }

    #[test]
    fn a_completion_continues_its_prompt_and_token_prompts_are_left_alone() {
        let request = map(json!({"model": "m", "prompt": "Once", "echo": true}));
        let next = next_turn(Api::Completions, &request, json!(" upon")).unwrap();
        assert_eq!(next["prompt"], "Once upon");
        assert!(!next.contains_key("echo"));
        let ids = map(json!({"model": "m", "prompt": [1, 2]}));
        assert_eq!(next_turn(Api::Completions, &ids, json!(" upon")), None);
    }
}
