//! ZeroMQ endpoints of the `tcp` transport: `tcp://host:port`, with `*` for every
//! interface when binding and brackets around an IPv6 address, as libzmq writes them.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

/// A `tcp://host:port` endpoint; `host` is a name, an address, or `*` to bind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    host: String,
    port: u16,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    #[error("no transport: write tcp://host:port")]
    NoTransport,
    #[error("transport {0:?} is not supported; only tcp is")]
    Transport(String),
    #[error("no port: write tcp://host:port")]
    NoPort,
    #[error("no host: write tcp://host:port (or tcp://*:port to bind every interface)")]
    NoHost,
    #[error("port {0:?} is not a number from 0 to 65535")]
    Port(String),
}

impl Endpoint {
    /// What to connect to (a name is resolved then).
    pub(crate) fn connect_addr(&self) -> (&str, u16) {
        (&self.host, self.port)
    }

    /// What to bind: `*` is every IPv4 interface.
    pub(crate) fn bind_addr(&self) -> (&str, u16) {
        let host = if self.host == "*" {
            "0.0.0.0"
        } else {
            &self.host
        };
        (host, self.port)
    }
}

impl FromStr for Endpoint {
    type Err = EndpointError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let rest = s
            .strip_prefix("tcp://")
            .ok_or_else(|| match s.split_once("://") {
                Some((transport, _)) => EndpointError::Transport(transport.into()),
                None => EndpointError::NoTransport,
            })?;
        let (host, port) = rest.rsplit_once(':').ok_or(EndpointError::NoPort)?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if host.is_empty() {
            return Err(EndpointError::NoHost);
        }
        let port = port.parse().map_err(|_| EndpointError::Port(port.into()))?;
        Ok(Self {
            host: host.into(),
            port,
        })
    }
}

impl From<SocketAddr> for Endpoint {
    fn from(addr: SocketAddr) -> Self {
        Self {
            host: addr.ip().to_string(),
            port: addr.port(),
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "tcp://[{}]:{}", self.host, self.port)
        } else {
            write!(f, "tcp://{}:{}", self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_endpoints_parse_and_print_back() {
        for text in [
            "tcp://127.0.0.1:5557",
            "tcp://engine.local:0",
            "tcp://*:5557",
            "tcp://[::1]:5557",
        ] {
            let endpoint: Endpoint = text.parse().unwrap();
            assert_eq!(endpoint.to_string(), text);
        }
        let v6: Endpoint = "tcp://[::1]:9".parse().unwrap();
        assert_eq!(v6.connect_addr(), ("::1", 9));
        let any: Endpoint = "tcp://*:7".parse().unwrap();
        assert_eq!(any.bind_addr(), ("0.0.0.0", 7));
        assert_eq!(
            Endpoint::from("127.0.0.1:80".parse::<SocketAddr>().unwrap()).to_string(),
            "tcp://127.0.0.1:80"
        );
    }

    #[test]
    fn other_transports_and_missing_parts_say_what_is_wrong() {
        let cases = [
            ("ipc:///tmp/kv", EndpointError::Transport("ipc".into())),
            ("127.0.0.1:5557", EndpointError::NoTransport),
            ("tcp://127.0.0.1", EndpointError::NoPort),
            ("tcp://:5557", EndpointError::NoHost),
            ("tcp://host:99999", EndpointError::Port("99999".into())),
            ("tcp://host:http", EndpointError::Port("http".into())),
        ];
        for (text, expected) in cases {
            assert_eq!(text.parse::<Endpoint>(), Err(expected), "{text}");
        }
    }
}
