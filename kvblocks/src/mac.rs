//! The MAC on a block: keyed BLAKE3 over everything a reader trusts (hash, parent,
//! tokens, layout, payload), keyed by the graph's secret. The checksum catches rot; the
//! MAC catches a block made or altered by anyone without the secret (a stranger's sidecar,
//! a tampered tier file, another graph's object in a shared bucket). Without a
//! credential there is no key: blocks carry no MAC and readers check the checksum only.

use std::fmt;

use crate::Block;
use crate::credential::Credential;

/// Bytes of a MAC.
pub const MAC_BYTES: usize = blake3::OUT_LEN;

/// A block's MAC.
pub type Mac = [u8; MAC_BYTES];

/// Separates block MACs from any other use of the graph's secret.
const KEY_CONTEXT: &str = "dynamo kvblocks 2026-11 block MAC v1";

/// The key blocks of one graph are MAC-ed with, derived from its credential.
#[derive(Clone)]
pub struct BlockKey([u8; blake3::KEY_LEN]);

/// Never printed, as the credential it comes from.
impl fmt::Debug for BlockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BlockKey(..)")
    }
}

impl BlockKey {
    pub fn of(credential: &Credential) -> Self {
        Self(blake3::derive_key(KEY_CONTEXT, credential.secret()))
    }

    /// The MAC of `block` as it is now.
    pub fn mac(&self, block: &Block) -> Mac {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(&block.hash.0.to_le_bytes());
        match block.parent {
            Some(p) => h.update(&[1]).update(&p.0.to_le_bytes()),
            None => h.update(&[0]),
        };
        let layout = &block.layout;
        h.update(&block.tokens.to_le_bytes())
            .update(&layout.block_bytes.to_le_bytes())
            .update(&layout.block_size.to_le_bytes())
            .update(&layout.layers.to_le_bytes())
            .update(&(layout.dtype.len() as u64).to_le_bytes())
            .update(layout.dtype.as_bytes())
            .update(&block.payload);
        *h.finalize().as_bytes()
    }

    /// `block` with its MAC set.
    pub fn seal(&self, block: Block) -> Block {
        let mac = Some(self.mac(&block));
        Block { mac, ..block }
    }

    /// Whether `block` carries the MAC this key gives it (compared in constant time).
    pub fn admits(&self, block: &Block) -> bool {
        block
            .mac
            .is_some_and(|mac| blake3::Hash::from_bytes(mac) == blake3::Hash::from(self.mac(block)))
    }
}

/// Whether `block` is authentic under `key`: with a key, it must carry that key's MAC;
/// without one (a graph without a credential), the checksum is all there is.
pub fn authentic(key: Option<&BlockKey>, block: &Block) -> bool {
    key.is_none_or(|k| k.admits(block))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use dynamo_kvcache::SeqHash;

    use super::*;
    use crate::test_block;

    fn key(token: &str) -> BlockKey {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), token).unwrap();
        BlockKey::of(&Credential::read(file.path()).unwrap())
    }

    #[test]
    fn a_sealed_block_is_admitted_and_any_change_or_other_key_is_not() {
        let ours = key("graph-a");
        let sealed = ours.seal(test_block());
        assert!(ours.admits(&sealed));
        assert!(!ours.admits(&test_block()), "no MAC, no admission");
        assert!(!key("graph-b").admits(&sealed));
        let changes = [
            Block {
                payload: Bytes::from_static(b"abce"),
                ..sealed.clone()
            },
            Block {
                hash: SeqHash(8),
                ..sealed.clone()
            },
            Block {
                parent: None,
                ..sealed.clone()
            },
            Block {
                tokens: 15,
                ..sealed.clone()
            },
        ];
        for changed in changes {
            assert!(!ours.admits(&changed), "{changed:?}");
        }
        let mut layout = sealed.clone();
        layout.layout.dtype = "float16".into();
        assert!(!ours.admits(&layout));
        assert!(authentic(None, &test_block()), "no key: checksum only");
        assert!(!authentic(Some(&ours), &test_block()));
    }
}
