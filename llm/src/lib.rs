//! What the engine and the router both need to speak for a model: its directory
//! (tokenizer, chat template, context length), the OpenAI-compatible API (request and
//! response types, request preparation, OpenAI-style errors), and the parsers that turn
//! engine text into `tool_calls` and `reasoning_content`.

pub mod agent_hints;
pub mod chat_template;
pub mod disagg;
pub mod embeddings;
pub mod error;
pub mod model_card;
pub mod model_dir;
pub mod openai;
pub mod parsers;
pub mod prepare;
pub mod prompt_bound;

pub use chat_template::ChatTemplate;
pub use error::ApiError;
pub use model_dir::{ModelDir, ModelDirError};
pub use prepare::{Endpoint, PreparedRequest};
