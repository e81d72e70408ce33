//! The graph's status: per-service replica counts, the lifecycle state, and the `Ready`,
//! `GangScheduled` and (with KV block tiers) `KvTiersFed` conditions with reasons a
//! person can act on.

use std::collections::BTreeMap;

use dynamo_crds::{DynamoGraphDeploymentStatus, GraphState, ServiceReplicaStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::Observed;
use super::graph::Graph;
use super::replicas::EngineOutcome;
use super::serving::DeploymentOutcome;

pub const READY: &str = "Ready";
pub const GANG_SCHEDULED: &str = "GangScheduled";
/// Present when a service sets KV block tiers: False while one's engine cannot feed them.
pub const KV_TIERS_FED: &str = "KvTiersFed";
/// The reason of a False [`KV_TIERS_FED`], and of its Warning Event.
pub const NO_KV_CONNECTOR: &str = "NoKvConnector";

pub(crate) fn compute(
    g: &Graph,
    previous: Option<&DynamoGraphDeploymentStatus>,
    observed: &Observed,
    engines: &[EngineOutcome],
    serving: &[DeploymentOutcome],
    unfed: &[String],
) -> DynamoGraphDeploymentStatus {
    let mut services: BTreeMap<String, (ServiceReplicaStatus, bool)> = BTreeMap::new();
    for e in engines {
        services.insert(e.service.clone(), (e.status.clone(), e.ready));
    }
    for d in serving {
        services.insert(d.service.clone(), (d.status.clone(), d.ready));
    }
    let ready_count = services.values().filter(|(_, ready)| *ready).count();
    // Every service in the spec must be accounted for and ready; an empty graph is not "ready".
    let all_ready = !g.spec.services.is_empty()
        && g.spec
            .services
            .keys()
            .all(|name| services.get(name).is_some_and(|(_, r)| *r));

    let pending: Vec<&String> = engines.iter().flat_map(|e| &e.gangs_pending).collect();
    let unschedulable: Vec<&String> = engines
        .iter()
        .flat_map(|e| &e.gangs_unschedulable)
        .collect();
    let has_gangs = engines.iter().any(|e| e.has_gangs);

    let previous_state = previous.and_then(|p| p.state);
    let same_generation = previous.and_then(|p| p.observed_generation) == g.generation;
    let nothing_exists = observed.pods.is_empty() && observed.deployments.is_empty();
    let state = if !unschedulable.is_empty() {
        GraphState::Failed
    } else if all_ready {
        GraphState::Ready
    } else if nothing_exists {
        GraphState::Pending
    } else if same_generation
        && matches!(
            previous_state,
            Some(GraphState::Ready | GraphState::Degraded)
        )
    {
        GraphState::Degraded
    } else {
        GraphState::Deploying
    };

    let join = |v: &[&String]| v.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("; ");
    let not_ready: Vec<String> = g
        .spec
        .services
        .keys()
        .filter(|name| !services.get(*name).is_some_and(|(_, r)| *r))
        .map(|name| {
            let desired = g.spec.services[name].replicas.unwrap_or(1);
            let s = services
                .get(name)
                .map(|(s, _)| s.clone())
                .unwrap_or_default();
            format!(
                "{name}: {}/{desired} ready, {}/{desired} updated",
                s.ready_replicas, s.updated_replicas
            )
        })
        .collect();
    let ready = if all_ready {
        (
            "True",
            "AllServicesReady",
            format!("all {} services are ready", services.len()),
        )
    } else if !unschedulable.is_empty() {
        ("False", "GangUnschedulable", join(&unschedulable))
    } else if !pending.is_empty() {
        ("False", "GangPending", join(&pending))
    } else {
        ("False", "ServicesNotReady", not_ready.join("; "))
    };
    let gang = if !has_gangs {
        (
            "True",
            "NoGangs",
            "the graph has no multinode services".to_string(),
        )
    } else if !unschedulable.is_empty() {
        ("False", "GangUnschedulable", join(&unschedulable))
    } else if !pending.is_empty() {
        ("False", "GangPending", join(&pending))
    } else {
        (
            "True",
            "AllGangsPlaced",
            "every gang is placed in one domain".to_string(),
        )
    };

    let tiered = g
        .wiring
        .iter()
        .flat_map(|w| w.engines.values())
        .any(|e| e.kvbm.is_some());
    let kv_tiers = tiered.then(|| {
        if unfed.is_empty() {
            (
                "True",
                "EnginesFeedTiers",
                "every service with KV block tiers runs an engine that offloads to them"
                    .to_string(),
            )
        } else {
            ("False", NO_KV_CONNECTOR, unfed.join("; "))
        }
    });

    let now = observed
        .now
        .clone()
        .unwrap_or(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    let previous_conditions = previous
        .and_then(|p| p.conditions.as_deref())
        .unwrap_or(&[]);
    let condition = |type_: &str, (status, reason, message): (&str, &str, String)| {
        // The transition time moves only when the status flips.
        let last_transition_time = previous_conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message,
            observed_generation: g.generation,
            last_transition_time,
        }
    };

    DynamoGraphDeploymentStatus {
        observed_generation: g.generation,
        state: Some(state),
        ready_services: Some(format!("{ready_count}/{}", g.spec.services.len())),
        conditions: Some(
            [
                Some(condition(READY, ready)),
                Some(condition(GANG_SCHEDULED, gang)),
                kv_tiers.map(|t| condition(KV_TIERS_FED, t)),
            ]
            .into_iter()
            .flatten()
            .collect(),
        ),
        services: Some(services.into_iter().map(|(k, (s, _))| (k, s)).collect()),
    }
}

/// Why each service's KV block tiers hold nothing (see
/// [`dynamo_wiring::EngineService::unfed_kv_tiers`]), in service order: the message of
/// the `KvTiersFed` condition and of its Warning Event.
pub(crate) fn unfed_kv_tiers(g: &Graph) -> Vec<String> {
    g.wiring
        .iter()
        .flat_map(|w| &w.engines)
        .filter_map(|(name, e)| e.unfed_kv_tiers(name))
        .collect()
}

#[cfg(test)]
mod tests {
    use dynamo_crds::DynamoGraphDeployment;
    use serde_json::{Value, json};

    use super::super::{Desired, Observed, OperatorConfig, Severity, reconcile};
    use super::*;

    fn desired(backend: &str, worker: Value) -> Desired {
        let dgd: DynamoGraphDeployment = serde_json::from_value(json!({
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": "DynamoGraphDeployment",
            "metadata": {"name": "g", "namespace": "ns", "uid": "u"},
            "spec": {"backendFramework": backend, "services": {"worker": worker}},
        }))
        .unwrap();
        reconcile(&dgd, &Observed::default(), &OperatorConfig::default()).unwrap()
    }

    fn kv_condition(d: &Desired) -> Option<&Condition> {
        d.status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == KV_TIERS_FED)
    }

    #[test]
    fn tiers_an_engine_cannot_feed_are_a_false_condition_and_a_warning() {
        let tiers = json!([{"name": "DYN_KVBM_CPU_CACHE_GB", "value": "2"}]);
        let sglang = desired(
            "sglang",
            json!({"componentType": "worker", "envs": tiers,
                   "extraPodSpec": {"mainContainer": {"command": ["python3", "-m", "sglang.launch_server", "--model-path", "m"]}}}),
        );
        let c = kv_condition(&sglang).expect("a KvTiersFed condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", NO_KV_CONNECTOR)
        );
        assert!(
            c.message.starts_with("worker: KV block tiers are set"),
            "{}",
            c.message
        );
        let warnings: Vec<_> = sglang
            .decisions
            .iter()
            .filter(|d| d.reason == NO_KV_CONNECTOR)
            .collect();
        assert_eq!(warnings.len(), 1);
        assert_eq!(warnings[0].severity, Severity::Warning);
        assert_eq!(warnings[0].message, c.message);

        // vLLM feeds them through our connector, one rank per engine.
        let vllm = |flags: &[&str]| {
            let mut command = vec!["vllm", "serve", "m"];
            command.extend(flags);
            desired(
                "vllm",
                json!({"componentType": "worker", "envs": tiers,
                       "extraPodSpec": {"mainContainer": {"command": command}}}),
            )
        };
        let tp = vllm(&["--tensor-parallel-size", "2"]);
        let c = kv_condition(&tp).expect("a KvTiersFed condition");
        assert_eq!(c.status, "False");
        assert!(c.message.contains("runs 2 ranks"), "{}", c.message);
        for fed in [
            vllm(&[]),
            desired("mocker", json!({"componentType": "worker", "envs": tiers})),
        ] {
            let c = kv_condition(&fed).expect("a KvTiersFed condition");
            assert_eq!(
                (c.status.as_str(), c.reason.as_str()),
                ("True", "EnginesFeedTiers")
            );
            assert!(fed.decisions.iter().all(|d| d.reason != NO_KV_CONNECTOR));
        }

        let untiered = desired("mocker", json!({"componentType": "worker"}));
        assert_eq!(kv_condition(&untiered), None);
    }
}
