//! `/healthz` and `/metrics` over a real socket.

use std::sync::Arc;

use dynamo_operator::controller::metrics::Metrics;
use dynamo_server::metrics_endpoint::serve;
use tokio::net::TcpListener;

#[tokio::test]
async fn health_and_metrics_are_served() {
    let metrics = Arc::new(Metrics::default());
    metrics.set_leader(true);
    metrics.observe("dgd", std::time::Duration::from_millis(3), Some("children"));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, move || metrics.encode()));

    let health = reqwest::get(format!("http://{addr}/healthz"))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);

    let response = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap();
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    let text = response.text().await.unwrap();
    for line in [
        "dynamo_operator_leader 1",
        r#"dynamo_operator_reconciles_total{controller="dgd"} 1"#,
        r#"dynamo_operator_reconcile_errors_total{controller="dgd",error="children"} 1"#,
        r#"dynamo_operator_reconcile_duration_seconds_bucket{le="0.004",controller="dgd"} 1"#,
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
}

/// The TLS trap of DEPENDENCIES.md: with no rustls crypto provider, or two, building an
/// HTTPS client panics.
#[tokio::test]
async fn an_https_client_can_be_built() {
    let config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
    kube::Client::try_from(config).expect("the TLS stack initializes");
}
