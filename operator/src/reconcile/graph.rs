//! The graph being reconciled, its services' roles, and the top-level [`reconcile`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use dynamo_crds::{ComponentSpec, DynamoGraphDeployment, DynamoGraphDeploymentSpec, ServiceRole};
use dynamo_names::Role;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

use dynamo_wiring::planner::PROMETHEUS_ENV;
use dynamo_wiring::planner::{
    PlannerInputs, PlannerTarget, PlannerWiringError, planner_args, profile_source,
};
use dynamo_wiring::{Defaults, EngineService, GraphWiring, WiringError};

use super::batch_scheduler::BatchScheduler;
use super::kinds::{Child, Delete, KindVisitor, Observe};
use super::pods::{PLANNER_METRICS_ADDR, PLANNER_PROFILE};
use super::{
    Decision, Desired, ObjectKey, ObjectKind, Observed, OperatorConfig, ReconcileError, Severity,
    adapters, credential, kinds, labels, names, network_policy, replicas, services, serving,
    status, volumes,
};

/// The graph and its settings, shared by every builder.
pub(crate) struct Graph<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    uid: &'a str,
    pub generation: Option<i64>,
    pub spec: &'a DynamoGraphDeploymentSpec,
    pub config: &'a OperatorConfig,
    pub annotations: BTreeMap<String, String>,
    /// Where engine pods are scheduled, when not by the default scheduler.
    pub batch_scheduler: Option<BatchScheduler>,
    /// The engines' commands and the picker's settings; `None` without engine services.
    pub wiring: Option<GraphWiring>,
    /// Each planner service's `dynamo planner`; `None`: a command of the user's that runs
    /// as written.
    pub planners: BTreeMap<String, Option<PlannerWiring>>,
}

/// A planner service that runs `dynamo planner`.
pub(crate) struct PlannerWiring {
    /// Its arguments after the `dynamo` binary.
    pub args: Vec<String>,
    /// The engine service whose mock engine measures its profile (at
    /// [`PLANNER_PROFILE`], which `args` read) before it starts.
    pub profile_from: Option<String>,
}

impl<'a> Graph<'a> {
    fn new(
        dgd: &'a DynamoGraphDeployment,
        config: &'a OperatorConfig,
    ) -> Result<Self, ReconcileError> {
        let meta = &dgd.metadata;
        let annotations = meta.annotations.clone().unwrap_or_default();
        Ok(Self {
            name: meta
                .name
                .as_deref()
                .ok_or(ReconcileError::MissingMetadata("name"))?,
            namespace: meta
                .namespace
                .as_deref()
                .ok_or(ReconcileError::MissingMetadata("namespace"))?,
            uid: meta
                .uid
                .as_deref()
                .ok_or(ReconcileError::MissingMetadata("uid"))?,
            generation: meta.generation,
            spec: &dgd.spec,
            config,
            batch_scheduler: BatchScheduler::from_annotations(&annotations)?,
            annotations,
            wiring: None,
            planners: BTreeMap::new(),
        })
    }

    /// Wires the engine services (after the names are known good, so a bad name is
    /// reported before what it would have run).
    fn wire(&mut self) -> Result<(), ReconcileError> {
        let defaults = Defaults {
            mocker_model_path: Some(self.config.mocker_model_path.clone()),
        };
        self.wiring = GraphWiring::new(self.spec, &defaults)?;
        for (service, spec) in &self.spec.services {
            if spec.role() != ServiceRole::Planner {
                continue;
            }
            // The service's own variable, else the graph's; else the planner's default.
            let prometheus = spec
                .envs
                .iter()
                .flatten()
                .chain(self.spec.envs.iter().flatten())
                .find(|e| e.name == PROMETHEUS_ENV)
                .and_then(|e| e.value.as_deref());
            let profile_from = match profile_source(service, spec, self.wiring.as_ref()) {
                Ok(source) => source.map(|(worker, _)| worker.to_owned()),
                Err(PlannerWiringError::Custom { .. }) => {
                    self.planners.insert(service.clone(), None);
                    continue;
                }
                Err(e) => return Err(WiringError::from(e).into()),
            };
            let inputs = PlannerInputs {
                target: PlannerTarget::Graph(self.name),
                prometheus,
                metrics_addr: PLANNER_METRICS_ADDR,
                profile: profile_from.as_ref().map(|_| Path::new(PLANNER_PROFILE)),
            };
            let args = planner_args(service, spec, &inputs).map_err(WiringError::from)?;
            let planner = PlannerWiring { args, profile_from };
            self.planners.insert(service.clone(), Some(planner));
        }
        Ok(())
    }

    /// The wiring of an engine service.
    pub fn engine(&self, service: &str) -> &EngineService {
        &self
            .wiring
            .as_ref()
            .expect("engine services are wired")
            .engines[service]
    }

    /// Controller owner reference: garbage collection removes everything with the graph.
    pub fn owner_reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: DynamoGraphDeployment::api_version(&()).into_owned(),
            kind: DynamoGraphDeployment::kind(&()).into_owned(),
            name: self.name.to_string(),
            uid: self.uid.to_string(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    /// Whether the graph is the object's controller.
    pub fn owns(&self, pod: &k8s_openapi::api::core::v1::Pod) -> bool {
        pod.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.uid == self.uid && o.controller == Some(true))
    }

    /// `spec.labels` plus the graph label (ours wins).
    pub fn labels(&self) -> BTreeMap<String, String> {
        let mut labels = self.spec.labels.clone().unwrap_or_default();
        labels.insert(labels::GRAPH.into(), self.name.into());
        labels
    }

    /// Labels of everything generated for one service.
    pub fn service_labels(&self, service: &str, spec: &ComponentSpec) -> BTreeMap<String, String> {
        let mut labels = self.spec.labels.clone().unwrap_or_default();
        labels.extend(spec.labels.clone().unwrap_or_default());
        labels.insert(labels::GRAPH.into(), self.name.into());
        labels.insert(labels::COMPONENT.into(), service.into());
        let component_type = spec
            .component_type
            .and_then(|t| {
                serde_json::to_value(t)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
            })
            .unwrap_or_else(|| {
                match spec.role() {
                    ServiceRole::Frontend => "frontend",
                    ServiceRole::Epp => "epp",
                    ServiceRole::Planner => "planner",
                    ServiceRole::Engine(_) => "worker",
                }
                .into()
            });
        labels.insert(labels::COMPONENT_TYPE.into(), component_type);
        if let Some(sub) = &spec.sub_component_type {
            labels.insert(labels::SUB_COMPONENT_TYPE.into(), sub.clone());
        }
        labels
    }

    /// Annotations of everything generated for one service: graph's, then the service's.
    pub fn service_annotations(&self, spec: &ComponentSpec) -> Option<BTreeMap<String, String>> {
        let mut annotations = self.spec.annotations.clone().unwrap_or_default();
        annotations.extend(spec.annotations.clone().unwrap_or_default());
        (!annotations.is_empty()).then_some(annotations)
    }

    /// Metadata of a generated object, owned by the graph.
    pub fn metadata(&self, name: String, labels: BTreeMap<String, String>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.namespace.to_string()),
            labels: Some(labels),
            annotations: self.spec.annotations.clone().filter(|a| !a.is_empty()),
            owner_references: Some(vec![self.owner_reference()]),
            ..ObjectMeta::default()
        }
    }

    pub fn engine_services(
        &self,
    ) -> impl Iterator<Item = (&'a String, &'a ComponentSpec, Role)> + '_ {
        self.spec.services.iter().filter_map(|(name, spec)| {
            let engine = self.wiring.as_ref()?.engines.get(name)?;
            Some((name, spec, engine.role))
        })
    }

    /// Node label of the domain a service's gangs are packed into.
    pub fn gang_domain_label(
        &self,
        service: &str,
        spec: &ComponentSpec,
    ) -> Result<String, ReconcileError> {
        let own = spec
            .topology_constraint
            .as_ref()
            .and_then(|t| t.pack_domain.as_deref());
        let pack_domain = own.or(self
            .spec
            .topology_constraint
            .as_ref()
            .and_then(|t| t.pack_domain.as_deref()));
        match pack_domain {
            None => Ok(self.config.default_gang_domain_label.clone()),
            Some(domain) => self
                .config
                .pack_domain_labels
                .get(domain)
                .cloned()
                .ok_or_else(|| ReconcileError::UnknownPackDomain {
                    path: match own {
                        Some(_) => format!("spec.services.{service}.topologyConstraint.packDomain"),
                        None => "spec.topologyConstraint.packDomain".into(),
                    },
                    domain: domain.to_string(),
                    known: self
                        .config
                        .pack_domain_labels
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", "),
                }),
        }
    }
}

/// Refuses a graph whose generated names the API server would refuse, before anything
/// is applied: the controller then reports the first problem in the `Ready` condition.
fn check_names(g: &Graph) -> Result<(), ReconcileError> {
    match names::problems(g.name, g.spec).into_iter().next() {
        Some(problem) => Err(problem.into()),
        None => Ok(()),
    }
}

/// Reconciles one graph: see the module documentation of [`super`].
pub fn reconcile(
    dgd: &DynamoGraphDeployment,
    observed: &Observed,
    config: &OperatorConfig,
) -> Result<Desired, ReconcileError> {
    let mut g = Graph::new(dgd, config)?;
    check_names(&g)?;
    g.wire()?;
    let mut desired = Desired::default();

    let engines = replicas::reconcile_engines(&g, observed, &mut desired)?;
    services::build(&g, &mut desired);
    let serving = serving::build(&g, observed, &mut desired);
    let adapters = adapters::build(&g, observed, &mut desired);
    volumes::build(&g, observed, &mut desired);
    credential::build(&g, observed, &mut desired);
    network_policy::build(&g, &mut desired);

    // Objects of ours that nothing above wants any more, deleted after every write and in
    // the reverse of the table's order: what depends on another goes first.
    let kept: BTreeSet<(ObjectKind, &str)> = adapters
        .iter()
        .map(|name| {
            (
                ObjectKind::DynamoGraphDeploymentScalingAdapter,
                name.as_str(),
            )
        })
        .collect();
    let stale = kinds::each_kind(&mut Unwanted {
        desired: &desired,
        observed,
        kept: &kept,
    });
    desired.deletions.extend(stale.into_iter().rev().flatten());

    let unfed = status::unfed_kv_tiers(&g);
    desired.status = status::compute(
        &g,
        dgd.status.as_ref(),
        observed,
        &engines,
        &serving,
        &unfed,
    );
    for message in unfed {
        desired.decisions.push(Decision {
            severity: Severity::Warning,
            reason: status::NO_KV_CONNECTOR.into(),
            message,
        });
    }
    Ok(desired)
}

/// The objects of one kind deleted when unwanted ([`Delete::Unwanted`]) that the graph has
/// and no longer wants, by name.
struct Unwanted<'a> {
    desired: &'a Desired,
    observed: &'a Observed,
    /// Wanted objects of the kinds created once, which `desired` holds only while missing.
    kept: &'a BTreeSet<(ObjectKind, &'a str)>,
}

impl KindVisitor for Unwanted<'_> {
    type Out = Vec<ObjectKey>;

    fn visit<K: Child>(&mut self) -> Vec<ObjectKey> {
        if K::DELETE != Delete::Unwanted {
            return Vec::new();
        }
        let wanted: BTreeSet<&str> = K::desired(self.desired)
            .iter()
            .map(|o| o.meta().name.as_deref().unwrap_or_default())
            .chain(
                self.kept
                    .iter()
                    .filter(|(kind, _)| *kind == K::KIND)
                    .map(|(_, name)| *name),
            )
            .collect();
        let whole: &[K] = match K::OBSERVE {
            Observe::Keys => &[],
            Observe::Controlled(field) | Observe::Labeled(field) => (field.get)(self.observed),
        };
        let has = whole.iter().map(|o| ObjectKey {
            kind: K::KIND,
            name: o.meta().name.clone().unwrap_or_default(),
            uid: o.meta().uid.clone(),
        });
        let mut stale: Vec<ObjectKey> = self
            .observed
            .owned
            .iter()
            .filter(|k| k.kind == K::KIND)
            .cloned()
            .chain(has)
            .filter(|k| !wanted.contains(k.name.as_str()))
            .collect();
        stale.sort();
        stale.dedup();
        stale
    }
}
