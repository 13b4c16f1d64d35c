//! Space: what a transaction allocates and frees, and the trees that record it (part of
//! the transaction layer; see `transaction`'s doc for why).
//!
//! - `block_group`: block groups in memory (allocation cursors, pinned and reserved
//!   bytes) and their BLOCK_GROUP_ITEMs.
//! - `chunk_alloc`: new chunks and their device extents when block groups run out.
//! - `free_space`: the free space tree.
//! - `delayed_ref`: reference changes queued during T; `extent_tree` applies them to
//!   EXTENT_ITEMs at commit; `backref` moves back references when shared blocks are copied.
//! - `reservation`: what an operation reserves before it changes anything (ENOSPC is
//!   decided there, never half-way), and when a commit must free space first.
//! - `statfs`: the numbers df shows.

pub(crate) mod backref;
pub mod block_group;
pub(crate) mod chunk_alloc;
pub(crate) mod delayed_ref;
pub mod extent_tree;
pub mod free_space;
pub(crate) mod reservation;
pub(crate) mod statfs;
