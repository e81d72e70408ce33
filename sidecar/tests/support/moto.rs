//! A real S3-compatible server for tests: PyPI `moto[server]` (pinned in
//! `e2e/requirements.txt`, installed into `.cache/venv` by `make pyenv`), run as
//! `moto_server -H 127.0.0.1 -p PORT`, one per test, with one bucket.
#![allow(dead_code)] // each test binary uses its own part of this

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use dynamo_sidecar::blocks::object::ObjectTier;
use object_store::aws::{AmazonS3, AmazonS3Builder};

/// Generous: the machine running the tests may be loaded, and moto imports a lot.
const START_WAIT: Duration = Duration::from_secs(60);

/// moto's server accepts any credentials and region.
const ACCESS_KEY: &str = "testing";
const SECRET_KEY: &str = "testing";
const REGION: &str = "us-east-1";

/// A running `moto_server`, killed on drop. Its state lives in the process: a restart
/// starts empty (the bucket is created again).
pub struct Moto {
    port: u16,
    bucket: String,
    child: Option<Child>,
}

impl Moto {
    /// moto on a free loopback port, answering, with `bucket` created.
    pub async fn start(bucket: &str) -> Self {
        let port = dynamo_server::free_port().expect("a free port");
        let mut moto = Self {
            port,
            bucket: bucket.to_owned(),
            child: None,
        };
        moto.restart().await;
        moto
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// `s3://BUCKET/prefix` (or the bucket's root for an empty prefix).
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{}/{prefix}", self.bucket)
    }

    /// The tier's own client settings, pointed at `endpoint` with moto's credentials
    /// (for a tier through a proxy in front of this server, say).
    pub fn builder_for(endpoint: &str) -> AmazonS3Builder {
        ObjectTier::s3_builder()
            .with_endpoint(endpoint)
            .with_allow_http(true)
            .with_access_key_id(ACCESS_KEY)
            .with_secret_access_key(SECRET_KEY)
            .with_region(REGION)
    }

    /// The tier's client settings pointed at this server.
    pub fn builder(&self) -> AmazonS3Builder {
        Self::builder_for(&self.endpoint())
    }

    /// A plain client of the bucket, to write and read raw objects behind the tier.
    pub fn raw(&self) -> AmazonS3 {
        self.builder()
            .with_bucket_name(&self.bucket)
            .build()
            .expect("an S3 client")
    }

    /// Takes the server down (the port then refuses connections).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// (Re)starts the server on the same port, waits until it answers and creates the
    /// bucket.
    pub async fn restart(&mut self) {
        self.kill();
        let server =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache/venv/bin/moto_server");
        assert!(
            server.exists(),
            "run `make pyenv` first (installs moto[server] into .cache/venv)"
        );
        let child = Command::new(server)
            .args(["-H", "127.0.0.1", "-p", &self.port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto_server starts");
        self.child = Some(child);
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let deadline = tokio::time::Instant::now() + START_WAIT;
        // Path-style bucket creation, as object_store addresses it. moto checks no
        // signature unless told to, so an unsigned PUT is enough.
        let create = format!("{}/{}", self.endpoint(), self.bucket);
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("moto_server exited at start: {status}");
            }
            match http.put(&create).send().await {
                Ok(resp) if resp.status().is_success() => break,
                Ok(resp) => panic!(
                    "creating bucket {}: {} {}",
                    self.bucket,
                    resp.status(),
                    resp.text().await.unwrap_or_default()
                ),
                Err(_) => {}
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "moto_server did not answer within {START_WAIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        self.kill();
    }
}
