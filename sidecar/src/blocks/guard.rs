//! Who may call the sidecar's gRPC port, the block API and the KV event stream alike
//! (`docs/sidecar.md`, "Security"): holders of the graph's credential; a sidecar given
//! none serves callers on its own host (loopback) only.
//!
//! Without a credential the safe choice is loopback: the engine beside the sidecar and a
//! picker on the same host still reach it, and nobody else can read, fill or poison its
//! blocks or learn which prompts it holds. Checked on the call's headers, before its body
//! is decoded and before any lease, region or subscription is made.

use std::net::SocketAddr;

use dynamo_kvblocks::Credential;
use dynamo_server::GrpcConnectInfo;
use tonic::service::Interceptor;
use tonic::{Request, Status};

#[derive(Clone, Debug)]
pub struct Guard {
    credential: Option<Credential>,
}

impl Guard {
    pub fn new(credential: Option<Credential>) -> Self {
        Self { credential }
    }

    fn admits(&self, request: &Request<()>) -> bool {
        match &self.credential {
            Some(credential) => credential.admits(request.metadata()),
            None => on_this_host(caller(request)),
        }
    }
}

/// The address a call came from, when it came through `dynamo_server`'s listener.
pub fn caller<T>(request: &Request<T>) -> Option<SocketAddr> {
    GrpcConnectInfo::of(request.extensions()).and_then(GrpcConnectInfo::remote_addr)
}

pub fn on_this_host(peer: Option<SocketAddr>) -> bool {
    peer.is_some_and(|peer| peer.ip().to_canonical().is_loopback())
}

impl Interceptor for Guard {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        if self.admits(&request) {
            return Ok(request);
        }
        Err(Status::unauthenticated(match self.credential {
            Some(_) => "this port needs the graph's credential",
            None => "this sidecar has no credential: it serves its own host only",
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_credential_only_loopback_is_served() {
        let from = |peer: &str| Some(peer.parse::<SocketAddr>().unwrap());
        for peer in ["127.0.0.1:5000", "[::1]:5000", "[::ffff:127.0.0.1]:5000"] {
            assert!(on_this_host(from(peer)), "{peer}");
        }
        for peer in ["10.0.0.7:5000", "[fd00::7]:5000", "[::ffff:10.0.0.7]:5000"] {
            assert!(!on_this_host(from(peer)), "{peer}");
        }
        let refused = Guard::new(None).call(Request::new(())).unwrap_err();
        assert_eq!(
            refused.code(),
            tonic::Code::Unauthenticated,
            "no peer address"
        );
    }
}
