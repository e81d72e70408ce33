//! Endpoints from Kubernetes: the Ready pods selected by an InferencePool
//! (`inference.networking.k8s.io/v1`) or by a label selector, each as `podIP:targetPort`,
//! kept current by kube-runtime watches.
//!
//! With `--pool-name`, the pool gives the selector (`spec.selector.matchLabels`) and the
//! port (`spec.targetPorts[0].number`); a change of either restarts the pod watch. Only
//! pods with the `Ready` condition `True`, an IP and no deletion timestamp count, so a
//! pod leaves the set as soon as it starts terminating.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use dynamo_crds::inference_pool::InferencePool;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::watch;

use dynamo_names::Role;

use super::{EndpointSet, EndpointSpec, normalize};
use crate::config::KubernetesConfig;

/// An equality-based label selector (`k=v,k2==v2`), the only kind a Service or an
/// InferencePool selects with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels(pub BTreeMap<String, String>);

impl Labels {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut labels = BTreeMap::new();
        for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (key, value) = term
                .split_once("==")
                .or_else(|| term.split_once('='))
                .filter(|(k, _)| !k.is_empty() && !k.ends_with('!'))
                .ok_or_else(|| {
                    format!("label selector term {term:?}: only `key=value` terms are supported")
                })?;
            labels.insert(key.trim().to_owned(), value.trim().to_owned());
        }
        Ok(Self(labels))
    }

    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        self.0
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
    }

    /// The `labelSelector` query parameter.
    pub fn to_query(&self) -> String {
        self.0
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// What selects the pods and where they listen.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Target {
    selector: Labels,
    port: u16,
}

/// Prefill and decode selectors decide each pod's role.
#[derive(Clone, Debug, Default)]
struct RoleSelectors {
    prefill: Option<Labels>,
    decode: Option<Labels>,
}

impl RoleSelectors {
    fn role(&self, labels: Option<&BTreeMap<String, String>>) -> Role {
        if self.prefill.as_ref().is_some_and(|s| s.matches(labels)) {
            Role::Prefill
        } else if self.decode.as_ref().is_some_and(|s| s.matches(labels)) {
            Role::Decode
        } else {
            Role::Aggregated
        }
    }
}

/// Checks the selectors of `config` (for the flags, before anything starts).
pub fn check(config: &KubernetesConfig) -> Result<(), String> {
    for s in [
        &config.selector,
        &config.prefill_selector,
        &config.decode_selector,
    ]
    .into_iter()
    .flatten()
    {
        Labels::parse(s)?;
    }
    if config.pool_name.is_none() && config.selector.is_none() {
        return Err("Kubernetes discovery needs --pool-name or --selector".into());
    }
    Ok(())
}

/// Publishes the pool's Ready pods on `tx` until every receiver is gone.
pub async fn watch(
    client: Client,
    config: KubernetesConfig,
    kv_events_port: u16,
    tx: watch::Sender<EndpointSet>,
) {
    let namespace = config
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let parse = |s: &Option<String>| s.as_deref().map(Labels::parse).transpose();
    let (extra, roles) = match (
        parse(&config.selector),
        parse(&config.prefill_selector),
        parse(&config.decode_selector),
    ) {
        (Ok(extra), Ok(prefill), Ok(decode)) => (extra, RoleSelectors { prefill, decode }),
        _ => {
            tracing::error!("invalid label selector; Kubernetes discovery stopped");
            return;
        }
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let watch_pods = |target: Target| {
        pod_watch(
            pods.clone(),
            target,
            roles.clone(),
            kv_events_port,
            tx.clone(),
        )
    };
    let Some(pool_name) = config.pool_name.clone() else {
        let target = Target {
            selector: extra.unwrap_or_default(),
            port: config.target_port,
        };
        tokio::select! {
            _ = watch_pods(target) => {}
            _ = tx.closed() => {}
        }
        return;
    };

    let pools: Api<InferencePool> = Api::namespaced(client, &namespace);
    let mut events = watcher::watcher(
        pools,
        watcher::Config::default().fields(&format!("metadata.name={pool_name}")),
    )
    .default_backoff()
    .boxed();
    let mut current: Option<Target> = None;
    let mut listed = false;
    let mut pod_task: Option<tokio::task::JoinHandle<()>> = None;
    loop {
        let event = tokio::select! {
            e = events.next() => e,
            _ = tx.closed() => None,
        };
        let Some(event) = event else { break };
        let next = match event {
            Ok(Event::Init) => {
                listed = false;
                continue;
            }
            Ok(Event::Apply(pool) | Event::InitApply(pool)) => {
                listed = true;
                pool_target(&pool, extra.as_ref())
            }
            Ok(Event::InitDone) if listed => continue,
            Ok(Event::InitDone | Event::Delete(_)) => None,
            Err(e) => {
                tracing::warn!(pool = %pool_name, error = %e, "InferencePool watch failed; retrying");
                continue;
            }
        };
        if next == current {
            continue;
        }
        if let Some(task) = pod_task.take() {
            task.abort();
        }
        match &next {
            Some(target) => {
                tracing::info!(pool = %pool_name, selector = %target.selector.to_query(), port = target.port, "watching the pool's pods");
                pod_task = Some(tokio::spawn(watch_pods(target.clone())));
            }
            None => {
                tracing::warn!(pool = %pool_name, namespace = %namespace, "InferencePool not found: no endpoints");
                tx.send_replace(EndpointSet::new());
            }
        }
        current = next;
    }
    if let Some(task) = pod_task {
        task.abort();
    }
}

/// The pool's selector (with `extra` ANDed) and target port; `None` for a pool without
/// a usable port.
fn pool_target(pool: &InferencePool, extra: Option<&Labels>) -> Option<Target> {
    let port = pool.spec.target_ports.first()?.number;
    let port = u16::try_from(port).ok().filter(|&p| p > 0)?;
    let mut selector = pool.spec.selector.match_labels.clone();
    if let Some(extra) = extra {
        selector.extend(extra.0.clone());
    }
    Some(Target {
        selector: Labels(selector),
        port,
    })
}

async fn pod_watch(
    pods: Api<Pod>,
    target: Target,
    roles: RoleSelectors,
    kv_events_port: u16,
    tx: watch::Sender<EndpointSet>,
) {
    let mut events = watcher::watcher(
        pods,
        watcher::Config::default().labels(&target.selector.to_query()),
    )
    .default_backoff()
    .boxed();
    // Pod name -> its endpoint while Ready.
    let mut live: BTreeMap<String, EndpointSpec> = BTreeMap::new();
    let mut listing: Option<BTreeMap<String, EndpointSpec>> = None;
    while let Some(event) = events.next().await {
        let endpoint = |pod: &Pod| pod_endpoint(pod, &target, &roles, kv_events_port);
        match event {
            Ok(Event::Init) => listing = Some(BTreeMap::new()),
            Ok(Event::InitApply(pod)) => {
                if let (Some(list), Some(e)) = (listing.as_mut(), endpoint(&pod)) {
                    list.insert(pod_name(&pod), e);
                }
                continue;
            }
            Ok(Event::InitDone) => live = listing.take().unwrap_or_default(),
            Ok(Event::Apply(pod)) => match endpoint(&pod) {
                Some(e) => {
                    live.insert(pod_name(&pod), e);
                }
                None => {
                    live.remove(&pod_name(&pod));
                }
            },
            Ok(Event::Delete(pod)) => {
                live.remove(&pod_name(&pod));
            }
            Err(e) => {
                tracing::warn!(error = %e, "pod watch failed; retrying");
                continue;
            }
        }
        if listing.is_some() {
            continue;
        }
        let set = normalize(live.values().cloned().collect());
        tx.send_if_modified(|current| {
            let changed = *current != set;
            *current = set;
            changed
        });
    }
}

fn pod_name(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

/// The pod's endpoint when it can take traffic: Ready, with an IP, not terminating.
fn pod_endpoint(
    pod: &Pod,
    target: &Target,
    roles: &RoleSelectors,
    kv_events_port: u16,
) -> Option<EndpointSpec> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref()?;
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if !ready {
        return None;
    }
    let ip: IpAddr = status.pod_ip.as_deref()?.parse().ok()?;
    let address = SocketAddr::new(ip, target.port);
    Some(EndpointSpec::new(
        address,
        kv_events_port,
        roles.role(pod.metadata.labels.as_ref()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_are_equality_terms() {
        let s = Labels::parse("app=x, tier==web").unwrap();
        assert_eq!(s.to_query(), "app=x,tier=web");
        let labels = BTreeMap::from([
            ("app".to_owned(), "x".to_owned()),
            ("tier".to_owned(), "web".to_owned()),
            ("other".to_owned(), "1".to_owned()),
        ]);
        assert!(s.matches(Some(&labels)));
        assert!(!Labels::parse("app=y").unwrap().matches(Some(&labels)));
        assert!(!s.matches(None));
        for bad in ["app!=x", "app in (x)", "app", "=x"] {
            assert!(Labels::parse(bad).is_err(), "{bad}");
        }
    }
}
