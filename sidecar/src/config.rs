//! Flags of the sidecar; each has an environment twin. Defaults are the pod layout of
//! `DESIGN.md` ("Pod anatomy"): proxy on 8000, engine on 8001, engine KV events on 5557,
//! gRPC on 9100, health and metrics on 9090.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use dynamo_kvblocks::MAX_MESSAGE_BYTES;
use dynamo_server::{LogArgs, MessageLimits, ServerLimits, parse_duration};

#[derive(Parser, Clone, Debug)]
#[command(name = "dynamo-sidecar", version, about)]
pub struct Config {
    /// Address of the inference proxy.
    #[arg(long, env = "DYNAMO_SIDECAR_LISTEN", default_value = "0.0.0.0:8000")]
    pub listen: SocketAddr,
    /// The engine's HTTP base URL; every proxied request goes there.
    #[arg(
        long,
        env = "DYNAMO_SIDECAR_ENGINE_URL",
        default_value = "http://127.0.0.1:8001"
    )]
    pub engine_url: reqwest::Url,
    /// The engine's ZMQ PUB endpoint of KV events; `none` disables the relay.
    #[arg(
        long,
        env = "DYNAMO_SIDECAR_ENGINE_KV_EVENTS",
        default_value = "tcp://127.0.0.1:5557"
    )]
    pub engine_kv_events: String,
    /// Listen at `--engine-kv-events` for the engine's publisher to connect, instead of
    /// connecting to it: vLLM 0.33 connects its PUB to every endpoint but `tcp://*:PORT`
    /// (`ZmqEventPublisher._is_bind_endpoint`), and `*` would open the engine's KV events
    /// to the network.
    #[arg(long, env = "DYNAMO_SIDECAR_ENGINE_KV_EVENTS_LISTEN")]
    pub engine_kv_events_listen: bool,
    /// The engine's ZMQ ROUTER endpoint for replaying missed KV events (vLLM's
    /// `--kv-events-config` `replay_endpoint`); `none`: a gap resets the pod's view.
    #[arg(long, env = "DYNAMO_SIDECAR_ENGINE_KV_REPLAY", default_value = "none")]
    pub engine_kv_replay: String,
    /// Largest KV event message, all frames together, taken from the engine's sockets
    /// [default: 32 MiB; one vLLM step's batch, even a million-token prefill, is under
    /// 10 MiB]. A peer that declares more is cut off before it is read, and counted.
    #[arg(
        long,
        env = "DYNAMO_SIDECAR_KV_EVENTS_MAX_MESSAGE_BYTES",
        default_value_t = 32 << 20,
        hide_default_value = true,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub kv_events_max_message_bytes: u64,
    /// Most frames in one KV event message (vLLM sends 3); past it the peer is cut off.
    #[arg(
        long,
        env = "DYNAMO_SIDECAR_KV_EVENTS_MAX_MESSAGE_FRAMES",
        default_value_t = 16,
        value_parser = clap::value_parser!(u64).range(3..)
    )]
    pub kv_events_max_message_frames: u64,
    /// Bind address of the gRPC and metrics listeners.
    #[arg(long, env = "DYNAMO_SIDECAR_HOST", default_value_t = IpAddr::V4(Ipv4Addr::UNSPECIFIED))]
    pub host: IpAddr,
    /// Port of the gRPC server (KV event stream).
    #[arg(long, env = "DYNAMO_SIDECAR_GRPC_PORT", default_value_t = 9100)]
    pub grpc_port: u16,
    /// File holding the graph's block API credential, a token every sidecar and engine
    /// of the graph shares: each block API call must carry it (others are refused,
    /// `UNAUTHENTICATED`), and this sidecar sends it to its peers. Without it the block
    /// API serves callers on this host (loopback) only.
    #[arg(long, env = dynamo_kvblocks::CREDENTIAL_FILE_ENV)]
    pub block_api_token_file: Option<PathBuf>,
    /// Port of `/health`, `/ready` and `/metrics`.
    #[arg(long, env = "DYNAMO_SIDECAR_METRICS_PORT", default_value_t = 9090)]
    pub metrics_port: u16,
    /// Model name that salts block hashes; it must be the name the endpoint picker
    /// hashes prompts with [default, also when empty: the engine's served model, the
    /// first of its `/v1/models`].
    #[arg(long, env = "DYNAMO_SIDECAR_MODEL_NAME")]
    pub model_name: Option<String>,
    /// What the engine loads: its model directory, or a Hugging Face id found in the hub
    /// cache under `--hf-home`. The model card (`/model_card` on the metrics port) serves
    /// its tokenizer and chat template; without it, no card.
    #[arg(long, env = "DYNAMO_SIDECAR_MODEL_SOURCE")]
    pub model_source: Option<String>,
    /// The engine's Hugging Face home (its `HF_HOME`), shared with the sidecar.
    #[arg(long, env = "DYNAMO_SIDECAR_HF_HOME")]
    pub hf_home: Option<PathBuf>,
    /// Tokens per KV block the engine uses, for the model card (the engine's own
    /// metrics win when they say).
    #[arg(long, env = "DYNAMO_SIDECAR_BLOCK_SIZE")]
    pub block_size: Option<u32>,
    /// Time in-flight requests get to finish after SIGTERM or SIGINT (`30`, `30s`, `500ms`).
    #[arg(
        long,
        env = "DYNAMO_SIDECAR_SHUTDOWN_GRACE",
        default_value = "30",
        value_parser = parse_duration
    )]
    pub shutdown_grace: Duration,
    /// Request paths the proxy passes to the engine, comma-separated; an entry ending in
    /// `*` is a prefix, and `*` alone passes everything (engine admin routes such as
    /// vLLM's `/reset_prefix_cache` included). Others get 404.
    #[arg(
        long,
        env = "DYNAMO_SIDECAR_PROXY_PATHS",
        value_delimiter = ',',
        default_value = DEFAULT_PROXY_PATHS
    )]
    pub proxy_paths: Vec<String>,
    #[command(flatten)]
    pub grpc: GrpcFlags,
    #[command(flatten)]
    pub kv_tiers: KvTierFlags,
    #[command(flatten)]
    pub disagg: DisaggFlags,
    #[command(flatten)]
    pub server: ServerLimits,
    #[command(flatten)]
    pub log: LogArgs,
}

/// Bounds on what clients of the gRPC port (the KV block API, the KV event stream) can
/// make the sidecar hold: each call's message in flight, each connection's, and for how
/// long.
#[derive(clap::Args, Clone, Debug)]
pub struct GrpcFlags {
    /// Longest a request message may take to arrive whole (each message of a streamed
    /// call too), counted from when the sidecar is ready for it; past it the call fails
    /// (`DEADLINE_EXCEEDED`) and what it held is freed. Also the longest a client may
    /// leave a block of an answer (`Onboard`) untaken; past it the client's connection
    /// is closed.
    #[arg(
        long,
        env = "DYNAMO_SIDECAR_GRPC_MESSAGE_TIMEOUT",
        default_value = "10s",
        value_parser = parse_duration
    )]
    pub grpc_message_timeout: Duration,
    /// Largest request message [default and most: 64 MiB, the block API's own limit; a
    /// block of a large model is several MB]. A call declaring a larger one fails
    /// (`RESOURCE_EXHAUSTED`) before it is read.
    #[arg(
        long,
        env = "DYNAMO_SIDECAR_GRPC_MAX_MESSAGE_BYTES",
        default_value = "64MiB",
        value_parser = message_bytes
    )]
    pub grpc_max_message_bytes: u64,
    /// Bytes of request messages one connection may be sending at once, its calls
    /// together (counted by each message's declared size from its first bytes until
    /// whole). A message past it fails its call (`RESOURCE_EXHAUSTED`).
    #[arg(
        long,
        env = "DYNAMO_SIDECAR_GRPC_MAX_CONNECTION_BYTES",
        default_value = "256MiB",
        value_parser = dynamo_kvblocks::parse_bytes
    )]
    pub grpc_max_connection_bytes: u64,
}

impl GrpcFlags {
    pub fn message_limits(&self) -> MessageLimits {
        MessageLimits {
            timeout: self.grpc_message_timeout,
            max_message_bytes: self.grpc_max_message_bytes,
            max_connection_bytes: self.grpc_max_connection_bytes,
        }
    }
}

/// A message size: at least a byte, at most the block API's [`MAX_MESSAGE_BYTES`].
fn message_bytes(s: &str) -> Result<u64, String> {
    let bytes = dynamo_kvblocks::parse_bytes(s)?;
    let most = MAX_MESSAGE_BYTES as u64;
    match bytes {
        1.. if bytes <= most => Ok(bytes),
        _ => Err(format!("{s:?}: from 1 byte to {most} bytes")),
    }
}

/// The KV block store's tiers (`DESIGN.md`, "KV blocks in the sidecar"). Each is off
/// unless sized; sizes are bytes, with an optional unit (`512MiB`, `4GiB`, `2GB`).
#[derive(clap::Args, Clone, Debug)]
pub struct KvTierFlags {
    /// Host-memory tier (G2): the blocks the engine offloads land here first.
    #[arg(long, env = "DYNAMO_SIDECAR_KV_HOST_BYTES", value_parser = dynamo_kvblocks::parse_bytes)]
    pub kv_host_bytes: Option<u64>,
    /// Directory of the local-disk tier (G3), one file per block; what a previous run
    /// left there is served again.
    #[arg(long, env = "DYNAMO_SIDECAR_KV_DISK_DIR", requires = "kv_disk_bytes")]
    pub kv_disk_dir: Option<PathBuf>,
    /// Capacity of the local-disk tier.
    #[arg(long, env = "DYNAMO_SIDECAR_KV_DISK_BYTES", value_parser = dynamo_kvblocks::parse_bytes, requires = "kv_disk_dir")]
    pub kv_disk_bytes: Option<u64>,
    /// Uses (offloads and onboards) a block needs before it moves from host memory to
    /// disk [default: 2, as Dynamo's KVBM, which offloads to disk only blocks seen
    /// twice]; 1 lets every evicted block through.
    #[arg(long, env = "DYNAMO_SIDECAR_KV_DISK_MIN_REUSE", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub kv_disk_min_reuse: u32,
    /// Object-storage tier (G4): `s3://bucket` or `s3://bucket/prefix`. Credentials,
    /// region and endpoint come from the usual AWS environment variables.
    #[arg(
        long,
        env = "DYNAMO_SIDECAR_KV_OBJECT_URL",
        requires = "kv_object_bytes"
    )]
    pub kv_object_url: Option<String>,
    /// Bytes this sidecar may keep in the object store.
    #[arg(long, env = "DYNAMO_SIDECAR_KV_OBJECT_BYTES", value_parser = dynamo_kvblocks::parse_bytes, requires = "kv_object_url")]
    pub kv_object_bytes: Option<u64>,
    /// Bytes of writes to disk, and to the object store, that may be in flight at once
    /// (each tier); past it, evicted blocks are dropped instead of queued, so a slow tier
    /// never holds more memory than this nor makes the engine wait.
    #[arg(long, env = "DYNAMO_SIDECAR_KV_WRITE_BUFFER_BYTES", default_value = "256MiB", value_parser = dynamo_kvblocks::parse_bytes)]
    pub kv_write_buffer_bytes: u64,
    /// Where shared memory regions for an engine on this host are created (the block
    /// API's `OpenRegion`; payloads then cross by memory copy); `none` keeps every
    /// payload inline in the gRPC messages.
    #[arg(long, env = "DYNAMO_SIDECAR_KV_REGION_DIR", default_value = "/dev/shm")]
    pub kv_region_dir: String,
    /// Uses a block needs before it moves down to the object store.
    #[arg(long, env = "DYNAMO_SIDECAR_KV_OBJECT_MIN_REUSE", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub kv_object_min_reuse: u32,
}

/// Disaggregated serving (`DESIGN.md`, "Disaggregated request"): the prefill hop a decode
/// pod's sidecar runs, and the leases every sidecar keeps.
#[derive(clap::Args, Clone, Debug)]
pub struct DisaggFlags {
    /// Pods the endpoint picker may name as a request's prefill pod
    /// (`x-prefiller-host-port`), comma-separated: `ip:port`; `dns:NAME:PORT`, every
    /// address NAME resolves to (a headless Service of the prefill pods); `file:PATH`,
    /// the prefill entries of the local runner's endpoints file. A request naming any
    /// other pod is refused (403), so a client cannot make the sidecar connect anywhere.
    #[arg(long, env = "DYNAMO_SIDECAR_PREFILL_PEERS", value_delimiter = ',')]
    pub prefill_peers: Vec<String>,
    /// Port of the block API of the prefill peers that `ip:port` and `dns:` entries name
    /// [default: this sidecar's --grpc-port: the pods of a graph share one layout];
    /// `file:` entries announce their own (`kv_events`). A prompt's blocks are fetched
    /// from there only, whatever port the prefill's answer names.
    #[arg(long, env = "DYNAMO_SIDECAR_PREFILL_PEER_GRPC_PORT")]
    pub prefill_peer_grpc_port: Option<u16>,
    /// Time the prefill pod gets to answer the prefill leg; past it the request is
    /// prefilled here instead.
    #[arg(long, env = "DYNAMO_SIDECAR_PREFILL_TIMEOUT", default_value = "30", value_parser = parse_duration)]
    pub prefill_timeout: Duration,
    /// Time the prompt's KV blocks get to move from the prefill pod's sidecar; past it
    /// the request is prefilled here instead.
    #[arg(long, env = "DYNAMO_SIDECAR_KV_TRANSFER_TIMEOUT", default_value = "10", value_parser = parse_duration)]
    pub kv_transfer_timeout: Duration,
    /// How long blocks lent for a remote decode wait to be fetched [default: 30 s,
    /// vLLM NixlConnector's `kv_lease_duration`, nixl/base_scheduler.py].
    #[arg(long, env = "DYNAMO_SIDECAR_KV_LEASE_DURATION", default_value = "30", value_parser = parse_duration)]
    pub kv_lease_duration: Duration,
    /// Bytes all leases may hold at once; a lease past it is refused (its decode
    /// prefills itself).
    #[arg(long, env = "DYNAMO_SIDECAR_KV_LEASE_BYTES", default_value = "1GiB", value_parser = dynamo_kvblocks::parse_bytes)]
    pub kv_lease_bytes: u64,
    /// Bytes the leases of one peer may hold at once [default: a quarter of
    /// --kv-lease-bytes]. A lease is charged to the address whose request made it (on a
    /// prefill pod, the client of the prefill leg), so one peer's junk leases cannot
    /// leave the others no room.
    #[arg(long, env = "DYNAMO_SIDECAR_KV_LEASE_BYTES_PER_PEER", value_parser = dynamo_kvblocks::parse_bytes)]
    pub kv_lease_bytes_per_peer: Option<u64>,
    /// Directory holding NIXL's `libnixl_capi.so` (the `nixl-cu12` wheel's
    /// `.nixl_cu12.mesonpy.libs`) [default: the loader's path, `LD_LIBRARY_PATH`]. With
    /// NIXL loaded, KV blocks move between sidecars by NIXL READ over UCX where the peer
    /// has an agent too; otherwise, and on any failure, over gRPC. `none`: no NIXL.
    #[arg(long, env = "DYNAMO_SIDECAR_NIXL_LIB_DIR")]
    pub nixl_lib_dir: Option<PathBuf>,
}

impl DisaggFlags {
    /// `--kv-lease-bytes-per-peer`, or its default.
    pub fn lease_peer_share(&self) -> u64 {
        self.kv_lease_bytes_per_peer
            .unwrap_or(self.kv_lease_bytes / 4)
    }
}

impl KvTierFlags {
    /// The `--kv-region-dir`, unless shared memory is off.
    pub fn region_dir(&self) -> Option<&Path> {
        endpoint_or_none(&self.kv_region_dir).map(Path::new)
    }
}

/// The OpenAI inference and model routes, the engine's `/metrics` (the endpoint picker
/// reads each pod's load there) and `/health`.
const DEFAULT_PROXY_PATHS: &str = "/v1/chat/completions,/v1/completions,/v1/embeddings,\
    /v1/responses,/v1/responses/*,/v1/models,/v1/models/*,/metrics,/health";

impl Config {
    /// Every default, as the binary gets them without flags or environment.
    pub fn defaults() -> Self {
        Self::parse_from(["dynamo-sidecar"])
    }

    pub fn kv_events_endpoint(&self) -> Option<&str> {
        endpoint_or_none(&self.engine_kv_events)
    }

    pub fn kv_replay_endpoint(&self) -> Option<&str> {
        endpoint_or_none(&self.engine_kv_replay)
    }

    /// The `--model-name` given, if not empty.
    pub fn model_name(&self) -> Option<&str> {
        self.model_name.as_deref().filter(|m| !m.is_empty())
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        SocketAddr::new(self.host, self.grpc_port)
    }

    pub fn metrics_addr(&self) -> SocketAddr {
        SocketAddr::new(self.host, self.metrics_port)
    }
}

fn endpoint_or_none(value: &str) -> Option<&str> {
    (!value.eq_ignore_ascii_case("none") && !value.is_empty()).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_pod_layout() {
        let c = Config::defaults();
        assert_eq!(c.listen, "0.0.0.0:8000".parse().unwrap());
        assert_eq!(c.engine_url.as_str(), "http://127.0.0.1:8001/");
        assert_eq!(c.kv_events_endpoint(), Some("tcp://127.0.0.1:5557"));
        assert_eq!(c.kv_replay_endpoint(), None);
        assert_eq!(c.grpc_addr(), "0.0.0.0:9100".parse().unwrap());
        assert_eq!(c.metrics_addr(), "0.0.0.0:9090".parse().unwrap());
        assert_eq!(c.shutdown_grace, Duration::from_secs(30));
        assert_eq!(c.model_name, None);
        assert_eq!(c.disagg.lease_peer_share(), 256 << 20);
        let limits = c.grpc.message_limits();
        assert_eq!(limits.timeout, Duration::from_secs(10));
        assert_eq!(limits.max_message_bytes, 64 << 20);
        assert_eq!(limits.max_connection_bytes, 256 << 20);
    }

    #[test]
    fn a_message_limit_past_the_block_apis_own_is_refused() {
        for bad in ["0", "65MiB"] {
            let err = Config::try_parse_from(["dynamo-sidecar", "--grpc-max-message-bytes", bad])
                .unwrap_err()
                .to_string();
            assert!(err.contains("from 1 byte"), "{err}");
        }
    }

    #[test]
    fn none_disables_the_relay_and_host_moves_both_listeners() {
        let c = Config::parse_from([
            "dynamo-sidecar",
            "--engine-kv-events",
            "none",
            "--host",
            "127.0.0.1",
            "--shutdown-grace",
            "2.5",
        ]);
        assert_eq!(c.kv_events_endpoint(), None);
        assert_eq!(c.grpc_addr().ip().to_string(), "127.0.0.1");
        assert_eq!(c.metrics_addr().ip().to_string(), "127.0.0.1");
        assert_eq!(c.shutdown_grace, Duration::from_millis(2500));
    }

    #[test]
    fn tier_sizes_take_units_and_a_disk_tier_needs_both_flags() {
        let c = Config::parse_from(["dynamo-sidecar", "--kv-host-bytes", "1GiB"]);
        assert_eq!(c.kv_tiers.kv_host_bytes, Some(1 << 30));
        assert_eq!(c.kv_tiers.kv_disk_min_reuse, 2);
        let err = Config::try_parse_from(["dynamo-sidecar", "--kv-disk-dir", "/tmp/kv"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--kv-disk-bytes"), "{err}");
    }

    #[test]
    fn a_negative_grace_is_refused() {
        let err = Config::try_parse_from(["dynamo-sidecar", "--shutdown-grace=-1"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid duration"), "{err}");
    }
}
