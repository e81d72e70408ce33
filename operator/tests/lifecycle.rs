//! Idempotence, replacement, rollout and status through `reconcile`.

mod common;

use std::collections::BTreeSet;

use common::{cluster, now, observed, run, running, sample};
use dynamo_crds::GraphState;
use dynamo_operator::reconcile::kinds::{Child, KindVisitor, Observe, Watch, each_kind};
use dynamo_operator::reconcile::{
    Desired, ObjectKey, ObjectKind, Observed, OperatorConfig, ReconcileError, is_gated,
    pod_selector, reconcile,
};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// What the controller would observe as keys (`Observe::Keys`) once `d` is applied.
fn owned_keys(d: &Desired) -> Vec<ObjectKey> {
    struct Keys<'a>(&'a Desired);
    impl KindVisitor for Keys<'_> {
        type Out = Vec<ObjectKey>;
        fn visit<K: Child>(&mut self) -> Vec<ObjectKey> {
            if K::WATCH == Watch::No || !matches!(K::OBSERVE, Observe::Keys) {
                return Vec::new();
            }
            K::desired(self.0)
                .iter()
                .map(|o| ObjectKey {
                    kind: K::KIND,
                    name: o.meta().name.clone().unwrap(),
                    uid: None,
                })
                .collect()
        }
    }
    each_kind(&mut Keys(d)).concat()
}

/// Deployments as the API server reports them once rolled out.
fn rolled_out(d: &Desired) -> Vec<Deployment> {
    d.deployments
        .iter()
        .cloned()
        .map(|mut dep| {
            let replicas = dep.spec.as_ref().unwrap().replicas;
            dep.metadata.generation = Some(1);
            dep.status = Some(DeploymentStatus {
                observed_generation: Some(1),
                replicas,
                updated_replicas: replicas,
                ready_replicas: replicas,
                available_replicas: replicas,
                ..DeploymentStatus::default()
            });
            dep
        })
        .collect()
}

/// Everything `d` asked for, as the cluster would show it once running and ready.
fn converged(d: &Desired) -> Observed {
    Observed {
        pods: running(d, "a1"),
        deployments: rolled_out(d),
        owned: owned_keys(d),
        nodes: cluster(),
        now: Some(now()),
        ..Observed::default()
    }
}

fn names(pods: &[Pod]) -> BTreeSet<String> {
    pods.iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect()
}

#[test]
fn a_second_pass_over_its_own_output_changes_nothing() {
    for sample_name in ["agg-mocker", "disagg-mocker", "agg-vllm", "disagg-vllm"] {
        let dgd = sample(sample_name);
        let first = run(&dgd, &observed(vec![], cluster()));
        let mut obs = observed(first.pods.clone(), cluster());
        obs.deployments = first.deployments.clone();
        obs.owned = owned_keys(&first);
        let second = run(&dgd, &obs);
        assert!(
            second.deletions.is_empty(),
            "{sample_name}: {:?}",
            second.deletions
        );
        assert_eq!(first.pods, second.pods, "{sample_name}");
        assert_eq!(first.services, second.services, "{sample_name}");
        assert_eq!(first.deployments, second.deployments, "{sample_name}");
        assert_eq!(
            first.inference_pools, second.inference_pools,
            "{sample_name}"
        );
        assert!(
            second.scaling_adapters.is_empty(),
            "{sample_name}: an existing adapter is never written again"
        );
    }
}

#[test]
fn scaling_adapters_are_created_once_and_removed_with_the_setting() {
    let mut dgd = sample("disagg-vllm");
    // The setting alone: a planner gives every engine service an adapter (at the end).
    let planner = dgd.spec.services.remove("Planner").unwrap();
    let first = run(&dgd, &observed(vec![], cluster()));
    let adapters: Vec<(&str, i32, &str)> = first
        .scaling_adapters
        .iter()
        .map(|a| {
            (
                a.metadata.name.as_deref().unwrap(),
                a.spec.replicas,
                a.spec.dgd_ref.service.as_str(),
            )
        })
        .collect();
    assert_eq!(
        adapters,
        vec![
            ("disagg-vllm-vllmdecodeworker", 2, "VllmDecodeWorker"),
            ("disagg-vllm-vllmprefillworker", 1, "VllmPrefillWorker"),
        ]
    );

    // The decode service stops using its adapter: the adapter goes, the other stays.
    let obs = converged(&first);
    dgd.spec
        .services
        .get_mut("VllmDecodeWorker")
        .unwrap()
        .scaling_adapter = None;
    let step = run(&dgd, &obs);
    assert!(step.scaling_adapters.is_empty());
    let deleted: Vec<(ObjectKind, &str)> = step
        .deletions
        .iter()
        .map(|k| (k.kind, k.name.as_str()))
        .collect();
    assert_eq!(
        deleted,
        vec![(
            ObjectKind::DynamoGraphDeploymentScalingAdapter,
            "disagg-vllm-vllmdecodeworker"
        )]
    );

    // With a planner the decode service keeps its adapter without the setting.
    dgd.spec.services.insert("Planner".into(), planner);
    let step = run(&dgd, &obs);
    assert!(
        !step
            .deletions
            .iter()
            .any(|k| k.kind == ObjectKind::DynamoGraphDeploymentScalingAdapter),
        "{:?}",
        step.deletions
    );
}

#[test]
fn an_adapter_selects_the_pods_of_its_service() {
    let dgd = sample("disagg-vllm");
    let selector = |service: &str| {
        dynamo_operator::reconcile::labels::selector_string(&pod_selector(
            "disagg-vllm",
            service,
            &dgd.spec.services[service],
        ))
    };
    assert_eq!(
        selector("VllmDecodeWorker"),
        "nvidia.com/dynamo-component=VllmDecodeWorker,nvidia.com/dynamo-graph-deployment-name=disagg-vllm"
    );
    // A frontend is served by the endpoint picker's pods.
    assert_eq!(
        selector("Frontend"),
        "nvidia.com/dynamo-component-type=epp,nvidia.com/dynamo-graph-deployment-name=disagg-vllm"
    );
    // The selector matches the labels of the pods reconcile makes for the service.
    let d = run(&dgd, &observed(vec![], cluster()));
    let decode_pods = d
        .pods
        .iter()
        .filter(|p| {
            let labels = p.metadata.labels.as_ref().unwrap();
            pod_selector(
                "disagg-vllm",
                "VllmDecodeWorker",
                &dgd.spec.services["VllmDecodeWorker"],
            )
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
        })
        .count();
    assert_eq!(decode_pods, 2);
}

#[test]
fn a_gang_graph_is_a_fixed_point_once_released() {
    // Gangs are created gated and released on the next pass, once every member exists;
    // from then on the output repeats.
    let dgd = sample("multinode-vllm");
    let first = run(&dgd, &observed(vec![], cluster()));
    let second = run(&dgd, &observed(first.pods.clone(), cluster()));
    let third = run(&dgd, &observed(second.pods.clone(), cluster()));
    assert_eq!(second.pods, third.pods);
    assert!(third.deletions.is_empty());
    // Also once the released pods are bound to nodes.
    let fourth = run(&dgd, &observed(running(&third, "a1"), cluster()));
    assert_eq!(third.pods, fourth.pods);
}

#[test]
fn ready_only_when_every_service_is_ready_at_this_generation() {
    let dgd = sample("disagg-vllm");
    let first = run(&dgd, &observed(vec![], cluster()));
    assert_eq!(first.status.state, Some(GraphState::Pending));
    assert_eq!(first.status.observed_generation, Some(1));

    // Pods exist but are not ready yet.
    let mut obs = observed(first.pods.clone(), cluster());
    obs.deployments = first.deployments.clone();
    let second = run(&dgd, &obs);
    assert_eq!(second.status.state, Some(GraphState::Deploying));
    let ready = &second.status.conditions.as_ref().unwrap()[0];
    assert_eq!(
        (ready.type_.as_str(), ready.status.as_str()),
        ("Ready", "False")
    );
    assert_eq!(ready.reason, "ServicesNotReady");
    assert!(
        ready.message.contains("VllmDecodeWorker: 0/2 ready"),
        "{}",
        ready.message
    );

    // Everything running and ready.
    let mut dgd = dgd;
    let third = run(&dgd, &converged(&first));
    assert_eq!(
        third.status.state,
        Some(GraphState::Ready),
        "{:?}",
        third.status
    );
    assert_eq!(third.status.ready_services.as_deref(), Some("5/5"));
    let decode = &third.status.services.as_ref().unwrap()["VllmDecodeWorker"];
    assert_eq!(
        (
            decode.replicas,
            decode.updated_replicas,
            decode.ready_replicas
        ),
        (2, 2, 2)
    );
    let ready = &third.status.conditions.as_ref().unwrap()[0];
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "AllServicesReady")
    );

    // A decode pod stops being ready at the same generation: degraded.
    dgd.status = Some(third.status.clone());
    let mut obs = converged(&first);
    obs.now = Some(Time("2026-01-01T01:00:00Z".parse().unwrap()));
    let pod = obs
        .pods
        .iter_mut()
        .find(|p| p.metadata.name.as_deref() == Some("disagg-vllm-vllmdecodeworker-1"))
        .unwrap();
    pod.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "False".into();
    let fourth = run(&dgd, &obs);
    assert_eq!(fourth.status.state, Some(GraphState::Degraded));
    let ready = &fourth.status.conditions.as_ref().unwrap()[0];
    assert_eq!(
        ready.last_transition_time,
        obs.now.clone().unwrap(),
        "flipped now"
    );
    let gang = &fourth.status.conditions.as_ref().unwrap()[1];
    assert_eq!(
        gang.last_transition_time,
        now(),
        "unchanged condition keeps its time"
    );

    // A new generation with a changed spec is deploying, not ready, until rolled.
    dgd.metadata.generation = Some(2);
    dgd.spec.services.get_mut("VllmDecodeWorker").unwrap().envs =
        Some(vec![k8s_openapi::api::core::v1::EnvVar {
            name: "NEW".into(),
            value: Some("1".into()),
            value_from: None,
        }]);
    let fifth = run(&dgd, &converged(&first));
    assert_eq!(fifth.status.state, Some(GraphState::Deploying));
    assert_eq!(fifth.status.observed_generation, Some(2));
}

#[test]
fn a_spec_change_rolls_one_replica_at_a_time() {
    let mut dgd = sample("agg-vllm");
    dgd.spec.services.get_mut("VllmWorker").unwrap().replicas = Some(3);
    let first = run(&dgd, &observed(vec![], cluster()));
    let obs = converged(&first);

    // New image for the workers.
    let worker = dgd.spec.services.get_mut("VllmWorker").unwrap();
    worker
        .extra_pod_spec
        .as_mut()
        .unwrap()
        .main_container
        .as_mut()
        .unwrap()
        .image = Some("nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.7.0".into());
    let step = run(&dgd, &obs);
    let deleted: Vec<&str> = step.deletions.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(
        deleted,
        vec!["agg-vllm-vllmworker-0"],
        "one replica at a time"
    );
    assert!(step.decisions.iter().any(|d| d.reason == "RollingUpdate"));
    // The outdated pods are left alone rather than re-applied with an immutable change.
    assert!(!names(&step.pods).contains("agg-vllm-vllmworker-1"));

    // Replica 0 is gone: it is recreated with the new spec and nothing else is deleted.
    let mut obs2 = obs.clone();
    obs2.pods
        .retain(|p| p.metadata.name.as_deref() != Some("agg-vllm-vllmworker-0"));
    let step = run(&dgd, &obs2);
    assert!(
        step.deletions.is_empty(),
        "replica 0 is unavailable: {:?}",
        step.deletions
    );
    let new0 = step
        .pods
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some("agg-vllm-vllmworker-0"))
        .unwrap();
    assert_eq!(
        new0.spec.as_ref().unwrap().containers[0].image.as_deref(),
        Some("nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.7.0")
    );

    // The new replica 0 is running but not ready yet: still no second deletion.
    let mut obs3 = obs2.clone();
    let mut pending = new0.clone();
    pending.metadata.uid = Some("uid-new0".into());
    obs3.pods.push(pending.clone());
    assert!(run(&dgd, &obs3).deletions.is_empty());

    // Ready: the next replica goes.
    let mut obs4 = obs2.clone();
    let mut ready = running(
        &Desired {
            pods: vec![pending],
            ..Desired::default()
        },
        "a1",
    );
    obs4.pods.append(&mut ready);
    let step = run(&dgd, &obs4);
    let deleted: Vec<&str> = step.deletions.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(deleted, vec!["agg-vllm-vllmworker-1"]);
}

#[test]
fn a_failed_pod_is_deleted_and_recreated() {
    let dgd = sample("agg-mocker");
    let first = run(&dgd, &observed(vec![], cluster()));
    let mut obs = converged(&first);
    let failed = obs
        .pods
        .iter_mut()
        .find(|p| p.metadata.name.as_deref() == Some("agg-mocker-worker-1"))
        .unwrap();
    failed.status.as_mut().unwrap().phase = Some("Failed".into());
    let step = run(&dgd, &obs);
    assert_eq!(
        step.deletions,
        vec![ObjectKey {
            kind: ObjectKind::Pod,
            name: "agg-mocker-worker-1".into(),
            uid: Some("uid-agg-mocker-worker-1".into()),
        }]
    );
    assert!(step.decisions.iter().any(|d| d.reason == "PodFailed"));
    obs.pods
        .retain(|p| p.metadata.name.as_deref() != Some("agg-mocker-worker-1"));
    let step = run(&dgd, &obs);
    assert!(names(&step.pods).contains("agg-mocker-worker-1"));
    assert!(step.deletions.is_empty());
}

#[test]
fn scaling_down_and_removing_services_deletes_their_objects() {
    let mut dgd = sample("disagg-mocker");
    let first = run(&dgd, &observed(vec![], cluster()));
    let obs = converged(&first);
    let deleted = |step: &Desired| -> BTreeSet<(ObjectKind, String)> {
        step.deletions
            .iter()
            .map(|k| (k.kind, k.name.clone()))
            .collect()
    };
    let pod = |name: &str| (ObjectKind::Pod, name.to_string());
    let service = |name: &str| (ObjectKind::Service, name.to_string());

    dgd.spec.services.get_mut("decode").unwrap().replicas = Some(1);
    let step = run(&dgd, &obs);
    assert_eq!(
        deleted(&step),
        BTreeSet::from([pod("disagg-mocker-decode-1")])
    );

    dgd.spec.services.remove("prefill");
    let gone = deleted(&run(&dgd, &obs));
    for object in [
        pod("disagg-mocker-prefill-0"),
        service("disagg-mocker-prefill"),
        service("disagg-mocker-prefill-peers"),
        // Its sidecar has no prefill peers left: the decode pod rolls.
        pod("disagg-mocker-decode-0"),
    ] {
        assert!(gone.contains(&object), "{object:?} not in {gone:?}");
    }
}

#[test]
fn serving_objects_follow_the_graph() {
    let dgd = sample("disagg-vllm");
    let d = run(&dgd, &observed(vec![], cluster()));
    // Frontend and Epp share one EPP Deployment; the frontend keeps a Service of its name.
    assert_eq!(d.deployments.len(), 2, "epp and planner");
    let epp = &d.deployments[0];
    assert_eq!(epp.metadata.name.as_deref(), Some("disagg-vllm-epp"));
    let args = epp
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .args
        .clone()
        .unwrap();
    let joined = args.join(" ");
    assert!(joined.contains("--prefill-selector nvidia.com/dynamo-inference-pool=disagg-vllm,nvidia.com/dynamo-role=prefill"), "{joined}");
    assert!(joined.contains("--decode-selector"), "{joined}");
    assert!(names_of_services(&d).contains("disagg-vllm-frontend"));
    let pool = &d.inference_pools[0];
    assert_eq!(pool.spec.target_ports[0].number, 8000);
    assert_eq!(pool.spec.endpoint_picker_ref.name, "disagg-vllm-epp");
    assert_eq!(pool.spec.endpoint_picker_ref.port.unwrap().number, 9002);
    assert!(d.http_routes.is_empty(), "no gateway annotation, no route");

    let mut dgd = dgd;
    dgd.metadata.annotations =
        Some([("nvidia.com/dynamo-gateway".to_string(), "gw".to_string())].into());
    let d = run(&dgd, &observed(vec![], cluster()));
    let route = &d.http_routes[0];
    let parent = &route.spec.parent_refs.as_ref().unwrap()[0];
    assert_eq!(
        (parent.name.as_str(), parent.namespace.as_deref()),
        ("gw", None)
    );
    let backend = &route.spec.rules.as_ref().unwrap()[0]
        .backend_refs
        .as_ref()
        .unwrap()[0];
    assert_eq!(backend.kind.as_deref(), Some("InferencePool"));
    assert_eq!(backend.name, "disagg-vllm-pool");

    // Every object is owned by the graph, as controller.
    for owner in d
        .pods
        .iter()
        .map(|p| &p.metadata)
        .chain(d.services.iter().map(|s| &s.metadata))
        .chain(d.deployments.iter().map(|s| &s.metadata))
        .chain(d.inference_pools.iter().map(|s| &s.metadata))
        .chain(d.http_routes.iter().map(|s| &s.metadata))
        .map(|m| &m.owner_references.as_ref().unwrap()[0])
    {
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("DynamoGraphDeployment", Some(true))
        );
    }
}

#[test]
fn the_epp_gets_its_own_access_unless_the_graph_names_an_account() {
    let mut dgd = sample("disagg-vllm");
    let first = run(&dgd, &observed(vec![], cluster()));
    let epp_pod = |d: &Desired| {
        d.deployments[0]
            .spec
            .clone()
            .unwrap()
            .template
            .spec
            .unwrap()
    };
    assert_eq!(
        epp_pod(&first).service_account_name.as_deref(),
        Some("disagg-vllm-epp")
    );
    let role = &first.roles[0];
    let granted: BTreeSet<(String, String)> = role
        .rules
        .iter()
        .flatten()
        .flat_map(|r| {
            let resource = r.resources.clone().unwrap()[0].clone();
            r.verbs.iter().map(move |v| (resource.clone(), v.clone()))
        })
        .collect();
    let expected: BTreeSet<(String, String)> = [
        ("inferencepools", "list"),
        ("inferencepools", "watch"),
        ("pods", "list"),
        ("pods", "watch"),
    ]
    .into_iter()
    .map(|(r, v)| (r.to_string(), v.to_string()))
    .collect();
    assert_eq!(granted, expected, "watches only, nothing to write");
    let binding = &first.role_bindings[0];
    assert_eq!(binding.role_ref.name, "disagg-vllm-epp");
    let subject = &binding.subjects.as_ref().unwrap()[0];
    assert_eq!(
        (
            subject.kind.as_str(),
            subject.name.as_str(),
            subject.namespace.as_deref()
        ),
        ("ServiceAccount", "disagg-vllm-epp", Some("inference"))
    );

    // The user's own account: ours are neither created nor kept.
    dgd.spec
        .services
        .get_mut("Epp")
        .unwrap()
        .extra_pod_spec
        .get_or_insert_default()
        .service_account_name = Some("platform-epp".into());
    let second = run(&dgd, &converged(&first));
    assert_eq!(
        epp_pod(&second).service_account_name.as_deref(),
        Some("platform-epp")
    );
    // (The planner's own access stays.)
    let named_epp = |name: Option<&String>| name.is_some_and(|n| n == "disagg-vllm-epp");
    assert!(
        !second
            .service_accounts
            .iter()
            .any(|a| named_epp(a.metadata.name.as_ref()))
            && !second
                .roles
                .iter()
                .any(|r| named_epp(r.metadata.name.as_ref()))
    );
    let deleted: BTreeSet<(ObjectKind, &str)> = second
        .deletions
        .iter()
        .map(|k| (k.kind, k.name.as_str()))
        .collect();
    for kind in [
        ObjectKind::ServiceAccount,
        ObjectKind::Role,
        ObjectKind::RoleBinding,
    ] {
        assert!(deleted.contains(&(kind, "disagg-vllm-epp")), "{kind:?}");
    }
}

#[test]
fn an_annotated_graph_hands_its_engine_pods_to_a_batch_scheduler() {
    let mut dgd = sample("multinode-vllm");
    dgd.metadata.annotations = Some(
        [
            ("nvidia.com/dynamo-scheduler", "kai"),
            ("nvidia.com/dynamo-scheduler-queue", "inference"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    );
    let d = run(&dgd, &observed(vec![], cluster()));
    assert!(!d.pods.is_empty());
    for pod in &d.pods {
        let name = pod.metadata.name.as_deref().unwrap();
        assert_eq!(
            pod.spec.as_ref().unwrap().scheduler_name.as_deref(),
            Some("kai-scheduler"),
            "{name}"
        );
        assert_eq!(
            pod.metadata.labels.as_ref().unwrap()["kai.scheduler/queue"],
            "inference",
            "{name}"
        );
        // A gang's gate still holds until the operator finds the whole gang a domain.
        let in_gang = pod
            .metadata
            .labels
            .as_ref()
            .unwrap()
            .contains_key("nvidia.com/dynamo-gang");
        assert_eq!(is_gated(pod), in_gang, "{name}");
    }
    let epp = d.deployments[0]
        .spec
        .clone()
        .unwrap()
        .template
        .spec
        .unwrap();
    assert_eq!(
        epp.scheduler_name, None,
        "the CPU-only EPP stays with the default"
    );

    dgd.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("nvidia.com/dynamo-scheduler".into(), "slurm".into());
    assert_eq!(
        reconcile(&dgd, &Observed::default(), &OperatorConfig::default()),
        Err(ReconcileError::UnknownScheduler {
            value: "slurm".into()
        })
    );
}

fn names_of_services(d: &Desired) -> BTreeSet<String> {
    d.services
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect()
}

#[test]
fn unusable_graphs_are_typed_errors() {
    let mut dgd = sample("agg-mocker");
    dgd.metadata.uid = None;
    assert_eq!(
        reconcile(&dgd, &Observed::default(), &OperatorConfig::default()),
        Err(ReconcileError::MissingMetadata("uid"))
    );
    let mut dgd = sample("multinode-vllm");
    dgd.spec.topology_constraint.as_mut().unwrap().pack_domain = Some("rack".into());
    dgd.spec
        .services
        .get_mut("VllmDecodeWorker")
        .unwrap()
        .topology_constraint = None;
    let err = reconcile(&dgd, &Observed::default(), &OperatorConfig::default()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("spec.topologyConstraint.packDomain: unknown pack domain \"rack\""),
        "{err}"
    );
    // A service's own constraint is named as the service's field.
    let decode = dgd.spec.services.get_mut("VllmDecodeWorker").unwrap();
    decode.topology_constraint = dgd.spec.topology_constraint.clone();
    let err = reconcile(&dgd, &Observed::default(), &OperatorConfig::default()).unwrap_err();
    assert!(
        err.to_string().starts_with(
            "spec.services.VllmDecodeWorker.topologyConstraint.packDomain: unknown pack domain"
        ),
        "{err}"
    );
}
