//! The engine's error type and its errno mapping (the FUSE edge uses `errno()`).

use std::io;

/// The result of every fallible engine operation.
pub type Result<T> = std::result::Result<T, Error>;

/// Why an operation failed. Each variant maps to one errno ([`Error::errno`]), the value
/// the FUSE server (oleo-fuse) replies with; a failed operation has changed nothing unless
/// its variant says otherwise.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No inode, directory entry, subvolume or tree item by that name or key; also a
    /// lookup of a name in a directory that does not have it. ENOENT.
    #[error("no such file or directory")]
    NotFound,
    /// An item (or name) with that key already exists: create, link, mkdir, symlink or a
    /// `RenameFlags::noreplace` rename onto an existing name, `XattrSet::Create` of an
    /// existing xattr, an item inserted twice. EEXIST.
    #[error("already exists")]
    AlreadyExists,
    /// A directory operation on an inode that is not a directory (a lookup or create in
    /// a file, rmdir of a file). ENOTDIR.
    #[error("not a directory")]
    NotDir,
    /// A file operation on a directory: read, write, truncate, fallocate or a hard link
    /// of a directory, unlink of a directory. EISDIR.
    #[error("is a directory")]
    IsDir,
    /// A request the engine refuses as malformed (the message says why): a bad name, a
    /// zero-length fallocate, a write to something that is not a regular file, options
    /// that do not fit the image. EINVAL.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// getxattr or removexattr of an xattr the inode does not have, or
    /// `XattrSet::Replace` of one. ENODATA.
    #[error("no such attribute")]
    NoXattr,
    /// A change to a filesystem opened read-only (`Filesystem::open`), or to a read-only
    /// subvolume (a read-only snapshot) or one being deleted. EROFS.
    #[error("read-only filesystem")]
    ReadOnly,
    /// The inode's flags forbid it (immutable, append-only; the message says which).
    /// EPERM.
    #[error("operation not permitted: {0}")]
    NotPermitted(String),
    /// A value too large for the caller's buffer. ERANGE. The engine itself does not
    /// return it at present: it hands out whole values and leaves sizing to the caller.
    #[error("value too large for the given buffer")]
    Range,
    /// lseek's SEEK_DATA/SEEK_HOLE past the end of the file, or no data after the offset.
    /// ENXIO.
    #[error("no data or hole at or after that offset")]
    NoSuchOffset,
    /// Something valid that oleo does not implement (the message says what): an
    /// incompat feature it cannot write, quotas, a log tree it cannot replay. EOPNOTSUPP.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The device (image file or block device) failed a read, write or flush. The OS
    /// error's own errno, EIO if it has none.
    #[error("io error: {0}")]
    Io(#[from] io::Error),
    /// Metadata that fails validation: a tree block whose checksum, header, item layout
    /// or keys are wrong, or that is not what its parent pointer promised. EUCLEAN, as the
    /// kernel's tree checker.
    #[error("corrupt metadata at logical {bytenr}: {reason}")]
    Corrupt {
        /// Logical address of the tree block (or item) that failed.
        bytenr: u64,
        /// What was wrong with it.
        reason: String,
    },
    /// File data whose checksum does not match its EXTENT_CSUM item in the csum tree.
    /// EIO, as the kernel.
    #[error("data checksum mismatch: inode {ino} (subvolume {subvol}) offset {offset} logical {logical}")]
    DataChecksum {
        /// The subvolume (tree id) of the file.
        subvol: u64,
        /// The file's inode number.
        ino: u64,
        /// File offset of the sector that failed.
        offset: u64,
        /// Its logical address.
        logical: u64,
    },
    /// An earlier failure aborted a transaction: no more writes until the filesystem is
    /// opened again, and what that transaction held is lost (the last commit is intact).
    /// EROFS, as the kernel after a transaction abort.
    #[error("the filesystem went read-only after an aborted transaction: {0}")]
    Aborted(String),
    /// Not enough free space for the operation, reserved before anything changes (nothing
    /// was changed). ENOSPC.
    #[error("no space left on device")]
    NoSpace,
    /// rmdir of a directory that has entries, a rename onto one, or deleting a subvolume
    /// that still holds other subvolumes. ENOTEMPTY.
    #[error("directory not empty")]
    NotEmpty,
    /// A name longer than 255 bytes (BTRFS_NAME_LEN). ENAMETOOLONG.
    #[error("name too long")]
    NameTooLong,
    /// A link beyond the 65535 an inode may have (BTRFS_LINK_MAX), or a name its
    /// INODE_REF / INODE_EXTREF items have no room left for (without the extended_iref
    /// feature, all its names in one directory share one INODE_REF). EMLINK.
    #[error("too many links")]
    TooManyLinks,
    /// A write, truncate or fallocate past the largest file size btrfs allows. EFBIG.
    #[error("file too large")]
    FileTooBig,
    /// A link, rename or copy_file_range between two subvolumes (each is its own inode
    /// number space, as a different device). EXDEV.
    #[error("cross-device link")]
    CrossDevice,
    /// fallocate of something that is neither a regular file nor a directory (a device,
    /// fifo, socket or symlink). ENODEV, as the kernel.
    #[error("operation not supported by this file type")]
    NoDevice,
    /// The image or device is held by someone else: another oleo writer, a mounted
    /// kernel btrfs, or a writer beside this read-only open (the message names who). Also
    /// deleting the default subvolume or the one opened, and a rename of "." or "..".
    /// EBUSY.
    #[error("{0}")]
    Busy(String),
    /// mkfs would destroy what the target holds (the message says what): set
    /// `MkfsOptions::force` to overwrite it. EEXIST.
    #[error("{0}")]
    WouldOverwrite(String),
    /// The image cannot be used at all (bad superblock, missing trees, a device smaller
    /// than the superblock says, ...). EIO.
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
    /// A [`Error::Corrupt`] for the block (or item) at logical `bytenr`.
    pub fn corrupt(bytenr: u64, reason: impl Into<String>) -> Self {
        Error::Corrupt {
            bytenr,
            reason: reason.into(),
        }
    }

    /// The errno a POSIX caller should see: what the FUSE server replies with, and the
    /// kernel's choice for the same failure.
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
