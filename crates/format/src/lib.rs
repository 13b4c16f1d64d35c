//! btrfs on-disk format: facts only.
//!
//! Bytes <-> typed values for the superblock, tree blocks, keys and items; checksums;
//! compression framing; and validation of a block before anyone trusts it. No IO, no locks,
//! no global state: every function here is safe to call on hostile bytes and returns an
//! error instead of panicking.
//!
//! The layout follows the kernel's `fs/btrfs` and btrfs-progs: all integers little-endian,
//! all structures packed. Where this crate says "logical" it means a btrfs virtual address
//! (what trees store, mapped to devices through the chunk tree); "physical" is a byte offset
//! on a device. A reader starts from a [`Superblock`] (at [`superblock::mirror_offset`]),
//! maps the SYSTEM chunks it embeds ([`Superblock::sys_chunks`]) to find the chunk tree, and
//! reads every other tree through [`TreeBlock`] views that [`validate::check_tree_block`]
//! has accepted. Writers build blocks with [`LeafBuilder`] / [`NodeBuilder`] or edit them in
//! place with [`tree_mut`].
//!
//! # Modules
//!
//! - [`superblock`]: the 4 KiB superblock, its mirrors and feature bits.
//! - [`tree_block`], [`tree_mut`], [`leaf_builder`]: tree block headers, read-only views,
//!   in-place editing and building from scratch.
//! - [`key`]: keys, item types and well-known object ids.
//! - [`items`]: the bodies of the items the trees hold.
//! - [`csum`]: block and data checksums, name and back reference hashes.
//! - [`compression`]: zlib, LZO and zstd as btrfs frames them.
//! - [`validate`]: the tree checker.
//! - [`raid56`]: RAID5/RAID6 parity (P and Q) and rebuilding lost stripes of a row.
//! - [`bytes`]: bounds-checked little-endian field reads.
//!
//! # Example: read a superblock
//!
//! The primary copy sits 64 KiB into the device; [`Superblock::parse`] checks its magic,
//! checksum and field sanity before returning it.
//!
//! ```no_run
//! use std::io::{Read, Seek, SeekFrom};
//! use oleo_format::superblock::{mirror_offset, SUPER_INFO_SIZE};
//! use oleo_format::Superblock;
//!
//! let mut dev = std::fs::File::open("btrfs.img")?;
//! let mut buf = vec![0u8; SUPER_INFO_SIZE];
//! dev.seek(SeekFrom::Start(mirror_offset(0)))?;
//! dev.read_exact(&mut buf)?;
//! let sb = Superblock::parse(&buf)?;
//! println!(
//!     "generation {}, nodesize {}, root tree at logical {}",
//!     sb.generation, sb.nodesize, sb.root
//! );
//! for (logical, chunk) in sb.sys_chunks()? {
//!     println!("SYSTEM chunk {logical}+{} on devid {}", chunk.length, chunk.stripes[0].devid);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Example: build, check and walk a leaf
//!
//! ```
//! use oleo_format::items::InodeItem;
//! use oleo_format::key::{item, Key};
//! use oleo_format::validate::{check_tree_block, Expect, FsContext};
//! use oleo_format::{CsumType, Header, LeafBuilder, TreeBlock};
//!
//! // A leaf of the top-level subvolume (tree 5) holding the root directory's inode.
//! let fsid = [7u8; 16];
//! let inode = InodeItem {
//!     generation: 1,
//!     transid: 1,
//!     nlink: 1,
//!     mode: 0o040755,
//!     ..Default::default()
//! };
//! let mut leaf = LeafBuilder::new(16384)?;
//! leaf.push(Key::new(256, item::INODE_ITEM, 0), &inode.to_bytes())?;
//! let header = Header {
//!     csum: [0; 32],
//!     fsid,
//!     bytenr: 30 << 20,
//!     flags: Header::new_block_flags(),
//!     chunk_tree_uuid: [9; 16],
//!     generation: 1,
//!     owner: 5,
//!     nritems: 0,
//!     level: 0,
//! };
//! let bytes = leaf.finish(&header, CsumType::Crc32c)?;
//!
//! // What a reader does with a block it fetched from logical address 30 MiB.
//! let ctx = FsContext {
//!     nodesize: 16384,
//!     sectorsize: 4096,
//!     csum_type: CsumType::Crc32c,
//!     metadata_fsid: fsid,
//!     super_generation: 1,
//! };
//! check_tree_block(&bytes, &ctx, &Expect { bytenr: 30 << 20, ..Default::default() })?;
//! let block = TreeBlock::new(&bytes)?;
//! assert!(block.is_leaf());
//! for slot in 0..block.nritems() {
//!     let key = block.item_key(slot)?;
//!     if key.item_type == item::INODE_ITEM {
//!         let inode = InodeItem::parse(block.item_data(slot)?)?;
//!         assert_eq!(inode.mode, 0o040755);
//!     }
//! }
//! # Ok::<(), oleo_format::FormatError>(())
//! ```

#![deny(missing_docs)]

pub mod bytes;
pub mod compression;
pub mod csum;
pub mod error;
pub mod items;
pub mod key;
pub mod leaf_builder;
pub mod raid56;
pub mod send_stream;
pub mod superblock;
pub mod tree_block;
pub mod tree_mut;
pub mod validate;

#[cfg(test)]
mod serialize_tests;

pub(crate) use error::invalid;

pub use csum::CsumType;
pub use error::{FormatError, Result};
pub use key::Key;
pub use leaf_builder::{LeafBuilder, NodeBuilder};
pub use superblock::Superblock;
pub use tree_block::{Header, TreeBlock};
