//! Layer 4, inodes and names: inode items, directory entries, xattrs, ACLs and
//! properties, read and written in the running transaction. Uses the transaction layer;
//! knows nothing of file data (the data layer above updates inode items as it writes).
//!
//! - `inode`: reading inodes and looking up names (the kernel's inode.c read side), and
//!   whether a subvolume takes writes.
//! - `inode_item`: writing INODE_ITEMs, times, sizes.
//! - `dir`, `dir_item`: reading and writing directory entries.
//! - `xattr`, `acl`, `props`: extended attributes, POSIX ACLs, btrfs properties.
//! - `inode_lock`: one file's writers, taken before the filesystem lock.

pub(crate) mod acl;
pub(crate) mod dir;
pub(crate) mod dir_item;
#[allow(clippy::module_inception)] // the kernel's file name
pub(crate) mod inode;
pub(crate) mod inode_item;
pub(crate) mod inode_lock;
pub mod props;
pub(crate) mod xattr;
