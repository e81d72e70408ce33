//! The gateway side: an Envoy `ext_proc` v3 server speaking the Gateway API Inference
//! Extension's endpoint picker protocol
//! (kubernetes-sigs/gateway-api-inference-extension,
//! `docs/proposals/004-endpoint-picker-protocol/README.md`):
//!
//! - the gateway streams each request's headers and body (`FULL_DUPLEX_STREAMED`); the
//!   picker buffers the body until `end_of_stream` (at most the body limit: a longer
//!   one, by `content-length` or by the chunks so far, gets an immediate 413), parses
//!   the OpenAI request, tokenizes it and picks a pod;
//! - it answers the headers phase with header `x-gateway-destination-endpoint: ip:port`
//!   and the same value in dynamic metadata under `envoy.lb`, removes a client's
//!   `x-prefiller-host-port` (only the picker names a prefill pod), then hands the body
//!   back unchanged but for a client's own `kv_transfer_params`, which it drops;
//! - it honours the subset hint: `x-gateway-destination-endpoint-subset` (a list of
//!   `ip:port`) under the `envoy.lb.subset_hint` namespace of the request's
//!   `metadata_context`; an empty subset or one with no known pod gets a 503;
//! - no ready pod: an immediate 503; every pod saturated and the queue full: an
//!   immediate 429; a bad request: the OpenAI 4xx the engine would have sent;
//! - the response streams through the picker too, so it measures TTFT/ITL and ends the
//!   request's load when the response body ends or the stream closes; a sidecar's 503
//!   `engine_unreachable` marks the pod unhealthy (the gateway, not the picker, would
//!   have to resend the request: see `docs/epp.md`).
//!
//! gRPC health (`grpc.health.v1`) answers `liveness` (always serving), `readiness` and
//! `envoy.service.ext_proc.v3.ExternalProcessor` (serving while the router is ready).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use dynamo_llm::ApiError;
use dynamo_server::GrpcConnection;
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption, Metadata};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Phase;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Reply;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, HttpHeaders,
    ImmediateResponse, ProcessingRequest, ProcessingResponse, StreamedBodyResponse,
    TrailersResponse, body_mutation,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use futures::Stream;
use http::StatusCode;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tonic_health::ServingStatus;

use crate::frontend::{ERROR_BODY_BYTES, engine_unreachable, route_error};
use crate::meter::ResponseMeter;
use crate::metrics::{Metrics, PREPROCESS};
use crate::model_source::ModelSource;
use crate::request::{self, Api};
use crate::router::{Assignment, RouteRequest, Router};
use dynamo_llm::disagg::PREFILLER_HEADER;

/// Header and metadata key of the chosen pod (the protocol's default names).
pub const DESTINATION_KEY: &str = "x-gateway-destination-endpoint";
/// Dynamic metadata namespace of the chosen pod.
pub const DESTINATION_NAMESPACE: &str = "envoy.lb";
/// Metadata namespace and key of the gateway's subset hint.
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
pub const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
/// gRPC health services the protocol names.
pub const HEALTH_SERVICES: [&str; 3] = [
    "liveness",
    "readiness",
    "envoy.service.ext_proc.v3.ExternalProcessor",
];

/// The ext_proc service; one [`Session`] per HTTP request stream.
#[derive(Clone)]
pub struct ExtProc {
    model: ModelSource,
    router: Arc<Router>,
    metrics: Arc<Metrics>,
}

impl ExtProc {
    pub fn new(model: ModelSource, router: Arc<Router>, metrics: Arc<Metrics>) -> Self {
        Self {
            model,
            router,
            metrics,
        }
    }

    /// Ready to serve: the model is loaded and the router can route.
    fn ready(&self) -> bool {
        self.model.get().is_ok() && self.router.readiness().is_ok()
    }
}

#[tonic::async_trait]
impl ExternalProcessor for ExtProc {
    type ProcessStream = ReceiverStream<Result<ProcessingResponse, Status>>;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let (tx, rx) = mpsc::channel(16);
        let session = Session::new(self.clone());
        tokio::spawn(session.run(request.into_inner(), tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Serves ext_proc and gRPC health on `incoming` until `shutdown`; readiness follows
/// the model and the router every 500 ms.
pub async fn serve(
    incoming: impl Stream<Item = std::io::Result<GrpcConnection>> + Send + 'static,
    ext_proc: ExtProc,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status(HEALTH_SERVICES[0], ServingStatus::Serving)
        .await;
    let watched = ext_proc.clone();
    let readiness = tokio::spawn(async move {
        let mut last = None;
        loop {
            let status = match watched.ready() {
                true => ServingStatus::Serving,
                false => ServingStatus::NotServing,
            };
            if last != Some(status) {
                for service in &HEALTH_SERVICES[1..] {
                    reporter.set_service_status(service, status).await;
                }
                last = Some(status);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let result = tonic::transport::Server::builder()
        .add_service(health)
        .add_service(ExternalProcessorServer::new(ext_proc))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    readiness.abort();
    result
}

/// One HTTP request as the gateway streams it.
struct Session {
    shared: ExtProc,
    started: Instant,
    /// When the pick was made and the request could leave for its pod.
    sent: Instant,
    path: String,
    subset: Option<Vec<SocketAddr>>,
    body: Vec<u8>,
    /// Largest request body buffered, in bytes (known once the model is).
    body_limit: usize,
    prompt_tokens: usize,
    assignment: Option<Assignment>,
    meter: Option<ResponseMeter>,
    /// The body so far of a 503 answer, to tell whether the pod's engine is down.
    error_body: Option<Vec<u8>>,
}

impl Session {
    fn new(shared: ExtProc) -> Self {
        Self {
            shared,
            started: Instant::now(),
            sent: Instant::now(),
            path: String::new(),
            subset: None,
            body: Vec::new(),
            body_limit: 0,
            prompt_tokens: 0,
            assignment: None,
            meter: None,
            error_body: None,
        }
    }

    async fn run(
        mut self,
        mut inbound: Streaming<ProcessingRequest>,
        tx: mpsc::Sender<Result<ProcessingResponse, Status>>,
    ) {
        // A closed or failed stream ends here; dropping the session ends the request's
        // load (the gateway is done with it, whatever the reason).
        while let Ok(Some(message)) = inbound.message().await {
            if self.subset.is_none() {
                self.subset = subset_hint(message.metadata_context.as_ref());
            }
            let Some(phase) = message.request else {
                continue;
            };
            let (replies, finished) = self.on_phase(phase).await;
            for reply in replies {
                if tx.send(Ok(reply)).await.is_err() {
                    return;
                }
            }
            if finished {
                return;
            }
        }
    }

    /// Replies to one phase; `true` when the exchange is over.
    async fn on_phase(&mut self, phase: Phase) -> (Vec<ProcessingResponse>, bool) {
        match phase {
            Phase::RequestHeaders(headers) => {
                self.started = Instant::now();
                self.path = header(&headers, ":path").unwrap_or_default();
                if headers.end_of_stream {
                    // No body (e.g. GET /v1/models): route on load alone.
                    return self.pick(false).await;
                }
                self.body_limit = match self.shared.model.get() {
                    Ok(loaded) => loaded.body_limit,
                    Err(e) => return (vec![self.refuse(e)], true),
                };
                let declared = header(&headers, "content-length").and_then(|v| v.parse().ok());
                if declared.is_some_and(|n: usize| n > self.body_limit) {
                    let refusal = self.refuse(ApiError::body_too_large(self.body_limit));
                    return (vec![refusal], true);
                }
                self.body.reserve(declared.unwrap_or(0));
                (Vec::new(), false)
            }
            Phase::RequestBody(body) => {
                if self.body.len() + body.body.len() > self.body_limit {
                    let refusal = self.refuse(ApiError::body_too_large(self.body_limit));
                    return (vec![refusal], true);
                }
                self.body.extend_from_slice(&body.body);
                if body.end_of_stream {
                    return self.pick(true).await;
                }
                (Vec::new(), false)
            }
            Phase::RequestTrailers(_) => (
                vec![reply(Reply::RequestTrailers(TrailersResponse::default()))],
                false,
            ),
            Phase::ResponseHeaders(headers) => {
                let status = header(&headers, ":status").unwrap_or_else(|| "200".into());
                self.count(&status);
                self.shared
                    .metrics
                    .prefill_hop(|name| header(&headers, name));
                if status == StatusCode::SERVICE_UNAVAILABLE.as_str() {
                    self.error_body = Some(Vec::new());
                }
                let mut meter = ResponseMeter::start(
                    self.shared.metrics.clone(),
                    self.shared.model.name(),
                    self.prompt_tokens,
                    self.started,
                    self.sent,
                );
                meter.set_content_type(header(&headers, "content-type").as_deref());
                self.meter = Some(meter);
                let replies = vec![reply(Reply::ResponseHeaders(HeadersResponse::default()))];
                if headers.end_of_stream {
                    self.finish();
                    return (replies, true);
                }
                (replies, false)
            }
            Phase::ResponseBody(body) => {
                if let Some(a) = self.assignment.as_mut() {
                    a.first_token();
                }
                if let Some(m) = self.meter.as_mut() {
                    m.on_data(&body.body);
                }
                self.inspect_error(&body.body, body.end_of_stream);
                let end = body.end_of_stream;
                let passthrough = reply(Reply::ResponseBody(streamed_body(body.body, end)));
                if end {
                    self.finish();
                }
                (vec![passthrough], end)
            }
            Phase::ResponseTrailers(_) => {
                self.finish();
                (
                    vec![reply(Reply::ResponseTrailers(TrailersResponse::default()))],
                    true,
                )
            }
        }
    }

    /// Parses the buffered request, picks a pod and answers the request phases (or
    /// refuses the request with an immediate response).
    async fn pick(&mut self, has_body: bool) -> (Vec<ProcessingResponse>, bool) {
        let mut route = RouteRequest::default();
        let body = Bytes::from(std::mem::take(&mut self.body));
        if let Some(api) = Api::from_path(&self.path) {
            let model = match self.shared.model.get() {
                Ok(loaded) => loaded.model.clone(),
                Err(e) => return (vec![self.refuse(e)], true),
            };
            match request::prepare_async(model, api, body.clone()).await {
                Ok(prepared) => {
                    let metrics = &self.shared.metrics;
                    metrics.stage(PREPROCESS, self.started.elapsed().as_secs_f64());
                    metrics.hints(self.shared.model.name(), &prepared.hints);
                    self.prompt_tokens = prepared.prompt_tokens;
                    route = prepared.route;
                }
                Err(e) => return (vec![self.refuse(e)], true),
            }
        }
        route.subset = self.subset.clone();
        let routed = self.shared.router.route(route).await;
        self.sent = Instant::now();
        let assignment = match routed {
            Ok(a) => a,
            Err(e) => return (vec![self.refuse(route_error(e))], true),
        };
        let destination = assignment.address.to_string();
        let mut set_headers = vec![set_header(DESTINATION_KEY, &destination)];
        let sent = request::without_transfer_params(body.clone());
        if sent.len() != body.len() {
            set_headers.push(set_header("content-length", &sent.len().to_string()));
        }
        let body = sent;
        if let Some(prefill) = assignment.prefill {
            set_headers.push(set_header(PREFILLER_HEADER, &prefill.to_string()));
        }
        let headers_reply = ProcessingResponse {
            response: Some(Reply::RequestHeaders(HeadersResponse {
                response: Some(CommonResponse {
                    // Envoy applies removals before settings (`MutationUtils::
                    // applyHeaderMutations`), so a prefill pod named here survives.
                    header_mutation: Some(HeaderMutation {
                        set_headers,
                        remove_headers: vec![PREFILLER_HEADER.to_owned()],
                    }),
                    // The destination header changes where the route sends the request.
                    clear_route_cache: true,
                    ..CommonResponse::default()
                }),
            })),
            dynamic_metadata: Some(destination_metadata(&destination)),
            ..ProcessingResponse::default()
        };
        self.assignment = Some(assignment);
        let mut replies = vec![headers_reply];
        if has_body {
            replies.push(reply(Reply::RequestBody(streamed_body(body.into(), true))));
        }
        (replies, false)
    }

    /// An immediate response carrying `error` as the OpenAI error body.
    fn refuse(&self, error: ApiError) -> ProcessingResponse {
        self.count(error.status.as_str());
        reply(Reply::ImmediateResponse(ImmediateResponse {
            status: Some(HttpStatus {
                // envoy.type.v3.StatusCode numbers its values by the HTTP code.
                code: i32::from(error.status.as_u16()),
            }),
            headers: Some(HeaderMutation {
                set_headers: vec![set_header("content-type", "application/json")],
                remove_headers: Vec::new(),
            }),
            body: error.body().to_string().into_bytes(),
            grpc_status: None,
            details: error.message,
        }))
    }

    fn count(&self, status: &str) {
        let route = Api::from_path(&self.path).map_or("other", Api::path);
        self.shared
            .metrics
            .request(self.shared.model.name(), route, status);
    }

    /// Collects a 503's body (up to [`ERROR_BODY_BYTES`]); at its end, a sidecar's
    /// `engine_unreachable` marks the pod unhealthy, so later requests avoid it.
    fn inspect_error(&mut self, chunk: &[u8], end: bool) {
        let Some(buffer) = self.error_body.as_mut() else {
            return;
        };
        if buffer.len() + chunk.len() > ERROR_BODY_BYTES as usize {
            self.error_body = None;
            return;
        }
        buffer.extend_from_slice(chunk);
        if let Some(a) = self
            .assignment
            .as_ref()
            .filter(|_| end && engine_unreachable(buffer))
        {
            tracing::warn!(address = %a.address, "endpoint's engine is unreachable");
            self.shared.router.mark_unhealthy(a.address);
        }
    }

    /// The response ended normally.
    fn finish(&mut self) {
        if let Some(m) = self.meter.take() {
            m.finish();
        }
        self.assignment = None;
    }
}

fn reply(response: Reply) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(response),
        ..ProcessingResponse::default()
    }
}

fn streamed_body(body: Vec<u8>, end_of_stream: bool) -> BodyResponse {
    BodyResponse {
        response: Some(CommonResponse {
            body_mutation: Some(BodyMutation {
                mutation: Some(body_mutation::Mutation::StreamedResponse(
                    StreamedBodyResponse {
                        body,
                        end_of_stream,
                        ..StreamedBodyResponse::default()
                    },
                )),
            }),
            ..CommonResponse::default()
        }),
    }
}

fn set_header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_owned(),
            raw_value: value.as_bytes().to_vec(),
            ..HeaderValue::default()
        }),
        ..HeaderValueOption::default()
    }
}

/// `{"envoy.lb": {"x-gateway-destination-endpoint": "ip:port"}}`.
fn destination_metadata(destination: &str) -> Struct {
    let inner = Struct {
        fields: [(DESTINATION_KEY.to_owned(), string_value(destination))].into(),
    };
    Struct {
        fields: [(
            DESTINATION_NAMESPACE.to_owned(),
            Value {
                kind: Some(Kind::StructValue(inner)),
            },
        )]
        .into(),
    }
}

fn string_value(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

/// A header's value; Envoy sends it in `raw_value` (or `value` in older versions).
fn header(headers: &HttpHeaders, name: &str) -> Option<String> {
    headers
        .headers
        .as_ref()?
        .headers
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| {
            if h.raw_value.is_empty() {
                h.value.clone()
            } else {
                String::from_utf8_lossy(&h.raw_value).into_owned()
            }
        })
}

/// The subset hint, when the gateway sent one: a list of `ip:port` strings (a single
/// comma-separated string is accepted too). Entries that do not parse match no pod.
fn subset_hint(metadata: Option<&Metadata>) -> Option<Vec<SocketAddr>> {
    let value = metadata?
        .filter_metadata
        .get(SUBSET_NAMESPACE)?
        .fields
        .get(SUBSET_KEY)?;
    let strings: Vec<String> = match value.kind.as_ref()? {
        Kind::ListValue(list) => list
            .values
            .iter()
            .filter_map(|v| match &v.kind {
                Some(Kind::StringValue(s)) => Some(s.clone()),
                _ => None,
            })
            .collect(),
        Kind::StringValue(s) => s.split(',').map(|p| p.trim().to_owned()).collect(),
        _ => Vec::new(),
    };
    Some(strings.iter().filter_map(|s| s.parse().ok()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf::ListValue;

    fn metadata(value: Value) -> Metadata {
        Metadata {
            filter_metadata: [(
                SUBSET_NAMESPACE.to_owned(),
                Struct {
                    fields: [(SUBSET_KEY.to_owned(), value)].into(),
                },
            )]
            .into(),
            ..Metadata::default()
        }
    }

    #[test]
    fn subset_hint_reads_a_list_or_a_string() {
        let list = Value {
            kind: Some(Kind::ListValue(ListValue {
                values: vec![string_value("10.0.0.1:8000"), string_value("bad")],
            })),
        };
        assert_eq!(
            subset_hint(Some(&metadata(list))),
            Some(vec!["10.0.0.1:8000".parse().unwrap()])
        );
        let joined = string_value("10.0.0.1:8000, 10.0.0.2:8000");
        assert_eq!(subset_hint(Some(&metadata(joined))).unwrap().len(), 2);
        assert_eq!(subset_hint(Some(&Metadata::default())), None);
        assert_eq!(subset_hint(None), None);
    }
}
