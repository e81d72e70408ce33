//! Keeps the webhook reachable: loads (or, without cert-manager, creates) the Secret with
//! its certificate, hands it to the server, and points the DynamoGraphDeployment CRD's
//! `spec.conversion` at the operator's Service with the CA the API server must trust.
//! Repeated every few minutes, so a renewed certificate, a deleted Secret or a
//! re-applied CRD are picked up without a restart.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use dynamo_crds::DynamoGraphDeployment;
use dynamo_crds::manifests::webhook_conversion;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
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
    /// The operator's namespace: the Service's and the Secret's.
    pub namespace: String,
    pub service: String,
    pub secret: String,
    /// The Secret is cert-manager's, issued for a Certificate of the same name.
    pub cert_manager: bool,
    pub cluster_domain: String,
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
        let cert = self.serving_cert().await?;
        slot.set(cert.certified_key()?);
        self.point_crd(&cert).await
    }

    async fn serving_cert(&self) -> anyhow::Result<ServingCert> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let what = format!("Secret {}/{}", self.namespace, self.secret);
        if let Some(secret) = secrets.get_opt(&self.secret).await? {
            return ServingCert::from_secret(&secret).with_context(|| {
                format!("{what} lacks tls.crt, tls.key or ca.crt; delete it to have a new one made")
            });
        }
        if self.cert_manager {
            bail!("{what} does not exist yet: waiting for cert-manager to issue it");
        }
        let names = dns_names(&self.service, &self.namespace, &self.cluster_domain);
        let cert = ServingCert::generate(&names)?;
        match secrets
            .create(
                &PostParams::default(),
                &cert.to_secret(&self.secret, &self.namespace),
            )
            .await
        {
            Ok(_) => {
                tracing::info!(secret = %what, "created the conversion webhook's certificate");
                Ok(cert)
            }
            // Another replica made it first: every replica serves that one.
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let secret = secrets.get(&self.secret).await?;
                ServingCert::from_secret(&secret).with_context(|| format!("{what} is incomplete"))
            }
            Err(e) => Err(e).with_context(|| format!("creating {what}")),
        }
    }

    /// Patches the CRD when its conversion settings differ from ours.
    async fn point_crd(&self, cert: &ServingCert) -> anyhow::Result<()> {
        let crds: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let name = DynamoGraphDeployment::crd_name();
        let crd = crds
            .get(name)
            .await
            .with_context(|| format!("reading CRD {name}"))?;
        let (ca, inject_from) = if self.cert_manager {
            let injected = crd.spec.conversion.as_ref().and_then(|c| {
                c.webhook
                    .as_ref()?
                    .client_config
                    .as_ref()?
                    .ca_bundle
                    .clone()
            });
            (
                injected.map(|b| b.0),
                Some(format!("{}/{}", self.namespace, self.secret)),
            )
        } else {
            (Some(cert.ca.clone().into_bytes()), None)
        };
        let desired = webhook_conversion(&self.namespace, &self.service, ca.as_deref());
        let annotation = crd
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(INJECT_CA_FROM));
        if crd.spec.conversion.as_ref() == Some(&desired) && annotation == inject_from.as_ref() {
            return Ok(());
        }
        let mut conversion = serde_json::to_value(&desired).expect("conversion serializes");
        // A merge patch keeps what it does not name: clear a `url` someone set.
        conversion["webhook"]["clientConfig"]["url"] = Value::Null;
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
        tracing::info!(crd = name, service = %self.service, namespace = %self.namespace, "pointed the CRD at the conversion webhook");
        Ok(())
    }
}
