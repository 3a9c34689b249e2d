use std::path::PathBuf;

/// Why a model cannot be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Checkpoint(#[from] fathom_checkpoint::CheckpointError),
    #[error(transparent)]
    Spec(#[from] fathom_spec::SpecError),
    #[error(transparent)]
    Plan(#[from] fathom_plan::PlanError),
    #[error(transparent)]
    Tokenizer(#[from] fathom_tokenizer::TokenizerError),
    #[error(transparent)]
    Backend(#[from] fathom_backend::BackendError),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{architecture:?} models cannot be run yet: fathom runs llama, qwen2, qwen3, qwen3_moe, gemma3, gemma4, qwen35, qwen35_moe and gpt_oss")]
    UnsupportedFamily { architecture: String },
    #[error(
        "{family} models with {what} cannot be run yet; fathom runs the {family} models without it"
    )]
    UnsupportedVariant { family: String, what: String },
    #[error("{family} models cannot run on the {backend} backend yet: {what}; run them with --device cpu")]
    UnsupportedOnBackend {
        family: String,
        backend: String,
        what: String,
    },
    #[error("tensor {tensor}: {dtype} weights are not supported; supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4")]
    UnsupportedDtype { tensor: String, dtype: String },
    #[error("tensor {tensor} is missing from the checkpoint")]
    MissingTensor { tensor: String },
    #[error("tensor {tensor} has shape {shape:?}, expected {expected:?}")]
    BadShape {
        tensor: String,
        shape: Vec<u64>,
        expected: Vec<u64>,
    },
    #[error("the prompt is {prompt} tokens and {generate} more were asked for, but the context holds {context}: shorten the prompt, lower -n, or raise --ctx-size (the model was trained on {trained})")]
    ContextExceeded {
        prompt: usize,
        generate: usize,
        context: usize,
        trained: u64,
    },
    /// A placement between the GPU and the host that a run cannot execute.
    #[error("placement: {0}")]
    Placement(String),
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    BadToken { id: u32, vocab: usize },
}
