//! Request migration (Dynamo's `--migration-limit`): `dynamo run` starts two mocker
//! workers with their sidecars and the picker (round-robin) as real processes; ten
//! streams, eight of them through the official `openai` Python client and two raw SSE,
//! are mid-answer when one engine gets SIGKILL (`scripts/openai_migration.py`).
//!
//! With migration on, the streams of the dead engine (about half: the script freezes the
//! engine before the kill and counts the streams left unfinished, so that none can end
//! between the count and the kill) continue on the other worker: every client gets
//! the whole answer, token for token the one the same seeded request gets alone (the mock
//! engine continues a seeded answer exactly), as one stream (one chunk id, one role) with
//! usage counting it all. With migration off, exactly those end with an error event and
//! `[DONE]`, which the `openai` client raises as an `APIError`, and the others complete.

#[allow(dead_code)] // the fixture serves several test binaries, each using a part
mod support;

use serde_json::Value;
use support::{LocalGraph, get_text, metric_sum};

const STREAMS: usize = 10;
const MAX_TOKENS: u64 = 400;

/// Waits until the picker routes to both workers: round-robin then gives each half of
/// the streams (on a loaded machine the second worker can come up after the graph is
/// healthy).
async fn both_workers_routable(graph: &LocalGraph) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let metrics = get_text(&graph.url("/metrics")).await;
        let ready = metric_sum(
            &metrics,
            "dynamo_epp_endpoints",
            &[("role", "aggregated"), ("state", "ready")],
        );
        if ready >= 2.0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{ready} workers ready in the picker after 60 s\n{}",
            graph.log_text()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// What the clients saw when the first worker's engine was killed mid-answer.
struct Killed {
    streams: Vec<Value>,
    /// How many of them the kill cut: unfinished on that engine when it was killed.
    on_killed_engine: usize,
}

/// Runs the streams against `graph`, killing its first worker's engine mid-answer.
async fn kill_mid_stream(graph: &LocalGraph) -> Killed {
    both_workers_routable(graph).await;
    let pid = graph.graph().await["services"]["worker"][0]["engine_pid"]
        .as_u64()
        .expect("the engine runs");
    let engine = &graph.engines("worker").await[0];
    let args = vec![
        graph.url("/v1"),
        graph.model.clone(),
        pid.to_string(),
        format!("http://{engine}"),
        STREAMS.to_string(),
        MAX_TOKENS.to_string(),
    ];
    let stdout = graph.run_script("openai_migration.py", args).await;
    let out: Value = serde_json::from_str(&stdout).expect("the script prints its results");
    let on_killed_engine = out["on_killed_engine"].as_f64().expect("a count") as usize;
    let running = out["running"].as_f64().expect("the engine's count") as usize;
    // The engine ran at least the streams its kill cut (a stream of its count may have
    // ended before it froze).
    assert!(
        on_killed_engine <= running,
        "{on_killed_engine} streams cut, {running} running on the engine just before"
    );
    // Round-robin over two workers gives each about half; none on the killed engine
    // would leave nothing to test.
    assert!(
        (1..STREAMS).contains(&on_killed_engine),
        "{on_killed_engine} of {STREAMS} streams on the killed engine\n{}",
        picks_and_failures(&get_text(&graph.url("/metrics")).await)
    );
    Killed {
        streams: out["streams"].as_array().expect("a list").clone(),
        on_killed_engine,
    }
}

/// The picker's picks and failures per pod, to say how the streams were spread.
fn picks_and_failures(metrics: &str) -> String {
    metrics
        .lines()
        .filter(|l| l.starts_with("dynamo_epp_picks") || l.starts_with("dynamo_epp_upstream"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `stream` got its whole answer, exactly, as one stream; else why not.
fn whole(stream: &Value) -> Result<(), String> {
    let fail = |why: &str| Err(format!("{why}: {stream}"));
    if !stream["error"].is_null() {
        return fail("failed");
    }
    if stream["text"] != stream["expected"] {
        return fail("not the answer the request gets alone (a token repeated or missing)");
    }
    if stream["pieces"] != MAX_TOKENS || stream["finish"] != "length" {
        return fail("not max_tokens tokens, one per chunk, to a length finish");
    }
    match stream["kind"].as_str() {
        Some("raw") if stream["last"][1] != "[DONE]" => fail("no [DONE] at the end"),
        Some("raw") => Ok(()),
        kind => {
            if stream["usage"]["completion_tokens"] != MAX_TOKENS {
                return fail("usage does not count the whole answer");
            }
            if stream["ids"] != 1 || (kind == Some("chat") && stream["roles"] != 1) {
                return fail("not one stream: several chunk ids or roles");
            }
            Ok(())
        }
    }
}

fn migrations(metrics: &str) -> f64 {
    let ongoing = [("migration_type", "ongoing_request")];
    metric_sum(metrics, "dynamo_frontend_model_migration_total", &ongoing)
}

#[tokio::test(flavor = "multi_thread")]
async fn streams_continue_on_another_worker_when_their_engine_is_killed() {
    let graph = LocalGraph::start_with_env(
        "agg-mocker.yaml",
        &["--replicas", "worker=2", "--router-mode", "round-robin"],
        &[("DYN_MIGRATION_LIMIT", "3")],
    )
    .await;
    let Killed {
        streams,
        on_killed_engine,
    } = kill_mid_stream(&graph).await;
    let broken: Vec<String> = streams.iter().filter_map(|s| whole(s).err()).collect();
    assert!(
        broken.is_empty(),
        "{} of {STREAMS} streams broken:\n{}\n{}",
        broken.len(),
        broken.join("\n"),
        graph.log_text()
    );
    let metrics = get_text(&graph.url("/metrics")).await;
    assert_eq!(
        migrations(&metrics),
        on_killed_engine as f64,
        "one migration per stream of the killed engine:\n{}",
        picks_and_failures(&metrics)
    );
    // What a migration adds, for the record: the picker times each from the break to the
    // continuation's first chunk; the clients see it as their stream's longest gap (the
    // other worker's streams also wait while it prefills the continuations).
    let resumed = |suffix: &str| {
        let name = format!("dynamo_epp_migration_resume_seconds_{suffix}");
        metric_sum(&metrics, &name, &[])
    };
    let ms = |key: &str| -> Vec<f64> {
        let mut v: Vec<f64> = streams.iter().filter_map(|s| s[key].as_f64()).collect();
        v.sort_by(f64::total_cmp);
        v
    };
    eprintln!(
        "{STREAMS} of {STREAMS} streams completed whole, {on_killed_engine} of them on the \
         killed engine; migrations resumed after {:.1} ms on average ({} of them); longest \
         gap per stream (ms): {:.1?}; median gap per stream (ms): {:.1?}",
        resumed("sum") * 1000.0 / resumed("count"),
        resumed("count"),
        ms("max_gap_ms"),
        ms("itl_ms"),
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn without_migration_a_broken_stream_ends_with_an_error_event_and_done() {
    // Migration is off unless asked for, as in Dynamo.
    let graph = LocalGraph::start(
        "agg-mocker.yaml",
        &["--replicas", "worker=2", "--router-mode", "round-robin"],
    )
    .await;
    let Killed {
        streams,
        on_killed_engine,
    } = kill_mid_stream(&graph).await;
    let (complete, cut): (Vec<&Value>, Vec<&Value>) =
        streams.iter().partition(|s| whole(s).is_ok());
    assert_eq!(
        (complete.len(), cut.len()),
        (STREAMS - on_killed_engine, on_killed_engine),
        "the streams of the killed engine, and only they, fail: {streams:#?}"
    );
    for stream in cut {
        match stream["kind"].as_str() {
            Some("raw") => {
                let error: Value = serde_json::from_str(stream["last"][0].as_str().unwrap())
                    .expect("the last event before [DONE] is JSON");
                assert_eq!(error["error"]["code"], "answer_interrupted", "{stream}");
                assert_eq!(stream["last"][1], "[DONE]", "{stream}");
            }
            _ => {
                // The `openai` client raises the error event as an API error, not a
                // broken connection.
                assert_eq!(stream["error"]["type"], "APIError", "{stream}");
                let message = stream["error"]["message"].as_str().unwrap();
                assert!(message.contains("migration is off"), "{stream}");
            }
        }
    }
    assert_eq!(migrations(&get_text(&graph.url("/metrics")).await), 0.0);
}
