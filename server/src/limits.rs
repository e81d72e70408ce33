//! The limits every listener applies, as flags shared by every binary. Each container has
//! its own environment, so the variables need no per-binary prefix.

use std::time::Duration;

use clap::builder::TypedValueParser;

/// Timeouts and the connection budget of a process's servers.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct ServerLimits {
    /// Longest a client may take to send a request's head (request line and headers),
    /// counted from its first byte; past it the connection is dropped, within a fifth of
    /// the timeout. gRPC connections must send their first bytes within it.
    #[arg(
        long,
        env = "DYNAMO_HTTP_HEADER_TIMEOUT",
        default_value = "30s",
        value_parser = parse_duration
    )]
    pub header_timeout: Duration,
    /// A connection with no request in flight is closed after this long: idle
    /// keep-alive connections, and connections that never send anything. Above the
    /// 90 s a reqwest client keeps idle connections, so our own clients never send on a
    /// connection the server is closing. While fewer than a tenth of --max-connections
    /// are free, such connections are closed after 1 s (or this, if shorter) instead,
    /// oldest first, to make room; requests in flight are never closed for room.
    #[arg(
        long,
        env = "DYNAMO_HTTP_IDLE_TIMEOUT",
        default_value = "120s",
        value_parser = parse_duration
    )]
    pub idle_timeout: Duration,
    /// Longest wait for the next piece of a request body.
    #[arg(
        long,
        env = "DYNAMO_HTTP_BODY_TIMEOUT",
        default_value = "30s",
        value_parser = parse_duration
    )]
    pub body_timeout: Duration,
    /// Connections served at once over all of the process's listeners; further ones
    /// wait in the kernel's accept queue until one closes. While fewer than a tenth are
    /// free, idle and silent connections get a shorter idle timeout (--idle-timeout).
    #[arg(
        long,
        env = "DYNAMO_MAX_CONNECTIONS",
        default_value_t = 4096,
        value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize)
    )]
    pub max_connections: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        use clap::{Args, FromArgMatches};
        let matches = Self::augment_args(clap::Command::new("limits")).get_matches_from(["limits"]);
        Self::from_arg_matches(&matches).expect("the defaults parse")
    }
}

/// A duration flag: `500ms`, `2s`, `1m`, or a bare number of seconds (`0.5`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    number
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .and_then(|v| Duration::try_from_secs_f64(v * scale).ok())
        .ok_or_else(|| format!("invalid duration {s:?}: expected e.g. 500ms, 2s, 1m or 0.5"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units_or_bare_seconds() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration(" 0.5 "), Ok(Duration::from_millis(500)));
        for bad in ["", "-1s", "nan", "1h", "1e300m"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn defaults_and_a_zero_connection_budget_is_refused() {
        let limits = ServerLimits::default();
        assert_eq!(limits.header_timeout, Duration::from_secs(30));
        assert_eq!(limits.idle_timeout, Duration::from_secs(120));
        assert_eq!(limits.body_timeout, Duration::from_secs(30));
        assert_eq!(limits.max_connections, 4096);

        use clap::Args;
        let err = ServerLimits::augment_args(clap::Command::new("x"))
            .try_get_matches_from(["x", "--max-connections", "0"])
            .unwrap_err();
        assert!(err.to_string().contains("--max-connections"), "{err}");
    }
}
