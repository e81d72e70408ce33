//! The kubelet's part, as kwok plays it: nodes registered through the API with their
//! capacity and a Ready condition, and every pod the real scheduler binds to one of them
//! marked Running and Ready through the status subresource. A bound pod being deleted is
//! removed at once, as a kubelet does once its containers have stopped.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, Ordering};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt as _};
use serde_json::{Value, json};

/// The label of a node's NVLink domain, as NVIDIA's GPU feature discovery sets it.
pub const CLIQUE_LABEL: &str = "nvidia.com/gpu.clique";

/// A node to register.
#[derive(Clone, Debug)]
pub struct FakeNode {
    pub name: String,
    /// `nvidia.com/gpu` in its capacity.
    pub gpus: u32,
    /// Labels beside `kubernetes.io/hostname`.
    pub labels: BTreeMap<String, String>,
}

impl FakeNode {
    /// A node with `gpus` GPUs in the NVLink domain `clique`.
    pub fn gpu(name: &str, clique: &str, gpus: u32) -> Self {
        FakeNode {
            name: name.into(),
            gpus,
            labels: BTreeMap::from([(CLIQUE_LABEL.to_string(), clique.to_string())]),
        }
    }
}

/// Registers `nodes` as Ready, schedulable nodes.
pub async fn add_nodes(client: &Client, nodes: &[FakeNode]) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    for (i, node) in nodes.iter().enumerate() {
        let mut labels = node.labels.clone();
        labels.insert("kubernetes.io/hostname".into(), node.name.clone());
        labels.insert("kubernetes.io/os".into(), "linux".into());
        let object: Node = serde_json::from_value(json!({
            "metadata": {"name": node.name, "labels": labels},
        }))?;
        api.create(&PostParams::default(), &object).await?;
        let resources = json!({
            "cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti",
            "nvidia.com/gpu": node.gpus.to_string(),
        });
        let now = now();
        let status = json!({"status": {
            "capacity": resources, "allocatable": resources,
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "envtest's kubelet", "lastHeartbeatTime": now, "lastTransitionTime": now,
            }],
            "addresses": [{"type": "InternalIP", "address": node_ip(i)}],
        }});
        api.patch_status(&node.name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        // The TaintNodesByCondition admission taints a new node not-ready until the node
        // lifecycle controller sees it Ready; here nothing else will lift it.
        api.patch(
            &node.name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"taints": null}})),
        )
        .await?;
    }
    Ok(())
}

fn node_ip(i: usize) -> String {
    Ipv4Addr::new(10, 1, (i / 250) as u8, (i % 250 + 1) as u8).to_string()
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Plays the kubelet for every node until the task is dropped (abort the handle).
pub fn run(client: Client) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let pods: Api<Pod> = Api::all(client);
        let config = watcher::Config::default().fields("spec.nodeName!=");
        let next_ip = AtomicU32::new(0);
        let events = watcher::watcher(pods.clone(), config).default_backoff();
        events
            .for_each(|event| async {
                match event {
                    Ok(Event::Apply(pod) | Event::InitApply(pod)) => {
                        if let Err(e) = tend(&pods, &pod, &next_ip).await {
                            tracing::warn!(pod = %pod.name_any(), error = %e, "envtest kubelet");
                        }
                    }
                    Ok(_) => {}
                    Err(e) => tracing::debug!(error = %e, "envtest kubelet: watch"),
                }
            })
            .await;
    })
}

/// Brings one bound pod to where a kubelet would: running and ready, or gone once deleted.
async fn tend(pods: &Api<Pod>, pod: &Pod, next_ip: &AtomicU32) -> anyhow::Result<()> {
    let namespace = pod.namespace().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(pods.clone().into_client(), &namespace);
    let name = pod.name_any();
    if pod.metadata.deletion_timestamp.is_some() {
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
    let status = pod.status.as_ref();
    if status.and_then(|s| s.phase.as_deref()) == Some("Running") {
        return Ok(());
    }
    let spec = pod.spec.as_ref().expect("a bound pod has a spec");
    let now = now();
    let running = |name: &str, image: &Option<String>| {
        json!({
            "name": name, "image": image, "imageID": "", "ready": true, "started": true,
            "restartCount": 0, "containerID": format!("envtest://{namespace}/{}/{name}", pod.name_any()),
            "state": {"running": {"startedAt": now}},
        })
    };
    let containers: Vec<Value> = spec
        .containers
        .iter()
        .map(|c| running(&c.name, &c.image))
        .collect();
    // Native sidecars (restartPolicy Always) keep running; other init containers are done.
    let init: Vec<Value> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| {
            if c.restart_policy.as_deref() == Some("Always") {
                running(&c.name, &c.image)
            } else {
                json!({
                    "name": c.name, "image": c.image, "imageID": "", "ready": true,
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                        "startedAt": now, "finishedAt": now}},
                })
            }
        })
        .collect();
    let n = next_ip.fetch_add(1, Ordering::Relaxed);
    let ip = Ipv4Addr::new(10, 244, (n / 250) as u8, (n % 250 + 1) as u8).to_string();
    let condition = |kind: &str| json!({"type": kind, "status": "True", "lastTransitionTime": now, "lastProbeTime": null});
    let conditions = ["PodScheduled", "Initialized", "ContainersReady", "Ready"].map(condition);
    let patch = json!({"status": {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "startTime": now,
        "conditions": conditions,
        "containerStatuses": containers,
        "initContainerStatuses": init,
    }});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}
