//! The mock engine as a server: vLLM's HTTP API, metrics and ZMQ KV events over the
//! engine core, on wall-clock time.

mod answer;
mod disagg;
mod engine_loop;
mod http;
mod kv_blocks;
mod kv_publisher;
mod metrics;
mod model_output;
mod output_vocab;
mod sampling;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use dynamo_llm::ModelDir;
use dynamo_server::{Server, ServerLimits};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::{Args, Engine, EngineConfig, KvGeometry, RealClock};

pub use engine_loop::{EngineHandle, GenEvent, SubmitError};
pub use model_output::ModelBehaviour;

/// Everything the server needs to start.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub model_path: PathBuf,
    /// Served model name; the model directory's name when `None`.
    pub model_name: Option<String>,
    pub listen: SocketAddr,
    /// ZMQ PUB endpoint for KV events; `None` publishes none.
    pub kv_events_endpoint: Option<String>,
    pub engine: EngineConfig,
    /// The kind of model the engine plays: whether it thinks and calls tools.
    pub behaviour: ModelBehaviour,
    /// Timeouts and connection budget of the HTTP server.
    pub server: ServerLimits,
}

impl ServerConfig {
    /// The server configuration `args` ask for (reads the timing table, resolves the
    /// host).
    pub async fn from_args(args: Args) -> anyhow::Result<Self> {
        let engine = args.engine_config()?;
        let listen: SocketAddr = tokio::net::lookup_host((args.host.as_str(), args.port))
            .await?
            .next()
            .ok_or_else(|| anyhow::anyhow!("cannot resolve {}", args.host))?;
        Ok(Self {
            model_path: args.model_path,
            model_name: args.model_name,
            listen,
            kv_events_endpoint: (args.kv_events_endpoint != "none")
                .then_some(args.kv_events_endpoint),
            engine,
            behaviour: ModelBehaviour {
                reasoning: args.reasoning,
                tool_calls: args.tool_call_format,
            },
            server: args.server,
        })
    }
}

/// A started server.
pub struct RunningServer {
    pub http_addr: SocketAddr,
    /// The bound KV event endpoint (port 0 resolved).
    pub kv_events_endpoint: Option<String>,
    pub model_name: String,
    serve: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl RunningServer {
    /// Serves until `shutdown` resolves, then stops accepting and finishes in-flight
    /// requests.
    pub async fn wait(self) -> anyhow::Result<()> {
        self.serve.await??;
        Ok(())
    }
}

fn kv_geometry(config_json: &Path) -> anyhow::Result<KvGeometry> {
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(config_json)?)?;
    Ok(KvGeometry::from_config(&config)?)
}

/// Loads the model, binds the sockets and starts serving; returns once listening.
pub async fn start(
    mut config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<RunningServer> {
    let model = ModelDir::load(&config.model_path, config.model_name.as_deref())?;
    tracing::info!(model = %model.name, encoder = model.encoder(), "model loaded");
    let vocab = output_vocab::OutputVocab::from_model(&model);
    config.engine.vocab_size = vocab.len();
    config
        .engine
        .model_name
        .get_or_insert_with(|| model.name.clone());

    let listener = TcpListener::bind(config.listen).await?;
    let http_addr = listener.local_addr()?;

    let (kv_sink, kv_events_endpoint) = match &config.kv_events_endpoint {
        Some(endpoint) => {
            // vLLM's topic convention for this deployment: `kv@<host:port>@<model>`.
            let topic = format!("kv@{http_addr}@{}", model.name);
            let publisher = kv_publisher::KvPublisher::bind(endpoint, topic).await?;
            let bound = publisher.endpoint.clone();
            let (sink, batches) = mpsc::unbounded_channel();
            tokio::spawn(publisher.run(batches));
            (Some(sink), Some(bound))
        }
        None => (None, None),
    };

    let mut metrics = metrics::EngineMetricsExporter::new(
        &model.name,
        config.engine.block_size,
        config.engine.num_gpu_blocks,
    );
    let engine = Engine::new(config.engine.clone(), RealClock::default())?;
    let kv_blocks = match &config.engine.kv_blocks {
        Some(kv) => {
            let path = model.path.join(dynamo_llm::model_dir::CONFIG_FILE);
            let geometry = kv_geometry(&path)
                .with_context(|| format!("the KV block size, from {}", path.display()))?;
            Some(kv_blocks::KvBlocks::new(
                kv.clone(),
                &config.engine,
                &geometry,
                engine.hasher().clone(),
                metrics.register_kv_blocks(),
            )?)
        }
        None => None,
    };
    let disagg = disagg::Disagg::new(kv_blocks.clone(), metrics.register_disagg())?;
    let metrics = Arc::new(metrics);
    let (engine, _engine_task) = engine_loop::spawn(engine, metrics.clone(), kv_sink, kv_blocks);

    let model_name = model.name.clone();
    let state = Arc::new(http::AppState {
        model,
        vocab,
        engine,
        kv_pool: http::KvPool::of(&config.engine),
        behaviour: config.behaviour,
        disagg,
        metrics,
        created: http::unix_now(),
        id_salt: http::process_salt(),
    });
    let warm = state.clone();
    dynamo_server::on_every_worker(move || warm.model.warm()).await;
    let app = http::router(state);
    let server = Server::new(&config.server);
    let serve = tokio::spawn(async move { server.serve_http(listener, app, shutdown).await });
    Ok(RunningServer {
        http_addr,
        kv_events_endpoint,
        model_name,
        serve,
    })
}
