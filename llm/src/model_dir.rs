//! A Hugging Face-style model directory: `tokenizer.json`, `tokenizer_config.json` (with
//! `chat_template`, or a `chat_template.jinja` file beside it), `config.json` and
//! `generation_config.json`. No weights are read, so a real model's directory and the
//! one `make model` builds work alike.

use std::path::{Path, PathBuf};

use serde_json::Value;
use tokenizers::Tokenizer;

use crate::ChatTemplate;
use crate::prompt_bound::PromptBound;

/// The files of a model directory this reads (Hugging Face's names).
pub const TOKENIZER_FILE: &str = "tokenizer.json";
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
pub const CONFIG_FILE: &str = "config.json";
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";
/// The chat template beside `tokenizer_config.json`, when that names none.
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// Context length assumed when neither config names one (vLLM refuses to start then; a
/// mock engine can afford a default).
const DEFAULT_CONTEXT: usize = 32_768;

/// Why a model directory could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ModelDirError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// A loaded model directory.
pub struct ModelDir {
    /// The served model name: the directory's name unless the caller overrides it.
    pub name: String,
    pub path: PathBuf,
    /// Hugging Face's tokenizer: decoding, the vocabulary, and encoding where `fast` is
    /// missing.
    pub tokenizer: Tokenizer,
    /// The encoder of prompts when it loads this `tokenizer.json` (it refuses some
    /// normalizers and pre-tokenizers): fastokens gives `tokenizer`'s ids 50-200x faster on
    /// long prompts (`llm/benches/encode.rs`), which is most of a router's CPU per request.
    fast: Option<fastokens::Tokenizer>,
    /// `None` when the model has no chat template: chat requests are then refused.
    pub chat_template: Option<ChatTemplate>,
    /// Prompt plus output may not exceed this many tokens.
    pub max_context: usize,
    /// Token ids that end generation.
    pub eos_token_ids: Vec<u32>,
    /// Vocabulary size with added tokens, counted once: `Tokenizer::get_vocab_size(true)`
    /// builds the whole vocabulary map on every call (tens of ms for Qwen's 151k tokens).
    vocab_size: usize,
    /// How few tokens a text can encode to, known before tokenizing it; `None` for
    /// tokenizers that can delete text.
    prompt_bound: Option<PromptBound>,
}

impl ModelDir {
    /// Loads `path`; `name` overrides the served model name.
    pub fn load(path: &Path, name: Option<&str>) -> Result<Self, ModelDirError> {
        let tokenizer_path = path.join(TOKENIZER_FILE);
        let tokenizer =
            Tokenizer::from_file(&tokenizer_path).map_err(|e| ModelDirError::Invalid {
                path: tokenizer_path.clone(),
                message: e.to_string(),
            })?;
        let fast = fastokens::Tokenizer::from_file(&tokenizer_path).ok();
        let tokenizer_config = read_json_if_present(&path.join(TOKENIZER_CONFIG_FILE))?;
        let config = read_json_if_present(&path.join(CONFIG_FILE))?;
        let generation_config = read_json_if_present(&path.join(GENERATION_CONFIG_FILE))?;

        let special = |key: &str| special_token(&tokenizer_config, key).unwrap_or_default();
        let chat_template = match chat_template_source(path, &tokenizer_config)? {
            Some(source) => Some(
                ChatTemplate::new(source, special("bos_token"), special("eos_token")).map_err(
                    |e| ModelDirError::Invalid {
                        path: path.join(TOKENIZER_CONFIG_FILE),
                        message: format!("chat_template: {e}"),
                    },
                )?,
            ),
            None => None,
        };

        let max_context = config
            .get("max_position_embeddings")
            .and_then(Value::as_u64)
            .or_else(|| {
                tokenizer_config
                    .get("model_max_length")
                    .and_then(Value::as_u64)
            })
            // transformers writes a huge sentinel when the length is unknown.
            .filter(|&n| n > 0 && n < 1 << 40)
            .map_or(DEFAULT_CONTEXT, |n| n as usize);

        let mut eos_token_ids = token_ids(generation_config.get("eos_token_id"));
        if eos_token_ids.is_empty() {
            eos_token_ids = token_ids(config.get("eos_token_id"));
        }
        if eos_token_ids.is_empty() {
            eos_token_ids.extend(tokenizer.token_to_id(&special("eos_token")));
        }

        let name = match name {
            Some(name) => name.to_owned(),
            None => dir_name(path)?,
        };
        let model = Self {
            name,
            path: path.to_owned(),
            vocab_size: tokenizer.get_vocab_size(true),
            prompt_bound: PromptBound::of(&tokenizer),
            tokenizer,
            fast,
            chat_template,
            max_context,
            eos_token_ids,
        };
        model.warm();
        Ok(model)
    }

    /// Encodes a long text, so that the encoder's setup is paid now and not on a
    /// request's time: fastokens builds its tables on a process's first encode (55-130 ms
    /// measured on 2 cores) and copies a 16 MiB cache seed on each thread's first (20-50
    /// ms there under load). Loading does it for the loading thread; servers do it on each
    /// of their worker threads (`dynamo_server::on_every_worker`) before they serve.
    /// Without, every run's first burst of requests waited 50-130 ms longer for its first
    /// tokens, which was the TTFT p99 of a 400-request run.
    pub fn warm(&self) {
        if let Some(fast) = &self.fast {
            let text = "The 3 quick brown foxes jumped over 12 lazy dogs, twice! ".repeat(256);
            let _ = fast.encode(&text);
        }
    }

    /// Token ids of `text`, with special tokens written in it recognised as such (chat
    /// templates write them) and nothing added around it.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        match &self.fast {
            Some(fast) => fast.encode(text).ok(),
            None => self
                .tokenizer
                .encode_fast(text, false)
                .ok()
                .map(|enc| enc.get_ids().to_vec()),
        }
        .unwrap_or_default()
    }

    /// Which library encodes prompts: `fastokens`, or `tokenizers` where fastokens cannot
    /// load the model's tokenizer.
    pub fn encoder(&self) -> &'static str {
        if self.fast.is_some() {
            "fastokens"
        } else {
            "tokenizers"
        }
    }

    /// Text of `ids`, special tokens dropped.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.tokenizer.decode(ids, true).unwrap_or_default()
    }

    /// How many ids the vocabulary has, special tokens included.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The longest prompt text that could fit the context, in bytes: longer ones are
    /// refused without tokenizing. `None` when the tokenizer admits no such bound.
    pub fn max_prompt_bytes(&self) -> Option<usize> {
        let bound = self.prompt_bound.as_ref()?;
        Some(self.max_context.saturating_mul(bound.bytes_per_token()))
    }

    /// A lower bound of `text`'s token count, tight enough to tell whether it exceeds
    /// `limit`, found without tokenizing it (see [`PromptBound`]); 0 when the tokenizer
    /// admits no bound.
    pub fn min_tokens(&self, text: &str, limit: usize) -> usize {
        self.prompt_bound
            .as_ref()
            .map_or(0, |b| b.min_tokens(&self.tokenizer, text, limit))
    }
}

impl std::fmt::Debug for ModelDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelDir")
            .field("name", &self.name)
            .field("path", &self.path)
            .field("encoder", &self.encoder())
            .field("max_context", &self.max_context)
            .field("eos_token_ids", &self.eos_token_ids)
            .finish_non_exhaustive()
    }
}

fn read_json_if_present(path: &Path) -> Result<Value, ModelDirError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| ModelDirError::Invalid {
            path: path.to_owned(),
            message: e.to_string(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Value::Null),
        Err(source) => Err(ModelDirError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

/// `chat_template` is a string, or a list of `{name, template}` where `default` is the
/// one for plain chat; newer models keep it in `chat_template.jinja`.
fn chat_template_source(
    dir: &Path,
    tokenizer_config: &Value,
) -> Result<Option<String>, ModelDirError> {
    match tokenizer_config.get("chat_template") {
        Some(Value::String(s)) => return Ok(Some(s.clone())),
        Some(Value::Array(named)) => {
            let default = named.iter().find(|t| t["name"] == "default");
            if let Some(s) = default.and_then(|t| t["template"].as_str()) {
                return Ok(Some(s.to_owned()));
            }
        }
        _ => {}
    }
    let file = dir.join(CHAT_TEMPLATE_FILE);
    match std::fs::read_to_string(&file) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ModelDirError::Read { path: file, source }),
    }
}

/// A special token is written as a string or as `{"content": "..."}`.
fn special_token(tokenizer_config: &Value, key: &str) -> Option<String> {
    let v = tokenizer_config.get(key)?;
    v.as_str()
        .or_else(|| v.get("content").and_then(Value::as_str))
        .map(str::to_owned)
}

fn token_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|n| n as u32).into_iter().collect(),
        Some(Value::Array(ids)) => ids
            .iter()
            .filter_map(Value::as_u64)
            .map(|n| n as u32)
            .collect(),
        _ => Vec::new(),
    }
}

fn dir_name(path: &Path) -> Result<String, ModelDirError> {
    let canonical = path.canonicalize().map_err(|source| ModelDirError::Read {
        path: path.to_owned(),
        source,
    })?;
    canonical
        .file_name()
        .and_then(|n| n.to_str())
        .map(str::to_owned)
        .ok_or_else(|| ModelDirError::Invalid {
            path: path.to_owned(),
            message: "cannot name the model after this directory; pass a model name".into(),
        })
}
