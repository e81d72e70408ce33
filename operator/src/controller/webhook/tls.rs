//! The webhook's serving certificate: made here (a self-signed CA and a certificate it
//! signs for the webhook Service's DNS names) or issued by cert-manager, kept in a Secret
//! either way, and served by rustls on aws-lc-rs.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use anyhow::Context as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// Keys of a `kubernetes.io/tls` Secret, with the CA where cert-manager puts it.
const CERT: &str = "tls.crt";
const KEY: &str = "tls.key";
const CA: &str = "ca.crt";

/// A serving certificate, its key and the CA that signed it, all PEM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServingCert {
    pub cert: String,
    pub key: String,
    pub ca: String,
}

/// The names the API server may use for the webhook Service: it connects to
/// `{service}.{namespace}.svc` (apiserver `webhook.ServiceResolver`).
pub fn dns_names(service: &str, namespace: &str, cluster_domain: &str) -> Vec<String> {
    vec![
        service.to_string(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.{cluster_domain}"),
    ]
}

impl ServingCert {
    /// A new CA and a serving certificate it signs for `dns_names`.
    pub fn generate(dns_names: &[String]) -> anyhow::Result<Self> {
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.distinguished_name
            .push(DnType::CommonName, "dynamo-operator webhook CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca, ca_key);

        let key = KeyPair::generate()?;
        let mut leaf = CertificateParams::new(dns_names.to_vec())?;
        leaf.distinguished_name.push(
            DnType::CommonName,
            dns_names.first().map_or("webhook", String::as_str),
        );
        leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = leaf.signed_by(&key, &issuer)?;
        Ok(Self {
            cert: cert.pem(),
            key: key.serialize_pem(),
            ca: ca_cert.pem(),
        })
    }

    /// The certificate held in `secret`, if it holds all three parts.
    pub fn from_secret(secret: &Secret) -> Option<Self> {
        let data = secret.data.as_ref()?;
        let text = |key: &str| String::from_utf8(data.get(key)?.0.clone()).ok();
        Some(Self {
            cert: text(CERT)?,
            key: text(KEY)?,
            ca: text(CA)?,
        })
    }

    /// A `kubernetes.io/tls` Secret holding the certificate.
    pub fn to_secret(&self, name: &str, namespace: &str) -> Secret {
        let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
        Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                ..ObjectMeta::default()
            },
            type_: Some("kubernetes.io/tls".into()),
            data: Some(BTreeMap::from([
                (CERT.to_string(), bytes(&self.cert)),
                (KEY.to_string(), bytes(&self.key)),
                (CA.to_string(), bytes(&self.ca)),
            ])),
            ..Secret::default()
        }
    }

    /// The chain and key as rustls serves them.
    pub fn certified_key(&self) -> anyhow::Result<CertifiedKey> {
        let chain = CertificateDer::pem_slice_iter(self.cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .context("reading tls.crt")?;
        let key = PrivateKeyDer::from_pem_slice(self.key.as_bytes()).context("reading tls.key")?;
        CertifiedKey::from_der(chain, key, &provider()).context("tls.key does not match tls.crt")
    }
}

/// aws-lc-rs, the provider kube's client uses too: rustls panics when it must pick
/// between two installed providers, so ours is always named.
fn provider() -> CryptoProvider {
    rustls::crypto::aws_lc_rs::default_provider()
}

/// The certificate the server presents, swapped in place when the Secret changes
/// (cert-manager renews it); until one is loaded, handshakes fail.
#[derive(Debug, Default)]
pub struct CertSlot(RwLock<Option<Arc<CertifiedKey>>>);

impl CertSlot {
    pub fn set(&self, key: CertifiedKey) {
        *self.0.write().expect("cert slot lock") = Some(Arc::new(key));
    }
}

impl ResolvesServerCert for CertSlot {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.read().expect("cert slot lock").clone()
    }
}

/// TLS settings of the webhook: the slot's certificate, HTTP/2 or HTTP/1.1 by ALPN.
pub fn server_config(slot: Arc<CertSlot>) -> Arc<rustls::ServerConfig> {
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(provider()))
        .with_safe_default_protocol_versions()
        .expect("aws-lc-rs supports the default TLS versions")
        .with_no_client_auth()
        .with_cert_resolver(slot);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_certificate_round_trips_through_its_secret() {
        let names = dns_names("hook", "ns", "cluster.local");
        assert_eq!(names[2], "hook.ns.svc");
        let cert = ServingCert::generate(&names).unwrap();
        assert!(cert.ca.starts_with("-----BEGIN CERTIFICATE-----"));
        assert_ne!(cert.ca, cert.cert);
        let secret = cert.to_secret("tls", "ns");
        assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
        let read = ServingCert::from_secret(&secret).unwrap();
        assert_eq!(read, cert);
        read.certified_key().unwrap();
    }

    #[test]
    fn a_secret_missing_a_part_holds_no_certificate() {
        let cert = ServingCert::generate(&["a".into()]).unwrap();
        let mut secret = cert.to_secret("tls", "ns");
        secret.data.as_mut().unwrap().remove(CA);
        assert_eq!(ServingCert::from_secret(&secret), None);
        let other = ServingCert::generate(&["a".into()]).unwrap();
        let mismatched = ServingCert {
            key: other.key,
            ..cert
        };
        assert!(mismatched.certified_key().is_err());
    }
}
