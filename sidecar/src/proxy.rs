//! The inference proxy on `--listen`, a tower stack of layers over the engine
//! ([`router`]), outermost first:
//!
//! 1. [`PrefillHopLayer`]: a request the picker gave a prefill pod takes its prefill
//!    hop first ([`crate::disagg::hop`]); it answers its own refusals and outcomes, and
//!    what it sends on to the engine is the request the layers below see and count.
//! 2. `ErrorMapLayer`: the one place every `ProxyError` of the layers below becomes
//!    the client's answer, an OpenAI-style error.
//! 3. `StatusMetricsLayer`: `dynamo_sidecar_requests_total{status}`, by the class of
//!    the answer, errors included.
//! 4. `InFlightLayer`: `dynamo_sidecar_requests_in_flight`, until the answer's body has
//!    been sent or dropped.
//! 5. `AllowlistLayer`: only `--proxy-paths` reach the engine.
//! 6. `TransferParamsLayer`: a client's own `kv_transfer_params` never reach the engine;
//!    only those the prefill hop set ([`FromHop`]), and a prefill leg's request, whose
//!    lease is charged to its client.
//! 7. `Forward`: the request on to the engine with its headers and body streamed as
//!    they arrive, and the answer back the same way: SSE tokens pass as they come, those
//!    that came together in one write (`dynamo_server::upstream`). A client that leaves drops the
//!    response body, which drops the engine connection and so cancels the request there.

mod allowlist;
mod error;
mod forward;
mod in_flight;
mod status_metrics;
mod transfer_params;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::Extensions;
use dynamo_server::upstream::Timeouts;
use tower::ServiceBuilder;

use crate::blocks::budget::peer_of;
use crate::blocks::lease::Leases;
use crate::disagg::hop::PrefillHopLayer;
use crate::metrics::Metrics;
use allowlist::AllowlistLayer;
pub use allowlist::PathAllowlist;
use error::ErrorMapLayer;
use forward::Forward;
use in_flight::InFlightLayer;
use status_metrics::StatusMetricsLayer;
pub use transfer_params::FromHop;
use transfer_params::TransferParamsLayer;

/// The proxy to the engine at `engine` (an `http://` URL), passing `paths`, counted in
/// `metrics`, behind the prefill `hop`; prefill legs' leases are charged to their
/// clients in `leases`.
pub fn router(
    engine: &reqwest::Url,
    paths: PathAllowlist,
    metrics: &Metrics,
    hop: PrefillHopLayer,
    leases: Leases,
) -> Result<Router, String> {
    let stack = ServiceBuilder::new()
        .layer(hop)
        .layer(ErrorMapLayer)
        .layer(StatusMetricsLayer::new(metrics.requests.clone()))
        .layer(InFlightLayer::new(metrics.in_flight.clone()))
        .layer(AllowlistLayer::new(paths))
        .layer(TransferParamsLayer::new(leases))
        .service(Forward::new(engine)?);
    Ok(Router::new().fallback_service(stack))
}

/// The sidecar's connections to its engine. vLLM's server closes connections idle for
/// 5 s (uvicorn's `timeout_keep_alive`, vllm `entrypoints/constants.py`
/// TIMEOUT_KEEP_ALIVE): ours are dropped first.
pub const ENGINE_TIMEOUTS: Timeouts = Timeouts {
    connect: Duration::from_secs(5),
    idle: Duration::from_secs(4),
};

/// The peer a request came from (`dynamo_server` gives each its client's address).
pub fn client_ip(extensions: &Extensions) -> IpAddr {
    peer_of(extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0))
}

/// The HTTP client the sidecar asks its engine with (health, model, the prefill hop); the
/// proxied requests go through `dynamo_server::upstream`.
pub fn engine_client() -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        // The engine is on loopback or in the pod: never through an HTTP proxy.
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .tcp_nodelay(true)
        .connect_timeout(ENGINE_TIMEOUTS.connect)
        .pool_idle_timeout(ENGINE_TIMEOUTS.idle)
        .build()
}
