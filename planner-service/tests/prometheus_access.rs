//! The planner's Prometheus source against a real Prometheus (Debian's `prometheus`, which
//! must be on PATH) behind TLS, basic authentication and mutual TLS (its
//! `--web.config.file`: https://prometheus.io/docs/prometheus/latest/configuration/https/),
//! and behind a real HTTP server that checks bearer tokens, as kube-rbac-proxy does in
//! front of OpenShift's Thanos Querier (Prometheus itself checks none). Each Prometheus
//! scrapes a target of the test's own every second; the source must read its series.
//! Certificates come from a CA the test makes (rcgen).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use dynamo_planner_service::cycle::{EngineReading, WorkerKind};
use dynamo_planner_service::source::Prometheus;
use dynamo_wiring::planner::PrometheusAccess;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use serde_json::json;
use tempfile::TempDir;

/// Far beyond Prometheus' start and its first scrapes (every second) on a busy machine.
const DEADLINE: Duration = Duration::from_secs(90);

/// What the scrape target serves: one engine's prefill queue, as the picker exports it.
const SERIES: &str = "# TYPE dynamo_frontend_worker_active_prefill_tokens gauge
dynamo_frontend_worker_active_prefill_tokens{worker_id=\"w1\",worker_type=\"prefill\"} 42
# EOF
";

const USER: &str = "planner";
const PASSWORD: &str = "planner-test-password";
/// bcrypt (cost 4) of PASSWORD, as Prometheus' `basic_auth_users` takes it; made with
/// Python's `bcrypt.hashpw(PASSWORD, bcrypt.gensalt(4))`.
const PASSWORD_HASH: &str = "$2b$04$.ex8s5AVJ5iwumLX6ZujxuPmpmw4ubCkByNdJXtA6IfAfGgKaCUKW";

/// The engine Prometheus holds once it scraped [`SERIES`].
fn scraped() -> Vec<EngineReading> {
    vec![EngineReading {
        worker_id: "w1".into(),
        kind: WorkerKind::Prefill,
        prefill_tokens: 42.0,
        decode_kv_tokens: None,
        max_kv_tokens: None,
    }]
}

/// A CA, and files of certificates it signs, in one directory.
struct Pki {
    dir: TempDir,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.distinguished_name.push(DnType::CommonName, name);
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let cert = ca.self_signed(&key).unwrap();
        let pki = Self {
            dir: tempfile::tempdir().unwrap(),
            issuer: Issuer::new(ca, key),
        };
        std::fs::write(pki.path("ca.pem"), cert.pem()).unwrap();
        pki
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    fn ca(&self) -> PathBuf {
        self.path("ca.pem")
    }

    /// `{name}.pem` and `{name}-key.pem`: a certificate for `names` (IP addresses become
    /// IP SANs) for the one `usage`.
    fn issue(&self, name: &str, names: &[&str], usage: ExtendedKeyUsagePurpose) -> [PathBuf; 2] {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let files = [
            self.path(&format!("{name}.pem")),
            self.path(&format!("{name}-key.pem")),
        ];
        std::fs::write(&files[0], cert.pem()).unwrap();
        std::fs::write(&files[1], key.serialize_pem()).unwrap();
        files
    }

    /// The server certificate Prometheus serves on 127.0.0.1.
    fn server(&self) -> [PathBuf; 2] {
        self.issue(
            "prometheus",
            &["127.0.0.1", "localhost"],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }
}

/// A target serving [`SERIES`] on loopback; it serves until the test's runtime ends.
async fn scrape_target() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(dynamo_server::metrics_endpoint::serve(listener, || {
        SERIES.to_string()
    }));
    addr
}

fn free_port() -> u16 {
    dynamo_server::free_port().unwrap()
}

/// A real Prometheus scraping `target` every second, serving its API as `web` (its web
/// config) says; killed when dropped.
struct RunningPrometheus {
    child: Child,
    dir: TempDir,
    port: u16,
}

impl RunningPrometheus {
    fn start(target: SocketAddr, web: Option<serde_json::Value>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = |f: &str| dir.path().join(f);
        // JSON is YAML.
        let config = json!({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [{
                "job_name": "planner-test",
                "static_configs": [{"targets": [target.to_string()]}],
            }],
        });
        std::fs::write(path("prometheus.yml"), config.to_string()).unwrap();
        let port = free_port();
        let mut command = Command::new("prometheus");
        command
            .arg(format!(
                "--config.file={}",
                path("prometheus.yml").display()
            ))
            .arg(format!("--storage.tsdb.path={}", path("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn");
        if let Some(web) = web {
            std::fs::write(path("web.yml"), web.to_string()).unwrap();
            command.arg(format!("--web.config.file={}", path("web.yml").display()));
        }
        let log = std::fs::File::create(path("prometheus.log")).unwrap();
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect(
                "these tests run a real Prometheus: install it \
                 (Debian and Ubuntu: `apt-get install prometheus`)",
            );
        Self { child, dir, port }
    }

    fn url(&self, scheme: &str) -> String {
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// The source's first reading of the scraped series, polled until the deadline.
    async fn first_reading(&self, source: &Prometheus) -> Vec<EngineReading> {
        let start = Instant::now();
        loop {
            let last = match source.engines().await {
                Ok(engines) if !engines.is_empty() => return engines,
                Ok(_) => "no series yet".to_string(),
                Err(e) => e.to_string(),
            };
            assert!(
                start.elapsed() < DEADLINE,
                "no reading within {DEADLINE:?}; last: {last}\nPrometheus' log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for RunningPrometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn source(url: &str, access: &PrometheusAccess) -> Prometheus {
    Prometheus::new(url, None, access).unwrap()
}

/// A query's error, as the planner logs it.
async fn refusal(source: &Prometheus) -> String {
    source.engines().await.unwrap_err().to_string()
}

#[tokio::test]
async fn tls_and_basic_auth_read_and_each_failure_says_what_to_change() {
    let pki = Pki::new("planner test CA");
    let [cert, key] = pki.server();
    let prometheus = RunningPrometheus::start(
        scrape_target().await,
        Some(json!({
            "tls_server_config": {"cert_file": cert, "key_file": key},
            "basic_auth_users": {USER: PASSWORD_HASH},
        })),
    );
    let url = prometheus.url("https");
    let password = pki.path("password");
    std::fs::write(&password, format!("{PASSWORD}\n")).unwrap();
    let access = PrometheusAccess {
        ca_file: Some(pki.ca()),
        basic_auth_user: Some(USER.into()),
        basic_auth_password_file: Some(password.clone()),
        ..PrometheusAccess::default()
    };
    let planner = source(&url, &access);
    assert_eq!(prometheus.first_reading(&planner).await, scraped());

    // A CA that did not sign Prometheus' certificate: a TLS error, named as one.
    let stranger = Pki::new("another CA");
    let wrong_ca = source(
        &url,
        &PrometheusAccess {
            ca_file: Some(stranger.ca()),
            ..access.clone()
        },
    );
    let e = refusal(&wrong_ca).await;
    assert!(
        e.contains("TLS error") && e.contains("UnknownIssuer"),
        "{e}"
    );
    assert!(e.contains("--prometheus-ca-file"), "{e}");

    // No verification at all still reads (encrypted, unauthenticated).
    let skip = source(
        &url,
        &PrometheusAccess {
            ca_file: None,
            insecure_skip_verify: true,
            ..access.clone()
        },
    );
    assert_eq!(skip.engines().await.unwrap(), scraped());

    // No credentials: a 401 that says which flags give them.
    let anonymous = source(
        &url,
        &PrometheusAccess {
            ca_file: Some(pki.ca()),
            ..PrometheusAccess::default()
        },
    );
    let e = refusal(&anonymous).await;
    assert!(
        e.contains("401") && e.contains("--prometheus-bearer-token-file"),
        "{e}"
    );

    // A wrong password, then the file rewritten: the next query reads the new one.
    std::fs::write(&password, "not-the-password").unwrap();
    let e = refusal(&planner).await;
    assert!(e.contains("401 Unauthorized"), "{e}");
    assert!(e.contains("--prometheus-basic-auth-password-file"), "{e}");
    assert!(!e.contains("not-the-password"), "a secret in an error: {e}");
    std::fs::write(&password, PASSWORD).unwrap();
    assert_eq!(planner.engines().await.unwrap(), scraped());
}

#[tokio::test]
async fn mutual_tls_reads_with_the_client_certificate_only() {
    let pki = Pki::new("planner test CA");
    let [cert, key] = pki.server();
    let prometheus = RunningPrometheus::start(
        scrape_target().await,
        Some(json!({"tls_server_config": {
            "cert_file": cert,
            "key_file": key,
            "client_auth_type": "RequireAndVerifyClientCert",
            "client_ca_file": pki.ca(),
        }})),
    );
    let url = prometheus.url("https");
    let [client_cert, client_key] = pki.issue("planner", &[], ExtendedKeyUsagePurpose::ClientAuth);
    let with_cert = PrometheusAccess {
        ca_file: Some(pki.ca()),
        cert_file: Some(client_cert),
        key_file: Some(client_key),
        ..PrometheusAccess::default()
    };
    assert_eq!(
        prometheus.first_reading(&source(&url, &with_cert)).await,
        scraped()
    );
    let without = source(
        &url,
        &PrometheusAccess {
            cert_file: None,
            key_file: None,
            ..with_cert
        },
    );
    // TLS 1.3 asks for the client's certificate after the handshake: the client meets
    // the server's alert (as a TLS error, or inside the connection's error) or only the
    // connection closing, as the timing falls; each names the flag to give.
    let e = refusal(&without).await;
    assert!(e.contains("--prometheus-cert-file"), "{e}");
}

/// An HTTP server in front of Prometheus that forwards a query only with
/// `Authorization: Bearer {token}`, and answers 401 otherwise.
#[derive(Clone)]
struct BearerCheck {
    token: Arc<Mutex<String>>,
    upstream: String,
    client: reqwest::Client,
}

async fn check_bearer(State(check): State<BearerCheck>, request: Request) -> Response {
    let expected = format!("Bearer {}", check.token.lock().unwrap());
    let given = request.headers().get(header::AUTHORIZATION);
    if given.and_then(|v| v.to_str().ok()) != Some(expected.as_str()) {
        return (StatusCode::UNAUTHORIZED, "Unauthorized\n").into_response();
    }
    let path = request.uri().path_and_query().map_or("/", |p| p.as_str());
    let answer = check
        .client
        .get(format!("{}{path}", check.upstream))
        .send()
        .await
        .unwrap();
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap();
    let content_type = answer.headers()[header::CONTENT_TYPE.as_str()]
        .to_str()
        .unwrap()
        .to_string();
    let body = answer.bytes().await.unwrap();
    (status, [(header::CONTENT_TYPE, content_type)], body).into_response()
}

#[tokio::test]
async fn a_bearer_token_is_sent_and_a_rotated_token_file_is_read_again() {
    let prometheus = RunningPrometheus::start(scrape_target().await, None);
    let token = Arc::new(Mutex::new("first-token".to_string()));
    let app = axum::Router::new()
        .fallback(check_bearer)
        .with_state(BearerCheck {
            token: token.clone(),
            upstream: prometheus.url("http"),
            client: reqwest::Client::new(),
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    // As a projected ServiceAccount token: no trailing newline; one is trimmed anyway.
    std::fs::write(&file, "first-token\n").unwrap();
    let planner = source(
        &url,
        &PrometheusAccess {
            bearer_token_file: Some(file.clone()),
            ..PrometheusAccess::default()
        },
    );
    assert_eq!(prometheus.first_reading(&planner).await, scraped());

    // The token rotates: the server wants the new one before the file has it...
    *token.lock().unwrap() = "second-token".into();
    let e = refusal(&planner).await;
    assert!(
        e.contains("401") && e.contains("--prometheus-bearer-token-file"),
        "{e}"
    );
    assert!(!e.contains("first-token"), "a secret in an error: {e}");
    // ...and the next query after the file changes sends it, on the same client.
    std::fs::write(&file, "second-token").unwrap();
    assert_eq!(planner.engines().await.unwrap(), scraped());
}

/// Builds the source and returns its error: every file is read at start.
fn refused_at_start(access: PrometheusAccess) -> String {
    match Prometheus::new("https://127.0.0.1:1", None, &access) {
        Ok(_) => panic!("{access:?} was accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_files_stop_it_at_start_naming_the_flag_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = |f: &str| dir.path().join(f);
    let missing = path("missing.pem");
    let e = refused_at_start(PrometheusAccess {
        ca_file: Some(missing.clone()),
        ..PrometheusAccess::default()
    });
    assert!(
        e.contains("--prometheus-ca-file") && e.contains(&missing.display().to_string()),
        "{e}"
    );

    std::fs::write(path("not-pem"), "hello").unwrap();
    let e = refused_at_start(PrometheusAccess {
        ca_file: Some(path("not-pem")),
        ..PrometheusAccess::default()
    });
    assert!(
        e.contains("--prometheus-ca-file") && e.contains("no PEM certificate"),
        "{e}"
    );

    std::fs::write(path("empty"), "\n").unwrap();
    let e = refused_at_start(PrometheusAccess {
        bearer_token_file: Some(path("empty")),
        ..PrometheusAccess::default()
    });
    assert!(
        e.contains("--prometheus-bearer-token-file") && e.contains("empty"),
        "{e}"
    );

    let e = refused_at_start(PrometheusAccess {
        basic_auth_user: Some(USER.into()),
        basic_auth_password_file: Some(path("no-password")),
        ..PrometheusAccess::default()
    });
    assert!(
        e.contains("--prometheus-basic-auth-password-file") && e.contains("no-password"),
        "{e}"
    );

    // A certificate with a key that is not one.
    let pki = Pki::new("planner test CA");
    let [cert, _] = pki.issue("planner", &[], ExtendedKeyUsagePurpose::ClientAuth);
    let e = refused_at_start(PrometheusAccess {
        cert_file: Some(cert),
        key_file: Some(path("not-pem")),
        ..PrometheusAccess::default()
    });
    assert!(
        e.contains("--prometheus-cert-file") && e.contains("--prometheus-key-file"),
        "{e}"
    );
}
