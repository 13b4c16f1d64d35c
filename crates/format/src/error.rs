//! Errors of the format layer: what is wrong with a run of bytes.

/// Result of every fallible function in this crate.
pub type Result<T> = std::result::Result<T, FormatError>;

/// Why a run of bytes is not what it claims to be. The format layer never panics on hostile
/// input: every bounds, magic, checksum or consistency failure comes back as one of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// A field or structure extends past the end of the buffer.
    #[error("truncated: need {need} bytes at offset {offset}, have {have}")]
    Truncated {
        /// Where the read or write started.
        offset: usize,
        /// How many bytes it needed from there.
        need: usize,
        /// Length of the buffer.
        have: usize,
    },
    /// The superblock's magic is not `_BHRfS_M` (not a btrfs superblock).
    #[error("bad magic")]
    BadMagic,
    /// The stored checksum of a superblock or tree block does not match its contents.
    #[error("checksum mismatch")]
    ChecksumMismatch,
    /// The superblock's `csum_type` is none of crc32c, xxhash64, sha256 or blake2b.
    #[error("unknown checksum type {0}")]
    UnknownCsumType(u16),
    /// The bytes parse but break a rule of the format (the message says which).
    #[error("{0}")]
    Invalid(String),
    /// A compressed extent does not decode.
    #[error("decompression failed: {0}")]
    Decompress(String),
}

impl FormatError {
    /// An [`FormatError::Invalid`] with `msg`.
    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        FormatError::Invalid(msg.into())
    }
}

/// Shorthand for `return Err(FormatError::Invalid(format!(...)))`.
macro_rules! invalid {
    ($($arg:tt)*) => { return Err($crate::error::FormatError::Invalid(format!($($arg)*))) };
}
pub(crate) use invalid;
