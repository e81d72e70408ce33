//! The DynamoGraphDeployment conversion webhook: the API server posts an
//! `apiextensions.k8s.io/v1` ConversionReview to `https://{service}.{namespace}.svc:443/convert`
//! whenever a client reads or writes a version other than the stored one (Kubernetes
//! "Versions in CustomResourceDefinitions", webhook conversion), and gets the objects back
//! converted by [`dynamo_crds::conversion`], all of them or a `Failure` saying why not.
//!
//! Every replica serves it (leader or not), over TLS with the certificate [`install`]
//! keeps in a Secret.

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
    /// HTTPS port of the conversion webhook; 0 serves none and leaves the CRD alone (an
    /// operator run outside the cluster).
    #[arg(long, env = "DYNAMO_WEBHOOK_PORT", default_value_t = 9443)]
    pub webhook_port: u16,
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

/// Binds the webhook's port, serves it and keeps its certificate and the CRD current, in
/// background tasks; does nothing when the port is 0.
pub async fn start(installer: install::Installer, port: u16) -> anyhow::Result<()> {
    if port == 0 {
        return Ok(());
    }
    let listener = TcpListener::bind(("0.0.0.0", port))
        .await
        .map_err(|e| anyhow::anyhow!("binding the conversion webhook's port {port}: {e}"))?;
    let slot = Arc::new(tls::CertSlot::default());
    tokio::spawn(serve(listener, tls::server_config(slot.clone())));
    tokio::spawn(installer.run(slot));
    Ok(())
}
