//! Launching a graph per router mode: real processes (a small Python HTTP server stands
//! in for `dynamo run`), health polling, SIGTERM to the whole process group.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use dynamo_loadgen::launch::{Launched, Stopped, expand};
use dynamo_server::free_port;

/// Serves `GET /health` (200) and `GET /mode` (the mode it was started with); on
/// SIGTERM writes "term" to the marker file and exits 0.
const STAND_IN: &str = r#"
import http.server, signal, sys
port, mode, marker = int(sys.argv[1]), sys.argv[2], sys.argv[3]
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = mode.encode() if self.path == "/mode" else b"ok"
        self.send_response(200 if self.path in ("/health", "/mode") else 404)
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
def on_term(*args):
    open(marker, "w").write("term")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"#;

fn scratch(name: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    std::env::temp_dir().join(format!(
        "dynamo-loadgen-launch-{}-{}-{name}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

fn http() -> reqwest::Client {
    reqwest::Client::new()
}

#[tokio::test]
async fn a_launched_graph_gets_its_mode_and_port_and_stops_on_sigterm() {
    let script = scratch("stand_in.py");
    let marker = scratch("marker");
    std::fs::write(&script, STAND_IN).unwrap();
    let template = format!(
        "python3 {} {{port}} {{mode}} {}",
        script.display(),
        marker.display()
    );
    let port = free_port().unwrap();
    let command = expand(&template, "round-robin", port);
    assert!(
        command.contains(&format!(" {port} round-robin ")),
        "{command}"
    );

    let mut graph = Launched::start(command).unwrap();
    let url = format!("http://127.0.0.1:{port}");
    graph
        .wait_healthy(&http(), &url, Duration::from_secs(60))
        .await
        .unwrap();
    let mode = http()
        .get(format!("{url}/mode"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(mode, "round-robin");

    assert_eq!(
        graph.stop(Duration::from_secs(30)).await.unwrap(),
        Stopped::Terminated
    );
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "term");
    assert!(
        http().get(format!("{url}/health")).send().await.is_err(),
        "nothing listens after the stop"
    );
    let _ = std::fs::remove_file(script);
    let _ = std::fs::remove_file(marker);
}

#[tokio::test]
async fn a_command_that_exits_early_is_reported_not_waited_for() {
    let mut graph = Launched::start("echo starting >&2; exit 3".into()).unwrap();
    let started = Instant::now();
    let err = graph
        .wait_healthy(&http(), "http://127.0.0.1:1", Duration::from_secs(120))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("exited") && err.contains("exit status: 3"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[tokio::test]
async fn a_group_that_ignores_sigterm_is_killed_after_the_grace_period() {
    // The shell ignores SIGTERM and so does its background child (inherited); it says
    // so by creating the marker, which the test waits for before stopping it.
    let marker = scratch("ignoring");
    let graph = Launched::start(format!(
        "trap '' TERM; touch {}; sleep 300 & wait",
        marker.display()
    ))
    .unwrap();
    let started = Instant::now();
    while !marker.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the shell never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        graph.stop(Duration::from_millis(500)).await.unwrap(),
        Stopped::Killed
    );
    assert!(started.elapsed() < Duration::from_secs(60));
    let _ = std::fs::remove_file(marker);
}

#[tokio::test]
async fn health_waits_time_out() {
    let port = free_port().unwrap();
    let mut graph = Launched::start("sleep 300".into()).unwrap();
    let err = graph
        .wait_healthy(
            &http(),
            &format!("http://127.0.0.1:{port}"),
            Duration::from_millis(300),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("not healthy within"), "{err}");
    assert_eq!(
        graph.stop(Duration::from_secs(30)).await.unwrap(),
        Stopped::Terminated
    );
}
