//! EXTENT_DATA: how a file's byte range maps to inline bytes, a disk extent, or a hole.

use crate::bytes::{put_u16, put_u64, put_u8, slice, u16_at, u64_at, u8_at};
use crate::error::Result;
use crate::invalid;

/// Size of the header every file extent item starts with; inline data follows it.
pub const FILE_EXTENT_INLINE_HEADER: usize = 21;
/// Size of a REG or PREALLOC file extent item: the header and the disk extent fields.
pub const FILE_EXTENT_REG_SIZE: usize = 53;

/// How a file extent's data is compressed (the item's `compression` byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// 0: stored as is.
    None,
    /// 1: one zlib stream.
    Zlib,
    /// 2: LZO1X with btrfs's per-sector framing.
    Lzo,
    /// 3: one zstd frame.
    Zstd,
}

impl Compression {
    /// The algorithm of an on-disk compression byte; an error for unknown values.
    pub fn from_raw(v: u8) -> Result<Compression> {
        Ok(match v {
            0 => Compression::None,
            1 => Compression::Zlib,
            2 => Compression::Lzo,
            3 => Compression::Zstd,
            other => invalid!("unknown compression type {other}"),
        })
    }

    /// The on-disk compression byte.
    pub fn raw(self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Zlib => 1,
            Compression::Lzo => 2,
            Compression::Zstd => 3,
        }
    }

    /// The lowercase name: `none`, `zlib`, `lzo` or `zstd`.
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Zlib => "zlib",
            Compression::Lzo => "lzo",
            Compression::Zstd => "zstd",
        }
    }
}

/// Where a file extent item's bytes are: in the item, or in an extent on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileExtentBody<'a> {
    /// File bytes stored in the item (possibly compressed).
    Inline {
        /// The stored bytes (the compressed stream if the item is compressed).
        data: &'a [u8],
    },
    /// A slice `[offset, offset + num_bytes)` of the decoded disk extent; `disk_bytenr == 0`
    /// is a hole. `prealloc` ranges read as zeros.
    Extent {
        /// PREALLOC (type 2, space reserved by fallocate) rather than REG (type 1).
        prealloc: bool,
        /// Logical address of the disk extent; 0 for a hole.
        disk_bytenr: u64,
        /// On-disk length of the whole extent (its EXTENT_ITEM key offset).
        disk_num_bytes: u64,
        /// Where this file range starts in the decoded extent.
        offset: u64,
        /// Length of the file range this item covers.
        num_bytes: u64,
    },
}

/// An EXTENT_DATA item body (`btrfs_file_extent_item`), key `(inode, EXTENT_DATA, file
/// offset)`: maps the file bytes from the key offset on to inline bytes, a disk extent or a
/// hole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileExtent<'a> {
    /// Transaction id in which the extent was written.
    pub generation: u64,
    /// Size of the decoded (uncompressed) extent.
    pub ram_bytes: u64,
    /// How the stored bytes are compressed.
    pub compression: Compression,
    /// Inline bytes or disk extent.
    pub body: FileExtentBody<'a>,
}

impl<'a> FileExtent<'a> {
    /// Parses an item body. Encrypted or otherwise encoded extents are refused, as the kernel's
    /// tree checker does.
    pub fn parse(b: &'a [u8]) -> Result<FileExtent<'a>> {
        let generation = u64_at(b, 0)?;
        let ram_bytes = u64_at(b, 8)?;
        let compression = Compression::from_raw(u8_at(b, 16)?)?;
        if u8_at(b, 17)? != 0 || u16_at(b, 18)? != 0 {
            invalid!("file extent uses encryption or other encoding");
        }
        let body = match u8_at(b, 20)? {
            0 => FileExtentBody::Inline {
                data: &b[FILE_EXTENT_INLINE_HEADER..],
            },
            t @ (1 | 2) => {
                if b.len() != FILE_EXTENT_REG_SIZE {
                    invalid!(
                        "regular file extent item is {} bytes, expected {}",
                        b.len(),
                        FILE_EXTENT_REG_SIZE
                    );
                }
                FileExtentBody::Extent {
                    prealloc: t == 2,
                    disk_bytenr: u64_at(b, 21)?,
                    disk_num_bytes: u64_at(b, 29)?,
                    offset: u64_at(b, 37)?,
                    num_bytes: u64_at(b, 45)?,
                }
            }
            other => invalid!("unknown file extent type {other}"),
        };
        // Make sure the inline case really had its header.
        slice(b, 0, FILE_EXTENT_INLINE_HEADER)?;
        Ok(FileExtent {
            generation,
            ram_bytes,
            compression,
            body,
        })
    }

    /// Bytes of file this item covers, starting at its key offset.
    pub fn file_len(&self) -> u64 {
        match self.body {
            FileExtentBody::Inline { .. } => self.ram_bytes,
            FileExtentBody::Extent { num_bytes, .. } => num_bytes,
        }
    }

    /// Appends the item: 21-byte header, then inline data or the 32-byte extent part.
    pub fn write_into(&self, out: &mut Vec<u8>) {
        put_u64(out, self.generation);
        put_u64(out, self.ram_bytes);
        put_u8(out, self.compression.raw());
        put_u8(out, 0); // encryption
        put_u16(out, 0); // other_encoding
        match self.body {
            FileExtentBody::Inline { data } => {
                put_u8(out, 0);
                out.extend_from_slice(data);
            }
            FileExtentBody::Extent {
                prealloc,
                disk_bytenr,
                disk_num_bytes,
                offset,
                num_bytes,
            } => {
                put_u8(out, if prealloc { 2 } else { 1 });
                put_u64(out, disk_bytenr);
                put_u64(out, disk_num_bytes);
                put_u64(out, offset);
                put_u64(out, num_bytes);
            }
        }
    }

    /// The item body (see [`FileExtent::write_into`]).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_into(&mut out);
        out
    }
}
