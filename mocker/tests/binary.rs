//! The `dynamo-mocker` binary as a process: its flags reach the server it runs.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::AsyncReadExt;

/// Generous: the machine running the tests may be loaded.
const WAIT: Duration = Duration::from_secs(30);

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_idle_timeout_flag_closes_silent_connections() {
    let port = dynamo_server::free_port().unwrap();
    let model = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache/models/qwen-mock");
    let _mocker = Killed(
        Command::new(env!("CARGO_BIN_EXE_dynamo-mocker"))
            .args(["--model-path", model.to_str().unwrap()])
            .args(["--port", &port.to_string(), "--kv-events-endpoint", "none"])
            .args(["--idle-timeout", "300ms"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut tcp = loop {
        match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Ok(tcp) => break tcp,
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("the mocker never listened: {e}"),
        }
    };
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(WAIT, tcp.read(&mut buf))
        .await
        .expect("the mocker closes a silent connection");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
}
