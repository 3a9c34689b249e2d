//! The one error type of the checkpoint room.

use std::path::{Path, PathBuf};

/// An error reading a checkpoint: always names the file, and through
/// [`ErrorKind`] the field and the offending value.
#[derive(Debug, thiserror::Error)]
#[error("{}: {kind}", path.display())]
pub struct CheckpointError {
    /// The file (or directory) being read.
    pub path: PathBuf,
    /// What was wrong with it.
    pub kind: ErrorKind,
}

impl CheckpointError {
    pub fn new(path: &Path, kind: ErrorKind) -> Self {
        CheckpointError {
            path: path.to_path_buf(),
            kind,
        }
    }

    pub fn io(path: &Path, source: std::io::Error) -> Self {
        CheckpointError::new(path, ErrorKind::Io(source))
    }
}

/// What went wrong, with the field and value involved.
#[derive(Debug, thiserror::Error)]
pub enum ErrorKind {
    #[error("{0}")]
    Io(#[source] std::io::Error),
    #[error("file truncated while reading {field} at offset {offset}: needs {needed} bytes, file has {file_size}")]
    Truncated {
        field: String,
        offset: u64,
        needed: u64,
        file_size: u64,
    },
    #[error("not a GGUF file: magic bytes are {found:?}, expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },
    #[error("unsupported GGUF version {version}: fathom reads versions 2 and 3")]
    UnsupportedVersion { version: u32 },
    #[error("{field} is {value}, over the limit of {limit}")]
    TooLarge {
        field: String,
        value: u64,
        limit: u64,
    },
    #[error("{field}: arithmetic overflow ({detail})")]
    Overflow { field: String, detail: String },
    #[error(
        "tensor {tensor}: data [{begin}, {end}) lies outside the data section of {available} bytes"
    )]
    OutOfBounds {
        tensor: String,
        begin: u64,
        end: u64,
        available: u64,
    },
    #[error("duplicate tensor name {name:?}")]
    DuplicateTensor { name: String },
    #[error("duplicate metadata key {key:?}")]
    DuplicateKey { key: String },
    #[error("tensor {tensor}: offset {offset} is not a multiple of the alignment {alignment}")]
    Misaligned {
        tensor: String,
        offset: u64,
        alignment: u64,
    },
    #[error("{field} at offset {offset} is not valid UTF-8")]
    InvalidUtf8 { field: String, offset: u64 },
    #[error("{field} has invalid value {value}: expected {expected}")]
    InvalidValue {
        field: String,
        value: String,
        expected: String,
    },
    #[error("shard {shard:?} named in the index is missing")]
    MissingShard { shard: String },
    #[error("invalid JSON in {field}: {message}")]
    Json { field: String, message: String },
    #[error("is {what}, not a regular file: give a .gguf file or a model directory")]
    NotAFile { what: &'static str },
}
