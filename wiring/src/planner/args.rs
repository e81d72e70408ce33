//! `dynamo planner`'s flags: the planner service parses them, and the wiring checks every
//! planner command line it writes with this same parser ([`super::parse`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::ValueEnum;
use dynamo_planner::knobs::HeadroomKnobs;
use dynamo_planner::predict::PredictorConfig;
use dynamo_server::parse_duration;

/// Dynamo's planner default (`metric_pulling_prometheus_endpoint`, kube-prometheus-stack's
/// Service in `monitoring`).
const DEFAULT_PROMETHEUS: &str =
    "http://prometheus-kube-prometheus-prometheus.monitoring.svc.cluster.local:9090";

/// Variables the planner's flags fall back to. Dynamo's planner reads the same ones
/// (`PROMETHEUS_ENDPOINT` in `planner_config.py`, `DYN_PARENT_DGD_K8S_NAME` in
/// `kubernetes_api.py`); the operator sets the graph's and the namespace's on planner pods.
pub const PROMETHEUS_ENV: &str = "PROMETHEUS_ENDPOINT";
pub const GRAPH_ENV: &str = "DYN_PARENT_DGD_K8S_NAME";
pub const NAMESPACE_ENV: &str = "POD_NAMESPACE";

/// Dynamo's load-based loop runs every 5 s (`load_adjustment_interval`).
const LOAD_INTERVAL: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    /// Size replicas from predicted traffic and the engines' performance profile.
    Throughput,
    /// Step replicas +1/-1 from each engine's prefill queue and KV usage.
    Load,
    /// Both, as Dynamo runs them together: throughput decisions every --interval, load
    /// decisions every --load-interval in between, never below the last throughput count.
    #[value(name = "throughput+load")]
    ThroughputLoad,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LoadTargetArg {
    Throughput,
    Latency,
}

#[derive(clap::Args, Debug)]
pub struct PlannerArgs {
    /// How replicas are decided.
    #[arg(long, value_enum, default_value = "throughput")]
    pub mode: ModeArg,
    /// Time between decisions [default: 180s in throughput mode, 5s in load mode, as Dynamo];
    /// throughput's in throughput+load.
    #[arg(long, value_parser = parse_duration)]
    pub interval: Option<Duration>,
    /// Time between load decisions in throughput+load [default: 5s, Dynamo's load loop].
    #[arg(long, value_parser = parse_duration)]
    pub load_interval: Option<Duration>,
    /// Wait before the first decision, so the graph and its metrics are up (Dynamo: 30 s).
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub startup_delay: Duration,
    /// Next-interval load predictor: constant, moving-average[:WINDOW], kalman, arima[:WINDOW].
    #[arg(long, default_value = "arima")]
    pub predictor: PredictorConfig,
    /// Time-to-first-token target, ms.
    #[arg(long, default_value_t = 500.0)]
    pub ttft_ms: f64,
    /// Inter-token latency target, ms.
    #[arg(long, default_value_t = 50.0)]
    pub itl_ms: f64,
    /// Most GPUs all engine services together may use.
    #[arg(long, default_value_t = 8)]
    pub max_gpu_budget: u32,
    /// Fewest replicas of each engine service (0 is read as 1: never scale to zero).
    #[arg(long, default_value_t = 1)]
    pub min_endpoint: u32,
    /// Most replicas one decision adds to or removes from a service.
    #[arg(long, default_value_t = 8)]
    pub max_step: u32,
    /// GPUs per prefill engine.
    #[arg(long, default_value_t = 1)]
    pub prefill_gpus: u32,
    /// GPUs per decode engine (and per aggregated worker).
    #[arg(long, default_value_t = 1)]
    pub decode_gpus: u32,
    /// Performance profile (JSON, docs/planner.md) of the engines, for throughput mode.
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Profile of the prefill engines, when it differs from --profile.
    #[arg(long)]
    pub prefill_profile: Option<PathBuf>,
    /// Profile of the decode engines, when it differs from --profile.
    #[arg(long)]
    pub decode_profile: Option<PathBuf>,
    /// Do not correct the profile with observed/expected TTFT and ITL.
    #[arg(long)]
    pub no_correction: bool,
    #[command(flatten)]
    pub headroom: HeadroomKnobs,
    /// Load mode's thresholds: throughput (scale late, pack engines) or latency (scale early).
    #[arg(long, value_enum, default_value = "throughput")]
    pub load_target: LoadTargetArg,
    /// The model's context length, tokens: load mode counts the prefill queue in contexts.
    #[arg(long, default_value_t = 8192.0)]
    pub context_length: f64,
    /// Prometheus' base URL.
    #[arg(long, env = PROMETHEUS_ENV, default_value = DEFAULT_PROMETHEUS)]
    pub prometheus: String,
    #[command(flatten)]
    pub prometheus_access: PrometheusAccess,
    /// Only this model's frontend series (the `model` label); all models when absent.
    #[arg(long)]
    pub model: Option<String>,
    /// Log and export decisions without applying them.
    #[arg(long)]
    pub advisory: bool,
    /// Where `/metrics` and `/healthz` listen.
    #[arg(long, default_value = "0.0.0.0:9090")]
    pub metrics_addr: SocketAddr,
    /// A local graph: the runner's admin API URL (`dynamo run` passes it).
    #[arg(long, conflicts_with = "graph")]
    pub admin_url: Option<String>,
    /// Bearer token of the admin API.
    #[arg(long, env = "DYNAMO_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// A cluster graph: the DynamoGraphDeployment whose scaling adapters it writes.
    #[arg(
        long,
        env = GRAPH_ENV,
        required_unless_present = "admin_url"
    )]
    pub graph: Option<String>,
    /// The graph's namespace [default: the client's, i.e. the pod's].
    #[arg(long, env = NAMESPACE_ENV)]
    pub namespace: Option<String>,
}

/// How the planner reaches a Prometheus behind TLS or authentication (OpenShift's Thanos
/// Querier, a managed Prometheus), named after Prometheus' own client settings
/// (`http_config`: `tls_config`, `authorization`, `basic_auth`;
/// https://prometheus.io/docs/prometheus/latest/configuration/configuration/#http_config).
/// Secrets come from files only, never from a flag's value, so they stay out of the pod
/// spec and the process list.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct PrometheusAccess {
    /// PEM CA certificate(s) that Prometheus' certificate must chain to, instead of the
    /// system's roots (`tls_config.ca_file`).
    #[arg(
        long = "prometheus-ca-file",
        env = "DYNAMO_PROMETHEUS_CA_FILE",
        value_name = "FILE"
    )]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate for mutual TLS, with --prometheus-key-file
    /// (`tls_config.cert_file`).
    #[arg(
        long = "prometheus-cert-file",
        env = "DYNAMO_PROMETHEUS_CERT_FILE",
        value_name = "FILE",
        requires = "key_file"
    )]
    pub cert_file: Option<PathBuf>,
    /// PEM private key of --prometheus-cert-file (`tls_config.key_file`).
    #[arg(
        long = "prometheus-key-file",
        env = "DYNAMO_PROMETHEUS_KEY_FILE",
        value_name = "FILE",
        requires = "cert_file"
    )]
    pub key_file: Option<PathBuf>,
    /// Accept any certificate from Prometheus (`tls_config.insecure_skip_verify`): an
    /// encrypted but unauthenticated connection, for trials only.
    #[arg(
        long = "prometheus-insecure-skip-verify",
        env = "DYNAMO_PROMETHEUS_INSECURE_SKIP_VERIFY",
        conflicts_with = "ca_file"
    )]
    pub insecure_skip_verify: bool,
    /// File holding a token sent as `Authorization: Bearer`, read again for every query so
    /// a rotated token (a projected ServiceAccount token) is used at once
    /// (`authorization.credentials_file`).
    #[arg(
        long = "prometheus-bearer-token-file",
        env = "DYNAMO_PROMETHEUS_BEARER_TOKEN_FILE",
        value_name = "FILE",
        conflicts_with = "basic_auth_user"
    )]
    pub bearer_token_file: Option<PathBuf>,
    /// Basic authentication's user name, with --prometheus-basic-auth-password-file
    /// (`basic_auth.username`).
    #[arg(
        long = "prometheus-basic-auth-user",
        env = "DYNAMO_PROMETHEUS_BASIC_AUTH_USER",
        value_name = "USER",
        requires = "basic_auth_password_file"
    )]
    pub basic_auth_user: Option<String>,
    /// File holding basic authentication's password, read again for every query
    /// (`basic_auth.password_file`).
    #[arg(
        long = "prometheus-basic-auth-password-file",
        env = "DYNAMO_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE",
        value_name = "FILE",
        requires = "basic_auth_user"
    )]
    pub basic_auth_password_file: Option<PathBuf>,
}

impl PlannerArgs {
    /// `--interval`, or the mode's default.
    pub fn interval(&self) -> Duration {
        self.interval.unwrap_or(match self.mode {
            ModeArg::Throughput | ModeArg::ThroughputLoad => Duration::from_secs(180),
            ModeArg::Load => LOAD_INTERVAL,
        })
    }

    /// `--load-interval` (throughput+load's), or its default.
    pub fn load_interval(&self) -> Duration {
        self.load_interval.unwrap_or(LOAD_INTERVAL)
    }
}
