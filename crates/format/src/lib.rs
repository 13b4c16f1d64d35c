//! btrfs on-disk format: facts only.
//!
//! Bytes <-> typed values for the superblock, tree blocks, keys and items; checksums;
//! compression framing; and validation of a block before anyone trusts it. No IO, no locks,
//! no global state: every function here is safe to call on hostile bytes and returns an
//! error instead of panicking.

pub mod bytes;
pub mod compression;
pub mod csum;
pub mod error;
pub mod items;
pub mod key;
pub mod leaf_builder;
pub mod superblock;
pub mod tree_block;
pub mod tree_mut;
pub mod validate;

#[cfg(test)]
mod serialize_tests;

pub use csum::CsumType;
pub use error::{FormatError, Result};
pub use key::Key;
pub use leaf_builder::{LeafBuilder, NodeBuilder};
pub use superblock::Superblock;
pub use tree_block::{Header, TreeBlock};
