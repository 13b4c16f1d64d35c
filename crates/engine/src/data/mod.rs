//! Layer 5, file data: reading and writing file contents. Uses the inode layer (a write
//! updates the inode item) and the transaction layer (extents, checksums, space).
//!
//! - `file`: EXTENT_DATA items read back as mappings; SEEK_DATA/SEEK_HOLE; FIEMAP.
//! - `file_read`: reads, with checksums verified and compressed extents decompressed, off
//!   the filesystem lock.
//! - `file_write`: extents and checksums of new data, truncation, hole punching, clones.
//! - `ordered_extent`: a write's data IO done outside the filesystem lock, then its
//!   extents inserted (the kernel's ordered extents).
//! - `nocow`: writes in place into NOCOW files and preallocated extents.
//! - `prealloc_fill`: filling preallocated ranges in place.
//! - `compression`: which writes are compressed, and compressing them on all cores.
//! - `reflink`: clones across subvolumes, compressed extents written as they come.
//! - `extent_users`: the file ranges that reference a data extent (its backrefs).

pub mod compression;
pub(crate) mod encoded;
pub(crate) mod extent_users;
pub(crate) mod file;
pub(crate) mod file_read;
pub(crate) mod file_write;
pub(crate) mod nocow;
pub(crate) mod ordered_extent;
pub(crate) mod prealloc_fill;
