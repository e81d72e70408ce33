//! Hugging Face chat templates rendered with minijinja.
//!
//! Templates are written for Python's Jinja2 as `transformers` configures it
//! (`trim_blocks`, `lstrip_blocks`, the loop-controls extension, a `raise_exception`
//! function) and call Python string methods (`.strip()`, `.startswith()`); minijinja
//! with those settings and `minijinja_contrib`'s Python-compatibility methods renders
//! them unchanged.

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Serde;
use minijinja::{Environment, ErrorKind, Value as JinjaValue, context};
use serde_json::Value;

use crate::ApiError;

const TEMPLATE_NAME: &str = "chat";

/// A model's compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` are the strings templates may refer to.
    pub fn new(
        source: String,
        bos_token: String,
        eos_token: String,
    ) -> Result<Self, minijinja::Error> {
        let mut env = Environment::new();
        env.set_syntax(
            SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .expect("the default delimiters are valid"),
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<String, _> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_template_owned(TEMPLATE_NAME, source)?;
        Ok(Self {
            env,
            bos_token,
            eos_token,
        })
    }

    /// Renders a conversation (OpenAI `messages`, content already flattened to text).
    /// A template that rejects the conversation (`raise_exception`) is the client's
    /// mistake, hence a 400.
    pub fn render(
        &self,
        messages: &[Value],
        tools: Option<&Value>,
        add_generation_prompt: bool,
    ) -> Result<String, ApiError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .expect("added in new()");
        template
            .render(context! {
                messages => JinjaValue::from(Serde(messages)),
                tools => JinjaValue::from(Serde(tools)),
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token.as_str(),
                eos_token => self.eos_token.as_str(),
            })
            .map_err(|e| match e.kind() {
                ErrorKind::InvalidOperation => ApiError::bad_request(
                    format!(
                        "The chat template refused the conversation: {}",
                        e.detail().unwrap_or("")
                    ),
                    Some("messages"),
                ),
                _ => ApiError::bad_request(
                    format!("The chat template could not render the conversation: {e}"),
                    Some("messages"),
                ),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chatml() -> ChatTemplate {
        let source = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content.strip() }}<|im_end|>\n{% endfor %}\
                      {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        ChatTemplate::new(source.into(), String::new(), "<|im_end|>".into()).unwrap()
    }

    #[test]
    fn renders_messages_with_python_string_methods() {
        let out = chatml()
            .render(&[json!({"role": "user", "content": "  hi  "})], None, true)
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn raise_exception_is_a_client_error() {
        let t = ChatTemplate::new(
            "{% if messages[0].role != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}".into(),
            String::new(),
            String::new(),
        )
        .unwrap();
        let err = t
            .render(&[json!({"role": "assistant", "content": "x"})], None, false)
            .unwrap_err();
        assert_eq!(err.status.as_u16(), 400);
        assert!(
            err.message.contains("first message must be from the user"),
            "{}",
            err.message
        );
    }

    #[test]
    fn a_broken_template_fails_to_compile() {
        assert!(ChatTemplate::new("{% for %}".into(), String::new(), String::new()).is_err());
    }
}
