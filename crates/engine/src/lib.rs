//! oleo: btrfs in userspace.
//!
//! Open a btrfs image or block device with [`Filesystem::open`] and read and write it in
//! the real on-disk format, without the kernel driver.
//!
//! The public API is the handle, [`Filesystem`], with the plain types it takes and hands
//! out ([`InodeId`], [`Attr`], [`DirEntry`], [`NewInode`], [`SetAttr`], [`Error`], ...);
//! [`mkfs`] makes new filesystems, and [`format`](mod@format) is the on-disk format itself
//! (oleo-format). Names are bytes (`&[u8]`), as btrfs stores them.
//!
//! # Reading an image
//!
//! A read-only open replays a pending log tree in memory only and never writes to the
//! image. List the root directory of the default subvolume and read a file:
//!
//! ```no_run
//! use oleo::{Filesystem, OpenOptions};
//!
//! let fs = Filesystem::open("disk.img", OpenOptions::default())?;
//! let root = fs.root();
//! fs.readdir(root, 0, &mut |entry| {
//!     println!("{:?} {}", entry.kind, String::from_utf8_lossy(&entry.name));
//!     true // false stops the listing
//! })?;
//! let file = fs.resolve_path(root, b"docs/numbers.txt")?;
//! let size = fs.getattr(file)?.size;
//! let bytes = fs.read(file, 0, size.min(1 << 20) as u32)?;
//! println!("{}", String::from_utf8_lossy(&bytes));
//! # Ok::<(), oleo::Error>(())
//! ```
//!
//! # Making and writing a filesystem
//!
//! [`mkfs::mkfs`] writes a new filesystem as `mkfs.btrfs` would; [`Filesystem::open_rw`]
//! opens it for writing (one writer per image). Changes join the running transaction;
//! [`Filesystem::close`] commits it and reports whether that worked:
//!
//! ```
//! use oleo::mkfs::{mkfs, MkfsOptions};
//! use oleo::{Filesystem, NewInode, OpenOptions};
//!
//! // A sparse 256 MiB image file: only what mkfs and the writes touch takes space.
//! let image = std::env::temp_dir().join(format!("oleo-doc-{}.img", std::process::id()));
//! let _ = std::fs::remove_file(&image);
//! mkfs(&image, &MkfsOptions { size: Some(256 << 20), ..Default::default() })?;
//!
//! let fs = Filesystem::open_rw(&image, OpenOptions::default())?;
//! let file = fs.mknod(fs.root(), b"hello.txt", &NewInode::file(0o644).owner(1000, 1000))?;
//! fs.write(file.id, 0, b"hello, btrfs\n")?;
//! fs.close()?;
//!
//! let fs = Filesystem::open(&image, OpenOptions::default())?;
//! let id = fs.lookup(fs.root(), b"hello.txt")?;
//! assert_eq!(fs.read(id, 0, 4096)?, b"hello, btrfs\n");
//! assert_eq!(fs.getattr(id)?.uid, 1000);
//! drop(fs);
//! std::fs::remove_file(&image)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Inside
//!
//! The engine is built in layers, each a folder that uses only the ones below it. A write
//! goes down the list; nothing calls back up:
//!
//! | layer | what it does |
//! |---|---|
//! | `mkfs/` | new filesystems (`--rootdir` fills one through the handle) |
//! | `filesystem/` | the public handle: a mount's steps, the locks, then calls down |
//! | `subvolume/`, `tree_log/` | snapshots and subvolumes; fsync's log tree and its replay |
//! | `rescue/` | `oleo restore`: files copied out of an image that will not mount |
//! | `vfs/` | the POSIX operations: create, link, rename, setattr, fallocate, flags, orphans |
//! | `data/` | file contents: reads, writes, NOCOW, compression |
//! | `inode/` | inode items, directory entries, xattrs, ACLs, properties |
//! | `transaction/` | the open filesystem (fs_info), the running transaction, commits, space |
//! | `ctree/` | the copy-on-write B-tree over a block source and store |
//! | `io/` | the device, its claim, the chunk map, verified block reads |
//!
//! `scripts/layers.py` checks that no import or method call goes up a layer.
//!
//! Base modules any layer may use: `error`, `sync` (std or the model checker's
//! primitives) and `blocking` (tells the embedding program a thread will wait).
//! Module and file names follow the kernel's fs/btrfs, so a btrfs developer finds each
//! concept in the file named after it. docs/architecture.md draws the layers and the data
//! paths.

#![deny(missing_docs)]

pub mod blocking;
pub(crate) mod error;
pub(crate) mod sync;

pub(crate) mod io;

pub(crate) mod ctree;

pub(crate) mod transaction;

pub(crate) mod inode;

pub(crate) mod data;

pub(crate) mod vfs;

pub mod mkfs;
pub mod rescue;
pub(crate) mod scrub;
pub(crate) mod subvolume;
pub(crate) mod tree_log;

pub(crate) mod filesystem;

pub use ctree::TreeRoot;
pub use data::file::ExtentInfo;
pub use error::{Error, Result};
pub use filesystem::{ChunkInfo, DeviceInfo, Filesystem};
pub use inode::inode_item::now;
pub use inode::xattr::XattrSet;
pub use io::device;
pub use io::rescue::{Rescue, SkipLog};
pub use oleo_format as format;
pub use scrub::{ScrubOptions, ScrubProgress};
pub use transaction::fs::{Attr, DirEntry, FileKind, InodeId, StatFs, SubvolumeInfo, Timespec};
pub use transaction::options::{Compress, OpenOptions};
pub use transaction::Transaction;
pub use vfs::file_ops::FallocMode;
pub use vfs::inode_ops::{NewInode, RenameFlags};
pub use vfs::setattr::{AtimeRule, SetAttr};

/// Compression settings: the mount option and the property (kept at this path for
/// programs written against it).
pub mod compression {
    pub use crate::inode::props::PROPERTY;
    pub use crate::transaction::options::Compress;
}
pub use vfs::fileattr;
