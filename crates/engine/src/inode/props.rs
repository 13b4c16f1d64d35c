//! Properties (the kernel's props.c): `btrfs property set PATH compression` stores an
//! xattr and sets the inode flags it implies.

use crate::error::{Error, Result};
use oleo_format::items::{
    Compression, INODE_FLAG_COMPRESS, INODE_FLAG_NOCOMPRESS, INODE_FLAG_NODATACOW,
    INODE_FLAG_NODATASUM,
};
use oleo_format::superblock::incompat;

/// The property `btrfs property set PATH compression` stores (an xattr).
pub const PROPERTY: &[u8] = b"btrfs.compression";

/// The algorithm a property value names (the kernel matches by prefix); None for `no`,
/// `none` and anything else.
pub fn property_type(value: &[u8]) -> Option<Compression> {
    [
        (&b"zlib"[..], Compression::Zlib),
        (b"lzo", Compression::Lzo),
        (b"zstd", Compression::Zstd),
    ]
    .into_iter()
    .find(|(p, _)| value.starts_with(p))
    .map(|(_, k)| k)
}

/// The kernel's prop_compression_validate: a type, `no`, `none`, or empty (removal), and
/// only on an inode that keeps checksums and COW.
pub(crate) fn validate_property(flags: u64, value: &[u8]) -> Result<()> {
    if flags & (INODE_FLAG_NODATACOW | INODE_FLAG_NODATASUM) != 0 {
        return Err(Error::InvalidArgument(
            "compression on a nodatacow or nodatasum inode".into(),
        ));
    }
    if value.is_empty() || value == b"no" || value == b"none" || property_type(value).is_some() {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "invalid compression property '{}'",
            String::from_utf8_lossy(value)
        )))
    }
}

/// The kernel's prop_compression_apply: the inode flags a property value (None: removed)
/// gives, and the incompat bit its algorithm needs.
pub(crate) fn apply_property(flags: u64, value: Option<&[u8]>) -> (u64, u64) {
    let cleared = flags & !(INODE_FLAG_COMPRESS | INODE_FLAG_NOCOMPRESS);
    match value {
        None | Some(b"") => (cleared, 0),
        Some(v) => match property_type(v) {
            Some(k) => (cleared | INODE_FLAG_COMPRESS, incompat_bit(k)),
            None => (cleared | INODE_FLAG_NOCOMPRESS, 0),
        },
    }
}

/// The incompat bit extents of `kind` need (zlib none).
pub(crate) fn incompat_bit(kind: Compression) -> u64 {
    match kind {
        Compression::Lzo => incompat::COMPRESS_LZO,
        Compression::Zstd => incompat::COMPRESS_ZSTD,
        _ => 0,
    }
}
