//! Keeps the webhook reachable: loads (or, without cert-manager, creates) the Secret with
//! its certificate, hands it to the server, and points the DynamoGraphDeployment CRD's
//! `spec.conversion` at the operator's Service with the CA the API server must trust; an
//! operator outside the cluster instead serves a certificate made at start for the host of
//! its `--webhook-url` and points the CRD at that URL. Repeated every few minutes, so a
//! renewed certificate, a deleted Secret or a re-applied CRD are picked up without a
//! restart.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use dynamo_crds::DynamoGraphDeployment;
use dynamo_crds::manifests::{service_client_config, url_client_config, webhook_conversion};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, WebhookClientConfig,
};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, CustomResourceExt};
use serde_json::{Value, json};

use super::tls::{CertSlot, ServingCert, dns_names};
use crate::reconcile::FIELD_MANAGER;

/// cert-manager's CA injector copies the CA of the named Certificate (`namespace/name`)
/// into the CRD's `spec.conversion.webhook.clientConfig.caBundle`.
pub const INJECT_CA_FROM: &str = "cert-manager.io/inject-ca-from";

/// How often the Secret and the CRD are checked again.
const REFRESH: Duration = Duration::from_secs(300);
/// Wait after a failed check (e.g. cert-manager has not issued the Secret yet).
const RETRY: Duration = Duration::from_secs(10);

/// Where the webhook is and where its certificate comes from.
#[derive(Clone)]
pub struct Installer {
    pub client: Client,
    pub endpoint: Endpoint,
}

/// Who writes the CA into the CRD's `caBundle`.
enum CaBundle {
    /// The operator: this PEM.
    Ours(String),
    /// cert-manager's CA injector, from the Certificate `namespace/name`.
    CertManager(String),
}

/// How the API server reaches the webhook.
#[derive(Clone)]
pub enum Endpoint {
    /// In the cluster: through the webhook's Service, with the certificate in a Secret.
    Service {
        /// The operator's namespace: the Service's and the Secret's.
        namespace: String,
        service: String,
        secret: String,
        /// The Secret is cert-manager's, issued for a Certificate of the same name.
        cert_manager: bool,
        cluster_domain: String,
    },
    /// Outside the cluster: at `url`, with a certificate this process made for its host.
    Url { url: String, cert: ServingCert },
}

impl Installer {
    /// Checks again and again; a failure is logged and retried sooner.
    pub async fn run(self, slot: Arc<CertSlot>) {
        loop {
            let wait = match self.refresh(&slot).await {
                Ok(()) => REFRESH,
                Err(e) => {
                    tracing::warn!(error = format!("{e:#}"), "conversion webhook");
                    RETRY
                }
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// Loads the certificate into `slot` and points the CRD at the webhook.
    pub async fn refresh(&self, slot: &CertSlot) -> anyhow::Result<()> {
        match &self.endpoint {
            Endpoint::Service {
                namespace,
                service,
                secret,
                cert_manager,
                cluster_domain,
            } => {
                let cert = self
                    .serving_cert(namespace, service, secret, *cert_manager, cluster_domain)
                    .await?;
                slot.set(cert.certified_key()?);
                let ca = if *cert_manager {
                    CaBundle::CertManager(format!("{namespace}/{secret}"))
                } else {
                    CaBundle::Ours(cert.ca)
                };
                self.point_crd(ca, |ca| service_client_config(namespace, service, ca))
                    .await
            }
            Endpoint::Url { url, cert } => {
                slot.set(cert.certified_key()?);
                let ca = CaBundle::Ours(cert.ca.clone());
                self.point_crd(ca, |ca| url_client_config(url, ca.unwrap_or_default()))
                    .await
            }
        }
    }

    async fn serving_cert(
        &self,
        namespace: &str,
        service: &str,
        secret: &str,
        cert_manager: bool,
        cluster_domain: &str,
    ) -> anyhow::Result<ServingCert> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let what = format!("Secret {namespace}/{secret}");
        if let Some(found) = secrets.get_opt(secret).await? {
            return ServingCert::from_secret(&found).with_context(|| {
                format!("{what} lacks tls.crt, tls.key or ca.crt; delete it to have a new one made")
            });
        }
        if cert_manager {
            bail!("{what} does not exist yet: waiting for cert-manager to issue it");
        }
        let names = dns_names(service, namespace, cluster_domain);
        let cert = ServingCert::generate(&names)?;
        match secrets
            .create(&PostParams::default(), &cert.to_secret(secret, namespace))
            .await
        {
            Ok(_) => {
                tracing::info!(secret = %what, "created the conversion webhook's certificate");
                Ok(cert)
            }
            // Another replica made it first: every replica serves that one.
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let found = secrets.get(secret).await?;
                ServingCert::from_secret(&found).with_context(|| format!("{what} is incomplete"))
            }
            Err(e) => Err(e).with_context(|| format!("creating {what}")),
        }
    }

    /// Patches the CRD when its conversion settings (`client_config` given the CA bundle)
    /// or its cert-manager annotation differ from ours.
    async fn point_crd(
        &self,
        ca: CaBundle,
        client_config: impl FnOnce(Option<&[u8]>) -> WebhookClientConfig,
    ) -> anyhow::Result<()> {
        let crds: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let name = DynamoGraphDeployment::crd_name();
        let crd = crds
            .get(name)
            .await
            .with_context(|| format!("reading CRD {name}"))?;
        let (bundle, inject_from) = match ca {
            CaBundle::Ours(pem) => (Some(pem.into_bytes()), None),
            // cert-manager's CA injector writes the bundle: keep what it wrote.
            CaBundle::CertManager(from) => {
                let injected = crd.spec.conversion.as_ref().and_then(|c| {
                    Some(
                        c.webhook
                            .as_ref()?
                            .client_config
                            .as_ref()?
                            .ca_bundle
                            .clone()?
                            .0,
                    )
                });
                (injected, Some(from))
            }
        };
        let desired = webhook_conversion(client_config(bundle.as_deref()));
        let annotation = crd
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(INJECT_CA_FROM));
        if crd.spec.conversion.as_ref() == Some(&desired) && annotation == inject_from.as_ref() {
            return Ok(());
        }
        let mut conversion = serde_json::to_value(&desired).expect("conversion serializes");
        // A merge patch keeps what it does not name: clear the other way of reaching it.
        let client_config = &mut conversion["webhook"]["clientConfig"];
        for field in ["url", "service"] {
            if client_config.get(field).is_none() {
                client_config[field] = Value::Null;
            }
        }
        let patch = json!({
            "metadata": {"annotations": {INJECT_CA_FROM: inject_from}},
            "spec": {"conversion": conversion},
        });
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        crds.patch(name, &params, &Patch::Merge(&patch))
            .await
            .with_context(|| format!("pointing CRD {name} at the conversion webhook"))?;
        let at = &conversion["webhook"]["clientConfig"];
        tracing::info!(crd = name, url = %at["url"], service = %at["service"], "pointed the CRD at the conversion webhook");
        Ok(())
    }
}
