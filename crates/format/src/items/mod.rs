//! Item bodies: one module per family, each a parse from bytes into a typed value.

mod dir;
mod extent;
mod file_extent;
mod inode;
mod root;
mod uuid;
mod volumes;

pub use dir::{DirEntryItem, DirEntryIter, FileType};
pub use extent::{
    ExtentItem, InlineRef, EXTENT_FLAG_DATA, EXTENT_FLAG_FULL_BACKREF, EXTENT_FLAG_TREE_BLOCK,
};
pub use file_extent::{
    Compression, FileExtent, FileExtentBody, FILE_EXTENT_INLINE_HEADER, FILE_EXTENT_REG_SIZE,
};
pub use inode::*;
pub use root::{RootItem, RootRef, ROOT_ITEM_SIZE, ROOT_SUBVOL_RDONLY};
pub use uuid::{uuid_key, UuidItem};
pub use volumes::{
    block_group, BlockGroupItem, ChunkItem, DevExtent, DevItem, FreeSpaceInfo, Stripe,
    FREE_SPACE_USING_BITMAPS,
};

/// A name's length as the u16 every on-disk name length field is; longer names are an error.
pub(crate) fn name_len(name: &[u8]) -> crate::error::Result<u16> {
    match u16::try_from(name.len()) {
        Ok(n) => Ok(n),
        Err(_) => crate::invalid!("name of {} bytes is too long", name.len()),
    }
}
