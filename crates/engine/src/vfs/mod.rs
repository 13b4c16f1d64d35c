//! Layer 6, the operations a program asks of a filesystem (the kernel's inode_operations,
//! file_operations and ioctls): create, link, unlink, rename, setattr, truncate,
//! fallocate, copy_file_range, xattrs, flags, and closing files. Each runs in the running
//! transaction and uses the layers below: names and inode items (`inode`), file data
//! (`data`), space and the transaction.
//!
//! - `inode_ops`: the namespace: create (every file type), link, unlink, rename.
//! - `setattr`: mode, owner, size and times; setting and removing xattrs.
//! - `file_ops`: one-step writes, fallocate, copy_file_range.
//! - `fileattr`: inode flags (chattr/lsattr, FS_IOC_FSGETXATTR/FSSETXATTR).
//! - `orphan`: files unlinked while open, deleted at the last close or the next mount;
//!   closing the filesystem.

pub(crate) mod file_ops;
pub mod fileattr;
pub mod inode_ops;
pub(crate) mod orphan;
pub(crate) mod reflink;
pub(crate) mod setattr;
