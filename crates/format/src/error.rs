//! Errors of the format layer: what is wrong with a run of bytes.

pub type Result<T> = std::result::Result<T, FormatError>;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("truncated: need {need} bytes at offset {offset}, have {have}")]
    Truncated {
        offset: usize,
        need: usize,
        have: usize,
    },
    #[error("bad magic")]
    BadMagic,
    #[error("checksum mismatch")]
    ChecksumMismatch,
    #[error("unknown checksum type {0}")]
    UnknownCsumType(u16),
    #[error("{0}")]
    Invalid(String),
    #[error("decompression failed: {0}")]
    Decompress(String),
}

impl FormatError {
    pub fn invalid(msg: impl Into<String>) -> Self {
        FormatError::Invalid(msg.into())
    }
}

/// Shorthand for `Err(FormatError::Invalid(format!(...)))`.
#[macro_export]
macro_rules! invalid {
    ($($arg:tt)*) => { return Err($crate::error::FormatError::Invalid(format!($($arg)*))) };
}
