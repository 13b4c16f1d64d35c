//! Layer 3, the transaction: the open filesystem's state (`fs`, the kernel's fs_info),
//! the running transaction that every change joins (`transaction`), and how its blocks,
//! log blocks and superblocks reach the disk in order (`commit_pipe`, `log_sync`). Uses
//! `ctree` (it is the B-tree's `BlockStore`) and `io`.
//!
//! - `fs`: `FsCore`, opening a filesystem (open_ctree), its caches, the public value types.
//! - `options`: mount options (`OpenOptions`, `compress=`).
//! - `transaction`: joining, closing and committing T; the bookkeeping fixpoint.
//! - `commit_pipe`: a closed commit's writes, off every filesystem lock, in order.
//! - `file_item`: data checksums in the csum tree: added as data is written, deleted
//!   when space frees an extent.
//! - `delayed_inode`: inode and DIR_INDEX items kept out of their trees until a commit.
//! - `root_tree`: which tree holds a subvolume, and the refs linking subvolumes.
//! - `changes`: what each edit touched, for the log tree's fsync decisions.
//! - `log_store`, `log_sync`: where log tree blocks live and how a log sync writes them
//!   and superblock copy 0 (every superblock write is this layer's, so commits and log
//!   syncs are ordered in one place).
//! - `space/`: the space a transaction accounts for.
//!
//! ## Why space is inside this layer
//! Space and the transaction call each other, as in the kernel: copying a tree block in
//! T allocates from a block group (`space::block_group`), and closing T settles what it
//! allocated and freed (`space::extent_tree` runs the delayed refs, `block_group` and
//! `free_space` write their items) by editing trees, which copies more blocks. The commit
//! runs that to a fixpoint. The space modules are methods on the running `Transaction`;
//! nothing outside this layer reaches into them except through `Transaction`.

pub(crate) mod changes;
pub mod commit_pipe;
pub(crate) mod delayed_inode;
pub(crate) mod file_item;
pub mod fs;
pub(crate) mod log_store;
pub(crate) mod log_sync;
pub(crate) mod name_sets;
pub mod options;
pub(crate) mod root_tree;
pub mod space;
#[allow(clippy::module_inception)] // the kernel's file name
pub mod transaction;

pub use transaction::{Transaction, TxnState};
