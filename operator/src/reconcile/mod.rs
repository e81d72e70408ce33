//! The DynamoGraphDeployment reconciler as a pure function.
//!
//! [`reconcile`] maps a graph, what exists in the cluster ([`Observed`]) and the operator's
//! settings ([`OperatorConfig`]) to what should exist ([`Desired`]): objects to
//! server-side apply with [`FIELD_MANAGER`], objects to delete, the graph's status, and the
//! decisions the controller reports as Events. It does no I/O and reads no clock (the time
//! comes in [`Observed::now`]), so the controller loop, tests and benchmarks all call the
//! same code.
//!
//! Pods are created directly (Grove-style, no external scheduler); multinode replicas are
//! gangs held behind a scheduling gate until [`gang`] finds one domain that fits them all.

mod access;
mod adapters;
mod batch_scheduler;
mod credential;
mod epp_access;
mod graph;
pub mod kinds;
mod network_policy;
mod planner_access;
mod pods;
mod replicas;
mod services;
mod serving;
mod status;
mod volumes;

pub mod gang;
pub mod labels;
pub mod names;

use std::collections::BTreeMap;

use dynamo_crds::inference_pool::InferencePool;
use dynamo_crds::{DynamoGraphDeploymentScalingAdapter, DynamoGraphDeploymentStatus};
use gateway_api::apis::standard::httproutes::HttpRoute;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    Node, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Serialize;

pub use adapters::{adapter_enabled, pod_selector};
pub use batch_scheduler::{QUEUE_ANNOTATION, SCHEDULER_ANNOTATION};
pub use epp_access::EPP_RULES;
pub use graph::reconcile;
pub use kinds::ObjectKind;
pub use planner_access::{PLANNER_RULES, PlannerScope};
pub use pods::{METRICS_PORT_NAME, is_gated, pinned_domain};
pub use status::{GANG_SCHEDULED, KV_TIERS_FED, NO_KV_CONNECTOR, READY};

/// Field manager of every server-side apply the operator makes.
pub const FIELD_MANAGER: &str = "dynamo-operator";

/// The image `make image` builds from the `Dockerfile`: every binary of ours (`dynamo`,
/// `dynamo-sidecar`, `dynamo-epp`, `dynamo-mocker`), tagged with the workspace version. The
/// chart's `image.repository` and the Makefile's `IMAGE_REGISTRY` name the same repository
/// (`tests/chart.rs` checks they agree); the chart passes its own image as `--image`.
pub const DEFAULT_IMAGE: &str = concat!("ghcr.io/dynamo-rs/dynamo:", env!("CARGO_PKG_VERSION"));

/// Operator-wide settings the reconciler needs (images, defaults, topology labels).
#[derive(Clone, Debug, PartialEq)]
pub struct OperatorConfig {
    /// Image of the injected `sidecar` container (default: [`DEFAULT_IMAGE`]).
    pub sidecar_image: String,
    /// Image of the endpoint picker with its OpenAI HTTP frontend (default: [`DEFAULT_IMAGE`]).
    pub epp_image: String,
    /// Image of planner services that run `dynamo planner` or Dynamo's planner launcher
    /// (default: [`DEFAULT_IMAGE`]).
    pub planner_image: String,
    /// Engine image for services that name none (vllm, sglang, trtllm).
    pub default_engine_image: String,
    /// Engine image for `backendFramework: mocker` services that name none (default:
    /// [`DEFAULT_IMAGE`]).
    pub mocker_image: String,
    /// Model directory of the mocker (`DYNAMO_MODEL_PATH`) unless the graph sets its own.
    pub mocker_model_path: String,
    /// Size of /dev/shm when `sharedMemory.size` is unset.
    pub default_shared_memory: String,
    /// EPP routing mode (`kv`, `approx`, `round-robin`, `random`) unless the graph sets
    /// `DYN_ROUTER_MODE` on its frontend or epp service.
    pub default_router_mode: String,
    /// Cluster DNS domain, for the gang leader's address.
    pub cluster_domain: String,
    /// `topologyConstraint.packDomain` values and the node label that defines each.
    pub pack_domain_labels: BTreeMap<String, String>,
    /// Node label of a gang's domain when no `packDomain` is set (the NVLink domain).
    pub default_gang_domain_label: String,
}

impl Default for OperatorConfig {
    fn default() -> Self {
        let pack_domain_labels = [
            ("nvlink", "nvidia.com/gpu.clique"),
            ("host", "kubernetes.io/hostname"),
            ("zone", "topology.kubernetes.io/zone"),
            ("region", "topology.kubernetes.io/region"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        Self {
            sidecar_image: DEFAULT_IMAGE.into(),
            epp_image: DEFAULT_IMAGE.into(),
            planner_image: DEFAULT_IMAGE.into(),
            default_engine_image: "vllm/vllm-openai:v0.11.0".into(),
            mocker_image: DEFAULT_IMAGE.into(),
            mocker_model_path: "/models/model".into(),
            default_shared_memory: "8Gi".into(),
            default_router_mode: "kv".into(),
            cluster_domain: "cluster.local".into(),
            pack_domain_labels,
            default_gang_domain_label: "nvidia.com/gpu.clique".into(),
        }
    }
}

/// What the controller saw in the cluster for one graph.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// Pods carrying the graph's label (any state, including terminating).
    pub pods: Vec<Pod>,
    /// Deployments carrying the graph's label (EPP, planner), with their status.
    pub deployments: Vec<Deployment>,
    /// Every other object the graph controls (Services, InferencePool, HTTPRoute,
    /// scaling adapters).
    pub owned: Vec<ObjectKey>,
    /// Nodes, with labels and allocatable resources.
    pub nodes: Vec<Node>,
    /// Pods of other workloads, for the GPUs they hold on their nodes.
    pub other_pods: Vec<Pod>,
    /// Time of the observation; used for condition transition times only.
    pub now: Option<Time>,
    /// A token the controller drew for this pass: the block API credential, should the
    /// graph's Secret be created on this pass (see `credential`).
    pub fresh_token: String,
}

/// One object, by kind and name (in the graph's namespace).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ObjectKey {
    pub kind: ObjectKind,
    pub name: String,
    /// UID to delete with as a precondition, so a recreated namesake is never deleted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// Event type of a [`Decision`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Severity {
    Normal,
    Warning,
}

/// Something the reconciler decided, reported by the controller as a Kubernetes Event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Decision {
    #[serde(rename = "type")]
    pub severity: Severity,
    /// CamelCase reason, e.g. `GangPending`.
    pub reason: String,
    pub message: String,
}

/// Everything one reconcile pass wants: the objects of each kind of the table
/// ([`kinds`], which names the field of each kind), deletions, status and Events.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Desired {
    pub pods: Vec<Pod>,
    pub services: Vec<Service>,
    pub deployments: Vec<Deployment>,
    pub inference_pools: Vec<InferencePool>,
    pub http_routes: Vec<HttpRoute>,
    /// The EPP's and the planners' API access (see `epp_access`, `planner_access`).
    pub service_accounts: Vec<ServiceAccount>,
    pub roles: Vec<Role>,
    pub role_bindings: Vec<RoleBinding>,
    /// Scaling adapters to create: only missing ones, as an existing adapter's replicas
    /// belong to whoever scales it.
    pub scaling_adapters: Vec<DynamoGraphDeploymentScalingAdapter>,
    /// Claims of `spec.pvcs` to create (only missing ones; see `volumes`).
    pub persistent_volume_claims: Vec<PersistentVolumeClaim>,
    /// The graph's block API credential, to create unless it exists (see `credential`).
    pub secrets: Vec<Secret>,
    /// Strangers kept from the sidecars' gRPC port (see `network_policy`).
    pub network_policies: Vec<NetworkPolicy>,
    /// Objects to delete (pods being replaced or rolled, objects no longer wanted).
    pub deletions: Vec<ObjectKey>,
    /// Status to write to the graph's status subresource.
    pub status: DynamoGraphDeploymentStatus,
    pub decisions: Vec<Decision>,
}

impl Desired {
    /// All objects to apply as one multi-document YAML (pods, services, deployments,
    /// pools, routes, the EPP's access, adapters, claims, the credential, the network policy, in that order), followed by a
    /// document with deletions, status and decisions. Deterministic, so it serves as a
    /// golden file.
    pub fn to_yaml(&self) -> String {
        fn doc<T: Serialize>(out: &mut String, value: &T) {
            out.push_str("---\n");
            out.push_str(&serde_saphyr::to_string(value).expect("objects serialize to YAML"));
        }
        fn docs<T: Serialize>(out: &mut String, objects: &[T]) {
            objects.iter().for_each(|o| doc(out, o));
        }
        // The golden files' order, older than the table's: every field is named, so a new
        // kind's field cannot be left out.
        let Desired {
            pods,
            services,
            deployments,
            inference_pools,
            http_routes,
            service_accounts,
            roles,
            role_bindings,
            scaling_adapters,
            persistent_volume_claims,
            secrets,
            network_policies,
            deletions,
            status,
            decisions,
        } = self;
        let mut out = String::new();
        docs(&mut out, pods);
        docs(&mut out, services);
        docs(&mut out, deployments);
        docs(&mut out, inference_pools);
        docs(&mut out, http_routes);
        docs(&mut out, service_accounts);
        docs(&mut out, roles);
        docs(&mut out, role_bindings);
        docs(&mut out, scaling_adapters);
        docs(&mut out, persistent_volume_claims);
        docs(&mut out, secrets);
        docs(&mut out, network_policies);
        #[derive(Serialize)]
        struct Outcome<'a> {
            deletions: &'a [ObjectKey],
            status: &'a DynamoGraphDeploymentStatus,
            decisions: &'a [Decision],
        }
        doc(
            &mut out,
            &Outcome {
                deletions,
                status,
                decisions,
            },
        );
        out
    }
}

/// Why a graph cannot be reconciled at all (nothing is applied; the controller reports it).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReconcileError {
    #[error("the DynamoGraphDeployment has no metadata.{0}")]
    MissingMetadata(&'static str),
    /// A generated name the API server would refuse (see [`names::problems`]).
    #[error(transparent)]
    InvalidName(#[from] names::NameProblem),
    /// Engines whose commands the wiring plan cannot write (see [`dynamo_wiring`]).
    #[error(transparent)]
    Wiring(#[from] dynamo_wiring::WiringError),
    #[error("{path}: unknown pack domain {domain:?}; known: {known}")]
    UnknownPackDomain {
        /// The field that names it: the service's `topologyConstraint` or the graph's.
        path: String,
        domain: String,
        known: String,
    },
    #[error(
        "annotation nvidia.com/dynamo-scheduler: unknown scheduler {value:?}; known: kai, volcano"
    )]
    UnknownScheduler { value: String },
}
