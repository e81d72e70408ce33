//! The shared routing state: known pods, the exact KV index fed by their event streams,
//! the approximate index, per-pod load, the scheduler and the waiting queue.
//!
//! A request is routed by [`Router::route`], which returns an [`Assignment`]: the chosen
//! pod (and, in a disaggregated pool, a prefill pod), with its load accounted until the
//! assignment is dropped. The caller reports the first token with
//! [`Assignment::first_token`]; dropping the assignment (response finished, failed, or
//! the client left) ends the request's load.
//!
//! Locks: `state` may take `index` (read) while held; event application takes `index`
//! alone. Nothing takes `state` while holding `index`, so they cannot deadlock. Waiters
//! are answered only after `state` is released, because an assignment dropped by a
//! waiter that left re-enters the router.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dynamo_kvcache::{
    BlockHasher, Decision, EngineMetrics, IndexError, KvIndex, OverlapScores, QueuedRequest,
    RequestId, RouterMode, RoutingCore, SeqHash, Side, Ticket, WaitingQueue, WorkModel, WorkerId,
};
use dynamo_kvstream::PodUpdate;
use tokio::sync::{oneshot, watch};

use crate::config::RouterConfig;
use dynamo_names::Role;

use crate::discovery::EndpointSpec;
use crate::metrics::{self, Metrics};

/// Roles that answer the client; prefill pods are only ever a request's helper.
const SERVING_ROLES: [Role; 2] = [Role::Aggregated, Role::Decode];

/// What the router needs to know of a request.
#[derive(Clone, Debug, Default)]
pub struct RouteRequest {
    /// The prompt's token ids (chat template applied).
    pub tokens: Vec<u32>,
    /// Output tokens at most (for the WSPT queue order, unless `osl` says better).
    pub max_tokens: u64,
    /// `nvext.agent_hints.osl`: the output tokens the client expects, which the pod's
    /// decode load counts while the request decodes.
    pub osl: Option<u64>,
    /// `nvext.agent_hints.priority`: higher waits less when requests queue.
    pub priority: i64,
    /// Only these pods may serve it (the gateway's subset hint).
    pub subset: Option<Vec<SocketAddr>>,
    /// Pods that already failed this request.
    pub exclude: Vec<SocketAddr>,
}

/// Why a request got no pod.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// 503: no pod could serve it.
    #[error("no ready endpoint: {0}")]
    NoEndpoint(String),
    /// 429: every pod is saturated and the waiting queue is full.
    #[error("every endpoint is saturated and {capacity} requests are already waiting")]
    Overloaded { capacity: usize },
}

/// A pod as the router knows it.
#[derive(Debug)]
struct Endpoint {
    spec: EndpointSpec,
    added: Instant,
    /// The first KV snapshot of the pod arrived.
    synced: bool,
    /// Avoided until then after refusing a connection.
    unhealthy_until: Option<Instant>,
    /// Why its model card does not fit the picker's model: never routed to meanwhile.
    card_problem: Option<String>,
}

/// A request's routing inputs, kept while it waits.
#[derive(Debug)]
struct Job {
    hashes: Vec<SeqHash>,
    subset: Option<Vec<SocketAddr>>,
    exclude: Vec<SocketAddr>,
    /// Output blocks the request is expected to hold on average while it decodes.
    output_blocks: u64,
}

#[derive(Debug)]
struct Waiter {
    job: Job,
    enqueued: Instant,
    tx: oneshot::Sender<Result<Assignment, RouteError>>,
}

type Delivery = (
    oneshot::Sender<Result<Assignment, RouteError>>,
    Result<Assignment, RouteError>,
);

struct State {
    endpoints: BTreeMap<WorkerId, Endpoint>,
    /// Schedulers, approximate index and load: the routing step the replay shares.
    core: RoutingCore,
    queue: WaitingQueue<Waiter>,
    next_request: u64,
}

impl State {
    /// A new id for the load accounting.
    fn next_request(&mut self) -> RequestId {
        self.next_request += 1;
        RequestId(self.next_request)
    }
}

/// The router; share it as `Arc<Router>`.
pub struct Router {
    config: RouterConfig,
    /// The served model, the label of the requests it counts as queued.
    model_name: String,
    hasher: BlockHasher,
    metrics: Arc<Metrics>,
    index: RwLock<KvIndex>,
    state: Mutex<State>,
    /// Origin of the approximate index's clock.
    origin: Instant,
    /// Ticks when a pod may have become able to serve (listed, or its model card fixed),
    /// for requests waiting for one ([`Router::route_within`]).
    serving_changed: watch::Sender<()>,
}

/// A routed request: the pod it goes to, accounted as load until dropped.
pub struct Assignment {
    router: Arc<Router>,
    request: RequestId,
    prefill_request: Option<RequestId>,
    first_token_seen: bool,
    pub worker: WorkerId,
    /// Where to send the request (`ip:port`).
    pub address: SocketAddr,
    /// The prefill pod of a disaggregated pool (`x-prefiller-host-port`).
    pub prefill: Option<SocketAddr>,
    pub decision: Decision,
    /// Full blocks of the prompt.
    pub prompt_blocks: u64,
}

impl std::fmt::Debug for Assignment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Assignment")
            .field("request", &self.request)
            .field("address", &self.address)
            .field("prefill", &self.prefill)
            .field("decision", &self.decision)
            .finish()
    }
}

impl Assignment {
    /// The response's first token arrived: the request's prefill is over.
    pub fn first_token(&mut self) {
        if !self.first_token_seen {
            self.first_token_seen = true;
            self.router
                .on_first_token(self.request, self.prefill_request);
        }
    }
}

impl Drop for Assignment {
    fn drop(&mut self) {
        self.router.on_finish(self.request, self.prefill_request);
    }
}

/// Takes a queued request out of the queue if its caller stops waiting.
struct QueueGuard<'a> {
    router: &'a Router,
    ticket: Option<Ticket>,
}

impl Drop for QueueGuard<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            let mut st = self.router.lock();
            st.queue.cancel(ticket);
            self.router.metrics.queue_depth.set(st.queue.len() as i64);
        }
    }
}

impl Router {
    pub fn new(config: RouterConfig, model_name: &str, metrics: Arc<Metrics>) -> Self {
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let scheduler_config = config.knobs.scheduler();
        let approx = config.knobs.approx();
        let state = State {
            endpoints: BTreeMap::new(),
            core: RoutingCore::new(config.mode, scheduler_config, approx, seed),
            queue: WaitingQueue::new(
                config.queue_policy,
                WorkModel::default(),
                config.queue_capacity,
            ),
            next_request: 0,
        };
        Self {
            // Same salt as the engines (the served model name), so prompt hashes meet
            // the hashes of the blocks the sidecars announce (`DESIGN.md`, "Block hashing").
            hasher: BlockHasher::new(config.block_size, model_name, None),
            index: RwLock::new(KvIndex::new(config.max_index_blocks)),
            config,
            model_name: model_name.to_owned(),
            metrics,
            state: Mutex::new(state),
            origin: Instant::now(),
            serving_changed: watch::Sender::new(()),
        }
    }

    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn hasher(&self) -> &BlockHasher {
        &self.hasher
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic under the lock leaves counters, not broken invariants: keep serving.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Chooses a pod for `request`, waiting in the queue while every pod is saturated;
    /// the request counts as queued meanwhile, and the time as its `route` stage.
    pub async fn route(self: &Arc<Self>, request: RouteRequest) -> Result<Assignment, RouteError> {
        let started = Instant::now();
        let queued = self.metrics.queued(&self.model_name);
        let routed = self.choose(request, started).await;
        drop(queued);
        let seconds = started.elapsed().as_secs_f64();
        self.metrics.stage(metrics::ROUTE, seconds);
        routed
    }

    /// [`Router::route`], but while no pod can take the request (the only ones left
    /// failed it), waits up to `wait` for one to be listed instead of failing at once:
    /// a request leaving a dead pod while the other replicas are seconds from being
    /// listed is not cut.
    pub async fn route_within(
        self: &Arc<Self>,
        request: RouteRequest,
        wait: Duration,
    ) -> Result<Assignment, RouteError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Subscribed before the attempt, so a pod listed during it is not missed.
            let mut changed = self.serving_changed.subscribe();
            match self.route(request.clone()).await {
                Err(RouteError::NoEndpoint(reason)) if !wait.is_zero() => {
                    if tokio::time::timeout_at(deadline, changed.changed())
                        .await
                        .is_err()
                    {
                        return Err(RouteError::NoEndpoint(format!(
                            "{reason}, and none was listed within {wait:?}"
                        )));
                    }
                }
                routed => return routed,
            }
        }
    }

    async fn choose(
        self: &Arc<Self>,
        request: RouteRequest,
        started: Instant,
    ) -> Result<Assignment, RouteError> {
        // A decoding request holds half its output on average over its decode.
        let block_size = self.config.block_size as u64;
        let job = Job {
            hashes: self.hasher.seq_hashes(&request.tokens),
            subset: request.subset,
            exclude: request.exclude,
            output_blocks: request.osl.map_or(0, |osl| osl.div_ceil(2 * block_size)),
        };
        // The exact index's lookup runs before the routing state is locked, so picks
        // do not wait on each other's lookups.
        let exact = (self.config.mode == RouterMode::Kv).then(|| self.exact_matches(&job.hashes));
        let (rx, ticket, deliveries) = {
            let mut st = self.lock();
            let serving = self.candidates(&st, &job, &SERVING_ROLES);
            if serving.is_empty() {
                return Err(self.no_endpoint(&st, &job));
            }
            if st.queue.is_empty() && !self.saturated(&st, &serving) {
                return self.assign(&mut st, &job, exact, started);
            }
            let (tx, rx) = oneshot::channel();
            // Which blocks will be cached by dispatch time is unknown: WSPT ranks on all.
            let prompt_blocks = job.hashes.len() as u64;
            let waiter = Waiter {
                enqueued: started,
                job,
                tx,
            };
            let output = request.osl.unwrap_or(request.max_tokens);
            let mut queued = QueuedRequest::new(waiter, prompt_blocks, output);
            queued.priority = request.priority.clamp(i32::MIN.into(), i32::MAX.into()) as i32;
            let ticket = match st.queue.push(queued) {
                Ok(ticket) => ticket,
                Err(full) => {
                    return Err(RouteError::Overloaded {
                        capacity: full.capacity,
                    });
                }
            };
            // Pods may have room now (the queue held others that just left).
            let deliveries = self.drain(&mut st);
            (rx, ticket, deliveries)
        };
        deliver(deliveries);
        let mut guard = QueueGuard {
            router: self,
            ticket: Some(ticket),
        };
        let result = rx
            .await
            .unwrap_or_else(|_| Err(RouteError::NoEndpoint("the router stopped".into())));
        guard.ticket = None;
        result
    }

    /// Pods of `roles` that may take `job`: in its subset, not excluded, and healthy
    /// unless none is.
    fn candidates(&self, st: &State, job: &Job, roles: &[Role]) -> Vec<WorkerId> {
        let now = Instant::now();
        let eligible: Vec<(&WorkerId, &Endpoint)> = st
            .endpoints
            .iter()
            .filter(|(_, e)| roles.contains(&e.spec.role))
            .filter(|(_, e)| {
                job.subset
                    .as_ref()
                    .is_none_or(|s| s.contains(&e.spec.address))
            })
            .filter(|(_, e)| !job.exclude.contains(&e.spec.address))
            .filter(|(_, e)| e.card_problem.is_none())
            .collect();
        let healthy: Vec<WorkerId> = eligible
            .iter()
            .filter(|(_, e)| e.unhealthy_until.is_none_or(|t| t <= now))
            .map(|(w, _)| **w)
            .collect();
        if healthy.is_empty() {
            // Every pod failed lately: trying one beats refusing outright.
            eligible.into_iter().map(|(w, _)| *w).collect()
        } else {
            healthy
        }
    }

    fn no_endpoint(&self, st: &State, job: &Job) -> RouteError {
        let reason = if st.endpoints.is_empty() {
            "no endpoints discovered".to_owned()
        } else if job.subset.as_ref().is_some_and(|s| s.is_empty()) {
            "the subset hint is empty".to_owned()
        } else if job.subset.is_some() {
            "no endpoint of the subset hint is known".to_owned()
        } else if !job.exclude.is_empty() {
            "every endpoint failed this request".to_owned()
        } else {
            "no worker or decode endpoint".to_owned()
        };
        RouteError::NoEndpoint(reason)
    }

    fn saturated(&self, st: &State, serving: &[WorkerId]) -> bool {
        let t = &self.config.saturation;
        let limited = t.max_waiting_requests.is_some()
            || t.max_kv_usage.is_some()
            || t.max_blocks_in_flight.is_some();
        limited && serving.iter().all(|&w| st.core.load().is_saturated(w, t))
    }

    fn exact_matches(&self, hashes: &[SeqHash]) -> OverlapScores {
        self.index
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .find_matches(hashes)
    }

    /// Picks now and accounts the load. `exact` holds the exact index's matches when
    /// they were looked up before the lock (a request that waited looks them up now);
    /// `started` is when the decision began.
    fn assign(
        self: &Arc<Self>,
        st: &mut State,
        job: &Job,
        exact: Option<OverlapScores>,
        started: Instant,
    ) -> Result<Assignment, RouteError> {
        let serving = self.candidates(st, job, &SERVING_ROLES);
        if serving.is_empty() {
            return Err(self.no_endpoint(st, job));
        }
        let prompt_blocks = job.hashes.len() as u64;
        let now = self.origin.elapsed();
        let scores = st
            .core
            .overlap(Side::Aggregated, &job.hashes, now, |hashes| {
                exact.unwrap_or_else(|| self.exact_matches(hashes))
            });
        let prefill_job = Job {
            hashes: Vec::new(),
            subset: None,
            exclude: Vec::new(),
            output_blocks: 0,
        };
        let prefill_pods = self.candidates(st, &prefill_job, &[Role::Prefill]);
        // Disaggregated (Dynamo's PrefillRouter) when the pool has prefill pods.
        let prefill = (!prefill_pods.is_empty()).then(|| (&prefill_pods[..], st.next_request()));
        let request = st.next_request();
        let route = st
            .core
            .pick_route(&scores, &serving, request, prefill, &job.hashes, now)
            .map_err(|e| RouteError::NoEndpoint(e.to_string()))?;
        if job.output_blocks > 0 {
            st.core.expect_output(request, job.output_blocks);
        }
        if prefill.is_some() && route.prefill.is_none() {
            self.metrics.prefill_hop_skipped();
        }
        let prefill = route.prefill.zip(prefill.map(|(_, r)| r));
        for d in prefill.iter().map(|(d, _)| d).chain([&route.serving]) {
            self.count_pick(st, d, job);
        }
        let decision = route.serving;
        let address = st.endpoints[&decision.worker].spec.address;
        let matched = u64::from(decision.overlap.total()).min(prompt_blocks);
        let m = &self.metrics;
        m.prompt_blocks.inc_by(prompt_blocks);
        m.matched_blocks.inc_by(matched);
        if prompt_blocks > 0 {
            m.hit_ratio.observe(matched as f64 / prompt_blocks as f64);
        }
        m.pick_seconds.observe(started.elapsed().as_secs_f64());
        Ok(Assignment {
            router: self.clone(),
            request,
            prefill_request: prefill.map(|(_, r)| r),
            first_token_seen: false,
            worker: decision.worker,
            address,
            prefill: prefill.map(|(d, _)| st.endpoints[&d.worker].spec.address),
            decision,
            prompt_blocks,
        })
    }

    /// Logs and counts a pick.
    fn count_pick(&self, st: &State, decision: &Decision, job: &Job) {
        let endpoint = &st.endpoints[&decision.worker].spec;
        tracing::debug!(
            pod = %endpoint.address,
            role = endpoint.role.as_str(),
            cost = decision.cost,
            credited_overlap = decision.credited_overlap,
            prompt_blocks = job.hashes.len(),
            "picked"
        );
        self.metrics
            .picks
            .get_or_create(&vec![
                ("pod", endpoint.address.to_string()),
                ("role", endpoint.role.as_str().to_owned()),
            ])
            .inc();
    }

    /// Hands queued requests to pods while some have room; answers are sent by
    /// [`deliver`] once the lock is released.
    fn drain(self: &Arc<Self>, st: &mut State) -> Vec<Delivery> {
        let mut out = Vec::new();
        while let Some(head) = st.queue.peek() {
            let serving = self.candidates(st, &head.payload.job, &SERVING_ROLES);
            if !serving.is_empty() && self.saturated(st, &serving) {
                break;
            }
            let waiter = st.queue.pop().expect("peeked").payload;
            if waiter.tx.is_closed() {
                continue;
            }
            self.metrics
                .queue_wait_seconds
                .observe(waiter.enqueued.elapsed().as_secs_f64());
            let result = self.assign(st, &waiter.job, None, Instant::now());
            out.push((waiter.tx, result));
        }
        self.metrics.queue_depth.set(st.queue.len() as i64);
        out
    }

    fn on_first_token(&self, request: RequestId, prefill: Option<RequestId>) {
        let mut st = self.lock();
        // Unknown: the pod was removed meanwhile, with its requests.
        st.core.first_token(request);
        if let Some(prefill) = prefill {
            st.core.finished(prefill);
        }
    }

    fn on_finish(self: &Arc<Self>, request: RequestId, prefill: Option<RequestId>) {
        let deliveries = {
            let mut st = self.lock();
            st.core.finished(request);
            if let Some(prefill) = prefill {
                st.core.finished(prefill);
            }
            self.drain(&mut st)
        };
        deliver(deliveries);
    }

    /// A pod appeared.
    pub fn add_endpoint(self: &Arc<Self>, worker: WorkerId, spec: EndpointSpec) {
        let deliveries = {
            let mut st = self.lock();
            st.core.add_worker(worker);
            st.endpoints.insert(
                worker,
                Endpoint {
                    spec,
                    added: Instant::now(),
                    synced: false,
                    unhealthy_until: None,
                    card_problem: None,
                },
            );
            self.publish_endpoint_gauges(&st);
            self.drain(&mut st)
        };
        deliver(deliveries);
        self.serving_changed.send_replace(());
    }

    /// A pod left: its blocks, load and requests in flight are forgotten.
    pub fn remove_endpoint(self: &Arc<Self>, worker: WorkerId) {
        self.with_index(|index| index.remove_worker(worker));
        let deliveries = {
            let mut st = self.lock();
            if let Some(gone) = st.endpoints.remove(&worker) {
                self.metrics.remove_pod(&gone.spec.address.to_string());
            }
            st.core.remove_worker(worker);
            self.publish_endpoint_gauges(&st);
            self.drain(&mut st)
        };
        deliver(deliveries);
    }

    /// Applies one update of `worker`'s KV event stream to the index.
    pub fn apply_update(&self, worker: WorkerId, update: PodUpdate) {
        let kind = match &update {
            PodUpdate::Snapshot(_) => "snapshot",
            PodUpdate::Event(..) => "event",
            PodUpdate::Lost => "lost",
        };
        let mut full = 0;
        let mut count_full = |r: Result<(), IndexError>| {
            if r.is_err() {
                full += 1;
            }
        };
        self.with_index(|index| match &update {
            PodUpdate::Snapshot(chains) => {
                index.remove_worker(worker);
                for chain in chains {
                    count_full(index.apply(worker, chain));
                }
            }
            PodUpdate::Event(event, _) => count_full(index.apply(worker, event)),
            PodUpdate::Lost => index.remove_worker(worker),
        });
        if let PodUpdate::Event(_, Some(published)) = &update {
            let lag = SystemTime::now()
                .duration_since(*published)
                .unwrap_or_default();
            self.metrics.kv_event_lag_seconds.observe(lag.as_secs_f64());
        }
        if full > 0 {
            self.metrics.kv_index_full.inc_by(full);
            tracing::warn!(%worker, "KV index full: some blocks of the pod are not indexed");
        }
        let m = &self.metrics;
        let address = {
            let mut st = self.lock();
            let Some(endpoint) = st.endpoints.get_mut(&worker) else {
                return;
            };
            let first_sync = matches!(update, PodUpdate::Snapshot(_)) && !endpoint.synced;
            if first_sync {
                endpoint.synced = true;
                m.kv_sync_seconds
                    .observe(endpoint.added.elapsed().as_secs_f64());
            }
            let address = endpoint.spec.address.to_string();
            if first_sync {
                self.publish_endpoint_gauges(&st);
            }
            address
        };
        m.kv_updates
            .get_or_create(&vec![("pod", address), ("kind", kind.to_owned())])
            .inc();
    }

    fn with_index<T>(&self, f: impl FnOnce(&mut KvIndex) -> T) -> T {
        let mut index = self.index.write().unwrap_or_else(PoisonError::into_inner);
        let out = f(&mut index);
        self.metrics.index_blocks.set(index.len() as i64);
        out
    }

    /// The pod's engine reported its load; queued requests may now fit.
    pub fn observe_engine(self: &Arc<Self>, worker: WorkerId, metrics: EngineMetrics) {
        let deliveries = {
            let mut st = self.lock();
            if !st.endpoints.contains_key(&worker) {
                return;
            }
            st.core.observe_metrics(worker, metrics);
            self.drain(&mut st)
        };
        deliver(deliveries);
    }

    /// Whether the pod's model card fits the picker's model (`None`) or why not; a pod
    /// that does not fit is not routed to until it does.
    pub fn set_card_problem(&self, worker: WorkerId, problem: Option<String>) {
        let mut st = self.lock();
        let Some(endpoint) = st.endpoints.get_mut(&worker) else {
            return;
        };
        let pod = vec![("pod", endpoint.spec.address.to_string())];
        self.metrics
            .model_card_mismatch
            .get_or_create(&pod)
            .set(i64::from(problem.is_some()));
        let fixed = endpoint.card_problem.is_some() && problem.is_none();
        endpoint.card_problem = problem;
        if fixed {
            self.serving_changed.send_replace(());
        }
    }

    /// The pod at `address` refused a connection: avoid it for a while.
    pub fn mark_unhealthy(&self, address: SocketAddr) {
        let until = Instant::now() + self.config.unhealthy_for;
        let mut st = self.lock();
        for e in st.endpoints.values_mut() {
            if e.spec.address == address {
                e.unhealthy_until = Some(until);
            }
        }
        self.metrics
            .upstream_failures
            .get_or_create(&vec![("pod", address.to_string())])
            .inc();
    }

    /// Whether the router can serve: some pod is known and every pod's first KV snapshot
    /// arrived (kv mode) or its warm-up time is over. The error says what is missing.
    pub fn readiness(&self) -> Result<(), String> {
        let st = self.lock();
        if st.endpoints.is_empty() {
            return Err("no endpoints discovered".into());
        }
        if st
            .endpoints
            .values()
            .all(|e| !SERVING_ROLES.contains(&e.spec.role))
        {
            return Err("no worker or decode endpoint".into());
        }
        let misfits: Vec<String> = st
            .endpoints
            .values()
            .filter_map(|e| Some(format!("{} {}", e.spec.address, e.card_problem.as_ref()?)))
            .collect();
        if misfits.len() == st.endpoints.len() {
            return Err(format!(
                "no pod serves the picker's model: {}",
                misfits.join("; ")
            ));
        }
        let waiting: Vec<String> = st
            .endpoints
            .values()
            .filter(|e| !self.is_ready(e))
            .map(|e| e.spec.address.to_string())
            .collect();
        if waiting.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "waiting for the first KV snapshot of {}",
                waiting.join(", ")
            ))
        }
    }

    fn is_ready(&self, e: &Endpoint) -> bool {
        self.config.mode != RouterMode::Kv || e.synced || e.added.elapsed() >= self.config.warmup
    }

    fn publish_endpoint_gauges(&self, st: &State) {
        for role in Role::ALL {
            for ready in [true, false] {
                let n = st
                    .endpoints
                    .values()
                    .filter(|e| e.spec.role == role && self.is_ready(e) == ready)
                    .count();
                self.metrics
                    .endpoints
                    .get_or_create(&vec![
                        ("role", role.as_str().to_owned()),
                        ("state", if ready { "ready" } else { "syncing" }.to_owned()),
                    ])
                    .set(n as i64);
            }
        }
    }

    /// Sets each pod's `dynamo_frontend_worker_active_*` gauges from the load the
    /// scheduler sees: prefill is this replica's requests alone (replicas add up), decode
    /// includes what the engine's metrics show beyond them (each replica sees about the
    /// whole pod). Called on each scrape; under the state lock, so a pod's series, once
    /// removed with the pod, stays removed.
    pub fn publish_load(&self) {
        let st = self.lock();
        let block_size = self.config.block_size as u64;
        for (&worker, e) in &st.endpoints {
            let worker_type = match e.spec.role {
                Role::Prefill => metrics::PREFILL_WORKER,
                Role::Aggregated | Role::Decode => metrics::DECODE_WORKER,
            };
            let load = st.core.load().load(worker);
            self.metrics.worker_load(
                &e.spec.address.to_string(),
                worker_type,
                load.prefill_blocks * block_size,
                load.decode_blocks,
            );
        }
    }

    /// Known pods with their current load, for logs and tests.
    pub fn endpoints(&self) -> Vec<EndpointView> {
        let st = self.lock();
        let index = self.index.read().unwrap_or_else(PoisonError::into_inner);
        st.endpoints
            .iter()
            .map(|(&worker, e)| EndpointView {
                worker,
                spec: e.spec.clone(),
                synced: e.synced,
                blocks: index.worker_blocks(worker),
                load: st.core.load().load(worker).total(),
            })
            .collect()
    }

    /// Requests waiting for a pod.
    pub fn queue_len(&self) -> usize {
        self.lock().queue.len()
    }
}

/// A pod and its state as [`Router::endpoints`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointView {
    pub worker: WorkerId,
    pub spec: EndpointSpec,
    pub synced: bool,
    /// Blocks of the pod in the exact index.
    pub blocks: usize,
    /// Prefill plus decode blocks in flight.
    pub load: u64,
}

fn deliver(deliveries: Vec<Delivery>) {
    for (tx, result) in deliveries {
        // A waiter that left drops the assignment here, which releases its load.
        let _ = tx.send(result);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use dynamo_kvcache::{KvEvent, SaturationThreshold, StoredBlock, Tier};

    use super::*;
    use crate::metrics::SHORT_PROMPT_OUTCOME;

    const MODEL: &str = "m";

    fn router(config: RouterConfig) -> Arc<Router> {
        Arc::new(Router::new(config, MODEL, Arc::new(Metrics::new())))
    }

    fn spec(port: u16, role: Role) -> EndpointSpec {
        EndpointSpec::new(SocketAddr::from(([127, 0, 0, 1], port)), 9100, role)
    }

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// A prompt of `blocks` full 16-token blocks.
    fn prompt(blocks: u32, salt: u32) -> Vec<u32> {
        (0..blocks * 16).map(|t| t * 7 + salt).collect()
    }

    fn stored(r: &Router, tokens: &[u32]) -> KvEvent {
        KvEvent::Stored {
            parent: None,
            blocks: r
                .hasher()
                .seq_hashes(tokens)
                .into_iter()
                .map(|seq_hash| StoredBlock {
                    seq_hash,
                    engine_hash: seq_hash.0,
                    tier: Tier::Gpu,
                })
                .collect(),
        }
    }

    fn request(tokens: Vec<u32>) -> RouteRequest {
        RouteRequest {
            tokens,
            max_tokens: 8,
            ..RouteRequest::default()
        }
    }

    fn saturating(capacity: usize) -> RouterConfig {
        RouterConfig {
            queue_capacity: capacity,
            saturation: SaturationThreshold {
                max_blocks_in_flight: Some(0),
                ..SaturationThreshold::default()
            },
            ..RouterConfig::default()
        }
    }

    /// Polls `cond` for up to 10 s (tasks run on a loaded machine).
    async fn eventually(mut cond: impl FnMut() -> bool) {
        for _ in 0..1000 {
            if cond() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("condition not reached in 10 s");
    }

    #[test]
    fn event_lag_is_measured_from_the_sidecars_publish_time() {
        let metrics = Arc::new(Metrics::new());
        let r = Arc::new(Router::new(RouterConfig::default(), MODEL, metrics.clone()));
        r.add_endpoint(WorkerId(1), spec(8001, Role::Aggregated));
        let event = stored(&r, &prompt(1, 0));
        let published = SystemTime::now() - Duration::from_millis(300);
        r.apply_update(
            WorkerId(1),
            PodUpdate::Event(event.clone(), Some(published)),
        );
        // Without a publish time there is nothing to measure.
        r.apply_update(WorkerId(1), PodUpdate::Event(event, None));
        let text = metrics.encode();
        let value = |name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
                .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
        };
        assert_eq!(value("dynamo_epp_kv_event_lag_seconds_count "), 1.0);
        let lag = value("dynamo_epp_kv_event_lag_seconds_sum ");
        assert!((0.3..10.0).contains(&lag), "lag {lag}");
    }

    #[tokio::test]
    async fn kv_mode_prefers_the_pod_holding_the_prefix_and_forgets_it_when_lost() {
        let r = router(RouterConfig::default());
        r.add_endpoint(WorkerId(1), spec(8001, Role::Aggregated));
        r.add_endpoint(WorkerId(2), spec(8002, Role::Aggregated));
        let tokens = prompt(8, 1);
        r.apply_update(WorkerId(2), PodUpdate::Snapshot(vec![stored(&r, &tokens)]));
        let a = r.route(request(tokens.clone())).await.unwrap();
        assert_eq!((a.worker, a.address), (WorkerId(2), addr(8002)));
        assert_eq!((a.decision.overlap.total(), a.prompt_blocks), (8, 8));
        drop(a);

        r.apply_update(WorkerId(2), PodUpdate::Lost);
        assert_eq!(r.endpoints()[1].blocks, 0);
        let a = r.route(request(tokens)).await.unwrap();
        assert_eq!(
            a.decision.overlap.total(),
            0,
            "nothing is cached anywhere now"
        );
    }

    /// `name{worker_id="127.0.0.1:port",worker_type}` after a refresh, if exported.
    fn worker_gauge(r: &Router, name: &str, port: u16, worker_type: &str) -> Option<i64> {
        r.publish_load();
        let series =
            format!("{name}{{worker_id=\"127.0.0.1:{port}\",worker_type=\"{worker_type}\"}} ");
        r.metrics()
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(&series)?.parse().ok())
    }

    const PREFILL_TOKENS: &str = "dynamo_frontend_worker_active_prefill_tokens";
    const DECODE_BLOCKS: &str = "dynamo_frontend_worker_active_decode_blocks";

    #[tokio::test]
    async fn per_worker_gauges_follow_prefill_then_decode_and_leave_with_the_pod() {
        let r = router(RouterConfig::default());
        r.add_endpoint(WorkerId(1), spec(8001, Role::Prefill));
        r.add_endpoint(WorkerId(2), spec(8002, Role::Decode));
        let g = |name, port, worker_type| worker_gauge(&r, name, port, worker_type);
        assert_eq!(
            g(PREFILL_TOKENS, 8001, "prefill"),
            Some(0),
            "idle pods report 0"
        );
        let mut a = r.route(request(prompt(3, 0))).await.unwrap();
        // 3 uncached blocks of 16 tokens on the prefill pod; both pods hold the prompt's
        // KV from the pick (the decode pod receives it).
        assert_eq!(g(PREFILL_TOKENS, 8001, "prefill"), Some(48));
        assert_eq!(g(DECODE_BLOCKS, 8001, "prefill"), Some(3));
        assert_eq!(g(PREFILL_TOKENS, 8002, "decode"), Some(0));
        assert_eq!(g(DECODE_BLOCKS, 8002, "decode"), Some(3));
        a.first_token();
        assert_eq!(g(PREFILL_TOKENS, 8001, "prefill"), Some(0));
        assert_eq!(g(DECODE_BLOCKS, 8002, "decode"), Some(3));
        // The engine holds 50 blocks: 47 of them other replicas' requests, which count
        // as the pod's decode load (each replica sees about the whole pod: the planner
        // takes the largest view), until the next report.
        let engine = EngineMetrics {
            num_requests_waiting: 0,
            kv_cache_usage_perc: 0.5,
            num_gpu_blocks: Some(100),
        };
        r.observe_engine(WorkerId(2), engine);
        r.metrics().engine("127.0.0.1:8002", &engine);
        assert_eq!(g(DECODE_BLOCKS, 8002, "decode"), Some(50));
        drop(a);
        assert_eq!(g(DECODE_BLOCKS, 8002, "decode"), Some(47));
        r.observe_engine(
            WorkerId(2),
            EngineMetrics {
                kv_cache_usage_perc: 0.0,
                ..engine
            },
        );
        assert_eq!(g(DECODE_BLOCKS, 8002, "decode"), Some(0));

        let mut b = r.route(request(prompt(2, 1))).await.unwrap();
        b.first_token();
        assert_eq!(g(DECODE_BLOCKS, 8002, "decode"), Some(2));
        assert!(
            r.metrics()
                .encode()
                .contains(r#"dynamo_epp_engine_kv_blocks{pod="127.0.0.1:8002"} 100"#)
        );
        r.remove_endpoint(WorkerId(2));
        assert_eq!(g(PREFILL_TOKENS, 8002, "decode"), None);
        assert_eq!(g(DECODE_BLOCKS, 8002, "decode"), None);
        // Its gauges go (its counters, such as its picks, stay).
        let text = r.metrics().encode();
        let gauges = ["dynamo_frontend_worker_", "dynamo_epp_engine_kv_"];
        let left: Vec<&str> = text
            .lines()
            .filter(|l| gauges.iter().any(|g| l.starts_with(g)) && l.contains("127.0.0.1:8002"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        // The request of the pod that left ends without resurrecting its series.
        drop(b);
        assert_eq!(g(DECODE_BLOCKS, 8002, "decode"), None);
        assert_eq!(g(PREFILL_TOKENS, 8001, "prefill"), Some(0));
    }

    #[tokio::test]
    async fn an_aggregated_pod_is_a_decode_worker_charged_its_uncached_prompt_only() {
        let r = router(RouterConfig::default());
        r.add_endpoint(WorkerId(1), spec(8001, Role::Aggregated));
        let tokens = prompt(4, 2);
        // The pod holds the first 2 of the prompt's 4 blocks.
        r.apply_update(
            WorkerId(1),
            PodUpdate::Snapshot(vec![stored(&r, &tokens[..32])]),
        );
        let mut a = r.route(request(tokens)).await.unwrap();
        assert_eq!(worker_gauge(&r, PREFILL_TOKENS, 8001, "decode"), Some(32));
        // The engine holds the prompt's blocks from admission, prefilling or not.
        assert_eq!(worker_gauge(&r, DECODE_BLOCKS, 8001, "decode"), Some(4));
        a.first_token();
        assert_eq!(worker_gauge(&r, PREFILL_TOKENS, 8001, "decode"), Some(0));
        assert_eq!(worker_gauge(&r, DECODE_BLOCKS, 8001, "decode"), Some(4));
        assert_eq!(worker_gauge(&r, DECODE_BLOCKS, 8001, "prefill"), None);
    }

    #[tokio::test]
    async fn an_expected_output_length_weighs_on_its_pod_while_it_decodes() {
        let r = router(RouterConfig::default());
        r.add_endpoint(WorkerId(1), spec(8001, Role::Aggregated));
        r.add_endpoint(WorkerId(2), spec(8002, Role::Aggregated));
        // A long answer is expected: 640 tokens, 20 blocks held on average (half of 40).
        let mut long = r
            .route(RouteRequest {
                osl: Some(640),
                ..request(prompt(2, 0))
            })
            .await
            .unwrap();
        let load = |w: WorkerId| r.endpoints().iter().find(|e| e.worker == w).unwrap().load;
        assert_eq!(
            load(long.worker),
            2 + 2,
            "its prompt, no output before the first token"
        );
        long.first_token();
        assert_eq!(load(long.worker), 2 + 20);
        // The next requests, with longer prompts than the first, avoid its pod.
        let other = if long.worker == WorkerId(1) {
            WorkerId(2)
        } else {
            WorkerId(1)
        };
        let mut held = Vec::new();
        for salt in 1..=3 {
            let mut a = r.route(request(prompt(5, salt))).await.unwrap();
            assert_eq!(a.worker, other, "request {salt}");
            a.first_token();
            held.push(a);
        }
        drop(long);
        assert_eq!(load(WorkerId(1)).min(load(WorkerId(2))), 0);
    }

    #[tokio::test]
    async fn load_is_held_until_the_assignment_is_dropped() {
        let r = router(RouterConfig::default());
        r.add_endpoint(WorkerId(1), spec(8001, Role::Aggregated));
        let mut a = r.route(request(prompt(4, 0))).await.unwrap();
        assert_eq!(
            r.endpoints()[0].load,
            4 + 4,
            "4 blocks to prefill, held meanwhile"
        );
        a.first_token();
        assert_eq!(r.endpoints()[0].load, 4, "now 4 blocks of decode");
        drop(a);
        assert_eq!(r.endpoints()[0].load, 0);
    }

    #[tokio::test]
    async fn saturated_pods_queue_requests_then_shed_them() {
        let r = router(saturating(1));
        r.add_endpoint(WorkerId(1), spec(8001, Role::Aggregated));
        let first = r.route(request(prompt(2, 0))).await.unwrap();
        let waiting = tokio::spawn({
            let r = r.clone();
            async move { r.route(request(prompt(2, 1))).await }
        });
        eventually(|| r.queue_len() == 1).await;
        assert_eq!(
            r.route(request(prompt(2, 2))).await.unwrap_err(),
            RouteError::Overloaded { capacity: 1 }
        );
        drop(first);
        let second = waiting.await.unwrap().unwrap();
        assert_eq!(second.worker, WorkerId(1));
        assert_eq!(r.queue_len(), 0);
    }

    #[tokio::test]
    async fn priority_moves_a_waiting_request_ahead() {
        let r = router(saturating(4));
        r.add_endpoint(WorkerId(1), spec(8001, Role::Aggregated));
        let first = r.route(request(prompt(2, 0))).await.unwrap();
        let spawn = |priority| {
            let r = r.clone();
            tokio::spawn(async move {
                let req = RouteRequest {
                    priority,
                    ..request(prompt(2, 5))
                };
                r.route(req).await
            })
        };
        let low = spawn(0);
        eventually(|| r.queue_len() == 1).await;
        let high = spawn(5);
        eventually(|| r.queue_len() == 2).await;
        drop(first);
        let served = high.await.unwrap().unwrap();
        assert_eq!(r.queue_len(), 1, "the low-priority request still waits");
        drop(served);
        assert!(low.await.unwrap().is_ok());
    }

    #[tokio::test]
    async fn a_caller_that_leaves_gives_up_its_place_and_a_pool_that_empties_fails_waiters() {
        let r = router(saturating(4));
        r.add_endpoint(WorkerId(1), spec(8001, Role::Aggregated));
        let _first = r.route(request(prompt(2, 0))).await.unwrap();
        let gone = tokio::spawn({
            let r = r.clone();
            async move { r.route(request(prompt(2, 1))).await }
        });
        eventually(|| r.queue_len() == 1).await;
        gone.abort();
        eventually(|| r.queue_len() == 0).await;

        let waiting = tokio::spawn({
            let r = r.clone();
            async move { r.route(request(prompt(2, 1))).await }
        });
        eventually(|| r.queue_len() == 1).await;
        r.remove_endpoint(WorkerId(1));
        assert!(matches!(
            waiting.await.unwrap(),
            Err(RouteError::NoEndpoint(_))
        ));
    }

    #[tokio::test]
    async fn disaggregated_pools_get_a_decode_and_a_prefill_pod() {
        let r = router(RouterConfig::default());
        r.add_endpoint(WorkerId(1), spec(8001, Role::Prefill));
        let err = r.route(request(prompt(2, 0))).await.unwrap_err();
        assert!(matches!(err, RouteError::NoEndpoint(_)), "{err}");
        r.add_endpoint(WorkerId(2), spec(8002, Role::Decode));
        let a = r.route(request(prompt(2, 0))).await.unwrap();
        assert_eq!((a.address, a.prefill), (addr(8002), Some(addr(8001))));
        assert_eq!(
            r.endpoints()[0].load,
            2 + 2,
            "the prefill pod carries the prefill and its KV"
        );
        let mut a = a;
        a.first_token();
        assert_eq!(
            r.endpoints()[0].load,
            0,
            "prefill is over at the first token"
        );
    }

    #[tokio::test]
    async fn a_prompt_filling_no_block_is_prefilled_on_its_decode_pod_without_a_hop() {
        let metrics = Arc::new(Metrics::new());
        let r = Arc::new(Router::new(RouterConfig::default(), MODEL, metrics.clone()));
        r.add_endpoint(WorkerId(1), spec(8001, Role::Prefill));
        r.add_endpoint(WorkerId(2), spec(8002, Role::Decode));
        let short: Vec<u32> = (0..15).collect();
        let a = r.route(request(short)).await.unwrap();
        assert_eq!((a.address, a.prefill), (addr(8002), None));
        assert_eq!(
            r.endpoints()[0].load,
            0,
            "the prefill pod has nothing to do"
        );
        let text = metrics.encode();
        let skipped =
            format!(r#"dynamo_epp_prefill_hops_total{{outcome="{SHORT_PROMPT_OUTCOME}"}} 1"#);
        assert!(text.contains(&skipped), "{text}");
    }

    #[tokio::test]
    async fn a_disaggregated_decode_pod_is_picked_by_decode_load_not_by_its_cache() {
        let r = router(RouterConfig::default());
        r.add_endpoint(WorkerId(1), spec(8001, Role::Prefill));
        r.add_endpoint(WorkerId(2), spec(8002, Role::Decode));
        r.add_endpoint(WorkerId(3), spec(8003, Role::Decode));
        // Decode pod 2 holds the whole prompt, and is the busier one.
        let tokens = prompt(8, 1);
        r.apply_update(WorkerId(2), PodUpdate::Snapshot(vec![stored(&r, &tokens)]));
        let mut busy = r.route(request(prompt(2, 9))).await.unwrap();
        busy.first_token();
        let busy_pod = busy.worker;
        let mut a = r.route(request(tokens)).await.unwrap();
        assert_ne!(a.worker, busy_pod, "the idle decode pod, cache or not");
        let load = |w: WorkerId| {
            let e = r.endpoints();
            e.iter().find(|e| e.worker == w).unwrap().load
        };
        assert_eq!(
            load(a.worker),
            8,
            "it prefills nothing, but holds the prompt's KV"
        );
        assert_eq!(
            load(WorkerId(1)),
            8 + 8,
            "the prefill pod prefills and holds it"
        );
        a.first_token();
        assert_eq!(load(a.worker), 8, "then decodes the whole prompt");
    }

    #[tokio::test]
    async fn subset_exclude_and_unhealthy_pods_narrow_the_choice() {
        let r = router(RouterConfig::default());
        for (w, port) in [(1, 8001), (2, 8002), (3, 8003)] {
            r.add_endpoint(WorkerId(w), spec(port, Role::Aggregated));
        }
        let only = |ports: &[u16]| RouteRequest {
            subset: Some(ports.iter().map(|&p| addr(p)).collect()),
            ..request(prompt(1, 0))
        };
        assert_eq!(r.route(only(&[8003])).await.unwrap().worker, WorkerId(3));
        let err = r.route(only(&[])).await.unwrap_err();
        assert_eq!(
            err,
            RouteError::NoEndpoint("the subset hint is empty".into())
        );
        let err = r.route(only(&[9999])).await.unwrap_err();
        assert!(matches!(err, RouteError::NoEndpoint(_)));

        let excluded = RouteRequest {
            exclude: vec![addr(8001)],
            ..request(prompt(1, 0))
        };
        assert_ne!(r.route(excluded).await.unwrap().worker, WorkerId(1));

        r.mark_unhealthy(addr(8001));
        r.mark_unhealthy(addr(8002));
        assert_eq!(
            r.route(request(prompt(1, 0))).await.unwrap().worker,
            WorkerId(3)
        );
        r.mark_unhealthy(addr(8003));
        // All failed lately: one is tried anyway.
        assert!(r.route(request(prompt(1, 0))).await.is_ok());
    }

    #[tokio::test]
    async fn readiness_waits_for_each_pods_first_snapshot_or_the_warm_up() {
        let r = router(RouterConfig {
            warmup: Duration::from_secs(3600),
            ..RouterConfig::default()
        });
        assert_eq!(r.readiness(), Err("no endpoints discovered".into()));
        r.add_endpoint(WorkerId(1), spec(8001, Role::Aggregated));
        let err = r.readiness().unwrap_err();
        assert!(err.contains("127.0.0.1:8001"), "{err}");
        r.apply_update(WorkerId(1), PodUpdate::Snapshot(Vec::new()));
        assert_eq!(r.readiness(), Ok(()));

        let quick = router(RouterConfig {
            warmup: Duration::ZERO,
            ..RouterConfig::default()
        });
        quick.add_endpoint(WorkerId(1), spec(8001, Role::Aggregated));
        assert_eq!(quick.readiness(), Ok(()));
    }

    #[tokio::test]
    async fn approx_mode_learns_from_its_own_picks() {
        let r = router(RouterConfig {
            mode: RouterMode::Approx,
            ..RouterConfig::default()
        });
        r.add_endpoint(WorkerId(1), spec(8001, Role::Aggregated));
        r.add_endpoint(WorkerId(2), spec(8002, Role::Aggregated));
        let shared = prompt(8, 3);
        // Pod 1 is busier, so a cold prompt goes to pod 2...
        let busy = RouteRequest {
            subset: Some(vec![addr(8001)]),
            ..request(prompt(2, 9))
        };
        let _busy = r.route(busy).await.unwrap();
        let first = r.route(request(shared.clone())).await.unwrap();
        assert_eq!(first.worker, WorkerId(2));
        drop(first);
        // ...and the same prompt follows it there, despite equal load now.
        let again = r.route(request(shared)).await.unwrap();
        assert_eq!(
            (again.worker, again.decision.overlap.total()),
            (WorkerId(2), 8)
        );
    }
}
