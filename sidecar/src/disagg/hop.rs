//! The prefill hop (`DESIGN.md`, "Disaggregated request"), a tower layer in front of the
//! proxy: a request the picker gave a prefill pod (`x-prefiller-host-port`) is first sent
//! there for its prefill, its KV blocks are brought here when they wait in that pod's
//! sidecar, and the original request then goes to the local engine with the prefill's
//! `kv_transfer_params`. Every failure but a 4xx from the prefill pod degrades to local
//! prefill of the original request, so the answer is always the engine's own.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use dynamo_kvcache::SeqHash;
use dynamo_llm::ApiError;
use dynamo_llm::disagg::{
    HopOutcome, KV_TRANSFER_MS_HEADER, KVBLOCKS_TRANSPORT, KvTransferParams, PREFILL_HOP_HEADER,
    PREFILLER_HEADER, prefill_body,
};
use futures::StreamExt;
use futures::future::BoxFuture;
use serde_json::{Map, Value};
use tower::{Layer, Service};

use super::metrics::HopMetrics;
use super::peers::PrefillPeers;
use super::transfer::Transfer;
use crate::blocks::lease::Leases;
use crate::proxy::FromHop;

/// Paths whose requests take the hop (vLLM's disaggregated proxy serves these two),
/// the ones whose bodies carry transfer parameters.
pub const HOP_PATHS: [&str; 2] = ["/v1/chat/completions", "/v1/completions"];
/// Largest request body the hop reads whole to rewrite it: a million-token prompt as
/// JSON text is well under this.
pub const MAX_BODY_BYTES: usize = 64 << 20;
/// Largest prefill answer read: one token and the transfer parameters of a
/// million-token prompt's block list.
const MAX_PREFILL_ANSWER_BYTES: usize = 16 << 20;
/// Most blocks one transfer names (as the block API's chain limit).
const MAX_BLOCKS: usize = 1 << 16;

/// What the hop needs, shared by every request.
pub struct Hop {
    /// HTTP client of the prefill pods' sidecars.
    pub client: reqwest::Client,
    pub peers: PrefillPeers,
    pub transfer: Transfer,
    pub leases: Leases,
    /// This sidecar's gRPC port, where its engine takes the fetched blocks.
    pub grpc_port: u16,
    pub prefill_timeout: Duration,
    pub metrics: HopMetrics,
}

#[derive(Clone)]
pub struct PrefillHopLayer(Arc<Hop>);

impl PrefillHopLayer {
    pub fn new(hop: Hop) -> Self {
        Self(Arc::new(hop))
    }
}

impl<S> Layer<S> for PrefillHopLayer {
    type Service = PrefillHop<S>;

    fn layer(&self, inner: S) -> PrefillHop<S> {
        PrefillHop {
            inner,
            hop: self.0.clone(),
        }
    }
}

/// The proxy `S` behind the prefill hop.
#[derive(Clone)]
pub struct PrefillHop<S> {
    inner: S,
    hop: Arc<Hop>,
}

impl<S> Service<Request> for PrefillHop<S>
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        // The clone is ready only if polled; the polled one goes with this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        if !request.headers().contains_key(PREFILLER_HEADER) {
            return Box::pin(inner.call(request));
        }
        let hop = self.hop.clone();
        Box::pin(async move { Ok(hop.run(request, inner).await) })
    }
}

/// The prefill pod of a request: where its prefill leg goes, and the port of its
/// sidecar's block API.
#[derive(Clone, Copy)]
struct Prefill {
    target: SocketAddr,
    block_port: u16,
}

/// How the prefill leg ended, short of transfer parameters.
enum Failed {
    /// The prefill pod's 4xx, for the client.
    Client(Response),
    Fallback(HopOutcome, String),
}

/// The request for the engine, and what the response reports.
struct Decode {
    body: Bytes,
    outcome: HopOutcome,
    transfer: Option<Duration>,
    /// The local lease of the fetched blocks, released when the response ends.
    lease: Option<LeaseGuard>,
}

impl Hop {
    async fn run<S>(&self, request: Request, mut inner: S) -> Response
    where
        S: Service<Request, Response = Response, Error = Infallible>,
    {
        let (mut parts, body) = request.into_parts();
        let named = parts.headers.remove(PREFILLER_HEADER);
        // The lease of the blocks fetched for this request is charged to its client.
        let peer = crate::proxy::client_ip(&parts.extensions);
        if !HOP_PATHS.contains(&parts.uri.path()) {
            return call(&mut inner, Request::from_parts(parts, body)).await;
        }
        let target = named
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<SocketAddr>().ok());
        let Some(target) = target else {
            return self.refuse(format!("{PREFILLER_HEADER} must be one ip:port"));
        };
        let Some(block_port) = self.peers.block_api_port(target).await else {
            return self.refuse(format!(
                "prefill pod {target} is not a prefill member of this pool"
            ));
        };
        let prefill = Prefill { target, block_port };
        let bytes = match read_body(body).await {
            Ok(bytes) => bytes,
            Err(e) => return e.into_response(),
        };
        // Not a JSON object: the engine says what is wrong with it.
        let Ok(Value::Object(client)) = serde_json::from_slice::<Value>(&bytes) else {
            return call(&mut inner, Request::from_parts(parts, Body::from(bytes))).await;
        };
        let request_id = new_id();
        let started = Instant::now();
        let decode = match self.prefill(target, &parts, &client, &request_id).await {
            Ok(params) => {
                self.metrics
                    .prefill_seconds
                    .observe(started.elapsed().as_secs_f64());
                self.decode(prefill, &client, params, peer).await
            }
            Err(Failed::Client(response)) => {
                return self.answered(response, HopOutcome::ClientError, None);
            }
            Err(Failed::Fallback(outcome, why)) => {
                tracing::warn!(prefill = %target, %why, "prefill hop failed; prefilling here");
                Decode {
                    body: with_none(&client),
                    outcome,
                    transfer: None,
                    lease: None,
                }
            }
        };
        parts.headers.insert(
            header::CONTENT_LENGTH,
            HeaderValue::from(decode.body.len() as u64),
        );
        parts.headers.insert(
            "x-request-id",
            HeaderValue::from_str(&request_id).expect("hex"),
        );
        parts.extensions.insert(FromHop);
        let response = call(
            &mut inner,
            Request::from_parts(parts, Body::from(decode.body)),
        )
        .await;
        let response = match decode.lease {
            Some(guard) => response.map(|body| {
                Body::from_stream(body.into_data_stream().map(move |chunk| {
                    let _ = &guard;
                    chunk
                }))
            }),
            None => response,
        };
        self.answered(response, decode.outcome, decode.transfer)
    }

    /// Sends the prefill leg and returns the prefill's transfer parameters.
    async fn prefill(
        &self,
        target: SocketAddr,
        parts: &axum::http::request::Parts,
        client: &Map<String, Value>,
        request_id: &str,
    ) -> Result<KvTransferParams, Failed> {
        let body = serde_json::to_vec(&prefill_body(client)).expect("JSON serializes");
        let mut leg = self
            .client
            .post(format!("http://{target}{}", parts.uri.path()))
            .header(header::CONTENT_TYPE, "application/json")
            .header("x-request-id", request_id)
            .body(body);
        if let Some(credentials) = parts.headers.get(header::AUTHORIZATION) {
            leg = leg.header(header::AUTHORIZATION, credentials);
        }
        let answer = async {
            let answer = leg.send().await?;
            let (status, headers) = (answer.status(), answer.headers().clone());
            let body = read_limited(answer, MAX_PREFILL_ANSWER_BYTES).await?;
            Ok::<_, reqwest::Error>((status, headers, body))
        };
        let (status, headers, body) = match tokio::time::timeout(self.prefill_timeout, answer).await
        {
            Err(_) => {
                let why = format!("no answer within {:?}", self.prefill_timeout);
                return Err(Failed::Fallback(HopOutcome::FallbackTimeout, why));
            }
            Ok(Err(e)) => {
                return Err(Failed::Fallback(
                    HopOutcome::FallbackPrefillFailed,
                    e.to_string(),
                ));
            }
            Ok(Ok(answer)) => answer,
        };
        // The request itself is wrong (as llm-d's sidecar, 4xx go to the client); but a
        // busy prefill pod (429) is no reason to refuse what this pod can prefill.
        if status.is_client_error() && status != StatusCode::TOO_MANY_REQUESTS {
            let Some(body) = body else {
                // Passing on the part that fits would hand the client invalid JSON.
                let error = ApiError {
                    status,
                    code: Some("prefill_answer_too_large"),
                    ..ApiError::bad_request(
                        format!(
                            "the prefill pod refused the request ({status}) with an answer \
                             longer than {} MiB",
                            MAX_PREFILL_ANSWER_BYTES >> 20
                        ),
                        None,
                    )
                };
                return Err(Failed::Client(error.into_response()));
            };
            let mut response = Response::new(Body::from(body));
            *response.status_mut() = status;
            if let Some(kind) = headers.get(header::CONTENT_TYPE) {
                response
                    .headers_mut()
                    .insert(header::CONTENT_TYPE, kind.clone());
            }
            return Err(Failed::Client(response));
        }
        if !status.is_success() {
            let why = format!("the prefill pod answered {status}");
            return Err(Failed::Fallback(HopOutcome::FallbackPrefillFailed, why));
        }
        let Some(body) = body else {
            let why = format!(
                "the prefill answer is longer than {} MiB",
                MAX_PREFILL_ANSWER_BYTES >> 20
            );
            return Err(Failed::Fallback(HopOutcome::FallbackPrefillFailed, why));
        };
        match serde_json::from_slice::<Value>(&body) {
            Ok(Value::Object(answer)) => KvTransferParams::of(&answer)
                .filter(|p| p.do_remote_prefill)
                .ok_or_else(|| {
                    let why = "the prefill answer has no kv_transfer_params".to_owned();
                    Failed::Fallback(HopOutcome::FallbackPrefillFailed, why)
                }),
            _ => {
                let why = "the prefill answer is not a JSON object".to_owned();
                Err(Failed::Fallback(HopOutcome::FallbackPrefillFailed, why))
            }
        }
    }

    /// The engine's request after a prefill that answered `params`, for `peer`.
    async fn decode(
        &self,
        prefill: Prefill,
        client: &Map<String, Value>,
        params: KvTransferParams,
        peer: IpAddr,
    ) -> Decode {
        let with = |params: &KvTransferParams| {
            let mut body = client.clone();
            params.put(&mut body);
            Bytes::from(serde_json::to_vec(&body).expect("JSON serializes"))
        };
        if !params.via_sidecars() {
            // The engines move the blocks themselves (vLLM's NixlConnector).
            return Decode {
                body: with(&params),
                outcome: HopOutcome::Passthrough,
                transfer: None,
                lease: None,
            };
        }
        if params.remote_block_ids.as_ref().is_some_and(Vec::is_empty) {
            // A prompt shorter than a block: nothing to move, the engine computes it.
            return Decode {
                body: with_none(client),
                outcome: HopOutcome::Remote,
                transfer: None,
                lease: None,
            };
        }
        let started = Instant::now();
        match self.fetch(prefill, &params, peer).await {
            Ok((local, hashes)) => {
                let took = started.elapsed();
                self.metrics.transfer_seconds.observe(took.as_secs_f64());
                let ours = KvTransferParams {
                    do_remote_prefill: true,
                    remote_block_ids: Some(hashes.iter().map(|h| h.0).collect()),
                    remote_engine_id: params.remote_engine_id.clone(),
                    remote_request_id: Some(local.name.clone()),
                    remote_host: Some(Ipv4Addr::LOCALHOST.to_string()),
                    remote_port: Some(self.grpc_port),
                    tp_size: params.tp_size,
                    remote_transport: Some(KVBLOCKS_TRANSPORT.into()),
                    ..KvTransferParams::default()
                };
                Decode {
                    body: with(&ours),
                    outcome: HopOutcome::Remote,
                    transfer: Some(took),
                    lease: Some(local),
                }
            }
            Err(why) => {
                tracing::warn!(prefill = %prefill.target, %why, "KV transfer failed; prefilling here");
                Decode {
                    body: with_none(client),
                    outcome: HopOutcome::FallbackTransferFailed,
                    transfer: None,
                    lease: None,
                }
            }
        }
    }

    /// Brings the prefill's blocks here under a fresh local lease, charged to `peer`.
    /// They are fetched from the pod the picker named (its IP, whatever `remote_host`
    /// says) on its announced block API port, which the prefill's `remote_port` must be.
    async fn fetch(
        &self,
        prefill: Prefill,
        params: &KvTransferParams,
        peer: IpAddr,
    ) -> Result<(LeaseGuard, Vec<SeqHash>), String> {
        let (Some(lease), Some(port), Some(ids)) = (
            &params.remote_request_id,
            params.remote_port,
            &params.remote_block_ids,
        ) else {
            return Err("the prefill's kv_transfer_params name no lease".into());
        };
        if port != prefill.block_port {
            self.metrics.transfer_unannounced_port.inc();
            return Err(format!(
                "the prefill's answer names port {port}, not its block API port {}",
                prefill.block_port
            ));
        }
        if ids.len() > MAX_BLOCKS {
            return Err(format!("{} blocks to fetch", ids.len()));
        }
        let hashes: Vec<SeqHash> = ids.iter().copied().map(SeqHash).collect();
        let from = SocketAddr::new(peer_ip(prefill.target.ip()), prefill.block_port);
        let (blocks, transport) = self
            .transfer
            .fetch(from, lease, &hashes)
            .await
            .map_err(|e| e.to_string())?;
        self.metrics.transfer(transport);
        if blocks.is_empty() {
            return Err("the prefill pod had none of the blocks".into());
        }
        let bytes: u64 = blocks.iter().map(|b| b.payload.len() as u64).sum();
        let fetched: Vec<SeqHash> = blocks.iter().map(|b| b.hash).collect();
        self.metrics.transfer_bytes.inc_by(bytes);
        self.metrics.transfer_blocks.inc_by(blocks.len() as u64);
        let name = new_id();
        let charge = self.leases.lending(&name, peer);
        self.leases
            .lend(&name, blocks, charge)
            .map_err(|e| format!("holding the fetched blocks: {e}"))?;
        let guard = LeaseGuard {
            leases: self.leases.clone(),
            name,
        };
        Ok((guard, fetched))
    }

    fn refuse(&self, message: String) -> Response {
        let error = ApiError {
            status: StatusCode::FORBIDDEN,
            code: Some("prefill_pod_refused"),
            ..ApiError::bad_request(message, None)
        };
        self.answered(error.into_response(), HopOutcome::Refused, None)
    }

    /// Counts the hop and says how it went in the response's headers.
    fn answered(
        &self,
        mut response: Response,
        outcome: HopOutcome,
        transfer: Option<Duration>,
    ) -> Response {
        self.metrics.hop(outcome);
        let headers: &mut HeaderMap = response.headers_mut();
        headers.insert(
            PREFILL_HOP_HEADER,
            HeaderValue::from_static(outcome.as_str()),
        );
        if let Some(took) = transfer {
            let ms = format!("{:.3}", took.as_secs_f64() * 1000.0);
            headers.insert(
                KV_TRANSFER_MS_HEADER,
                HeaderValue::from_str(&ms).expect("digits"),
            );
        }
        response
    }
}

/// The client's body as it came (without transfer parameters of its own: a client
/// cannot hand the engine a lease).
fn with_none(client: &Map<String, Value>) -> Bytes {
    let mut body = client.clone();
    body.remove(KvTransferParams::FIELD);
    Bytes::from(serde_json::to_vec(&body).expect("JSON serializes"))
}

/// A prefill pod reached over loopback (the local runner) keeps its loopback address;
/// an unspecified one (`0.0.0.0`) means this host.
fn peer_ip(ip: IpAddr) -> IpAddr {
    if ip.is_unspecified() {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        ip
    }
}

/// Releases a local lease (if its engine has not taken it) when dropped: with the
/// response, whether it ended or the client left.
struct LeaseGuard {
    leases: Leases,
    name: String,
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.leases.release(&self.name);
    }
}

async fn call<S>(inner: &mut S, request: Request) -> Response
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    match inner.call(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

/// A fresh request id and lease name: 128 random bits in hex, so that no client can
/// name another request's lease.
pub(crate) fn new_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

async fn read_body(body: Body) -> Result<Bytes, ApiError> {
    let mut out = Vec::new();
    let mut chunks = body.into_data_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::bad_request(format!("reading the request body failed: {e}"), None)
        })?;
        if out.len() + chunk.len() > MAX_BODY_BYTES {
            return Err(ApiError::body_too_large(MAX_BODY_BYTES));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(out))
}

/// A prefill answer's body, or `None` when it is longer than `limit` (what was read of it
/// is no whole answer, so nothing of it is used).
async fn read_limited(
    answer: reqwest::Response,
    limit: usize,
) -> Result<Option<Bytes>, reqwest::Error> {
    let mut out = Vec::new();
    let mut chunks = answer.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk?;
        if out.len() + chunk.len() > limit {
            return Ok(None);
        }
        out.extend_from_slice(&chunk);
    }
    Ok(Some(Bytes::from(out)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks::lease::LeaseMetrics;
    use crate::metrics::Metrics;
    use std::sync::Mutex;
    use tower::ServiceExt;

    /// The hop with `peers` as its prefill pods, and its metrics.
    fn layer(peers: &[String]) -> (PrefillHopLayer, Arc<Hop>) {
        let mut metrics = Metrics::new();
        let hop = Hop {
            client: reqwest::Client::new(),
            peers: PrefillPeers::parse(peers, 9100).unwrap(),
            transfer: Transfer::new(Duration::from_secs(1), None),
            leases: Leases::new(
                Duration::from_secs(1),
                1 << 20,
                1 << 20,
                LeaseMetrics::register(&mut metrics),
            ),
            grpc_port: 0,
            prefill_timeout: Duration::from_secs(5),
            metrics: HopMetrics::register(&mut metrics),
        };
        let layer = PrefillHopLayer::new(hop);
        let hop = layer.0.clone();
        (layer, hop)
    }

    /// An engine that answers 200 and keeps the requests it was sent (headers, body).
    #[derive(Clone, Default)]
    struct Engine(Arc<Mutex<Vec<(HeaderMap, Bytes)>>>);

    impl Engine {
        fn service(
            &self,
        ) -> impl Service<
            Request,
            Response = Response,
            Error = Infallible,
            Future = impl Future<Output = Result<Response, Infallible>> + Send,
        > + Clone
        + Send
        + 'static {
            let seen = self.0.clone();
            tower::service_fn(move |request: Request| {
                let seen = seen.clone();
                async move {
                    let (parts, body) = request.into_parts();
                    let body = read_body(body).await.unwrap();
                    seen.lock().unwrap().push((parts.headers, body));
                    Ok(Response::new(Body::from("engine")))
                }
            })
        }

        fn seen(&self) -> Vec<(HeaderMap, Bytes)> {
            self.0.lock().unwrap().clone()
        }
    }

    fn completion(prefiller: Option<&str>) -> Request {
        let mut request = axum::http::Request::post("/v1/completions");
        if let Some(prefiller) = prefiller {
            request = request.header(PREFILLER_HEADER, prefiller);
        }
        let body = r#"{"model":"m","prompt":"hi","kv_transfer_params":{"do_remote_prefill":true}}"#;
        request.body(Body::from(body)).unwrap()
    }

    #[tokio::test]
    async fn a_request_no_prefill_pod_was_named_for_goes_straight_to_the_engine() {
        let (layer, hop) = layer(&[]);
        let engine = Engine::default();
        let response = layer.layer(engine.service()).oneshot(completion(None));
        let response = response.await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(!response.headers().contains_key(PREFILL_HOP_HEADER));
        let seen = engine.seen();
        assert_eq!(seen.len(), 1);
        assert!(seen[0].1.starts_with(br#"{"model":"m""#));
        assert!(HopOutcome::ALL.iter().all(|o| hop.metrics.hops(*o) == 0));
    }

    #[tokio::test]
    async fn a_prefill_pod_outside_the_pool_is_refused_before_the_engine() {
        let (layer, hop) = layer(&["10.0.0.1:8000".to_owned()]);
        let engine = Engine::default();
        let request = completion(Some("10.0.0.2:8000"));
        let response = layer
            .layer(engine.service())
            .oneshot(request)
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        assert_eq!(response.headers()[PREFILL_HOP_HEADER], "refused");
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"]["code"], "prefill_pod_refused");
        assert!(engine.seen().is_empty());
        assert_eq!(hop.metrics.hops(HopOutcome::Refused), 1);
    }

    #[tokio::test]
    async fn a_prefill_pod_that_cannot_be_reached_leaves_the_prefill_to_the_engine() {
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let pod = closed.local_addr().unwrap().to_string();
        drop(closed);
        let (layer, hop) = layer(std::slice::from_ref(&pod));
        let engine = Engine::default();
        let request = completion(Some(&pod));
        let response = layer
            .layer(engine.service())
            .oneshot(request)
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()[PREFILL_HOP_HEADER],
            "fallback_prefill_failed"
        );
        let seen = engine.seen();
        assert_eq!(seen.len(), 1);
        let (headers, body) = &seen[0];
        assert!(!headers.contains_key(PREFILLER_HEADER));
        assert_eq!(headers["x-request-id"].len(), 32);
        // The client's own transfer parameters never reach the engine.
        let body: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(body, serde_json::json!({"model": "m", "prompt": "hi"}));
        assert_eq!(hop.metrics.hops(HopOutcome::FallbackPrefillFailed), 1);
    }
}
