//! oleo: btrfs in userspace.
//!
//! Open a btrfs image or block device with [`Filesystem::open`] and read and write it in
//! the real on-disk format, without the kernel driver.
//!
//! The engine is built in layers, each a folder that uses only the ones below it. A write
//! goes down the list; nothing calls back up:
//!
//! | layer | what it does |
//! |---|---|
//! | `filesystem/` | the public handle: locks, then calls down |
//! | `subvolume/`, `tree_log/` | snapshots and subvolumes; fsync's log tree and its replay |
//! | `mkfs/` | new filesystems |
//! | `data/` | file contents: reads, writes, NOCOW, compression |
//! | `inode/` | inodes, names, xattrs, ACLs, flags: the POSIX operations |
//! | `transaction/` | the open filesystem (fs_info), the running transaction, commits, space |
//! | `ctree/` | the copy-on-write B-tree over a block source and store |
//! | `io/` | the device, its claim, the chunk map, verified block reads |
//!
//! Base modules any layer may use: `error`, `sync` (std or the model checker's
//! primitives) and `blocking` (tells the embedding program a thread will wait).
//! Module and file names follow the kernel's fs/btrfs, so a btrfs developer finds each
//! concept in the file named after it. docs/architecture.md draws the layers and the data
//! paths.

#![warn(missing_docs)]

pub mod blocking;
pub mod error;
pub(crate) mod sync;

pub mod io;

pub mod ctree;

pub mod transaction;

pub mod inode;

pub mod data;

pub mod vfs;

pub mod mkfs;
pub(crate) mod subvolume;
pub(crate) mod tree_log;

pub mod filesystem;

pub use ctree::TreeRoot;
pub use data::file::ExtentInfo;
pub use error::{Error, Result};
pub use filesystem::Filesystem;
pub use inode::inode_item::now;
pub use io::device;
pub use oleo_format as format;
pub use transaction::fs::{Attr, DirEntry, FileKind, InodeId, StatFs, SubvolumeInfo, Timespec};
pub use transaction::options::{Compress, OpenOptions};
pub use transaction::Transaction;
pub use vfs::inode_ops::{FallocMode, NewInode, RenameFlags, SetAttr, XattrSet};

/// Compression settings: the mount option and the property (kept at this path for
/// programs written against it).
pub mod compression {
    pub use crate::inode::props::PROPERTY;
    pub use crate::transaction::options::Compress;
}
pub use vfs::fileattr;
