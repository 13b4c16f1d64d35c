//! Layer 4, inodes and names: inode items, directories, xattrs, ACLs, flags, properties,
//! orphans and the POSIX namespace operations (create, link, unlink, rename, setattr).
//! Uses the transaction layer below; knows nothing of file data beyond inline extents and
//! dropping extents on truncate, which it asks of the transaction's trees directly.
//!
//! - `inode`: reading inodes and looking up names (the kernel's inode.c read side).
//! - `inode_item`: writing INODE_ITEMs, times, sizes.
//! - `inode_ops`: the POSIX operations on the running transaction.
//! - `dir`, `dir_item`: reading and writing directory entries.
//! - `xattr`, `acl`, `props`: extended attributes, POSIX ACLs, btrfs properties.
//! - `fileattr`: inode flags (chattr/lsattr, FS_IOC_FSSETXATTR).
//! - `orphan`: files unlinked while open, removed at the last close or the next mount.
//! - `inode_lock`: one file's writers, taken before the filesystem lock.

pub(crate) mod acl;
pub(crate) mod dir;
pub(crate) mod dir_item;
pub mod fileattr;
#[allow(clippy::module_inception)] // the kernel's file name
pub(crate) mod inode;
pub(crate) mod inode_item;
pub(crate) mod inode_lock;
pub mod inode_ops;
pub(crate) mod orphan;
pub mod props;
pub(crate) mod xattr;
