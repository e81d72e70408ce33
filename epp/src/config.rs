//! Command-line flags (each with an environment twin) and the checked configuration the
//! rest of the crate runs on.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use dynamo_kvblocks::Credential;
use dynamo_kvcache::{QueuePolicy, RouterKnobs, RouterMode, SaturationThreshold};
use dynamo_server::{LogArgs, ServerLimits, parse_duration};

use crate::answer_parsing::AnswerParsers;
use crate::frontend::FrontendOptions;

/// Endpoint picker: Gateway API Inference Extension ext_proc server and OpenAI HTTP
/// frontend, routing on KV cache overlap and load.
#[derive(Parser, Debug, Clone)]
#[command(name = "dynamo-epp", version, about)]
pub struct Args {
    /// Hugging Face-style model directory (tokenizer.json, tokenizer_config.json,
    /// config.json). Without one the picker loads the model from its pods' model cards
    /// (what the operator's picker does) and `--model-name` is required.
    #[arg(long, env = "DYNAMO_MODEL_PATH")]
    pub model_path: Option<PathBuf>,
    /// Served model name [default: the directory's name].
    #[arg(long, env = "DYNAMO_MODEL_NAME")]
    pub model_name: Option<String>,
    /// Port of each pod's model card (its sidecar's metrics port), read to check that the
    /// pod serves the picker's model and, without `--model-path`, to load it; 0: no
    /// cards (an endpoints file may name each pod's own).
    #[arg(long, env = "DYNAMO_EPP_MODEL_CARD_PORT", default_value_t = 9090)]
    pub model_card_port: u16,

    /// Address the HTTP frontend, ext_proc and metrics listeners bind.
    #[arg(
        long,
        alias = "http-host",
        env = "DYNAMO_EPP_HOST",
        default_value = "0.0.0.0"
    )]
    pub host: String,
    /// OpenAI HTTP frontend (also `/health`, `/live`, `/metrics`); 0 picks a free port.
    #[arg(long, env = "DYNAMO_EPP_HTTP_PORT", default_value_t = 8000)]
    pub http_port: u16,
    /// Envoy ext_proc gRPC server with the gRPC health services; 0 picks a free port.
    #[arg(
        long,
        alias = "grpc-port",
        env = "DYNAMO_EPP_EXT_PROC_PORT",
        default_value_t = 9002
    )]
    pub ext_proc_port: u16,
    /// Extra listener serving only `/metrics`, `/health` and `/live` (e.g. 9090 in a pod).
    #[arg(long, env = "DYNAMO_EPP_METRICS_PORT")]
    pub metrics_port: Option<u16>,

    /// Static endpoints `ip:port,...` (the pods' inference port, 8000 for a sidecar).
    #[arg(long, env = "DYNAMO_EPP_ENDPOINTS", value_delimiter = ',')]
    pub endpoints: Vec<SocketAddr>,
    /// JSON file `{"endpoints": [{"address", "kv_events"?, "role"?}]}`, re-read on change.
    #[arg(long, env = "DYNAMO_EPP_ENDPOINTS_FILE")]
    pub endpoints_file: Option<PathBuf>,
    /// How often the endpoints file is checked for changes.
    #[arg(long, env = "DYNAMO_EPP_ENDPOINTS_FILE_POLL", default_value = "500ms", value_parser = parse_duration)]
    pub endpoints_file_poll: Duration,

    /// Kubernetes: the InferencePool whose pods to route to (selector and target port).
    #[arg(long, env = "DYNAMO_EPP_POOL_NAME")]
    pub pool_name: Option<String>,
    /// Kubernetes namespace of the pool and its pods [default: the client's namespace].
    #[arg(long, env = "DYNAMO_EPP_POOL_NAMESPACE")]
    pub pool_namespace: Option<String>,
    /// Kubernetes label selector `k=v,...` of the pods (ANDed with the pool's when both are given).
    #[arg(long, env = "DYNAMO_EPP_SELECTOR")]
    pub selector: Option<String>,
    /// Pods' inference port when no InferencePool names one.
    #[arg(long, env = "DYNAMO_EPP_TARGET_PORT", default_value_t = 8000)]
    pub target_port: u16,
    /// Pods matching this selector are prefill workers.
    #[arg(long, env = "DYNAMO_EPP_PREFILL_SELECTOR")]
    pub prefill_selector: Option<String>,
    /// Pods matching this selector are decode workers.
    #[arg(long, env = "DYNAMO_EPP_DECODE_SELECTOR")]
    pub decode_selector: Option<String>,

    /// Port of each pod's KV event stream (the sidecar's gRPC port).
    #[arg(long, env = "DYNAMO_EPP_KV_EVENTS_PORT", default_value_t = 9100)]
    pub kv_events_port: u16,
    /// File of the graph's credential, sent when subscribing to a pod's KV event stream
    /// (a sidecar given one serves its stream to holders only; as the sidecar's flag).
    // `dynamo_kvblocks::CREDENTIAL_FILE_ENV`.
    #[arg(long, env = "DYNAMO_BLOCK_API_TOKEN_FILE")]
    pub block_api_token_file: Option<PathBuf>,
    /// Tokens per KV block; must match the engines'.
    #[arg(
        long,
        alias = "kv-cache-block-size",
        env = "DYNAMO_EPP_BLOCK_SIZE",
        default_value_t = 16
    )]
    pub block_size: usize,
    /// kv (overlap from KV events), approx (from past picks), round-robin or random.
    #[arg(long, env = "DYN_ROUTER_MODE", default_value = "kv")]
    pub router_mode: RouterMode,
    #[command(flatten)]
    pub knobs: RouterKnobs,
    /// Most blocks the exact index holds, over all pods.
    #[arg(
        long,
        env = "DYNAMO_EPP_MAX_INDEX_BLOCKS",
        default_value_t = 10_000_000
    )]
    pub max_index_blocks: usize,

    /// How often each pod's `/metrics` is read for load correction; 0 turns it off.
    #[arg(long, env = "DYNAMO_EPP_METRICS_POLL_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub metrics_poll_interval: Duration,
    /// /health waits at most this long for a new pod's first KV snapshot.
    #[arg(long, env = "DYNAMO_EPP_WARMUP", default_value = "5s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// A pod that failed a request before answering is avoided for this long.
    #[arg(long, env = "DYNAMO_EPP_UNHEALTHY_FOR", default_value = "5s", value_parser = parse_duration)]
    pub unhealthy_for: Duration,
    /// Pods an HTTP frontend request is sent to at most, one after another, while each
    /// fails before answering (engine unreachable, connection refused or reset).
    #[arg(long, env = "DYNAMO_EPP_MAX_ATTEMPTS", default_value_t = DEFAULT_MAX_ATTEMPTS)]
    pub max_attempts: usize,
    /// Times one HTTP frontend request whose answer breaks off (its pod died, its stream
    /// was cut) is sent to another pod to continue where it stopped, as Dynamo's frontend
    /// `--migration-limit` (same variable, and off by default as there); when off or
    /// used up, a stream ends with an error event and a whole answer is a 502.
    #[arg(long, env = "DYN_MIGRATION_LIMIT", default_value_t = 0)]
    pub migration_limit: u32,
    /// How long a request leaving a pod that failed it (a migration, or a retry before
    /// any answer) waits for another pod to be listed when none is left, before it fails:
    /// replicas being started or replaced are often seconds from ready.
    #[arg(long, env = "DYNAMO_EPP_MIGRATION_WAIT", default_value = DEFAULT_MIGRATION_WAIT, value_parser = parse_duration)]
    pub migration_wait: Duration,
    /// Splits tool calls out of chat answers' text, in this model family's format (vLLM's
    /// `--tool-call-parser` names: hermes, mistral, llama3_json, deepseek_v3, pythonic,
    /// phi4_mini_json), for engines that send calls as text (the mock engine; vLLM without
    /// `--enable-auto-tool-choice`).
    #[arg(long, alias = "dyn-tool-call-parser", env = "DYN_TOOL_CALL_PARSER")]
    pub tool_call_parser: Option<String>,
    /// Splits `<think>` reasoning out of chat answers' text into `reasoning_content`
    /// (vLLM's `--reasoning-parser` names: deepseek_r1, qwen3).
    #[arg(long, alias = "dyn-reasoning-parser", env = "DYN_REASONING_PARSER")]
    pub reasoning_parser: Option<String>,
    /// Send each chat prompt's token ids to the engine in `nvext.token_data` (Dynamo's
    /// field), so that an engine reading it (the mock engine) does not render and
    /// tokenize the messages again; vLLM ignores the field and tokenizes as usual.
    #[arg(long, env = "DYNAMO_EPP_FORWARD_TOKEN_IDS")]
    pub forward_token_ids: bool,
    /// Largest request body accepted, in bytes [default: the longest prompt text the
    /// model's context could hold, plus 1 MiB].
    #[arg(long, env = "DYNAMO_EPP_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,

    /// Order of requests waiting while every pod is saturated: fcfs, lcfs or wspt.
    #[arg(
        long,
        alias = "router-queue-policy",
        env = "DYNAMO_EPP_QUEUE_POLICY",
        default_value = "fcfs"
    )]
    pub queue_policy: QueuePolicy,
    /// Requests that may wait; one more is refused with 429. 0 sheds at once.
    #[arg(long, env = "DYNAMO_EPP_QUEUE_CAPACITY", default_value_t = 1024)]
    pub queue_capacity: usize,
    /// A pod is saturated with more requests than this waiting in its engine.
    #[arg(long, env = "DYNAMO_EPP_MAX_WAITING_REQUESTS")]
    pub max_waiting_requests: Option<u64>,
    /// A pod is saturated above this KV cache usage (0 to 1).
    #[arg(
        long,
        alias = "active-decode-blocks-threshold",
        env = "DYNAMO_EPP_MAX_KV_USAGE"
    )]
    pub max_kv_usage: Option<f64>,
    /// A pod is saturated with more prefill plus decode blocks in flight than this.
    #[arg(long, env = "DYNAMO_EPP_MAX_BLOCKS_IN_FLIGHT")]
    pub max_blocks_in_flight: Option<u64>,

    #[command(flatten)]
    pub server: ServerLimits,
    #[command(flatten)]
    pub log: LogArgs,
}

/// Dynamo's variables for our knobs, `(ours, Dynamo's)`, read by [`dynamo_server::parse_args`]
/// when ours is unset (the frontend's, in Dynamo's `components/src/dynamo/frontend/frontend_args.py`
/// and `common/configuration/groups/{router,kv_router}_args.py`; docs/dynamo-compatibility.md).
/// `DYN_ROUTER_MODE`, `DYN_MIGRATION_LIMIT` and the parsers' are Dynamo's and read directly.
pub const DYNAMO_ENV_ALIASES: &[(&str, &str)] = &[
    ("DYNAMO_MODEL_PATH", "DYN_MODEL_PATH"),
    ("DYNAMO_MODEL_NAME", "DYN_MODEL_NAME"),
    ("DYNAMO_EPP_HOST", "DYN_HTTP_HOST"),
    ("DYNAMO_EPP_HTTP_PORT", "DYN_HTTP_PORT"),
    ("DYNAMO_EPP_BLOCK_SIZE", "DYN_KV_CACHE_BLOCK_SIZE"),
    ("DYNAMO_EPP_ROUTER_TEMPERATURE", "DYN_ROUTER_TEMPERATURE"),
    (
        "DYNAMO_EPP_OVERLAP_SCORE_WEIGHT",
        "DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT",
    ),
    (
        "DYNAMO_EPP_OVERLAP_SCORE_WEIGHT",
        "DYN_OVERLAP_SCORE_WEIGHT",
    ),
    (
        "DYNAMO_EPP_OVERLAP_SCORE_WEIGHT",
        "DYN_ROUTER_PREFILL_LOAD_SCALE",
    ),
    ("DYNAMO_EPP_APPROX_TTL", "DYN_ROUTER_TTL_SECS"),
    ("DYNAMO_EPP_QUEUE_POLICY", "DYN_ROUTER_QUEUE_POLICY"),
    (
        "DYNAMO_EPP_MAX_KV_USAGE",
        "DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD",
    ),
];

/// Pods an HTTP frontend request is tried on unless `--max-attempts` says otherwise.
pub const DEFAULT_MAX_ATTEMPTS: usize = 3;
/// `--migration-wait` unless given.
pub const DEFAULT_MIGRATION_WAIT: &str = "10s";

/// Where the pods come from.
#[derive(Debug, Clone, PartialEq)]
pub enum DiscoveryConfig {
    Static(Vec<SocketAddr>),
    File { path: PathBuf, poll: Duration },
    Kubernetes(KubernetesConfig),
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct KubernetesConfig {
    pub pool_name: Option<String>,
    pub namespace: Option<String>,
    pub selector: Option<String>,
    pub target_port: u16,
    pub prefill_selector: Option<String>,
    pub decode_selector: Option<String>,
}

/// Routing settings the router runs on.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterConfig {
    pub mode: RouterMode,
    /// Temperature, prefill weight and the approx index's TTL.
    pub knobs: RouterKnobs,
    pub block_size: usize,
    pub max_index_blocks: usize,
    pub warmup: Duration,
    pub unhealthy_for: Duration,
    pub queue_policy: QueuePolicy,
    pub queue_capacity: usize,
    pub saturation: SaturationThreshold,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            mode: RouterMode::Kv,
            knobs: RouterKnobs::default(),
            block_size: 16,
            max_index_blocks: 10_000_000,
            warmup: Duration::from_secs(5),
            unhealthy_for: Duration::from_secs(5),
            queue_policy: QueuePolicy::Fcfs,
            queue_capacity: 1024,
            saturation: SaturationThreshold::default(),
        }
    }
}

/// Everything [`crate::start`] needs.
#[derive(Debug, Clone)]
pub struct Config {
    pub model_path: Option<PathBuf>,
    pub model_name: Option<String>,
    pub model_card_port: Option<u16>,
    pub http_addr: SocketAddr,
    pub ext_proc_addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    pub discovery: DiscoveryConfig,
    pub kv_events_port: u16,
    pub credential: Option<Credential>,
    pub metrics_poll_interval: Option<Duration>,
    pub router: RouterConfig,
    /// Retries, migration and answer parsing of the HTTP frontend.
    pub frontend: FrontendOptions,
    /// `None`: derived from the model ([`crate::request::default_body_limit`]).
    pub max_body_bytes: Option<usize>,
    pub server: ServerLimits,
}

impl Args {
    /// Checks the flags together and resolves the listen addresses.
    pub fn into_config(self) -> anyhow::Result<Config> {
        let sources = [
            !self.endpoints.is_empty(),
            self.endpoints_file.is_some(),
            self.pool_name.is_some() || self.selector.is_some(),
        ];
        let discovery = match sources {
            [true, false, false] => DiscoveryConfig::Static(self.endpoints),
            [false, true, false] => DiscoveryConfig::File {
                path: self.endpoints_file.expect("checked"),
                poll: self.endpoints_file_poll.max(Duration::from_millis(10)),
            },
            [false, false, true] => DiscoveryConfig::Kubernetes(KubernetesConfig {
                pool_name: self.pool_name,
                namespace: self.pool_namespace,
                selector: self.selector,
                target_port: self.target_port,
                prefill_selector: self.prefill_selector,
                decode_selector: self.decode_selector,
            }),
            _ => anyhow::bail!(
                "give exactly one endpoint source: --endpoints, --endpoints-file, or \
                 --pool-name/--selector (Kubernetes)"
            ),
        };
        if let DiscoveryConfig::Kubernetes(k8s) = &discovery {
            crate::discovery::kubernetes::check(k8s).map_err(anyhow::Error::msg)?;
        }
        anyhow::ensure!(self.block_size > 0, "--block-size must be positive");
        anyhow::ensure!(
            self.model_path.is_some() || self.model_name.is_some(),
            "give --model-path, or --model-name to load the model from the pods' model cards"
        );
        anyhow::ensure!(self.max_attempts > 0, "--max-attempts must be at least 1");
        self.knobs.check().map_err(anyhow::Error::msg)?;
        if let Some(usage) = self.max_kv_usage {
            anyhow::ensure!(
                (0.0..=1.0).contains(&usage),
                "--max-kv-usage must be between 0 and 1, got {usage}"
            );
        }
        let parsers = AnswerParsers::from_names(
            self.tool_call_parser.as_deref(),
            self.reasoning_parser.as_deref(),
        )
        .map_err(|e| anyhow::anyhow!("--tool-call-parser / --reasoning-parser: {e}"))?;
        let ip: std::net::IpAddr = self
            .host
            .parse()
            .map_err(|e| anyhow::anyhow!("--host {:?}: {e}", self.host))?;
        Ok(Config {
            model_path: self.model_path,
            model_name: self.model_name,
            model_card_port: (self.model_card_port != 0).then_some(self.model_card_port),
            http_addr: SocketAddr::new(ip, self.http_port),
            ext_proc_addr: SocketAddr::new(ip, self.ext_proc_port),
            metrics_addr: self.metrics_port.map(|p| SocketAddr::new(ip, p)),
            discovery,
            kv_events_port: self.kv_events_port,
            credential: self
                .block_api_token_file
                .as_deref()
                .map(Credential::read)
                .transpose()?,
            metrics_poll_interval: (!self.metrics_poll_interval.is_zero())
                .then_some(self.metrics_poll_interval),
            router: RouterConfig {
                mode: self.router_mode,
                knobs: self.knobs,
                block_size: self.block_size,
                max_index_blocks: self.max_index_blocks,
                warmup: self.warmup,
                unhealthy_for: self.unhealthy_for,
                queue_policy: self.queue_policy,
                queue_capacity: self.queue_capacity,
                saturation: SaturationThreshold {
                    max_waiting_requests: self.max_waiting_requests,
                    max_kv_usage: self.max_kv_usage,
                    max_blocks_in_flight: self.max_blocks_in_flight,
                },
            },
            frontend: FrontendOptions {
                max_attempts: self.max_attempts,
                migration_limit: self.migration_limit,
                migration_wait: self.migration_wait,
                parsers,
                forward_token_ids: self.forward_token_ids,
            },
            max_body_bytes: self.max_body_bytes,
            server: self.server,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches};

    fn args(extra: &[&str]) -> Result<Config, String> {
        let mut argv = vec!["dynamo-epp", "--model-path", "/m"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .into_config()
            .map_err(|e| e.to_string())
    }

    #[test]
    fn without_a_model_directory_the_model_is_named_and_learned_from_the_pods() {
        let pods = |extra: &[&str]| {
            let mut argv = vec!["dynamo-epp", "--endpoints", "10.0.0.1:8000"];
            argv.extend_from_slice(extra);
            Args::try_parse_from(argv).unwrap().into_config()
        };
        let err = pods(&[]).unwrap_err().to_string();
        assert!(err.contains("--model-name"), "{err}");
        let c = pods(&["--model-name", "Qwen/Qwen3-0.6B"]).unwrap();
        assert_eq!((c.model_path, c.model_card_port), (None, Some(9090)));
        assert_eq!(
            pods(&["--model-name", "m", "--model-card-port", "0"])
                .unwrap()
                .model_card_port,
            None
        );
    }

    #[test]
    fn exactly_one_endpoint_source() {
        let c = args(&["--endpoints", "10.0.0.1:8000,10.0.0.2:8000"]).unwrap();
        assert_eq!(
            c.discovery,
            DiscoveryConfig::Static(vec![
                "10.0.0.1:8000".parse().unwrap(),
                "10.0.0.2:8000".parse().unwrap()
            ])
        );
        let err = args(&[]).unwrap_err();
        assert!(err.contains("exactly one endpoint source"), "{err}");
        let err = args(&["--endpoints", "10.0.0.1:8000", "--endpoints-file", "/f"]).unwrap_err();
        assert!(err.contains("exactly one endpoint source"), "{err}");
        // The operator's spelling of the flags.
        let c = args(&[
            "--pool-name",
            "g-pool",
            "--pool-namespace",
            "ns",
            "--selector",
            "a=b",
            "--grpc-port",
            "9002",
            "--metrics-port",
            "9090",
        ])
        .unwrap();
        assert!(
            matches!(c.discovery, DiscoveryConfig::Kubernetes(ref k) if k.pool_name.as_deref() == Some("g-pool"))
        );
        assert_eq!(c.metrics_addr.unwrap().port(), 9090);
    }

    #[test]
    fn bad_values_are_refused_with_the_flag_name() {
        let e = args(&["--endpoints", "10.0.0.1:8000", "--router-mode", "best"]).unwrap_err();
        assert!(e.contains("unknown router mode"), "{e}");
        let e = args(&["--endpoints", "10.0.0.1:8000", "--max-kv-usage", "3"]).unwrap_err();
        assert!(e.contains("--max-kv-usage"), "{e}");
        let e = args(&["--endpoints", "nowhere"]).unwrap_err();
        assert!(e.contains("nowhere"), "{e}");
        let e = args(&["--endpoints", "10.0.0.1:8000", "--max-attempts", "0"]).unwrap_err();
        assert!(e.contains("--max-attempts"), "{e}");
        let c = args(&["--endpoints", "10.0.0.1:8000"]).unwrap();
        assert_eq!((c.frontend.max_attempts, c.max_body_bytes), (3, None));
        assert_eq!(c.frontend.migration_limit, 0, "off, as Dynamo's default");
        assert_eq!(c.frontend.migration_wait, Duration::from_secs(10));
        assert_eq!(c.frontend.parsers, AnswerParsers::default());
        let c = args(&["--endpoints", "10.0.0.1:8000", "--migration-limit", "3"]).unwrap();
        assert_eq!(c.frontend.migration_limit, 3);
        let e = args(&["--endpoints", "10.0.0.1:8000", "--tool-call-parser", "xml"]).unwrap_err();
        assert!(
            e.contains("--tool-call-parser") && e.contains("hermes"),
            "{e}"
        );
        let c = args(&[
            "--endpoints",
            "10.0.0.1:8000",
            "--tool-call-parser",
            "hermes",
            "--reasoning-parser",
            "qwen3",
        ])
        .unwrap();
        assert!(c.frontend.parsers.tool_calls.is_some() && c.frontend.parsers.reasoning.is_some());
        let c = args(&[
            "--endpoints",
            "10.0.0.1:8000",
            "--max-body-bytes",
            "1000000",
        ])
        .unwrap();
        assert_eq!(c.max_body_bytes, Some(1_000_000));
        let c = args(&[
            "--endpoints",
            "10.0.0.1:8000",
            "--metrics-poll-interval",
            "0",
        ])
        .unwrap();
        assert_eq!(c.metrics_poll_interval, None);
    }

    /// Ours and Dynamo's spelling of each knob parse to the same configuration.
    #[test]
    fn dynamos_flag_names_are_aliases() {
        let base = ["--endpoints", "10.0.0.1:8000"];
        let pairs: &[(&[&str], &[&str])] = &[
            (&["--block-size", "32"], &["--kv-cache-block-size", "32"]),
            (&["--host", "127.0.0.1"], &["--http-host", "127.0.0.1"]),
            (
                &["--overlap-score-weight", "2.5"],
                &["--kv-overlap-score-weight", "2.5"],
            ),
            (
                &["--overlap-score-weight", "2.5"],
                &["--router-kv-overlap-score-weight", "2.5"],
            ),
            (
                &["--overlap-score-weight", "2.5"],
                &["--router-prefill-load-scale", "2.5"],
            ),
            (&["--approx-ttl", "30s"], &["--router-ttl-secs", "30"]),
            (
                &["--queue-policy", "wspt"],
                &["--router-queue-policy", "wspt"],
            ),
            (
                &["--max-kv-usage", "0.8"],
                &["--active-decode-blocks-threshold", "0.8"],
            ),
            (
                &["--tool-call-parser", "hermes"],
                &["--dyn-tool-call-parser", "hermes"],
            ),
            (
                &["--reasoning-parser", "qwen3"],
                &["--dyn-reasoning-parser", "qwen3"],
            ),
        ];
        let default = format!("{:?}", args(&base).unwrap());
        for (ours, dynamo) in pairs {
            let parse = |flags: &[&str]| {
                let argv: Vec<&str> = base.iter().chain(flags).copied().collect();
                format!("{:?}", args(&argv).unwrap())
            };
            assert_eq!(parse(ours), parse(dynamo), "{ours:?} vs {dynamo:?}");
            assert_ne!(parse(ours), default, "{ours:?} changes nothing");
        }
    }

    /// Each of Dynamo's variables sets the same field as the flag it stands for.
    #[test]
    fn dynamos_variables_stand_in_for_ours() {
        let parse = |argv: &[&str], env: &[(&str, &str)]| {
            let var = |name: &str| {
                env.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            };
            let command = dynamo_server::with_env_aliases(Args::command(), DYNAMO_ENV_ALIASES, var);
            let argv = ["dynamo-epp", "--endpoints", "10.0.0.1:8000"]
                .iter()
                .chain(argv);
            let matches = command.try_get_matches_from(argv).unwrap();
            let args = Args::from_arg_matches(&matches).unwrap();
            format!("{:?}", args.into_config().unwrap())
        };
        let cases: &[(&str, &str, &[&str])] = &[
            ("DYN_MODEL_PATH", "/m2", &["--model-path", "/m2"]),
            ("DYN_MODEL_NAME", "served", &["--model-name", "served"]),
            ("DYN_HTTP_HOST", "127.0.0.1", &["--host", "127.0.0.1"]),
            ("DYN_HTTP_PORT", "8123", &["--http-port", "8123"]),
            ("DYN_KV_CACHE_BLOCK_SIZE", "64", &["--block-size", "64"]),
            (
                "DYN_ROUTER_TEMPERATURE",
                "0.7",
                &["--router-temperature", "0.7"],
            ),
            (
                "DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT",
                "3",
                &["--overlap-score-weight", "3"],
            ),
            (
                "DYN_OVERLAP_SCORE_WEIGHT",
                "3",
                &["--overlap-score-weight", "3"],
            ),
            (
                "DYN_ROUTER_PREFILL_LOAD_SCALE",
                "3",
                &["--overlap-score-weight", "3"],
            ),
            ("DYN_ROUTER_TTL_SECS", "45", &["--approx-ttl", "45s"]),
            (
                "DYN_ROUTER_QUEUE_POLICY",
                "wspt",
                &["--queue-policy", "wspt"],
            ),
            (
                "DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD",
                "0.9",
                &["--max-kv-usage", "0.9"],
            ),
        ];
        for (var, value, flags) in cases {
            // Every case but the model path's own names the model directory.
            let base: &[&str] = if *var == "DYN_MODEL_PATH" {
                &[]
            } else {
                &["--model-path", "/m"]
            };
            let with_flags: Vec<&str> = base.iter().chain(flags.iter()).copied().collect();
            assert_eq!(
                parse(base, &[(var, value)]),
                parse(&with_flags, &[]),
                "{var}"
            );
        }
        // A flag wins over Dynamo's variable.
        assert_eq!(
            parse(
                &["--model-path", "/m", "--block-size", "8"],
                &[("DYN_KV_CACHE_BLOCK_SIZE", "64")]
            ),
            parse(&["--model-path", "/m", "--block-size", "8"], &[])
        );
    }
}
