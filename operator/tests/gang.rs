//! Gang placement on hand-made node sets, alone and through `reconcile`.

mod common;

use common::{busy_pod, cluster, gpu_node, observed, run, running, sample};
use dynamo_operator::reconcile::gang::{GangPlacement, GangRequest, place};
use dynamo_operator::reconcile::{ObjectKind, Severity, is_gated, pinned_domain};
use k8s_openapi::api::core::v1::Pod;

fn request(pods: u32, gpus: u32) -> GangRequest {
    GangRequest {
        name: "g-decode-0".into(),
        pods,
        gpus_per_pod: gpus,
        gpu_resource: "nvidia.com/gpu".into(),
        domain_label: "nvidia.com/gpu.clique".into(),
    }
}

fn pinned_clique(pod: &Pod) -> Option<String> {
    pinned_domain(pod, "nvidia.com/gpu.clique")
}

#[test]
fn fits_in_one_domain_with_best_fit_and_name_tie_break() {
    // clique-b has a node with 4 GPUs taken: it still fits 2x4 and has less to spare.
    let nodes = cluster();
    let busy = vec![busy_pod("other", "b1", 4)];
    match place(&request(2, 4), &nodes, &busy) {
        GangPlacement::Placed(p) => {
            assert_eq!(p.domain, "clique-b");
            assert_eq!(p.nodes, vec!["b1", "b2"]);
            assert_eq!(p.spare_gpus, 4);
        }
        other => panic!("expected a placement, got {other:?}"),
    }
    // Equal spare everywhere: the first domain by name.
    match place(&request(2, 8), &nodes, &[]) {
        GangPlacement::Placed(p) => assert_eq!(p.domain, "clique-a"),
        other => panic!("expected a placement, got {other:?}"),
    }
}

#[test]
fn never_splits_a_gang_across_domains_or_shares_a_node() {
    // 16 GPUs are free in total across domains, but no domain has two free 8-GPU nodes.
    let nodes = vec![gpu_node("a1", "clique-a", 8), gpu_node("b1", "clique-b", 8)];
    match place(&request(2, 8), &nodes, &[]) {
        GangPlacement::Pending {
            reason,
            missing_gpus,
        } => {
            assert_eq!(missing_gpus, 8);
            assert!(reason.contains("needs 16 GPUs"), "{reason}");
            assert!(reason.contains("nvidia.com/gpu.clique"), "{reason}");
            assert!(reason.contains("has 8 usable"), "{reason}");
        }
        other => panic!("expected pending, got {other:?}"),
    }
    // One 16-GPU node does not host two pods of the gang either.
    let big = vec![gpu_node("x1", "clique-x", 16)];
    assert!(matches!(
        place(&request(2, 8), &big, &[]),
        GangPlacement::Pending {
            missing_gpus: 8,
            ..
        }
    ));
}

#[test]
fn terminated_pods_hold_no_gpus() {
    let nodes = vec![gpu_node("a1", "clique-a", 8), gpu_node("a2", "clique-a", 8)];
    let mut done = busy_pod("done", "a1", 8);
    done.status.as_mut().unwrap().phase = Some("Succeeded".into());
    assert!(matches!(
        place(&request(2, 8), &nodes, &[done]),
        GangPlacement::Placed(_)
    ));
}

/// multinode-vllm's decode gang (2 pods x 8 GPUs) on a cluster where one node of each
/// domain is busy: created gated, stays gated with the reason, released when a node frees.
#[test]
fn gang_stays_gated_until_a_node_frees_then_releases_together() {
    let dgd = sample("multinode-vllm");
    let nodes = vec![
        gpu_node("a1", "clique-a", 8),
        gpu_node("a2", "clique-a", 8),
        gpu_node("b1", "clique-b", 8),
        gpu_node("b2", "clique-b", 8),
    ];
    let blockers = vec![busy_pod("train-a", "a2", 8), busy_pod("train-b", "b2", 8)];

    let mut obs = observed(vec![], nodes.clone());
    obs.other_pods = blockers.clone();
    let first = run(&dgd, &obs);
    let gang: Vec<&Pod> = first
        .pods
        .iter()
        .filter(|p| {
            p.metadata
                .name
                .as_deref()
                .unwrap()
                .contains("vllmdecodeworker")
        })
        .collect();
    assert_eq!(gang.len(), 2);
    assert!(gang.iter().all(|p| is_gated(p)), "created behind the gate");

    // Second pass: both members exist, but no domain has two free 8-GPU nodes.
    let mut obs = observed(first.pods.clone(), nodes.clone());
    obs.other_pods = blockers.clone();
    let second = run(&dgd, &obs);
    let gang: Vec<&Pod> = second
        .pods
        .iter()
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .unwrap()
                .contains_key("nvidia.com/dynamo-gang")
        })
        .collect();
    assert!(gang.iter().all(|p| is_gated(p)), "stays gated");
    let ready = second.status.conditions.as_ref().unwrap();
    let gang_condition = ready.iter().find(|c| c.type_ == "GangScheduled").unwrap();
    assert_eq!(gang_condition.status, "False");
    assert_eq!(gang_condition.reason, "GangPending");
    assert!(
        gang_condition
            .message
            .contains("VllmDecodeWorker replica 0")
            && gang_condition.message.contains("needs 16 GPUs"),
        "{}",
        gang_condition.message
    );
    assert!(
        second
            .decisions
            .iter()
            .any(|d| d.reason == "GangPending" && d.severity == Severity::Warning)
    );
    assert_ne!(
        second.status.state,
        Some(dynamo_crds::GraphState::Failed),
        "it can fit later"
    );

    // The training pod on b2 finishes: clique-b now fits, every member is released at once.
    let mut finished = blockers.clone();
    finished[1].status.as_mut().unwrap().phase = Some("Succeeded".into());
    let mut obs = observed(first.pods.clone(), nodes);
    obs.other_pods = finished;
    let third = run(&dgd, &obs);
    let gang: Vec<&Pod> = third
        .pods
        .iter()
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .unwrap()
                .contains_key("nvidia.com/dynamo-gang")
        })
        .collect();
    assert_eq!(gang.len(), 2);
    for pod in &gang {
        assert!(!is_gated(pod));
        assert_eq!(pinned_clique(pod).as_deref(), Some("clique-b"));
    }
    assert!(third.decisions.iter().any(|d| d.reason == "GangScheduled"));
}

#[test]
fn a_gang_that_can_never_fit_fails_the_graph() {
    let dgd = sample("multinode-vllm");
    let nodes = vec![gpu_node("a1", "clique-a", 4), gpu_node("a2", "clique-a", 4)];
    let first = run(&dgd, &observed(vec![], nodes.clone()));
    let second = run(&dgd, &observed(first.pods.clone(), nodes));
    assert_eq!(second.status.state, Some(dynamo_crds::GraphState::Failed));
    let gang = second
        .status
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == "GangScheduled")
        .unwrap();
    assert_eq!(gang.reason, "GangUnschedulable");
}

#[test]
fn a_gang_that_lost_a_member_restarts_as_a_whole() {
    let dgd = sample("multinode-vllm");
    let first = run(&dgd, &observed(vec![], cluster()));
    let second = run(&dgd, &observed(first.pods.clone(), cluster()));
    let mut pods = running(&second, "a1");
    // The worker of the gang is evicted and gone.
    pods.retain(|p| p.metadata.name.as_deref() != Some("multinode-vllm-vllmdecodeworker-0-wkr-1"));
    let third = run(&dgd, &observed(pods, cluster()));
    let deleted: Vec<&str> = third
        .deletions
        .iter()
        .filter(|k| k.kind == ObjectKind::Pod)
        .map(|k| k.name.as_str())
        .collect();
    assert_eq!(deleted, vec!["multinode-vllm-vllmdecodeworker-0-ldr"]);
    assert!(
        !third.pods.iter().any(|p| p
            .metadata
            .name
            .as_deref()
            .unwrap()
            .starts_with("multinode-vllm-vllmdecodeworker")),
        "nothing of the gang is applied while it restarts"
    );
    assert!(third.decisions.iter().any(|d| d.reason == "GangRestart"));
    // Once the leader is gone too, the whole gang is created again, gated.
    let mut pods = running(&second, "a1");
    pods.retain(|p| {
        !p.metadata
            .name
            .as_deref()
            .unwrap()
            .contains("vllmdecodeworker")
    });
    let fourth = run(&dgd, &observed(pods, cluster()));
    let recreated: Vec<&Pod> = fourth
        .pods
        .iter()
        .filter(|p| {
            p.metadata
                .name
                .as_deref()
                .unwrap()
                .contains("vllmdecodeworker")
        })
        .collect();
    assert_eq!(recreated.len(), 2);
    assert!(recreated.iter().all(|p| is_gated(p)));
}

#[test]
fn two_gangs_in_one_pass_do_not_take_the_same_gpus() {
    let mut dgd = sample("multinode-vllm");
    dgd.spec
        .services
        .get_mut("VllmDecodeWorker")
        .unwrap()
        .replicas = Some(2);
    let nodes = cluster();
    let first = run(&dgd, &observed(vec![], nodes.clone()));
    let second = run(&dgd, &observed(first.pods.clone(), nodes));
    let mut cliques: Vec<String> = second
        .pods
        .iter()
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .unwrap()
                .get("nvidia.com/dynamo-gang-rank")
                .map(String::as_str)
                == Some("0")
        })
        .filter_map(pinned_clique)
        .collect();
    cliques.sort();
    assert_eq!(cliques, vec!["clique-a", "clique-b"]);
}

#[test]
fn a_pods_init_containers_hold_gpus_as_the_scheduler_counts_them() {
    use k8s_openapi::api::core::v1::Container;
    let nodes = vec![gpu_node("a1", "clique-a", 8)];
    let with_init = |restart_policy: Option<&str>, gpus: u32| {
        let mut pod = busy_pod("other", "a1", 2);
        let spec = pod.spec.as_mut().unwrap();
        let mut init = spec.containers[0].clone();
        init.name = "init".into();
        init.restart_policy = restart_policy.map(str::to_string);
        init.resources = busy_pod("x", "a1", gpus).spec.unwrap().containers[0]
            .resources
            .clone();
        spec.init_containers = Some(vec![init]);
        spec.containers.push(Container {
            name: "no-gpu".into(),
            ..Container::default()
        });
        pod
    };
    // A native sidecar runs beside the containers: 2 + 2 held, 4 free.
    let sidecar = [with_init(Some("Always"), 2)];
    assert!(matches!(
        place(&request(1, 4), &nodes, &sidecar),
        GangPlacement::Placed(_)
    ));
    match place(&request(1, 5), &nodes, &sidecar) {
        GangPlacement::Pending { missing_gpus, .. } => assert_eq!(missing_gpus, 1),
        other => panic!("expected pending, got {other:?}"),
    }
    // An ordinary init container runs before them: the larger of 7 and 2 is held.
    let init = [with_init(None, 7)];
    assert!(matches!(
        place(&request(1, 1), &nodes, &init),
        GangPlacement::Placed(_)
    ));
    assert!(matches!(
        place(&request(1, 2), &nodes, &init),
        GangPlacement::Pending { .. }
    ));
}
