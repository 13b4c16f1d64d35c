//! oleo: btrfs in userspace.
//!
//! Open a btrfs image or block device with [`Filesystem::open`] and read it without the
//! kernel driver. Modules follow the kernel's fs/btrfs naming: a btrfs developer should
//! find each concept in the file named after it.

mod acl;
mod backref;
pub mod block_group;
pub mod blocking;
mod chunk_alloc;
pub mod claim;
mod commit_pipe;
pub mod compression;
pub mod ctree;
mod delayed_inode;
mod delayed_ref;
pub mod device;
mod device_uring;
mod dir;
mod dir_item;
pub mod disk_io;
pub mod error;
pub mod extent_tree;
mod file;
mod file_item;
mod file_read;
mod file_write;
pub mod fileattr;
pub mod filesystem;
pub mod free_space;
pub mod fs;
mod inode;
mod inode_item;
mod inode_lock;
mod inode_ops;
mod inspect;
pub mod mkfs;
mod nocow;
mod ordered_extent;
mod orphan;
mod prealloc_fill;
mod reservation;
mod statfs;
mod subvolume;
mod sync;
pub mod transaction;
mod tree_log;
mod uuid_tree;
pub mod volumes;
mod xattr;

pub use ctree::TreeRoot;
pub use error::{Error, Result};
pub use file::ExtentInfo;
pub use filesystem::Filesystem;
pub use fs::{Attr, DirEntry, FileKind, InodeId, OpenOptions, StatFs, SubvolumeInfo, Timespec};
pub use inode_item::now;
pub use inode_ops::{FallocMode, NewInode, RenameFlags, SetAttr, XattrSet};
pub use oleo_format as format;
pub use transaction::Transaction;
