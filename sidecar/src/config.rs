//! Flags of the sidecar; each has an environment twin. Defaults are the pod layout of
//! `DESIGN.md` ("Pod anatomy"): proxy on 8000, engine on 8001, engine KV events on 5557,
//! gRPC on 9100, health and metrics on 9090.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use clap::Parser;

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
    /// The engine's ZMQ ROUTER endpoint for replaying missed KV events (vLLM's
    /// `--kv-events-config` `replay_endpoint`); `none`: a gap resets the pod's view.
    #[arg(long, env = "DYNAMO_SIDECAR_ENGINE_KV_REPLAY", default_value = "none")]
    pub engine_kv_replay: String,
    /// Bind address of the gRPC and metrics listeners.
    #[arg(long, env = "DYNAMO_SIDECAR_HOST", default_value_t = IpAddr::V4(Ipv4Addr::UNSPECIFIED))]
    pub host: IpAddr,
    /// Port of the gRPC server (KV event stream).
    #[arg(long, env = "DYNAMO_SIDECAR_GRPC_PORT", default_value_t = 9100)]
    pub grpc_port: u16,
    /// Port of `/health`, `/ready` and `/metrics`.
    #[arg(long, env = "DYNAMO_SIDECAR_METRICS_PORT", default_value_t = 9090)]
    pub metrics_port: u16,
    /// Model name that salts block hashes; it must be the name the endpoint picker
    /// hashes prompts with [default, also when empty: the engine's served model, the
    /// first of its `/v1/models`].
    #[arg(long, env = "DYNAMO_SIDECAR_MODEL_NAME")]
    pub model_name: Option<String>,
    /// Seconds in-flight requests get to finish after SIGTERM or SIGINT.
    #[arg(
        long,
        env = "DYNAMO_SIDECAR_SHUTDOWN_GRACE",
        default_value = "30",
        value_parser = parse_seconds
    )]
    pub shutdown_grace: Duration,
}

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

fn parse_seconds(s: &str) -> Result<Duration, String> {
    s.parse::<f64>()
        .ok()
        .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
        .ok_or_else(|| format!("{s:?} is not a number of seconds (0 or more)"))
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
    fn a_negative_grace_is_refused() {
        let err = Config::try_parse_from(["dynamo-sidecar", "--shutdown-grace=-1"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a number of seconds"), "{err}");
    }
}
