//! Disaggregated serving end to end (`DESIGN.md`, "Disaggregated request"): `dynamo run`
//! starts `config/samples/disagg-mocker.yaml` (prefill and decode mocker workers, their
//! sidecars, the picker) as real processes. Requests are prefilled on the prefill pod,
//! their KV blocks move between the two sidecars over NIXL (gRPC where NIXL is not
//! installed), and the decode pod answers;
//! a process without the run's block API credential is refused; a killed prefill engine
//! degrades to local prefill with the same answer, scaling
//! either side works under traffic, and no lease is left behind.

#[allow(dead_code)] // the fixture serves several test binaries, each using a part
mod support;

use std::time::Duration;

use rustix::process::Signal;
use serde_json::{Value, json};
use support::{LocalGraph, get_text, metric_sum, signal};

/// NIXL's library directory (`make nixl`) for the run's sidecars, which then move the
/// blocks over NIXL; `None` where it is not installed (a run without NIXL moves them over
/// gRPC), which CI (`DYNAMO_REQUIRE_NIXL`) does not allow.
fn nixl_lib_dir() -> Option<String> {
    let dir = std::env::var("NIXL_LIB_DIR")
        .ok()
        .filter(|d| std::path::Path::new(d).join("libnixl_capi.so").is_file());
    if dir.is_none() {
        assert!(
            std::env::var_os("DYNAMO_REQUIRE_NIXL").is_none(),
            "NIXL is required here but NIXL_LIB_DIR holds no libnixl_capi.so"
        );
        println!("NIXL is not installed (set NIXL_LIB_DIR): the blocks move over gRPC");
    }
    dir
}

/// `disagg-mocker.yaml` run with NIXL where it is installed, and the transport its
/// decode sidecars then use.
async fn start_disagg() -> (LocalGraph, &'static str) {
    let nixl = nixl_lib_dir();
    let env: Vec<(&str, &str)> = nixl
        .iter()
        .map(|dir| ("DYNAMO_SIDECAR_NIXL_LIB_DIR", dir.as_str()))
        .collect();
    let graph = LocalGraph::start_with_env("disagg-mocker.yaml", &[], &env).await;
    (graph, if nixl.is_some() { "nixl" } else { "grpc" })
}

/// A prompt of about `words` tokens, different for each `id`.
fn prompt(id: usize, words: usize) -> String {
    (0..words)
        .map(|i| format!("w{}", (i * 7 + id * 13) % 97))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A whole completion: its text and finish reason.
async fn complete(graph: &LocalGraph, id: usize) -> (String, String) {
    let response = reqwest::Client::new()
        .post(graph.url("/v1/completions"))
        .json(
            &json!({"model": graph.model, "prompt": prompt(id, 300), "max_tokens": 12,
                      "seed": id, "ignore_eos": true}),
        )
        .send()
        .await
        .unwrap();
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    assert!(
        status.is_success(),
        "{status}: {body}\n{}",
        graph.log_text()
    );
    let choice = &body["choices"][0];
    (
        choice["text"].as_str().unwrap().to_owned(),
        choice["finish_reason"].as_str().unwrap().to_owned(),
    )
}

async fn picker_hops(graph: &LocalGraph, outcome: &str) -> f64 {
    let text = get_text(&graph.url("/metrics")).await;
    metric_sum(
        &text,
        "dynamo_epp_prefill_hops_total",
        &[("outcome", outcome)],
    )
}

/// The sum of `name` over the sidecars of `service`'s replicas; `None` while one of
/// them does not answer (a killed one the runner is restarting).
async fn sidecars_sum(
    graph: &LocalGraph,
    service: &str,
    name: &str,
    filter: &[(&str, &str)],
) -> Option<f64> {
    let mut sum = 0.0;
    for replica in graph.graph().await["services"][service].as_array()? {
        let url = replica["sidecar_metrics"].as_str()?;
        let text = reqwest::get(url).await.ok()?.text().await.ok()?;
        sum += metric_sum(&text, name, filter);
    }
    Some(sum)
}

/// Waits until every sidecar of the graph answers and none holds a lease.
async fn no_lease_left(graph: &LocalGraph) {
    for _ in 0..300 {
        let prefill = sidecars_sum(graph, "prefill", "dynamo_sidecar_kv_leases", &[]).await;
        let decode = sidecars_sum(graph, "decode", "dynamo_sidecar_kv_leases", &[]).await;
        if prefill == Some(0.0) && decode == Some(0.0) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("leases left on the sidecars\n{}", graph.log_text());
}

#[tokio::test(flavor = "multi_thread")]
async fn prefill_on_one_pod_decode_on_another_and_the_same_answer_without_it() {
    let (graph, transport) = start_disagg().await;
    let mut answers = Vec::new();
    for id in 0..6 {
        let (text, finish) = complete(&graph, id).await;
        assert_eq!(finish, "length");
        answers.push(text);
    }
    assert_eq!(
        picker_hops(&graph, "remote").await,
        6.0,
        "{}",
        graph.log_text()
    );
    let fetched = [("how", "fetched")];
    let ended = "dynamo_sidecar_kv_leases_ended_total";
    let prefill_fetched = sidecars_sum(&graph, "prefill", ended, &fetched).await;
    assert_eq!(prefill_fetched, Some(6.0));
    let decode_fetched = sidecars_sum(&graph, "decode", ended, &fetched).await;
    assert_eq!(decode_fetched, Some(6.0));
    let moved = sidecars_sum(
        &graph,
        "decode",
        "dynamo_sidecar_kv_transfer_blocks_total",
        &[],
    )
    .await
    .unwrap();
    assert!(moved >= 6.0, "{moved} blocks moved");
    let transfers = "dynamo_sidecar_kv_transfers_total";
    let over = [("transport", transport)];
    let by_transport = sidecars_sum(&graph, "decode", transfers, &over).await;
    assert_eq!(by_transport, Some(6.0), "every transfer over {transport}");
    no_lease_left(&graph).await;

    // Those transfers carried the run's credential; a local process without it, loopback
    // and all, gets nothing from the prefill sidecar that holds the blocks.
    let block_api = graph.graph().await["services"]["prefill"][0]["kv_events"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut stranger = dynamo_kvblocks::BlockClient::new(&block_api).unwrap();
    match stranger.lookup(&[dynamo_kvcache::SeqHash(1)]).await {
        Err(dynamo_kvblocks::ClientError::Status(status)) => {
            assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status}")
        }
        other => panic!("{other:?}"),
    }

    // The prefill engine dies: its sidecar answers 503, the decode pods prefill.
    let pid = graph.graph().await["services"]["prefill"][0]["engine_pid"]
        .as_u64()
        .expect("the prefill engine runs");
    signal(pid, Signal::KILL);
    for (id, before) in answers.iter().enumerate() {
        let (text, _) = complete(&graph, id).await;
        assert_eq!(
            &text, before,
            "request {id}: the same answer, prefilled locally"
        );
    }
    let fallbacks = picker_hops(&graph, "fallback_prefill_failed").await
        + picker_hops(&graph, "fallback_timeout").await;
    // The runner restarts the engine; requests after that go remote again.
    assert!(fallbacks >= 1.0, "no fallback seen\n{}", graph.log_text());
    no_lease_left(&graph).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn blocks_whose_lease_expired_before_the_fetch_are_prefilled_again() {
    // Every sidecar inherits the lease duration: 1 ms is over before a decode sidecar
    // has the prefill's answer in hand.
    let env = [("DYNAMO_SIDECAR_KV_LEASE_DURATION", "1ms")];
    let graph = LocalGraph::start_with_env("disagg-mocker.yaml", &[], &env).await;
    for id in 0..4 {
        let (_, finish) = complete(&graph, id).await;
        assert_eq!(finish, "length");
    }
    let failed = picker_hops(&graph, "fallback_transfer_failed").await;
    assert!(failed >= 1.0, "no expired lease met\n{}", graph.log_text());
    let expired = [("how", "expired")];
    let ended = "dynamo_sidecar_kv_leases_ended_total";
    let expired = sidecars_sum(&graph, "prefill", ended, &expired)
        .await
        .unwrap();
    assert!(
        expired >= failed,
        "{expired} expired, {failed} transfers failed"
    );
    no_lease_left(&graph).await;
}

/// Sends `n` small requests one after another; returns how each that failed did (its
/// status and answer, or the client's error).
fn steady_load(graph: &LocalGraph, n: usize) -> tokio::task::JoinHandle<Vec<String>> {
    let (url, model) = (graph.url("/v1/completions"), graph.model.clone());
    tokio::spawn(async move {
        let client = reqwest::Client::new();
        let mut failed = Vec::new();
        for id in 0..n {
            let body = json!({"model": model, "prompt": prompt(id, 200), "max_tokens": 4});
            match client.post(&url).json(&body).send().await {
                Ok(r) if r.status().is_success() => {}
                Ok(r) => failed.push(format!(
                    "request {id}: {} {}",
                    r.status(),
                    r.text().await.unwrap_or_default()
                )),
                Err(e) => failed.push(format!("request {id}: {e}")),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        failed
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_prefill_pod_killed_under_load_fails_no_request() {
    let (graph, _) = start_disagg().await;
    let load = steady_load(&graph, 60);
    tokio::time::sleep(Duration::from_millis(800)).await;
    // The whole prefill pod: its sidecar, which serves the leases and the prefill leg.
    let pid = graph.graph().await["services"]["prefill"][0]["sidecar_pid"]
        .as_u64()
        .expect("the prefill sidecar runs");
    signal(pid, Signal::KILL);
    let failed = load.await.unwrap();
    assert!(
        failed.is_empty(),
        "requests failed: {failed:#?}\n{}",
        graph.log_text()
    );
    assert!(picker_hops(&graph, "remote").await > 0.0);
    no_lease_left(&graph).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn prefill_and_decode_scale_separately_under_traffic() {
    let graph = LocalGraph::start("disagg-mocker.yaml", &[]).await;
    let load = steady_load(&graph, 60);
    let scale = |service: &'static str, replicas: u32| {
        let url = graph.admin("/scale");
        async move {
            let response = reqwest::Client::new()
                .post(url)
                .json(&json!({"service": service, "replicas": replicas}))
                .send()
                .await
                .unwrap();
            assert!(response.status().is_success(), "scale {service}");
        }
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    scale("prefill", 2).await;
    scale("decode", 1).await;
    let failed = load.await.unwrap();
    assert!(
        failed.is_empty(),
        "requests failed while scaling: {failed:#?}"
    );
    // The new prefill replica is a member its decode peers accept.
    for id in 100..110 {
        complete(&graph, id).await;
    }
    let refused = picker_hops(&graph, "refused").await;
    assert_eq!(
        refused,
        0.0,
        "a prefill replica was refused\n{}",
        graph.log_text()
    );
    let served = sidecars_sum(
        &graph,
        "prefill",
        "dynamo_sidecar_kv_leases_lent_total",
        &[],
    )
    .await
    .unwrap();
    assert!(served > 0.0);
    assert_eq!(graph.engines("prefill").await.len(), 2);
    no_lease_left(&graph).await;
}
