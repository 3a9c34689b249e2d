//! Tokenizers, streaming detokenization and chat templates.
//!
//! The contract is llama.cpp's: for a GGUF file, [`Tokenizer::encode`] gives
//! the ids `llama-tokenize` gives, and [`Tokenizer::piece`] the bytes
//! `llama_token_to_piece` gives. A Hugging Face `tokenizer.json` (byte-level
//! BPE) runs through the same core, so a checkpoint tokenizes the same in
//! either form. The test corpus in `tests/data` holds llama.cpp's own output.

mod chat;
mod gguf;
mod hf;
mod pretok;
mod stream;
mod tokenizer;
mod unicode;

pub use chat::{
    civil_date, encode_chat, encode_chat_tools, json_to_template, ChatEncodeError, ChatTemplate,
    Message, TemplateKwargs, ToolCall,
};
pub use stream::StreamDecoder;
pub use tokenizer::{Special, Tokenizer, TooManyTokens};

/// An error loading a tokenizer or rendering a chat template; names the file
/// and field, and what was wrong with the value.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{file}: {field} is missing")]
    Missing { file: String, field: String },
    #[error("{file}: {field} {problem}")]
    Invalid {
        file: String,
        field: String,
        problem: String,
    },
    #[error("{file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: not valid JSON: {source}")]
    Json {
        file: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("chat template: {0}")]
    Template(String),
}
