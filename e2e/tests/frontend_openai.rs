//! The OpenAI surface an agent relies on, end to end: `dynamo run` starts mocker engines
//! that play a reasoning, tool-calling model, their sidecars and the picker parsing their
//! answers, as real processes; the official `openai` Python client drives an agent's turn
//! (tool call, result, answer), embeddings, `n`/`stop`/`logprobs` and agent hints
//! (`scripts/openai_frontend.py`).

#[allow(dead_code)] // the fixture serves several test binaries, each using a part
mod support;

use serde_json::Value;
use support::{LocalGraph, get_text, metric_sum};

#[tokio::test(flavor = "multi_thread")]
async fn an_agents_turn_through_the_official_client() {
    let graph = LocalGraph::start_with_env(
        "agg-mocker.yaml",
        &["--replicas", "worker=2"],
        &[
            ("DYNAMO_MOCKER_REASONING", "true"),
            ("DYNAMO_MOCKER_TOOL_CALL_FORMAT", "hermes"),
            ("DYN_TOOL_CALL_PARSER", "hermes"),
            ("DYN_REASONING_PARSER", "qwen3"),
        ],
    )
    .await;
    let args = vec![graph.url("/v1"), graph.model.clone()];
    let stdout = graph.run_script("openai_frontend.py", args).await;
    let summary: Value = serde_json::from_str(&stdout).expect("the script prints a summary");
    assert!(summary["reasoning_words"].as_u64() >= Some(8), "{summary}");

    // The hints were seen, and the tool-call turn's next turn was prefilled.
    let metrics = get_text(&graph.url("/metrics")).await;
    // Responses requests are counted on their own route, refusals included.
    let responses = &summary["responses"];
    assert!(responses["events"].as_u64() >= Some(10), "{summary}");
    for (status, field) in [("200", "answered"), ("400", "refused")] {
        let n = metric_sum(
            &metrics,
            "dynamo_frontend_requests_total",
            &[("route", "/v1/responses"), ("status", status)],
        );
        assert_eq!(
            Some(n as u64),
            responses[field].as_u64(),
            "{status}:\n{metrics}"
        );
    }
    for hint in ["osl", "speculative_prefill", "cache_control"] {
        let n = metric_sum(
            &metrics,
            "dynamo_frontend_agent_hints_total",
            &[("hint", hint)],
        );
        assert_eq!(n, 1.0, "{hint}:\n{metrics}");
    }
    let sent = [("outcome", "sent")];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while metric_sum(
        &get_text(&graph.url("/metrics")).await,
        "dynamo_frontend_speculative_prefills_total",
        &sent,
    ) < 1.0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no speculative prefill was sent"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
