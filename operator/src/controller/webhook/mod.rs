//! The DynamoGraphDeployment conversion webhook: the API server posts an
//! `apiextensions.k8s.io/v1` ConversionReview to `https://{service}.{namespace}.svc:443/convert`
//! whenever a client reads or writes a version other than the stored one (Kubernetes
//! "Versions in CustomResourceDefinitions", webhook conversion), and gets the objects back
//! converted by [`dynamo_crds::conversion`], all of them or a `Failure` saying why not.
//!
//! Every replica serves it (leader or not), over TLS with the certificate [`install`]
//! keeps in a Secret; an operator outside the cluster serves it at `--webhook-url`.

pub mod install;
pub mod tls;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::routing::post;
use dynamo_crds::conversion::{self, WEBHOOK_PATH, WEBHOOK_SERVICE};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use kube::core::Status;
use kube::core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// Flags of the conversion webhook (part of `dynamo operator`'s).
#[derive(clap::Args, Debug, Clone)]
pub struct WebhookArgs {
    /// HTTPS port of the conversion webhook in the cluster (behind `--webhook-service`); 0
    /// serves none and leaves the CRD alone.
    #[arg(long, env = "DYNAMO_WEBHOOK_PORT", default_value_t = 9443)]
    pub webhook_port: u16,
    /// Outside the cluster (a laptop, a test): the HTTPS URL at which the API server
    /// reaches this process, e.g. `https://127.0.0.1:9443/convert`. The webhook is served
    /// on the URL's port with a certificate made at start for the URL's host, and the CRD's
    /// conversion points at the URL (`clientConfig.url` and `caBundle`); no Service or
    /// Secret is used.
    #[arg(long, env = "DYNAMO_WEBHOOK_URL", conflicts_with_all = ["webhook_service", "webhook_secret", "webhook_cert_manager"])]
    pub webhook_url: Option<WebhookUrl>,
    /// The Service in front of the webhook, in the operator's namespace; the operator
    /// points the DynamoGraphDeployment CRD's conversion at it.
    #[arg(long, env = "DYNAMO_WEBHOOK_SERVICE", default_value = WEBHOOK_SERVICE)]
    pub webhook_service: String,
    /// Secret (operator's namespace) holding the webhook's certificate: `tls.crt`,
    /// `tls.key` and the CA in `ca.crt`. Created with a new CA when missing, unless
    /// `--webhook-cert-manager`.
    #[arg(
        long,
        env = "DYNAMO_WEBHOOK_SECRET",
        default_value = "dynamo-operator-webhook-tls"
    )]
    pub webhook_secret: String,
    /// cert-manager issues the Secret, for a Certificate of the same name: the CRD gets
    /// cert-manager's `inject-ca-from` annotation instead of the operator's CA.
    #[arg(long, env = "DYNAMO_WEBHOOK_CERT_MANAGER")]
    pub webhook_cert_manager: bool,
}

/// Largest ConversionReview read: a list of graphs may come in one review, and one graph
/// may be as large as etcd stores (1.5 MiB).
const MAX_REVIEW_BYTES: usize = 32 << 20;
/// A client that has not finished its TLS handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for a request's head on an open connection.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// The review the API server gets for a request body: the objects converted, or a
/// `Failure` whose message names the object and field at fault.
pub fn review(body: &[u8]) -> ConversionReview {
    let failed = |message: String| {
        ConversionResponse::invalid(Status::failure(&message, "BadRequest").with_code(400))
            .into_review()
    };
    let review: ConversionReview = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(e) => return failed(format!("the body is not a ConversionReview: {e}")),
    };
    let (api_version, kind) = (review.types.api_version.clone(), review.types.kind.clone());
    let request = match ConversionRequest::from_review(review) {
        Ok(request) => request,
        Err(_) => return failed("the ConversionReview has no request".into()),
    };
    if api_version != "apiextensions.k8s.io/v1" || kind != "ConversionReview" {
        let message = format!(
            "expected an apiextensions.k8s.io/v1 ConversionReview, got {api_version}/{kind}"
        );
        return ConversionResponse::for_request(request)
            .failure(Status::failure(&message, "BadRequest").with_code(400))
            .into_review();
    }
    let desired = request.desired_api_version.clone();
    let converted: Result<Vec<Value>, String> = request
        .objects
        .iter()
        .enumerate()
        .map(|(i, object)| {
            conversion::convert(object, &desired).map_err(|e| {
                let name = object.pointer("/metadata/name").and_then(Value::as_str);
                let namespace = object
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str);
                match (namespace, name) {
                    (Some(ns), Some(name)) => format!("{ns}/{name}: {e}"),
                    (None, Some(name)) => format!("{name}: {e}"),
                    _ => format!("object {i}: {e}"),
                }
            })
        })
        .collect();
    let response = ConversionResponse::for_request(request);
    match converted {
        Ok(objects) => response.success(objects),
        Err(message) => {
            tracing::warn!(%message, %desired, "conversion refused");
            response.failure(Status::failure(&message, "Invalid").with_code(422))
        }
    }
    .into_review()
}

/// The webhook's HTTP routes.
pub fn router() -> Router {
    Router::new()
        .route(
            WEBHOOK_PATH,
            post(|body: Bytes| async move { axum::Json(review(&body)) }),
        )
        .layer(DefaultBodyLimit::max(MAX_REVIEW_BYTES))
}

/// Serves [`router`] over TLS on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, tls: Arc<rustls::ServerConfig>) {
    let acceptor = TlsAcceptor::from(tls);
    let app = router();
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // Out of descriptors, or a connection reset before it was accepted.
                tracing::warn!(error = %e, "conversion webhook: accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (acceptor, app) = (acceptor.clone(), app.clone());
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => return tracing::debug!(error = %e, "conversion webhook: TLS"),
                Err(_) => return tracing::debug!("conversion webhook: TLS handshake timed out"),
            };
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            let service = TowerToHyperService::new(app);
            if let Err(e) = builder
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, "conversion webhook: connection");
            }
        });
    }
}

impl WebhookArgs {
    /// Whether the webhook's certificate lives in a Secret of the operator's namespace.
    pub fn uses_secret(&self) -> bool {
        self.webhook_port != 0 && self.webhook_url.is_none()
    }
}

/// `--webhook-url`: an `https` URL with a host, a port (443 when absent) and the path
/// `/convert`, which the webhook serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookUrl {
    pub url: String,
    /// The host as the certificate names it (an IP address or a DNS name).
    pub host: String,
    pub port: u16,
}

impl std::str::FromStr for WebhookUrl {
    type Err = String;

    fn from_str(url: &str) -> Result<Self, String> {
        let uri: axum::http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
        if uri.scheme_str() != Some("https") {
            return Err(format!(
                "{url}: the API server calls webhooks over https only"
            ));
        }
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| format!("{url}: no host"))?;
        if uri.path() != WEBHOOK_PATH || uri.query().is_some() {
            return Err(format!(
                "{url}: the webhook is served at the path {WEBHOOK_PATH}"
            ));
        }
        Ok(WebhookUrl {
            url: url.into(),
            host: host.trim_start_matches('[').trim_end_matches(']').into(),
            port: uri.port_u16().unwrap_or(443),
        })
    }
}

/// Serves the webhook and keeps its certificate and the CRD current, in background tasks:
/// at `--webhook-url` when given, else on `--webhook-port` behind the Service (nothing when
/// that port is 0). `namespace` is the operator's.
pub async fn start(
    client: kube::Client,
    args: &WebhookArgs,
    namespace: &str,
    cluster_domain: &str,
) -> anyhow::Result<()> {
    let (endpoint, port) = match &args.webhook_url {
        Some(at) => {
            let cert = tls::ServingCert::generate(std::slice::from_ref(&at.host))?;
            let endpoint = install::Endpoint::Url {
                url: at.url.clone(),
                cert,
            };
            (endpoint, at.port)
        }
        None if args.webhook_port == 0 => return Ok(()),
        None => {
            let endpoint = install::Endpoint::Service {
                namespace: namespace.into(),
                service: args.webhook_service.clone(),
                secret: args.webhook_secret.clone(),
                cert_manager: args.webhook_cert_manager,
                cluster_domain: cluster_domain.into(),
            };
            (endpoint, args.webhook_port)
        }
    };
    let listener = TcpListener::bind(("0.0.0.0", port))
        .await
        .map_err(|e| anyhow::anyhow!("binding the conversion webhook's port {port}: {e}"))?;
    let slot = Arc::new(tls::CertSlot::default());
    tokio::spawn(serve(listener, tls::server_config(slot.clone())));
    tokio::spawn(install::Installer { client, endpoint }.run(slot));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_webhook_url_is_https_at_the_convert_path() {
        let at: WebhookUrl = "https://127.0.0.1:9443/convert".parse().unwrap();
        assert_eq!((at.host.as_str(), at.port), ("127.0.0.1", 9443));
        let at: WebhookUrl = "https://[::1]/convert".parse().unwrap();
        assert_eq!((at.host.as_str(), at.port), ("::1", 443));
        let at: WebhookUrl = "https://laptop.example:8443/convert".parse().unwrap();
        assert_eq!(at.host, "laptop.example");
        for bad in [
            "http://127.0.0.1:9443/convert",
            "https://127.0.0.1:9443/",
            "https://127.0.0.1:9443/convert?x=1",
            "127.0.0.1:9443",
        ] {
            assert!(bad.parse::<WebhookUrl>().is_err(), "{bad}");
        }
    }
}
