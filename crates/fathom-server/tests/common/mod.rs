//! The test vocabularies and real chat templates `scripts/fetch-vocab.sh`
//! puts in `models/`.

use std::path::{Path, PathBuf};

use fathom_checkpoint::Checkpoint;

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models")
}

/// The vocabulary of `models/name`.
pub fn vocabulary(name: &str) -> fathom_engine::Tokenizer {
    vocabulary_at(&models().join(name))
}

/// The vocabulary of the GGUF file at `path`.
pub fn vocabulary_at(path: &Path) -> fathom_engine::Tokenizer {
    let checkpoint = Checkpoint::open(path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run scripts/fetch-vocab.sh, which fetches the vocabularies",
            path.display()
        )
    });
    fathom_engine::load_tokenizer(&checkpoint).unwrap()
}

/// The chat template `name` from `models/templates/`.
pub fn template(name: &str) -> String {
    let path = models().join("templates").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run scripts/fetch-vocab.sh, which fetches the real chat templates",
            path.display()
        )
    })
}

/// The prompt the server renders for `prepared` (messages and tools made
/// ready for a format): through `chat`, with the generation prompt.
pub fn prompt_of(
    tok: &fathom_engine::Tokenizer,
    chat: &fathom_tokenizer::ChatTemplate,
    prepared: &fathom_server::tools::Prepared,
    kwargs: Option<&fathom_tokenizer::TemplateKwargs>,
) -> Vec<u32> {
    fathom_tokenizer::encode_chat_tools(
        tok,
        chat,
        &prepared.messages,
        prepared.tools.as_ref(),
        kwargs,
        true,
        1 << 20,
    )
    .unwrap()
}
