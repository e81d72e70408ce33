//! What the planner reads from Prometheus, over its HTTP API: the frontend's traffic and
//! latencies over the last interval (throughput mode) and each engine's load now (load
//! mode), in Dynamo's metric names, which the endpoint picker exports.
//!
//! Queries follow Dynamo's planner (`../shared/research/pillars.md` section 4): a mean is
//! `increase(m_sum[I]) / increase(m_count[I])`, a count `increase(m_total[I])`, summed over
//! the matching series (every picker replica). Unlike Dynamo, an absent series is `None`,
//! never 0: the planner holds rather than reading "no data" as "no traffic".

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use dynamo_names::metrics::frontend::{
    ENGINE_KV_BLOCKS, INPUT_SEQUENCE_TOKENS as ISL, INTER_TOKEN_LATENCY as ITL,
    MODEL_KV_CACHE_BLOCK_SIZE as BLOCK_SIZE, OUTPUT_SEQUENCE_TOKENS as OSL,
    POOL_AVERAGE_QUEUE_SIZE, POOL_READY_PODS, QUEUED_REQUESTS, REQUEST_DURATION as DURATION,
    REQUESTS, TIME_TO_FIRST_TOKEN as TTFT, WORKER_ACTIVE_DECODE_BLOCKS as ACTIVE_DECODE,
    WORKER_ACTIVE_PREFILL_TOKENS as ACTIVE_PREFILL,
};
use dynamo_wiring::planner::PrometheusAccess;
use prometheus_http_query::Client;
use prometheus_http_query::response::Data;
use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, HeaderValue};

use super::cycle::{EngineReading, LoadReading, Traffic, WorkerKind};

#[derive(Debug, thiserror::Error)]
#[error("Prometheus at {url}: {message}")]
pub struct SourceError {
    url: String,
    message: String,
}

pub struct Prometheus {
    client: Client,
    url: String,
    /// `{model="..."}` or empty.
    selector: String,
    credentials: Option<Credentials>,
    /// HTTPS with no client certificate given.
    tls_without_client_cert: bool,
}

/// Where the `Authorization` header comes from. The files are read again for every query,
/// as Prometheus' own client does (`prometheus/common` `config/http_config.go`: the
/// `credentials_file` and `password_file` round trippers read the file per request): a
/// kubelet-rotated projected token or a re-mounted Secret is used at the next query, with
/// no watcher and no restart, for a file read per query (a few per interval).
enum Credentials {
    Bearer(PathBuf),
    Basic {
        user: String,
        password_file: PathBuf,
    },
}

impl Credentials {
    fn of(access: &PrometheusAccess) -> Option<Self> {
        match (&access.bearer_token_file, &access.basic_auth_user) {
            (Some(file), _) => Some(Self::Bearer(file.clone())),
            (None, Some(user)) => Some(Self::Basic {
                user: user.clone(),
                // The parser requires the file with the user.
                password_file: access.basic_auth_password_file.clone()?,
            }),
            (None, None) => None,
        }
    }

    /// The header, from the file as it is now; the error names the flag and the file.
    fn header(&self) -> Result<HeaderValue, String> {
        let mut value = match self {
            Self::Bearer(file) => {
                let token = secret(file, "--prometheus-bearer-token-file")?;
                HeaderValue::try_from(format!("Bearer {token}"))
            }
            Self::Basic {
                user,
                password_file,
            } => {
                use base64::Engine as _;
                let password = secret(password_file, "--prometheus-basic-auth-password-file")?;
                let pair =
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
                HeaderValue::try_from(format!("Basic {pair}"))
            }
        }
        .map_err(|_| "the credentials hold a character an HTTP header cannot".to_string())?;
        // Kept out of any debug output of the request.
        value.set_sensitive(true);
        Ok(value)
    }
}

/// A secret file's content without surrounding whitespace (the newline `echo` and editors
/// leave; Prometheus trims it too); an empty file is refused.
fn secret(file: &Path, flag: &str) -> Result<String, String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("{flag} {}: cannot read it: {e}", file.display()))?;
    let text = text.trim();
    if text.is_empty() {
        return Err(format!("{flag} {}: the file is empty", file.display()));
    }
    Ok(text.to_string())
}

fn read_file(file: &Path, flag: &str) -> Result<Vec<u8>, String> {
    std::fs::read(file).map_err(|e| format!("{flag} {}: cannot read it: {e}", file.display()))
}

/// The HTTP client `access` describes: rustls (on aws-lc-rs, the workspace's one
/// provider). As Prometheus' `tls_config.ca_file`, a CA file replaces the system's roots
/// rather than adding to them. Plain HTTP with no TLS setting trusts no root at all, so a
/// machine or image without a CA bundle still starts it.
fn http_client(url: &str, access: &PrometheusAccess) -> Result<reqwest::Client, String> {
    let mut builder = reqwest::Client::builder().timeout(std::time::Duration::from_secs(10));
    if let Some(file) = &access.ca_file {
        let flag = "--prometheus-ca-file";
        let certs = reqwest::Certificate::from_pem_bundle(&read_file(file, flag)?)
            .map_err(|e| format!("{flag} {}: not PEM certificates: {e}", file.display()))?;
        if certs.is_empty() {
            return Err(format!(
                "{flag} {}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                file.display()
            ));
        }
        builder = builder.tls_certs_only(certs);
    } else if access.insecure_skip_verify {
        builder = builder.tls_danger_accept_invalid_certs(true);
    } else if !is_https(url) {
        builder = builder.tls_certs_only([]);
    }
    if let (Some(cert), Some(key)) = (&access.cert_file, &access.key_file) {
        let mut pem = read_file(cert, "--prometheus-cert-file")?;
        pem.push(b'\n');
        pem.extend(read_file(key, "--prometheus-key-file")?);
        let identity = reqwest::Identity::from_pem(&pem).map_err(|e| {
            format!(
                "--prometheus-cert-file {} / --prometheus-key-file {}: not a PEM certificate \
                 and its private key: {}",
                cert.display(),
                key.display(),
                chain(&e)
            )
        })?;
        builder = builder.identity(identity);
    }
    builder.build().map_err(|e| {
        format!(
            "cannot set up its HTTP client: {} (for https without --prometheus-ca-file, \
             the system's CA certificates)",
            chain(&e)
        )
    })
}

/// Whether `url` is an `https:` one (the scheme in any case).
fn is_https(url: &str) -> bool {
    url.get(..6)
        .is_some_and(|s| s.eq_ignore_ascii_case("https:"))
}

/// An error and its causes, each once.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            out = format!("{out}: {text}");
        }
        source = cause.source();
    }
    out
}

/// What went wrong with a query, named for what to change: a refusal of the credentials,
/// a TLS failure, else the error and its causes. `tls_without_client_cert`: over HTTPS
/// with no client certificate given, a connection closed after it was made may be a
/// server that requires one: in TLS 1.3 the server asks for it after the handshake, so
/// the client sees either the server's alert or only the connection closing.
fn explain(
    e: &prometheus_http_query::Error,
    credentials: Option<&Credentials>,
    tls_without_client_cert: bool,
) -> String {
    let mut closed = false;
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(cause) = source {
        if let Some(http) = cause.downcast_ref::<reqwest::Error>() {
            if let Some(status) = http.status() {
                return refused(status, credentials);
            }
            closed |= http.is_request() && !http.is_connect();
        }
        if let Some(tls) = rustls_cause(cause) {
            let hint = match tls {
                rustls::Error::InvalidCertificate(_) => {
                    "is --prometheus-ca-file the CA that signed Prometheus' certificate?"
                }
                _ => {
                    "does Prometheus want a client certificate it trusts \
                     (--prometheus-cert-file, --prometheus-key-file)?"
                }
            };
            return format!("TLS error: {tls} ({hint})");
        }
        source = cause.source();
    }
    if closed && tls_without_client_cert {
        return format!(
            "{} (does Prometheus want a client certificate it trusts \
             (--prometheus-cert-file, --prometheus-key-file)?)",
            chain(e)
        );
    }
    chain(e)
}

/// rustls' error, which reaches us inside the I/O error(s) of the TLS stream.
fn rustls_cause<'e>(mut e: &'e (dyn std::error::Error + 'static)) -> Option<&'e rustls::Error> {
    loop {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        e = e.downcast_ref::<std::io::Error>()?.get_ref()?;
    }
}

fn refused(status: StatusCode, credentials: Option<&Credentials>) -> String {
    let given = match credentials {
        Some(Credentials::Bearer(file)) => format!(
            "the token of --prometheus-bearer-token-file {}",
            file.display()
        ),
        Some(Credentials::Basic {
            user,
            password_file,
        }) => format!(
            "user {user:?} with the password of --prometheus-basic-auth-password-file {}",
            password_file.display()
        ),
        None => {
            return format!(
                "HTTP {status}: it wants credentials and none were given: \
                 --prometheus-bearer-token-file, or --prometheus-basic-auth-user and \
                 --prometheus-basic-auth-password-file"
            );
        }
    };
    match status {
        StatusCode::UNAUTHORIZED => format!("HTTP {status}: it refused {given}"),
        StatusCode::FORBIDDEN => format!(
            "HTTP {status}: {given} may not query it (OpenShift's Thanos Querier wants the \
             cluster-monitoring-view cluster role)"
        ),
        _ => format!("HTTP {status}"),
    }
}

impl Prometheus {
    /// `url` is Prometheus' base URL; `model`, when given, keeps only that model's series;
    /// `access` says how to reach it. Every file it names is read now, so a bad one stops
    /// the planner at start naming the flag and the file.
    pub fn new(
        url: &str,
        model: Option<&str>,
        access: &PrometheusAccess,
    ) -> Result<Self, SourceError> {
        let error = |message: String| SourceError {
            url: url.into(),
            message,
        };
        let client = http_client(url, access).map_err(error)?;
        let client = Client::from(client, url).map_err(|e| error(e.to_string()))?;
        let credentials = Credentials::of(access);
        if let Some(credentials) = &credentials {
            credentials.header().map_err(error)?;
        }
        let selector = model
            .map(|m| {
                format!(
                    "{{model=\"{}\"}}",
                    m.replace('\\', "\\\\").replace('"', "\\\"")
                )
            })
            .unwrap_or_default();
        Ok(Self {
            client,
            url: url.into(),
            selector,
            credentials,
            tls_without_client_cert: is_https(url) && access.cert_file.is_none(),
        })
    }

    fn error(&self, message: impl ToString) -> SourceError {
        SourceError {
            url: self.url.clone(),
            message: message.to_string(),
        }
    }

    /// Every sample of an instant query, with its labels. An empty answer is `[]`.
    async fn query(
        &self,
        promql: &str,
    ) -> Result<Vec<(BTreeMap<String, String>, f64)>, SourceError> {
        let mut request = self.client.query(promql);
        if let Some(credentials) = &self.credentials {
            request = request.header(
                AUTHORIZATION,
                credentials.header().map_err(|e| self.error(e))?,
            );
        }
        let result = request.get().await.map_err(|e| {
            let hint = self.tls_without_client_cert;
            self.error(explain(&e, self.credentials.as_ref(), hint))
        })?;
        match result.data() {
            Data::Vector(v) => Ok(v
                .iter()
                .map(|s| {
                    let labels = s
                        .metric()
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    (labels, s.sample().value())
                })
                .collect()),
            Data::Scalar(s) => Ok(vec![(BTreeMap::new(), s.value())]),
            other => Err(self.error(format!("{promql}: unexpected result {other:?}"))),
        }
    }

    /// One number, or `None` when the query matched no series.
    async fn scalar(&self, promql: &str) -> Result<Option<f64>, SourceError> {
        Ok(self.query(promql).await?.first().map(|(_, v)| *v))
    }

    /// The mean of histogram `m` over the window: NaN when it had no observations.
    async fn mean(&self, m: &str, window: &str) -> Result<Option<f64>, SourceError> {
        let s = &self.selector;
        self.scalar(&format!(
            "sum(increase({m}_sum{s}[{window}])) / sum(increase({m}_count{s}[{window}]))"
        ))
        .await
    }

    /// The frontend's traffic over the last `interval_s` seconds.
    pub async fn traffic(&self, interval_s: f64) -> Result<Traffic, SourceError> {
        let window = format!("{}s", interval_s.round().max(1.0) as u64);
        let s = &self.selector;
        let ms = |v: Option<f64>| v.map(|x| x * 1000.0);
        Ok(Traffic {
            requests: self
                .scalar(&format!("sum(increase({REQUESTS}_total{s}[{window}]))"))
                .await?,
            isl: self.mean(ISL, &window).await?,
            osl: self.mean(OSL, &window).await?,
            ttft_ms: ms(self.mean(TTFT, &window).await?),
            itl_ms: ms(self.mean(ITL, &window).await?),
            duration_s: self.mean(DURATION, &window).await?,
            backlog: self.backlog().await?,
        })
    }

    /// Requests waiting now: in the picker's queue (summed over its replicas) and in the
    /// engines' (the pool's mean queue times its ready pods, the largest view of the
    /// replicas). Each gauge appears only once there is something to count (a queued
    /// request, a named pool), so an absent one is no backlog.
    async fn backlog(&self) -> Result<f64, SourceError> {
        let picker = self.picker_queued().await?;
        let engines = self
            .scalar(&format!(
                "sum(max by (name) ({POOL_AVERAGE_QUEUE_SIZE}) * max by (name) ({POOL_READY_PODS}))"
            ))
            .await?
            .unwrap_or(0.0);
        Ok(picker + engines)
    }

    /// Requests waiting in the picker's queue, summed over its replicas (absent: none).
    async fn picker_queued(&self) -> Result<f64, SourceError> {
        Ok(self
            .scalar(&format!("sum({QUEUED_REQUESTS}{})", self.selector))
            .await?
            .unwrap_or(0.0))
    }

    /// Each engine's load now, and the prompt tokens waiting in the picker's queue: its
    /// queued requests (summed over its replicas) at the mean ISL of the last
    /// `interval_s` seconds' requests.
    pub async fn load(&self, interval_s: f64) -> Result<LoadReading, SourceError> {
        let window = format!("{}s", interval_s.round().max(1.0) as u64);
        let queued = self.picker_queued().await?;
        let picker_queued_tokens = if queued > 0.0 {
            queued
                * self
                    .mean(ISL, &window)
                    .await?
                    .filter(|m| m.is_finite())
                    .unwrap_or(0.0)
        } else {
            0.0
        };
        Ok(LoadReading {
            engines: self.engines().await?,
            picker_queued_tokens,
        })
    }

    /// Each engine's load now. Active prefill tokens are summed over the picker replicas
    /// (each counts only what it sent); active decode blocks already include what other
    /// replicas sent (the picker corrects its view with the engine's own usage), so the
    /// largest view is taken. KV capacity is the engine's reported block count.
    pub async fn engines(&self) -> Result<Vec<EngineReading>, SourceError> {
        let prefill = self
            .query(&format!(
                "sum by (worker_id, worker_type) ({ACTIVE_PREFILL})"
            ))
            .await?;
        let decode = self
            .query(&format!("max by (worker_id) ({ACTIVE_DECODE})"))
            .await?;
        let capacity = self
            .query(&format!("max by (pod) ({ENGINE_KV_BLOCKS})"))
            .await?;
        let block_size = self
            .scalar(&format!("max({BLOCK_SIZE}{})", self.selector))
            .await?;
        let label = |l: &BTreeMap<String, String>, k: &str| l.get(k).cloned().unwrap_or_default();
        let by = |rows: &[(BTreeMap<String, String>, f64)], key: &str, id: &str| {
            rows.iter()
                .find(|(l, _)| l.get(key).map(String::as_str) == Some(id))
                .map(|(_, v)| *v)
        };
        Ok(prefill
            .iter()
            .map(|(labels, tokens)| {
                let id = label(labels, "worker_id");
                let kind = if label(labels, "worker_type") == "prefill" {
                    WorkerKind::Prefill
                } else {
                    WorkerKind::Decode
                };
                EngineReading {
                    prefill_tokens: *tokens,
                    decode_kv_tokens: by(&decode, "worker_id", &id)
                        .zip(block_size)
                        .map(|(b, s)| b * s),
                    max_kv_tokens: by(&capacity, "pod", &id)
                        .zip(block_size)
                        .map(|(b, s)| b * s),
                    worker_id: id,
                    kind,
                }
            })
            .collect())
    }
}
