use thiserror::Error;

/// What a backend can refuse.
#[derive(Debug, Error)]
pub enum BackendError {
    #[error("bytes {offset}..+{len} lie outside a {size}-byte buffer")]
    OutOfRange {
        offset: usize,
        len: usize,
        size: usize,
    },
    #[error("{what}: {needed} bytes needed, {available} planned")]
    OverPlan {
        what: String,
        needed: u64,
        available: u64,
    },
    #[error("{backend}: {message}")]
    Device {
        backend: &'static str,
        message: String,
    },
}
