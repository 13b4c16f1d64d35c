//! The engine's error type and its errno mapping (the FUSE edge uses `errno()`).

use std::io;

pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no such file or directory")]
    NotFound,
    /// An item (or name) with that key already exists.
    #[error("already exists")]
    AlreadyExists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("no such attribute")]
    NoXattr,
    #[error("read-only filesystem")]
    ReadOnly,
    /// The inode's flags forbid it (immutable, append-only): EPERM.
    #[error("operation not permitted: {0}")]
    NotPermitted(String),
    #[error("value too large for the given buffer")]
    Range,
    /// lseek's SEEK_DATA/SEEK_HOLE past the end of the file, or no data after the offset.
    #[error("no data or hole at or after that offset")]
    NoSuchOffset,
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("io error: {0}")]
    Io(#[from] io::Error),
    /// Metadata that fails validation: the block address says where.
    #[error("corrupt metadata at logical {bytenr}: {reason}")]
    Corrupt { bytenr: u64, reason: String },
    /// Data whose checksum does not match the csum tree.
    #[error("data checksum mismatch: inode {ino} (subvolume {subvol}) offset {offset} logical {logical}")]
    DataChecksum {
        subvol: u64,
        ino: u64,
        offset: u64,
        logical: u64,
    },
    /// An earlier failure aborted a transaction: no more writes until remounted.
    #[error("the filesystem went read-only after an aborted transaction: {0}")]
    Aborted(String),
    /// Not enough free space for the operation (nothing was changed).
    #[error("no space left on device")]
    NoSpace,
    #[error("directory not empty")]
    NotEmpty,
    #[error("name too long")]
    NameTooLong,
    #[error("too many links")]
    TooManyLinks,
    #[error("file too large")]
    FileTooBig,
    #[error("cross-device link")]
    CrossDevice,
    #[error("operation not supported by this file type")]
    NoDevice,
    /// The image or device is held by someone else (the message names who).
    #[error("{0}")]
    Busy(String),
    /// mkfs would destroy what the target holds (the message says what).
    #[error("{0}")]
    WouldOverwrite(String),
    /// The image cannot be used at all (bad superblock, missing trees, ...).
    #[error("unusable filesystem: {0}")]
    Unusable(String),
    /// Internal: a lookup under the filesystem's lock needed a tree block that is not in
    /// memory (`disk_io::CachedOnly`); the caller reads it after letting go and retries.
    /// Never returned by the public API.
    #[doc(hidden)]
    #[error("tree block {} is not cached", .0.bytenr)]
    NotCached(Box<TreeMiss>),
}

impl Error {
    pub fn corrupt(bytenr: u64, reason: impl Into<String>) -> Self {
        Error::Corrupt {
            bytenr,
            reason: reason.into(),
        }
    }

    /// The errno a POSIX caller should see.
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound => libc::ENOENT,
            Error::Busy(_) => libc::EBUSY,
            Error::WouldOverwrite(_) => libc::EEXIST,
            Error::AlreadyExists => libc::EEXIST,
            Error::NotDir => libc::ENOTDIR,
            Error::IsDir => libc::EISDIR,
            Error::InvalidArgument(_) => libc::EINVAL,
            Error::NoXattr => libc::ENODATA,
            Error::ReadOnly => libc::EROFS,
            Error::NotPermitted(_) => libc::EPERM,
            Error::Range => libc::ERANGE,
            Error::NoSuchOffset => libc::ENXIO,
            Error::Unsupported(_) => libc::EOPNOTSUPP,
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Error::Corrupt { .. } => libc::EUCLEAN,
            Error::DataChecksum { .. } => libc::EIO,
            Error::Unusable(_) => libc::EIO,
            Error::Aborted(_) => libc::EROFS,
            Error::NoSpace => libc::ENOSPC,
            Error::NotEmpty => libc::ENOTEMPTY,
            Error::NameTooLong => libc::ENAMETOOLONG,
            Error::TooManyLinks => libc::EMLINK,
            Error::FileTooBig => libc::EFBIG,
            Error::CrossDevice => libc::EXDEV,
            Error::NoDevice => libc::ENODEV,
            Error::NotCached(_) => libc::EIO,
        }
    }
}

/// A tree block a lookup wanted and the cache did not have, with what its parent promised.
#[derive(Debug)]
pub struct TreeMiss {
    pub bytenr: u64,
    pub(crate) level: Option<u8>,
    pub(crate) generation: Option<u64>,
    pub(crate) first_key: Option<oleo_format::key::Key>,
}
