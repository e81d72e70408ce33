//! Transfer parameters only from the prefill hop: a request's `kv_transfer_params`
//! tell the engine whose KV to take and where from (a lease name; vLLM's connector
//! connects to `remote_host`), so a client's own would let it hand the engine another
//! request's lease or point it anywhere. Those the hop made ([`FromHop`]) pass; of a
//! client's, only the prefill leg's request (`do_remote_decode`, as a decode pod's hop
//! sends it to this prefill pod) passes, rewritten to exactly that; any other is dropped.
//!
//! The lease the engine lends for a prefill leg (named by the leg's `x-request-id`) is
//! claimed for the leg's client until the answer ends, so it is charged to that peer's
//! share of the lease budget (`blocks::lease`).

use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::request::Parts;
use axum::http::{HeaderValue, header};
use dynamo_llm::ApiError;
use dynamo_llm::disagg::KvTransferParams;
use dynamo_server::Guarded;
use futures::StreamExt;
use futures::future::BoxFuture;
use serde_json::{Map, Value};
use tower::{Layer, Service};

use super::error::ProxyError;
use crate::blocks::lease::{Claim, Leases};
use crate::disagg::hop::{HOP_PATHS, MAX_BODY_BYTES, new_id};

/// Marks a request whose transfer parameters the prefill hop set (an extension: no
/// client can send one).
#[derive(Clone, Copy, Debug)]
pub struct FromHop;

#[derive(Clone)]
pub struct TransferParamsLayer {
    leases: Leases,
}

impl TransferParamsLayer {
    pub fn new(leases: Leases) -> Self {
        Self { leases }
    }
}

impl<S> Layer<S> for TransferParamsLayer {
    type Service = TransferParams<S>;

    fn layer(&self, inner: S) -> TransferParams<S> {
        TransferParams {
            inner,
            leases: self.leases.clone(),
        }
    }
}

#[derive(Clone)]
pub struct TransferParams<S> {
    inner: S,
    leases: Leases,
}

impl<S, B> Service<Request> for TransferParams<S>
where
    S: Service<Request, Response = http::Response<B>, Error = ProxyError> + Clone + Send + 'static,
    S::Future: Send,
{
    /// The answer, holding a prefill leg's claim to its end: an engine lends when its
    /// prefill is done, with a streamed answer at its end.
    type Response = http::Response<Guarded<B, Option<Claim>>>;
    type Error = ProxyError;
    type Future = BoxFuture<'static, Result<Self::Response, ProxyError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        // The clone is ready only if polled; the polled one goes with this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        if request.extensions().get::<FromHop>().is_some()
            || !HOP_PATHS.contains(&request.uri().path())
        {
            let answered = inner.call(request);
            return Box::pin(
                async move { Ok(answered.await?.map(|body| Guarded::new(body, None))) },
            );
        }
        let leases = self.leases.clone();
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            let body = read(body).await?;
            let Cleaned { rewritten, leg } = client_free(&body)?;
            let body = match rewritten {
                Some(rewritten) => {
                    parts.headers.insert(
                        header::CONTENT_LENGTH,
                        HeaderValue::from(rewritten.len() as u64),
                    );
                    rewritten
                }
                None => body,
            };
            let claim = leg.then(|| claim_lease(&leases, &mut parts));
            let response = inner
                .call(Request::from_parts(parts, Body::from(body)))
                .await?;
            Ok(response.map(|body| Guarded::new(body, claim)))
        })
    }
}

/// Claims the lease of a prefill leg for its client: the leg's `x-request-id` (what the
/// engine names it by), or a fresh one where it has none or another leg holds it.
fn claim_lease(leases: &Leases, parts: &mut Parts) -> Claim {
    let client = super::client_ip(&parts.extensions);
    let named = parts
        .headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|id| !id.is_empty());
    if let Some(claim) = named.and_then(|id| leases.claim(id, client)) {
        return claim;
    }
    loop {
        let id = new_id();
        if let Some(claim) = leases.claim(&id, client) {
            let id = HeaderValue::from_str(&id).expect("hex");
            parts.headers.insert("x-request-id", id);
            return claim;
        }
    }
}

/// A client's body, checked.
#[derive(Debug, PartialEq)]
struct Cleaned {
    /// The body without the client's transfer parameters; `None` when it had none to drop.
    rewritten: Option<Bytes>,
    /// Whether it is a prefill leg's request.
    leg: bool,
}

/// The body without the client's transfer parameters (but the prefill leg's request).
/// A body this parser cannot read is the engine's to refuse, unless it may name the
/// field (literally, or through a `\u` escape): the engine's parser might read it
/// (Python's takes `NaN`, say).
fn client_free(body: &[u8]) -> Result<Cleaned, ProxyError> {
    let untouched = Cleaned {
        rewritten: None,
        leg: false,
    };
    let Ok(mut map) = serde_json::from_slice::<Map<String, Value>>(body) else {
        let contains = |needle: &[u8]| body.windows(needle.len()).any(|w| w == needle);
        if contains(KvTransferParams::FIELD.as_bytes()) || contains(b"\\u") {
            return Err(ProxyError::BodyRefused(ApiError::bad_request(
                "a request body that may carry kv_transfer_params must be a JSON object",
                None,
            )));
        }
        return Ok(untouched);
    };
    let Some(sent) = map.get(KvTransferParams::FIELD) else {
        return Ok(untouched);
    };
    let leg = KvTransferParams::of(&map).filter(|p| p.do_remote_decode);
    let kept = leg.map(|_| KvTransferParams::remote_decode());
    let leg = kept.is_some();
    if kept
        .as_ref()
        .and_then(|p| serde_json::to_value(p).ok())
        .as_ref()
        == Some(sent)
    {
        return Ok(Cleaned {
            rewritten: None,
            leg,
        });
    }
    map.remove(KvTransferParams::FIELD);
    if let Some(kept) = kept {
        kept.put(&mut map);
    }
    let rewritten = Bytes::from(serde_json::to_vec(&map).expect("JSON serializes"));
    Ok(Cleaned {
        rewritten: Some(rewritten),
        leg,
    })
}

/// The whole body (as the hop reads it, up to its limit); a client that leaves
/// mid-upload is [`ProxyError::ClientAborted`].
async fn read(body: Body) -> Result<Bytes, ProxyError> {
    let mut out = Vec::new();
    let mut chunks = body.into_data_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|_| ProxyError::ClientAborted)?;
        if out.len() + chunk.len() > MAX_BODY_BYTES {
            let too_large = ApiError::body_too_large(MAX_BODY_BYTES);
            return Err(ProxyError::BodyRefused(too_large));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rewritten(body: Value) -> Option<Value> {
        let bytes = serde_json::to_vec(&body).unwrap();
        client_free(&bytes)
            .unwrap()
            .rewritten
            .map(|b| serde_json::from_slice(&b).unwrap())
    }

    fn is_leg(body: Value) -> bool {
        client_free(&serde_json::to_vec(&body).unwrap())
            .unwrap()
            .leg
    }

    #[test]
    fn a_clients_lease_or_host_is_dropped_and_the_prefill_legs_request_kept() {
        let plain = json!({"model": "m", "prompt": "hi"});
        assert_eq!(rewritten(plain.clone()), None);
        let stolen = json!({"model": "m", "prompt": "hi", "kv_transfer_params": {
            "do_remote_prefill": true, "remote_request_id": "stolen-lease",
            "remote_host": "10.0.0.9", "remote_port": 22}});
        assert_eq!(rewritten(stolen), Some(plain.clone()));
        let mut leg = plain.as_object().unwrap().clone();
        KvTransferParams::remote_decode().put(&mut leg);
        assert_eq!(rewritten(Value::Object(leg.clone())), None);
        let widened = json!({"model": "m", "prompt": "hi", "kv_transfer_params": {
            "do_remote_decode": true, "remote_host": "10.0.0.9"}});
        assert!(is_leg(widened.clone()));
        assert_eq!(rewritten(widened), Some(Value::Object(leg.clone())));
        assert!(is_leg(Value::Object(leg)));
        assert!(!is_leg(plain));
    }

    #[test]
    fn an_escaped_name_is_dropped_and_an_unreadable_body_naming_it_refused() {
        let escaped = br#"{"model":"m","kv\u005ftransfer_params":{"remote_request_id":"x"}}"#;
        let out = client_free(escaped).unwrap().rewritten.unwrap();
        assert_eq!(out.as_ref(), br#"{"model":"m"}"#);
        let nan = br#"{"model":"m","temperature":NaN,"kv_transfer_params":{}}"#;
        assert!(matches!(client_free(nan), Err(ProxyError::BodyRefused(_))));
        let untouched = Cleaned {
            rewritten: None,
            leg: false,
        };
        assert_eq!(client_free(b"not json").unwrap(), untouched);
    }
}
