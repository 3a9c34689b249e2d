//! Header-only readers for the checkpoint formats fathom plans from.
//!
//! This room knows file formats and nothing about architectures or memory:
//! it turns bytes on disk into typed headers (metadata, tensor tables with
//! dtypes, shapes and byte sizes) and rejects hostile input with a typed
//! [`CheckpointError`] naming the file, the field and the offending value.
//! Nothing here reads or maps tensor data.

pub mod error;
pub mod gguf;
pub mod hf;
pub mod safetensors;
pub mod tokenizer_json;

use std::path::Path;

pub use error::{CheckpointError, ErrorKind};
/// The ggml type table lives in `fathom-ggml`; re-exported here because
/// GGUF tensor headers carry it.
pub use fathom_ggml::GgmlType;
pub use gguf::{GgufFile, GgufTensor, MetaValue};
pub use hf::{HfCheckpoint, MlxQuantization};
pub use safetensors::{SafetensorsFile, StDtype, StTensor};

/// A checkpoint opened for its headers only.
#[derive(Debug, Clone)]
pub enum Checkpoint {
    /// A single `.gguf` file.
    Gguf(GgufFile),
    /// A Hugging Face (or MLX) directory: `config.json` plus safetensors.
    Hf(HfCheckpoint),
}

impl Checkpoint {
    /// Opens `path` as a GGUF file or as a Hugging Face / MLX directory,
    /// reading headers only.
    pub fn open(path: &Path) -> Result<Self, CheckpointError> {
        let meta = std::fs::metadata(path).map_err(|e| CheckpointError::io(path, e))?;
        if meta.is_dir() {
            Ok(Checkpoint::Hf(HfCheckpoint::open(path)?))
        } else {
            Ok(Checkpoint::Gguf(GgufFile::open(path)?))
        }
    }

    /// The short name of the format, as reported in `inspect --json`.
    pub fn format_name(&self) -> &'static str {
        match self {
            Checkpoint::Gguf(_) => "gguf",
            Checkpoint::Hf(hf) if hf.quantization.is_some() => "mlx",
            Checkpoint::Hf(_) => "safetensors",
        }
    }
}

/// Opens `path` for reading if it is a regular file (symlinks followed).
/// A FIFO, socket or device is refused before `open`, which would block
/// on a FIFO until a writer appears.
pub fn open_regular(path: &Path) -> Result<std::fs::File, CheckpointError> {
    let meta = std::fs::metadata(path).map_err(|e| CheckpointError::io(path, e))?;
    let kind = file_kind(&meta.file_type());
    if let Some(what) = kind {
        return Err(CheckpointError::new(path, ErrorKind::NotAFile { what }));
    }
    std::fs::File::open(path).map_err(|e| CheckpointError::io(path, e))
}

/// What a non-regular file is, in words; `None` for a regular file.
fn file_kind(t: &std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    if t.is_file() {
        None
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_fifo() {
        Some("a FIFO (named pipe)")
    } else if t.is_socket() {
        Some("a socket")
    } else if t.is_char_device() {
        Some("a character device")
    } else if t.is_block_device() {
        Some("a block device")
    } else {
        Some("neither a file nor a directory")
    }
}
