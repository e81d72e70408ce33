//! `dynamo-epp`: the endpoint picker. It learns the pool's pods (static list, JSON file
//! or Kubernetes), follows each pod's KV event stream into one shared index, and routes
//! each request to the pod with the best cache overlap for its load, as an Envoy
//! `ext_proc` server for a Gateway API inference gateway and as an OpenAI HTTP frontend.
//! See `docs/epp.md`.
//!
//! - [`config`]: flags and checked configuration;
//! - [`discovery`]: where the pods come from; [`pool`]: keeps the router's pods current;
//! - [`events`]: KV event followers; [`engine_metrics`]: engine load polling;
//!   [`model_source`]: the model, from a directory or the pods' model cards;
//! - [`router`]: the shared routing state, picks and load accounting;
//! - [`request`]: OpenAI request checks and tokenization; [`meter`]: response metrics;
//! - [`frontend`]: the HTTP frontend; [`responses`]: its Responses API over the chat
//!   path; [`migration`]: continuing an answer on another pod; [`ext_proc`]: the
//!   gateway's ext_proc server;
//! - [`metrics`]: the Prometheus registry.

pub mod answer_parsing;
pub mod config;
pub mod discovery;
pub mod engine_metrics;
pub mod events;
pub mod ext_proc;
pub mod frontend;
pub mod meter;
pub mod metrics;
pub mod migration;
pub mod model_source;
pub mod openapi;
pub mod pod_connections;
pub mod pool;
pub mod request;
pub mod responses;
pub mod router;
pub mod speculative;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dynamo_server::Server;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use config::{Args, Config, DYNAMO_ENV_ALIASES};
pub use router::Router;

use crate::ext_proc::ExtProc;
use crate::frontend::Frontend;
use crate::metrics::Metrics;
use crate::model_source::ModelSource;

/// A running picker; dropping it does not stop it, [`Epp::shutdown`] does.
pub struct Epp {
    pub http_addr: SocketAddr,
    pub ext_proc_addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    pub model_name: String,
    pub router: Arc<Router>,
    pub metrics: Arc<Metrics>,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<anyhow::Result<()>>>,
    pool: JoinHandle<()>,
}

impl Epp {
    /// Stops accepting, lets the servers finish in-flight requests, and stops the
    /// per-pod tasks.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        self.stop.cancel();
        self.wait().await
    }

    /// A token that stops the picker when cancelled (for signal handlers).
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Serves until stopped or until a server fails.
    pub async fn wait(self) -> anyhow::Result<()> {
        let servers = self.tasks.into_iter().map(|t| async move { t.await? });
        let result = futures::future::try_join_all(servers).await.map(|_| ());
        self.stop.cancel();
        self.pool.abort();
        result
    }
}

/// Loads the model (or starts learning it from the pods), binds every listener, starts
/// discovery, and serves.
pub async fn start(config: Config) -> anyhow::Result<Epp> {
    let block_size = u32::try_from(config.router.block_size)?;
    let model = match &config.model_path {
        Some(path) => ModelSource::from_dir(
            path,
            config.model_name.as_deref(),
            block_size,
            config.max_body_bytes,
        )?,
        None => ModelSource::from_pods(
            config
                .model_name
                .clone()
                .ok_or_else(|| anyhow::anyhow!("--model-name is required without --model-path"))?,
            block_size,
            config.max_body_bytes,
        ),
    };
    let metrics = Arc::new(Metrics::new());
    // The InferencePool the picker serves names the Inference Extension's pool gauges;
    // without one (static or file discovery), the model does.
    metrics.set_pool_name(
        match &config.discovery {
            config::DiscoveryConfig::Kubernetes(k) => k.pool_name.as_deref(),
            _ => None,
        }
        .unwrap_or(model.name()),
    );
    let router = Arc::new(Router::new(
        config.router.clone(),
        model.name(),
        metrics.clone(),
    ));
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .build()?;
    let endpoints = discovery::start(&config.discovery, config.kv_events_port).await?;
    let pod_tasks = pool::PodTasks {
        metrics_poll: config.metrics_poll_interval,
        model: model.clone(),
        model_card_port: config.model_card_port,
        client: client.clone(),
        credential: config.credential.clone(),
    };
    let pool = tokio::spawn(pool::run(router.clone(), endpoints, pod_tasks));

    let server = Server::new(&config.server);
    let stop = CancellationToken::new();
    let frontend = Arc::new(Frontend::new(
        model.clone(),
        router.clone(),
        metrics.clone(),
        config.frontend,
    ));
    let mut tasks = Vec::new();

    let http = TcpListener::bind(config.http_addr).await?;
    let http_addr = http.local_addr()?;
    tasks.push(serve_http(
        &server,
        http,
        frontend::routes(frontend.clone()),
        &stop,
    ));

    let metrics_addr = match config.metrics_addr {
        Some(addr) => {
            let listener = TcpListener::bind(addr).await?;
            let bound = listener.local_addr()?;
            let app = frontend::ops_routes().with_state(frontend);
            tasks.push(serve_http(&server, listener, app, &stop));
            Some(bound)
        }
        None => None,
    };

    let grpc = TcpListener::bind(config.ext_proc_addr).await?;
    let ext_proc_addr = grpc.local_addr()?;
    let service = ExtProc::new(model.clone(), router.clone(), metrics.clone());
    let (incoming, shutdown) = (server.grpc_incoming(grpc), stop.clone().cancelled_owned());
    tasks.push(tokio::spawn(async move {
        ext_proc::serve(incoming, service, shutdown).await?;
        Ok(())
    }));

    Ok(Epp {
        http_addr,
        ext_proc_addr,
        metrics_addr,
        model_name: model.name().to_owned(),
        router,
        metrics,
        stop,
        tasks,
        pool,
    })
}

fn serve_http(
    server: &Server,
    listener: TcpListener,
    app: axum::Router,
    stop: &CancellationToken,
) -> JoinHandle<anyhow::Result<()>> {
    let (server, shutdown) = (server.clone(), stop.clone().cancelled_owned());
    tokio::spawn(async move {
        server.serve_http(listener, app, shutdown).await?;
        Ok(())
    })
}
