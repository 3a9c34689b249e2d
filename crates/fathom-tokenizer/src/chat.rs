//! Chat templates: the Jinja source a checkpoint ships, rendered the way
//! Hugging Face `apply_chat_template` renders it.

use std::collections::BTreeMap;

use minijinja::syntax::SyntaxConfig;
use minijinja::{context, Environment, Error, ErrorKind, Value};

use crate::TokenizerError;

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

const NAME: &str = "chat_template";

fn template_error(e: Error) -> TokenizerError {
    TokenizerError::Template(e.to_string())
}

impl ChatTemplate {
    /// Compiles `source`; a syntax error is reported here, not at render.
    /// `bos_token` and `eos_token` are the texts templates see under those
    /// names.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TokenizerError> {
        let mut env = Environment::new();
        // Hugging Face compiles templates with both on; templates are
        // written for it (block tags on their own lines leave no blank lines).
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(template_error)?;
        env.set_syntax(syntax);
        // Templates call Python string methods (`.strip()`, `.startswith()`).
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // The helper Hugging Face provides for templates to reject input.
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_template_owned(NAME, source.to_string())
            .map_err(template_error)?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// The prompt text for `messages`; `add_generation_prompt` appends the
    /// opening of the assistant's turn.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let template = self.env.get_template(NAME).map_err(template_error)?;
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| {
                Value::from(BTreeMap::from([
                    ("role", Value::from(m.role.as_str())),
                    ("content", Value::from(m.content.as_str())),
                ]))
            })
            .collect();
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token.as_str(),
                eos_token => self.eos_token.as_str(),
            })
            .map_err(template_error)
    }
}
