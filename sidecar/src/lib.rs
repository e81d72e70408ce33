//! The sidecar: the per-pod data plane beside every engine (`DESIGN.md`, "Pod anatomy").
//!
//! - [`proxy`]: the inference proxy on 8000, streaming to and from the engine, behind
//!   the prefill hop of disaggregated serving ([`disagg`]);
//! - [`relay`]: the engine's ZMQ KV events, re-hashed and published into a
//!   [`KvEventHub`] served by the gRPC server on 9100 ([`grpc`]);
//! - [`blocks`]: the KV block tiers (host memory, disk, object storage), the leases of
//!   disaggregated serving, and their block API, on the same gRPC server;
//! - [`health`]: `/health`, `/ready` and `/metrics` on 9090 ([`metrics`]), and the
//!   engine's [`model_card`];
//! - [`nixl`]: the NIXL agent that moves leased KV blocks between sidecars;
//! - [`engine`]: what the sidecar asks the engine itself.
//!
//! [`Sidecar::start`] runs all of it in-process, which is what the binary and the tests do.

pub mod blocks;
pub mod config;
pub mod disagg;
pub mod engine;
pub mod grpc;
pub mod health;
pub mod metrics;
pub mod model_card;
pub mod nixl;
pub mod proxy;
pub mod relay;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use dynamo_kvstream::{HubConfig, KvEventHub};
use dynamo_server::{MessageLimitsLayer, Server};
use tokio::net::TcpListener;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::AbortOnDropHandle;

use blocks::lease::{LeaseMetrics, Leases};
pub use config::Config;
use disagg::hop::{Hop, PrefillHopLayer};
use disagg::metrics::HopMetrics;
use disagg::peers::PrefillPeers;
use disagg::transfer::Transfer;
use health::Health;
use metrics::Metrics;
use proxy::PathAllowlist;

/// A started sidecar. Dropping it stops everything at once (in-flight proxied requests
/// are left to finish on their own); [`Sidecar::shutdown`] lets them finish first.
pub struct Sidecar {
    pub proxy_addr: SocketAddr,
    pub grpc_addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    pub hub: KvEventHub,
    pub metrics: Arc<Metrics>,
    /// Blocks held for remote decodes (disaggregated serving).
    pub leases: Leases,
    draining: Arc<AtomicBool>,
    stop_accepting: CancellationToken,
    proxy: AbortOnDropHandle<std::io::Result<()>>,
    /// Ends the gRPC server and its open subscriptions (first: fields drop in order).
    _stop_grpc: DropGuard,
    _background: Vec<AbortOnDropHandle<()>>,
}

impl Sidecar {
    /// Binds every listener (a taken port fails here) and starts serving.
    pub async fn start(config: &Config) -> anyhow::Result<Self> {
        let parse = |flag: &str, endpoint: Option<&str>| -> anyhow::Result<_> {
            endpoint
                .map(|e| {
                    e.parse::<dynamo_zmtp::Endpoint>()
                        .with_context(|| format!("{flag} {e:?} is not a ZMQ endpoint"))
                })
                .transpose()
        };
        let kv_events = parse("--engine-kv-events", config.kv_events_endpoint())?;
        let kv_replay = parse("--engine-kv-replay", config.kv_replay_endpoint())?;
        let hub = KvEventHub::new(HubConfig::default());
        let mut metrics = Metrics::new();
        metrics.watch_hub(hub.clone());
        let block_metrics = Arc::new(blocks::metrics::BlockMetrics::register(&mut metrics));
        let leases = Leases::new(
            config.disagg.kv_lease_duration,
            config.disagg.kv_lease_bytes,
            config.disagg.lease_peer_share(),
            LeaseMetrics::register(&mut metrics),
        );
        let hop_metrics = HopMetrics::register(&mut metrics);
        let message_limits = MessageLimitsLayer::new(config.grpc.message_limits());
        metrics.watch_grpc_messages(message_limits.stats());
        let credential = config
            .block_api_token_file
            .as_deref()
            .map(dynamo_kvblocks::Credential::read)
            .transpose()?;
        let admission = blocks::admission::Admission::new(
            dynamo_kvblocks::LayoutRules {
                block_size: config.block_size,
            },
            credential.as_ref().map(dynamo_kvblocks::BlockKey::of),
        )
        .registered(&mut metrics);
        let metrics = Arc::new(metrics);
        let store = blocks::open(
            &config.kv_tiers,
            hub.clone(),
            block_metrics,
            admission.clone(),
        )?;
        let client = proxy::engine_client().context("building the engine HTTP client")?;
        // The arenas are bounded as the leases are: what they hold is charged to the leases.
        let nixl = nixl::start(
            config.disagg.nixl_lib_dir.as_deref(),
            config.disagg.kv_lease_bytes,
        );

        let proxy_listener = bind(config.listen, "--listen").await?;
        let grpc_listener = bind(config.grpc_addr(), "--grpc-port").await?;
        let metrics_listener = bind(config.metrics_addr(), "--metrics-port").await?;
        let (proxy_addr, grpc_addr, metrics_addr) = (
            proxy_listener.local_addr()?,
            grpc_listener.local_addr()?,
            metrics_listener.local_addr()?,
        );

        let peer_block_port = config.disagg.prefill_peer_grpc_port;
        let peers = PrefillPeers::parse(
            &config.disagg.prefill_peers,
            peer_block_port.unwrap_or(grpc_addr.port()),
        )
        .map_err(|e| anyhow::anyhow!("--prefill-peers: {e}"))?;
        let server = Server::new(&config.server);
        let stop_accepting = CancellationToken::new();
        let hop = PrefillHopLayer::new(Hop {
            client: client.clone(),
            peers,
            transfer: Transfer::new(config.disagg.kv_transfer_timeout, credential.clone())
                .with_nixl(nixl.clone(), config.disagg.kv_lease_bytes),
            leases: leases.clone(),
            grpc_port: grpc_addr.port(),
            prefill_timeout: config.disagg.prefill_timeout,
            metrics: hop_metrics,
        });
        let proxy_app = proxy::router(
            &config.engine_url,
            PathAllowlist::new(&config.proxy_paths),
            &metrics,
            hop,
            leases.clone(),
        )
        .map_err(|e| anyhow::anyhow!("--engine-url: {e}"))?;
        let proxy = {
            let (server, stop) = (server.clone(), stop_accepting.clone());
            AbortOnDropHandle::new(tokio::spawn(async move {
                server
                    .serve_http(proxy_listener, proxy_app, stop.cancelled_owned())
                    .await
            }))
        };

        let mut background = Vec::new();
        let relay_connected = match kv_events {
            Some(endpoint) => {
                let connected = Arc::new(AtomicBool::new(false));
                let (replay, limits) = (kv_replay, relay::limits(config));
                let listen = config.engine_kv_events_listen;
                let socket = relay::sockets::subscribe(
                    endpoint.clone(),
                    listen,
                    limits,
                    connected.clone(),
                    metrics.clone(),
                )
                .await
                .with_context(|| format!("--engine-kv-events {endpoint}: cannot listen there"))?;
                tracing::info!(%endpoint, listen, "the engine's KV events");
                let (model, client, engine) = (
                    config.model_name().map(str::to_owned),
                    client.clone(),
                    config.engine_url.clone(),
                );
                let (hub, metrics) = (hub.clone(), metrics.clone());
                let store = store.clone();
                background.push(spawn(async move {
                    let model = match model {
                        Some(model) => model,
                        None => engine::served_model(&client, &engine).await,
                    };
                    let relay = relay::Relay::new(model, None, hub, metrics).with_store(store);
                    relay::run(relay, socket, replay, limits).await;
                }));
                Some(connected)
            }
            None => None,
        };

        let region_dir = config.kv_tiers.region_dir().map(ToOwned::to_owned);
        let guard = blocks::guard::Guard::new(credential);
        let blocks = blocks::service::service(
            store.clone(),
            admission,
            leases.clone(),
            region_dir,
            nixl,
            guard.clone(),
            config.grpc.grpc_message_timeout,
        );
        background.push(spawn(leases.clone().sweep()));
        let (hub_for_grpc, stop_grpc) = (hub.clone(), CancellationToken::new());
        let (stop, incoming) = (stop_grpc.clone(), server.grpc_incoming(grpc_listener));
        background.push(spawn(async move {
            let served = grpc::serve(incoming, hub_for_grpc, guard, blocks, message_limits, stop);
            if let Err(e) = served.await {
                tracing::error!(error = %e, "the gRPC server stopped");
            }
        }));

        let draining = Arc::new(AtomicBool::new(false));
        let card = config.model_source.clone().map(|source| {
            model_card::CardSource::new(
                source,
                config.hf_home.clone(),
                config.model_name().map(str::to_owned),
                config.block_size,
                client.clone(),
                config.engine_url.clone(),
            )
        });
        let health = Health {
            client,
            engine: config.engine_url.clone(),
            metrics: metrics.clone(),
            relay_connected,
            draining: draining.clone(),
        };
        background.push(spawn(async move {
            let forever = std::future::pending();
            if let Err(e) = server
                .serve_http(metrics_listener, health.router(card), forever)
                .await
            {
                tracing::error!(error = %e, "the metrics server stopped");
            }
        }));

        Ok(Self {
            proxy_addr,
            grpc_addr,
            metrics_addr,
            hub,
            metrics,
            leases,
            draining,
            stop_accepting,
            proxy,
            _stop_grpc: stop_grpc.drop_guard(),
            _background: background,
        })
    }

    /// Stops accepting requests, reports not ready, lets in-flight requests finish for
    /// up to `grace`, then stops everything.
    pub async fn shutdown(self, grace: Duration) {
        self.draining.store(true, Ordering::Relaxed);
        self.stop_accepting.cancel();
        match tokio::time::timeout(grace, self.proxy).await {
            Ok(_) => tracing::info!("in-flight requests finished"),
            Err(_) => tracing::warn!(
                in_flight = self.metrics.in_flight.get(),
                "shutdown grace elapsed; dropping the requests still in flight"
            ),
        }
    }
}

/// Keeps freed block payloads in the allocator for the next ones. A KV block is one
/// allocation of 100s of KB to MBs; by default glibc maps each from the kernel and
/// unmaps it when freed, so every block the host tier takes costs its pages' faults and
/// zeroing again (`mallopt(3)`). Served from the arenas instead (blocks up to 32 MiB,
/// glibc's largest threshold) and not trimmed back below 1 GiB, the memory of evicted
/// blocks is reused. What is kept is bounded by the trim threshold.
pub fn keep_freed_blocks() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt sets global parameters of glibc's allocator under its arena lock;
    // it touches no memory of ours.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

async fn bind(addr: SocketAddr, flag: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} ({flag})"))
}

fn spawn(task: impl Future<Output = ()> + Send + 'static) -> AbortOnDropHandle<()> {
    AbortOnDropHandle::new(tokio::spawn(task))
}
