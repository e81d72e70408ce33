//! The graph's credential on the block API: a secret every sidecar and engine of one
//! graph shares, read from a file, sent by every client as `authorization: Bearer
//! <token>` and checked by the sidecar on every call before any work.

use std::fmt;
use std::path::{Path, PathBuf};

use subtle::ConstantTimeEq;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};

/// Environment twin of the flag naming the credential's file, the same for every
/// process of a graph that speaks the block API (sidecar, engine).
pub const CREDENTIAL_FILE_ENV: &str = "DYNAMO_BLOCK_API_TOKEN_FILE";

const HEADER: &str = "authorization";

#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("reading the block API credential {0:?}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("the block API credential {0:?} is empty")]
    Empty(PathBuf),
    #[error("the block API credential {0:?} is not one line of visible ASCII")]
    Invalid(PathBuf),
}

/// The header value a client sends and the sidecar expects.
#[derive(Clone)]
pub struct Credential(AsciiMetadataValue);

/// Never printed: logs must not leak the graph's secret.
impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Credential(..)")
    }
}

impl Credential {
    /// The token in `path` (surrounding whitespace, such as a final newline, ignored).
    pub fn read(path: &Path) -> Result<Self, CredentialError> {
        let text =
            std::fs::read_to_string(path).map_err(|e| CredentialError::Read(path.into(), e))?;
        let token = text.trim();
        if token.is_empty() {
            return Err(CredentialError::Empty(path.into()));
        }
        let visible = token.bytes().all(|b| b.is_ascii_graphic());
        format!("Bearer {token}")
            .parse()
            .ok()
            .filter(|_| visible)
            .map(Self)
            .ok_or_else(|| CredentialError::Invalid(path.into()))
    }

    /// The secret's bytes, for deriving keys from ([`crate::BlockKey`]).
    pub(crate) fn secret(&self) -> &[u8] {
        self.0.as_bytes()
    }

    /// Puts the credential in a request's `metadata`.
    pub fn attach(&self, metadata: &mut MetadataMap) {
        metadata.insert(HEADER, self.0.clone());
    }

    /// Whether `metadata` carries this credential, compared in constant time so that
    /// response times tell nothing of how much of a guess was right.
    pub fn admits(&self, metadata: &MetadataMap) -> bool {
        metadata
            .get(HEADER)
            .is_some_and(|sent| bool::from(sent.as_bytes().ct_eq(self.0.as_bytes())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credential(token: &str) -> Result<Credential, CredentialError> {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), token).unwrap();
        Credential::read(file.path())
    }

    #[test]
    fn admits_its_own_token_only() {
        let ours = credential("s3cret-token\n").unwrap();
        let mut metadata = MetadataMap::new();
        assert!(!ours.admits(&metadata));
        ours.attach(&mut metadata);
        assert!(ours.admits(&metadata));
        let mut other = MetadataMap::new();
        credential("s3cret-tokem").unwrap().attach(&mut other);
        assert!(!ours.admits(&other));
        other.insert(HEADER, "s3cret-token".parse().unwrap());
        assert!(!ours.admits(&other), "the Bearer scheme is part of it");
        assert_eq!(format!("{ours:?}"), "Credential(..)");
    }

    #[test]
    fn an_empty_or_multi_line_token_is_refused() {
        assert!(matches!(credential(" \n"), Err(CredentialError::Empty(_))));
        assert!(matches!(
            credential("a\nb"),
            Err(CredentialError::Invalid(_))
        ));
        assert!(matches!(
            Credential::read(Path::new("/nonexistent/token")),
            Err(CredentialError::Read(..))
        ));
    }
}
