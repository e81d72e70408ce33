//! Gang placement: find one topology domain where every pod of a multinode replica fits.
//!
//! A domain is the set of nodes sharing one value of a node label (by default
//! `nvidia.com/gpu.clique`, the NVLink domain). One pod per node (the pods also carry a
//! required pod anti-affinity on the hostname, so the kube-scheduler keeps it that way).
//! Free GPUs on a node = allocatable minus what bound, non-terminated pods request.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Node, Pod};

/// GPU resource when a service does not name one.
pub const DEFAULT_GPU_RESOURCE: &str = "nvidia.com/gpu";

/// What one gang needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GangRequest {
    /// Gang name, used in messages.
    pub name: String,
    /// Pods in the gang (`multinode.nodeCount`), one per node.
    pub pods: u32,
    /// GPUs each pod requests.
    pub gpus_per_pod: u32,
    /// Extended resource name of the GPU, e.g. `nvidia.com/gpu`.
    pub gpu_resource: String,
    /// Node label whose values define the domains.
    pub domain_label: String,
}

impl GangRequest {
    /// GPUs of the whole gang.
    pub fn total_gpus(&self) -> u32 {
        self.pods * self.gpus_per_pod
    }
}

/// Where a gang goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Node label the gang is pinned by.
    pub domain_label: String,
    /// Value of that label for the chosen domain.
    pub domain: String,
    /// The nodes that fit it (informational: the kube-scheduler binds within the domain).
    pub nodes: Vec<String>,
    /// Free GPUs left in the domain after the gang (lower is a tighter fit).
    pub spare_gpus: u32,
}

/// Result of [`place`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GangPlacement {
    /// Every pod fits in one domain.
    Placed(Placement),
    /// No domain fits; the gang stays gated.
    Pending {
        /// A sentence a person can act on.
        reason: String,
        /// GPUs missing in the domain closest to fitting.
        missing_gpus: u32,
    },
}

/// Places `request` on `nodes`, given every pod bound to a node (from any workload).
pub fn place(request: &GangRequest, nodes: &[Node], bound_pods: &[Pod]) -> GangPlacement {
    Capacity::from_cluster(nodes, bound_pods.iter()).place(request)
}

/// Free resources per schedulable node, updated as gangs are placed in one pass.
#[derive(Clone, Debug, Default)]
pub struct Capacity {
    nodes: BTreeMap<String, NodeCapacity>,
}

#[derive(Clone, Debug, Default)]
struct NodeCapacity {
    labels: BTreeMap<String, String>,
    /// Free amount per extended resource (allocatable minus requested; may go negative
    /// when a node is overcommitted or shrank).
    free: BTreeMap<String, i64>,
}

impl NodeCapacity {
    fn free(&self, resource: &str) -> u32 {
        self.free
            .get(resource)
            .copied()
            .unwrap_or(0)
            .clamp(0, u32::MAX as i64) as u32
    }
}

impl Capacity {
    /// Free resources of the schedulable nodes, after the requests of `bound_pods`.
    pub fn from_cluster<'p>(nodes: &[Node], bound_pods: impl IntoIterator<Item = &'p Pod>) -> Self {
        let mut capacity = Capacity::default();
        for node in nodes {
            let Some(name) = node.metadata.name.clone() else {
                continue;
            };
            if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
                continue;
            }
            let free = node
                .status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .map(|alloc| {
                    alloc
                        .iter()
                        .filter_map(|(k, q)| Some((k.clone(), parse_count(&q.0)?)))
                        .collect()
                })
                .unwrap_or_default();
            let labels = node.metadata.labels.clone().unwrap_or_default();
            capacity.nodes.insert(name, NodeCapacity { labels, free });
        }
        for pod in bound_pods.into_iter().filter(|p| !is_terminated(p)) {
            let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
                continue;
            };
            if let Some(node) = capacity.nodes.get_mut(node) {
                for (resource, amount) in extended_requests(pod) {
                    *node.free.entry(resource).or_insert(0) -= amount;
                }
            }
        }
        capacity
    }

    /// Holds GPUs for gang pods already released to `domain` but not bound yet, on the
    /// nodes of that domain with the most free GPUs (where the scheduler is likely to put them).
    pub fn reserve_unbound(&mut self, request: &GangRequest, domain: &str, pods: u32) {
        let mut candidates: Vec<(u32, String)> = self
            .domain_nodes(&request.domain_label, domain)
            .map(|(name, node)| (node.free(&request.gpu_resource), name.clone()))
            .collect();
        candidates.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        for (_, name) in candidates.into_iter().take(pods as usize) {
            self.take(&name, &request.gpu_resource, request.gpus_per_pod);
        }
    }

    /// Best-fit placement: among domains where `request.pods` distinct nodes each have
    /// `gpus_per_pod` free, the one with the fewest GPUs to spare; ties by domain name.
    pub fn place(&self, request: &GangRequest) -> GangPlacement {
        let mut domains: BTreeMap<&str, Vec<(u32, &String)>> = BTreeMap::new();
        for (name, node) in &self.nodes {
            if let Some(domain) = node.labels.get(&request.domain_label) {
                domains
                    .entry(domain)
                    .or_default()
                    .push((node.free(&request.gpu_resource), name));
            }
        }
        if domains.is_empty() {
            return GangPlacement::Pending {
                reason: format!(
                    "needs {} GPUs ({} pods x {}) in one {} domain; no schedulable node has that label",
                    request.total_gpus(),
                    request.pods,
                    request.gpus_per_pod,
                    request.domain_label
                ),
                missing_gpus: request.total_gpus(),
            };
        }
        let mut best: Option<Placement> = None;
        // Domain closest to fitting, for the message: (usable GPUs, domain).
        let mut closest: Option<(u32, &str)> = None;
        for (domain, mut nodes) in domains {
            // Tightest nodes first, so the listed nodes are the best fit too.
            nodes.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)));
            let fitting: Vec<&(u32, &String)> = nodes
                .iter()
                .filter(|(free, _)| *free >= request.gpus_per_pod)
                .collect();
            let total_free: u32 = nodes.iter().map(|(free, _)| free).sum();
            if fitting.len() >= request.pods as usize {
                let spare = total_free - request.total_gpus();
                if best.as_ref().is_none_or(|b| spare < b.spare_gpus) {
                    best = Some(Placement {
                        domain_label: request.domain_label.clone(),
                        domain: domain.to_string(),
                        nodes: fitting
                            .iter()
                            .take(request.pods as usize)
                            .map(|(_, n)| (*n).clone())
                            .collect(),
                        spare_gpus: spare,
                    });
                }
            } else {
                // A pod cannot use GPUs of two nodes: count at most gpus_per_pod on each
                // of the `pods` roomiest nodes.
                let mut usable: Vec<u32> = nodes
                    .iter()
                    .map(|(free, _)| (*free).min(request.gpus_per_pod))
                    .collect();
                usable.sort_unstable_by(|a, b| b.cmp(a));
                let usable: u32 = usable.iter().take(request.pods as usize).sum();
                if closest.is_none_or(|(u, _)| usable > u) {
                    closest = Some((usable, domain));
                }
            }
        }
        match (best, closest) {
            (Some(placement), _) => GangPlacement::Placed(placement),
            (None, Some((usable, domain))) => GangPlacement::Pending {
                reason: format!(
                    "needs {} GPUs ({} pods x {}, one per node) in one {} domain; the best domain, {domain}, has {usable} usable",
                    request.total_gpus(),
                    request.pods,
                    request.gpus_per_pod,
                    request.domain_label
                ),
                missing_gpus: request.total_gpus() - usable,
            },
            (None, None) => unreachable!("domains is not empty, so one branch ran"),
        }
    }

    /// Records a placement so later gangs of the same pass see the GPUs as taken.
    pub fn commit(&mut self, request: &GangRequest, placement: &Placement) {
        for node in &placement.nodes {
            self.take(node, &request.gpu_resource, request.gpus_per_pod);
        }
    }

    fn take(&mut self, node: &str, resource: &str, amount: u32) {
        if let Some(node) = self.nodes.get_mut(node) {
            *node.free.entry(resource.to_string()).or_insert(0) -= i64::from(amount);
        }
    }

    fn domain_nodes<'a>(
        &'a self,
        label: &'a str,
        domain: &'a str,
    ) -> impl Iterator<Item = (&'a String, &'a NodeCapacity)> + 'a {
        self.nodes
            .iter()
            .filter(move |(_, n)| n.labels.get(label).map(String::as_str) == Some(domain))
    }
}

/// A pod that no longer holds resources.
pub fn is_terminated(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The extended resources (GPUs) a pod holds, counted as the scheduler counts a pod's
/// requests (Kubernetes' effective requests with native sidecars, KEP-753): its containers
/// and its native sidecars (init containers with `restartPolicy: Always`) added up, or,
/// where larger, an ordinary init container's own amount with the sidecars started before
/// it.
fn extended_requests(pod: &Pod) -> BTreeMap<String, i64> {
    let Some(spec) = &pod.spec else {
        return BTreeMap::new();
    };
    let add = |total: &mut BTreeMap<String, i64>, more: BTreeMap<String, i64>| {
        for (name, n) in more {
            *total.entry(name).or_insert(0) += n;
        }
    };
    let mut sidecars = BTreeMap::new();
    let mut init_peak = BTreeMap::new();
    for init in spec.init_containers.iter().flatten() {
        if init.restart_policy.as_deref() == Some("Always") {
            add(&mut sidecars, container_extended(init));
        } else {
            let mut during = sidecars.clone();
            add(&mut during, container_extended(init));
            for (name, n) in during {
                let peak = init_peak.entry(name).or_insert(n);
                *peak = (*peak).max(n);
            }
        }
    }
    let mut running = sidecars;
    for container in &spec.containers {
        add(&mut running, container_extended(container));
    }
    for (name, n) in init_peak {
        let held = running.entry(name).or_insert(n);
        *held = (*held).max(n);
    }
    running
}

/// One container's extended resources (names with a `/`); its request where it sets one,
/// else its limit (the API server makes them equal).
fn container_extended(container: &Container) -> BTreeMap<String, i64> {
    let mut amounts = BTreeMap::new();
    let Some(resources) = &container.resources else {
        return amounts;
    };
    for source in [&resources.limits, &resources.requests]
        .into_iter()
        .flatten()
    {
        for (name, q) in source {
            if name.contains('/')
                && let Some(n) = parse_count(&q.0)
            {
                amounts.insert(name.clone(), n);
            }
        }
    }
    amounts
}

/// Extended resources are whole numbers; anything else (cpu "500m") is not counted.
fn parse_count(quantity: &str) -> Option<i64> {
    quantity.parse().ok()
}
