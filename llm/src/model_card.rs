//! A model card: what a pod's sidecar tells the endpoint picker about the model its engine
//! serves, so the picker tokenizes as the engine does without reaching a model hub (as
//! Dynamo's frontend loads its tokenizer from its workers' model deployment cards): the
//! served name, the KV block size, and the files of the model directory that
//! [`crate::ModelDir`] reads, each with its length and a hash, so a picker can check that
//! every pod of its pool serves the same model.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model_dir::{
    CHAT_TEMPLATE_FILE, CONFIG_FILE, GENERATION_CONFIG_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE,
};

/// Where a sidecar serves the card (on its metrics port); each file is at
/// `{CARD_PATH}/files/{name}`.
pub const CARD_PATH: &str = "/model_card";

/// The files of a model directory that [`crate::ModelDir::load`] reads.
pub const FILES: [&str; 5] = [
    TOKENIZER_FILE,
    TOKENIZER_CONFIG_FILE,
    CONFIG_FILE,
    GENERATION_CONFIG_FILE,
    CHAT_TEMPLATE_FILE,
];

/// The one file a model directory cannot do without.
const REQUIRED: &str = TOKENIZER_FILE;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ModelCard {
    /// The name clients send.
    pub name: String,
    /// Tokens per KV block, when the engine says.
    pub block_size: Option<u32>,
    /// The model directory's files among [`FILES`], in that order.
    pub files: Vec<CardFile>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct CardFile {
    pub name: String,
    pub bytes: u64,
    /// XXH3-64 of the contents, hex: tells files apart, not a defence against a forger
    /// (the picker trusts its pool's pods).
    pub xxh3: String,
}

impl ModelCard {
    /// The card of the model directory `dir`.
    pub fn read(dir: &Path, name: &str, block_size: Option<u32>) -> std::io::Result<Self> {
        let mut files = Vec::new();
        for file in FILES {
            match std::fs::read(dir.join(file)) {
                Ok(bytes) => files.push(CardFile {
                    name: file.into(),
                    bytes: bytes.len() as u64,
                    xxh3: format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&bytes)),
                }),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && file != REQUIRED => {}
                Err(e) => return Err(e),
            }
        }
        Ok(Self {
            name: name.into(),
            block_size,
            files,
        })
    }

    /// Whether the file `name` is one a card may hold.
    pub fn is_card_file(name: &str) -> bool {
        FILES.contains(&name)
    }

    /// Why `other` does not describe the same model, if it does not: a different name,
    /// block size, or any file that differs.
    pub fn differs_from(&self, other: &ModelCard) -> Option<String> {
        if self.name != other.name {
            return Some(format!("serves {:?}, not {:?}", other.name, self.name));
        }
        if let (Some(a), Some(b)) = (self.block_size, other.block_size)
            && a != b
        {
            return Some(format!("uses KV blocks of {b} tokens, not {a}"));
        }
        (self.files != other.files).then(|| {
            let names = |c: &ModelCard| c.files.iter().map(|f| f.name.clone()).collect::<Vec<_>>();
            format!(
                "has other model files ({:?} against {:?}, or their contents differ)",
                names(other),
                names(self)
            )
        })
    }
}

/// The model directory of `source`, what an engine loads: `source` itself when it is a
/// directory, else its snapshot in the Hugging Face hub cache under `hf_home`
/// (`{hf_home}/hub/models--{org}--{name}/snapshots/{revision}`, the revision that
/// `refs/main` names: huggingface_hub's cache layout, `file_download.py`), once the
/// engine has downloaded it.
pub fn resolve_dir(source: &str, hf_home: Option<&Path>) -> Option<PathBuf> {
    let direct = Path::new(source);
    if direct.join(REQUIRED).is_file() {
        return Some(direct.to_owned());
    }
    let repo = hf_home?
        .join("hub")
        .join(format!("models--{}", source.replace('/', "--")));
    let revision = std::fs::read_to_string(repo.join("refs").join("main")).ok()?;
    let snapshot = repo.join("snapshots").join(revision.trim());
    snapshot.join(REQUIRED).is_file().then_some(snapshot)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (name, text) in files {
            let path = d.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        d
    }

    #[test]
    fn a_card_lists_the_files_there_are_and_needs_a_tokenizer() {
        let d = dir(&[
            ("tokenizer.json", "{}"),
            ("config.json", "{\"a\":1}"),
            ("x.bin", "w"),
        ]);
        let card = ModelCard::read(d.path(), "m", Some(16)).unwrap();
        let names: Vec<&str> = card.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["tokenizer.json", "config.json"]);
        assert_eq!(card.files[1].bytes, 7);
        assert!(ModelCard::read(dir(&[("config.json", "{}")]).path(), "m", None).is_err());
        assert!(ModelCard::is_card_file("tokenizer.json"));
        assert!(!ModelCard::is_card_file("../etc/passwd"));
    }

    #[test]
    fn cards_differ_by_name_block_size_or_any_file() {
        let a = ModelCard::read(dir(&[("tokenizer.json", "{}")]).path(), "m", Some(16)).unwrap();
        assert_eq!(a.differs_from(&a.clone()), None);
        let unknown_size = ModelCard {
            block_size: None,
            ..a.clone()
        };
        assert_eq!(a.differs_from(&unknown_size), None);
        let other_name = ModelCard {
            name: "n".into(),
            ..a.clone()
        };
        assert!(a.differs_from(&other_name).unwrap().contains("\"n\""));
        let other_size = ModelCard {
            block_size: Some(64),
            ..a.clone()
        };
        assert!(a.differs_from(&other_size).unwrap().contains("64"));
        let other_tokenizer =
            ModelCard::read(dir(&[("tokenizer.json", "{ }")]).path(), "m", Some(16)).unwrap();
        assert!(a.differs_from(&other_tokenizer).is_some());
    }

    #[test]
    fn a_hub_id_resolves_to_its_downloaded_snapshot() {
        let home = dir(&[
            ("hub/models--Qwen--Qwen3-0.6B/refs/main", "abc123\n"),
            (
                "hub/models--Qwen--Qwen3-0.6B/snapshots/abc123/tokenizer.json",
                "{}",
            ),
        ]);
        assert_eq!(
            resolve_dir("Qwen/Qwen3-0.6B", Some(home.path())),
            Some(
                home.path()
                    .join("hub/models--Qwen--Qwen3-0.6B/snapshots/abc123")
            )
        );
        assert_eq!(resolve_dir("Qwen/Other", Some(home.path())), None);
        assert_eq!(resolve_dir("Qwen/Qwen3-0.6B", None), None);
        let local = dir(&[("tokenizer.json", "{}")]);
        assert_eq!(
            resolve_dir(local.path().to_str().unwrap(), None),
            Some(local.path().to_owned())
        );
    }
}
