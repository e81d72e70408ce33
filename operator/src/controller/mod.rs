//! `dynamo operator`: the controllers that run the pure reconciler against a cluster.
//!
//! Three controllers on kube-runtime's [`applier`]: DynamoGraphDeployments ([`dgd`]),
//! their scaling adapters ([`dgdsa`]) and DynamoGraphDeploymentRequests ([`dgdr`]), fed
//! by one watch per kind ([`watches`]). With
//! `--leader-elect` only the replica holding the Lease ([`leader`]) reconciles. `/metrics`
//! and `/healthz` are served on `--port` ([`metrics`]); every replica serves the CRD's
//! conversion webhook ([`webhook`]).
//!
//! The graph controller watches `nvidia.com/v1alpha1`, the stored version: its reads need
//! no conversion (they work while the webhook is down), and v1beta1 objects reach it
//! converted by the API server, so both versions reconcile alike.

mod apply;
mod context;
pub mod dgd;
pub mod dgdr;
pub mod dgdsa;
mod error;
pub mod leader;
pub mod metrics;
mod observe;
pub mod rbac;
pub mod watches;
pub mod webhook;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use dynamo_crds::DynamoGraphDeploymentScalingAdapter;
use dynamo_crds::common::NameRule;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::Api;
use kube::runtime::controller::{self, Config, applier};
use tokio::net::TcpListener;

pub use context::{ChildStores, Context, Stores};
pub use error::{ChildError, Error, Verb};
pub use observe::observe;
pub use watches::OptionalApis;

use crate::reconcile::OperatorConfig;
use leader::{LeaderElector, LeaseTiming};
use metrics::Metrics;

/// Flags of `dynamo operator` (each with an environment variable twin).
#[derive(clap::Args, Debug)]
pub struct OperatorArgs {
    /// Port of `/metrics` and `/healthz`.
    #[arg(long, env = "DYNAMO_OPERATOR_PORT", default_value_t = 8080)]
    pub port: u16,
    /// Reconcile only while holding the leader Lease (for more than one replica).
    #[arg(long, env = "DYNAMO_LEADER_ELECT")]
    pub leader_elect: bool,
    /// Name of the leader Lease.
    #[arg(long, env = "DYNAMO_LEASE_NAME", default_value = "dynamo-operator")]
    pub lease_name: String,
    /// Namespace of the leader Lease (default: the client's namespace, in a pod its own).
    #[arg(long, env = "POD_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// Identity written into the Lease and Events (default: the host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Watch and reconcile graphs in this namespace only, with the namespaced part of the
    /// operator's rules granted there (a Role; the chart's `namespaceScoped.enabled`)
    /// instead of cluster-wide. Nodes are not read: multinode (gang) services stay
    /// pending.
    #[arg(long, env = "DYNAMO_WATCH_NAMESPACE", value_parser = namespace_name)]
    pub watch_namespace: Option<String>,
    /// Graphs reconciled at the same time.
    #[arg(long, env = "DYNAMO_OPERATOR_CONCURRENCY", default_value_t = 8)]
    pub concurrency: u16,
    /// Triggers of one object within this window collapse into one reconcile.
    #[arg(long, env = "DYNAMO_OPERATOR_DEBOUNCE_MS", default_value_t = 500)]
    pub debounce_ms: u64,
    /// The dynamo image (every binary of ours): the sidecar's, the endpoint picker's, the
    /// planner's and the mocker's unless their own flags name another. The chart passes the
    /// operator's own image.
    #[arg(long, env = "DYNAMO_IMAGE")]
    pub image: Option<String>,
    /// Image of the injected sidecar container.
    #[arg(long, env = "DYNAMO_SIDECAR_IMAGE")]
    pub sidecar_image: Option<String>,
    /// Image of the endpoint picker.
    #[arg(long, env = "DYNAMO_EPP_IMAGE")]
    pub epp_image: Option<String>,
    /// Image of planner services that run `dynamo planner` or Dynamo's planner launcher.
    #[arg(long, env = "DYNAMO_PLANNER_IMAGE")]
    pub planner_image: Option<String>,
    /// Engine image for services that name none.
    #[arg(long, env = "DYNAMO_ENGINE_IMAGE")]
    pub engine_image: Option<String>,
    /// Engine image of `backendFramework: mocker` services that name none.
    #[arg(long, env = "DYNAMO_MOCKER_IMAGE")]
    pub mocker_image: Option<String>,
    /// Model directory of the mocker inside its image.
    #[arg(long, env = "DYNAMO_MOCKER_MODEL_PATH")]
    pub mocker_model_path: Option<String>,
    /// Size of /dev/shm when a service does not set one.
    #[arg(long, env = "DYNAMO_SHARED_MEMORY")]
    pub shared_memory: Option<String>,
    /// Routing mode of the endpoint picker unless a graph sets DYN_ROUTER_MODE.
    #[arg(long, env = "DYNAMO_ROUTER_MODE")]
    pub router_mode: Option<String>,
    /// Cluster DNS domain.
    #[arg(long, env = "DYNAMO_CLUSTER_DOMAIN")]
    pub cluster_domain: Option<String>,
    /// Node label of a gang's domain when a graph sets no packDomain.
    #[arg(long, env = "DYNAMO_GANG_DOMAIN_LABEL")]
    pub gang_domain_label: Option<String>,
    #[command(flatten)]
    pub webhook: webhook::WebhookArgs,
}

impl OperatorArgs {
    /// The reconciler settings: each flag given replaces its default.
    pub fn operator_config(&self) -> OperatorConfig {
        let mut c = OperatorConfig::default();
        let set = |field: &mut String, flag: &Option<String>| {
            if let Some(v) = flag {
                field.clone_from(v);
            }
        };
        for field in [
            &mut c.sidecar_image,
            &mut c.epp_image,
            &mut c.planner_image,
            &mut c.mocker_image,
        ] {
            set(field, &self.image);
        }
        set(&mut c.sidecar_image, &self.sidecar_image);
        set(&mut c.epp_image, &self.epp_image);
        set(&mut c.planner_image, &self.planner_image);
        set(&mut c.default_engine_image, &self.engine_image);
        set(&mut c.mocker_image, &self.mocker_image);
        set(&mut c.mocker_model_path, &self.mocker_model_path);
        set(&mut c.default_shared_memory, &self.shared_memory);
        set(&mut c.default_router_mode, &self.router_mode);
        set(&mut c.cluster_domain, &self.cluster_domain);
        set(&mut c.default_gang_domain_label, &self.gang_domain_label);
        c
    }
}

/// Runs the operator until SIGINT/SIGTERM, or until it loses the leader Lease (an error,
/// so the pod restarts and stands in line again). Logging is the caller's (`dynamo
/// --log-format`).
pub fn run(args: OperatorArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let outcome = runtime.block_on(serve(args));
    // Dropping the runtime would wait for a DGDR profile running on a blocking thread (many
    // seconds): abandon it instead; the request is profiled again by the next leader.
    runtime.shutdown_background();
    outcome
}

async fn serve(args: OperatorArgs) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::default());
    let listener = TcpListener::bind(("0.0.0.0", args.port))
        .await
        .with_context(|| format!("binding port {}", args.port))?;
    let scraped = metrics.clone();
    tokio::spawn(dynamo_server::metrics_endpoint::serve(
        listener,
        move || scraped.encode(),
    ));

    let client = Client::try_default()
        .await
        .context("connecting to the API server")?;
    // The operator's own namespace: the Lease's, the webhook Service's and Secret's.
    let lease_namespace = args
        .lease_namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let watch_namespace = args.watch_namespace.as_deref();
    let needs = rbac::Needs {
        namespace: &lease_namespace,
        watch_namespace,
        leader_elect: args.leader_elect,
        webhook_secret: args.webhook.uses_secret(),
    };
    let missing = rbac::missing_access(client.clone(), &needs)
        .await
        .context("checking the operator's RBAC")?;
    let remedy = match watch_namespace {
        None => "install the chart's ClusterRole and Roles".to_string(),
        Some(ns) => format!("install the chart with namespaceScoped.enabled (its Role in {ns})"),
    };
    anyhow::ensure!(
        missing.is_empty(),
        "the operator's service account may not: {}; {remedy}",
        missing.join(", ")
    );
    match watch_namespace {
        Some(ns) => tracing::info!(namespace = %ns, "watching one namespace"),
        None => tracing::info!("watching every namespace"),
    }
    webhook::start(
        client.clone(),
        &args.webhook,
        &lease_namespace,
        &args.operator_config().cluster_domain,
    )
    .await?;
    let apis = OptionalApis::discover(&client).await;
    let identity = args.identity.clone().unwrap_or_else(hostname);
    let settings = Config::default()
        .concurrency(args.concurrency)
        .debounce(Duration::from_millis(args.debounce_ms));
    let controllers = run_controllers(
        client.clone(),
        args.operator_config(),
        settings,
        apis,
        metrics.clone(),
        &identity,
        watch_namespace,
    );

    let shutdown = dynamo_server::logged_shutdown_signal();
    tokio::pin!(shutdown);
    if !args.leader_elect {
        metrics.set_leader(true);
        return tokio::select! {
            () = controllers => Ok(()),
            () = &mut shutdown => Ok(()),
        };
    }
    let leases: Api<Lease> = Api::namespaced(client, &lease_namespace);
    let mut elector =
        LeaderElector::new(leases, &args.lease_name, &identity, LeaseTiming::default());
    tracing::info!(%identity, lease = %args.lease_name, "waiting for the leader lease");
    tokio::select! {
        () = elector.acquire() => {}
        () = &mut shutdown => return Ok(()),
    }
    tracing::info!(%identity, "leading");
    metrics.set_leader(true);
    let outcome = tokio::select! {
        () = controllers => Ok(()),
        () = elector.hold() => Err(anyhow::anyhow!("lost the leader lease {}", args.lease_name)),
        () = &mut shutdown => Ok(()),
    };
    metrics.set_leader(false);
    if let Err(e) = elector.release().await {
        tracing::warn!(error = %e, "releasing the leader lease");
    }
    outcome
}

/// The controllers over shared watches, until the watches end. `identity` names this
/// replica in Events; `watch_namespace` limits the watches to one namespace.
pub async fn run_controllers(
    client: Client,
    config: OperatorConfig,
    settings: Config,
    apis: OptionalApis,
    metrics: Arc<Metrics>,
    identity: &str,
    watch_namespace: Option<&str>,
) {
    let (stores, queues, watching) = watches::start(client.clone(), apis, watch_namespace);
    let adapters = (stores.children)
        .get::<DynamoGraphDeploymentScalingAdapter>()
        .cloned()
        .expect("scaling adapters are always watched");
    let ctx = Arc::new(Context::new(
        client,
        config,
        stores.clone(),
        metrics,
        Some(identity.to_string()),
    ));
    let graphs = applier(
        |dgd, ctx| Box::pin(dgd::reconcile(dgd, ctx)),
        dgd::error_policy,
        ctx.clone(),
        stores.graphs,
        queues.graphs.map(Ok::<_, std::convert::Infallible>),
        settings.clone(),
    )
    .for_each(log_outcome);
    let adapters = applier(
        |adapter, ctx| Box::pin(dgdsa::reconcile(adapter, ctx)),
        dgdsa::error_policy,
        ctx.clone(),
        adapters,
        queues.adapters.map(Ok::<_, std::convert::Infallible>),
        settings.clone(),
    )
    .for_each(log_outcome);
    let requests = applier(
        |request, ctx| Box::pin(dgdr::reconcile(request, ctx)),
        dgdr::error_policy,
        ctx,
        stores.requests,
        queues.requests.map(Ok::<_, std::convert::Infallible>),
        settings,
    )
    .for_each(log_outcome);
    tokio::join!(watching, graphs, adapters, requests);
}

async fn log_outcome<T, E: std::error::Error, Q: std::error::Error>(
    outcome: Result<T, controller::Error<E, Q>>,
) {
    match outcome {
        Ok(_) => {}
        // Queued, then deleted before its turn.
        Err(controller::Error::ObjectNotFound(r)) => tracing::debug!(object = %r, "gone"),
        // Reconcile errors are logged by the error policies.
        Err(controller::Error::ReconcilerFailed(..)) => {}
        Err(e) => tracing::warn!(error = %e, "controller"),
    }
}

/// `--watch-namespace`: a namespace name, as the API server checks it (a DNS-1123 label).
fn namespace_name(value: &str) -> Result<String, String> {
    NameRule::Dns1123Label
        .check(value)
        .map(|()| value.to_string())
        .map_err(|e| format!("not a namespace name: {e}"))
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("dynamo-operator-{}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: OperatorArgs,
    }

    fn config(flags: &[&str]) -> OperatorConfig {
        let argv = std::iter::once("operator").chain(flags.iter().copied());
        Cli::try_parse_from(argv).unwrap().args.operator_config()
    }

    #[test]
    fn the_image_flag_names_every_image_of_ours_and_each_part_may_differ() {
        let defaults = config(&[]);
        assert_eq!(defaults, OperatorConfig::default());
        let c = config(&["--image=r/dynamo:1", "--epp-image=r/epp:2"]);
        assert_eq!(c.sidecar_image, "r/dynamo:1");
        assert_eq!(c.mocker_image, "r/dynamo:1");
        assert_eq!(c.planner_image, "r/dynamo:1");
        assert_eq!(c.epp_image, "r/epp:2");
        assert_eq!(c.default_engine_image, defaults.default_engine_image);
    }

    #[test]
    fn the_watch_namespace_is_a_namespace_name() {
        let parse = |flags: &[&str]| {
            let argv = std::iter::once("operator").chain(flags.iter().copied());
            Cli::try_parse_from(argv).map(|c| c.args.watch_namespace)
        };
        assert_eq!(parse(&[]).unwrap(), None);
        assert_eq!(
            parse(&["--watch-namespace=team-a"]).unwrap().as_deref(),
            Some("team-a")
        );
        for bad in ["Team", "-a", "a_b", ""] {
            let e = parse(&[&format!("--watch-namespace={bad}")]).unwrap_err();
            assert!(e.to_string().contains("not a namespace name"), "{bad}: {e}");
        }
    }
}
