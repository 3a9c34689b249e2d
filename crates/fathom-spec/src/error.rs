use std::path::PathBuf;

/// A checkpoint whose headers parsed but do not describe a model fathom can plan.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("{}: {field} is missing; it is required for {family} models", path.display())]
    MissingField {
        path: PathBuf,
        field: String,
        family: String,
    },
    #[error("{}: {field} has invalid value {value}: expected {expected}", path.display())]
    InvalidField {
        path: PathBuf,
        field: String,
        value: String,
        expected: String,
    },
}
