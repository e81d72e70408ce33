//! The Gateway API Inference Extension's EPP metrics on the picker's `/metrics`, after
//! requests through the picker to real mock engines whose `/metrics` it polls.

mod common;

use std::time::Duration;

use common::*;
use dynamo_epp::config::RouterConfig;
use dynamo_epp::start;
use serde_json::json;

/// The float value of the sample `series` (name and labels as printed), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_through_the_picker_show_in_the_inference_extensions_metrics() {
    let pods = [Pod::start().await, Pod::start().await];
    let file = EndpointsFile::new();
    file.write(&pods.iter().map(Pod::entry).collect::<Vec<_>>());
    let epp = start(dynamo_epp::Config {
        metrics_poll_interval: Some(Duration::from_millis(50)),
        ..config(&file, RouterConfig::default())
    })
    .await
    .expect("picker starts");
    let base = format!("http://{}", epp.http_addr);
    let http = reqwest::Client::new();
    let scrape = || async {
        let response = http.get(format!("{base}/metrics")).send().await.unwrap();
        response.text().await.unwrap()
    };
    eventually("both pods ready and their engines read", || async {
        let text = scrape().await;
        sample(&text, r#"inference_pool_ready_pods{name="qwen-mock"}"#) == Some(2.0)
            && text.matches("dynamo_epp_engine_kv_usage{").count() == 2
    })
    .await;

    let post = |body: String| {
        http.post(format!("{base}/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    for stream in [false, true] {
        let answer = post(chat("hello there", 4, stream).to_string())
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        answer.bytes().await.unwrap();
    }
    let refused = post(json!({"model": MODEL}).to_string()).await.unwrap();
    assert_eq!(refused.status(), 400);

    let text = scrape().await;
    let objective = r#"{model_name="qwen-mock",target_model_name="qwen-mock"}"#;
    let value = |name: &str| sample(&text, &format!("{name}{objective}"));
    assert_eq!(
        value("inference_objective_request_total"),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"inference_objective_request_error_total{model_name="qwen-mock",target_model_name="qwen-mock",error_code="BadRequest"}"#
        ),
        Some(1.0),
        "{text}"
    );
    for histogram in [
        "inference_objective_request_duration_seconds_count",
        "inference_objective_input_tokens_count",
        "inference_objective_output_tokens_count",
        "inference_objective_normalized_time_per_output_token_seconds_count",
    ] {
        assert_eq!(value(histogram), Some(2.0), "{histogram}:\n{text}");
    }
    // Four output tokens each, in the source's buckets (1, 8, ...).
    assert_eq!(
        sample(
            &text,
            r#"inference_objective_output_tokens_bucket{le="8.0",model_name="qwen-mock",target_model_name="qwen-mock"}"#
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"inference_objective_running_requests{model_name="qwen-mock"}"#
        ),
        Some(0.0),
        "{text}"
    );

    // The pool's averages are the mean of what each pod's engine last reported.
    let pods_usage: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with("dynamo_epp_engine_kv_usage{"))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse().unwrap())
        .collect();
    let mean = pods_usage.iter().sum::<f64>() / pods_usage.len() as f64;
    let pool_usage = sample(
        &text,
        r#"inference_pool_average_kv_cache_utilization{name="qwen-mock"}"#,
    )
    .expect("pool KV usage");
    assert!((pool_usage - mean).abs() < 1e-9, "{pool_usage} vs {mean}");
    assert_eq!(
        sample(
            &text,
            r#"inference_pool_average_queue_size{name="qwen-mock"}"#
        ),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, r#"inference_pool_ready_pods{name="qwen-mock"}"#),
        Some(2.0)
    );
    epp.shutdown().await.unwrap();
}
