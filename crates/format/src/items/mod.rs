//! Item bodies: one module per family, each a parse from bytes into a typed value.

mod dir;
mod extent;
mod file_extent;
mod inode;
mod root;
mod volumes;

pub use dir::{DirEntryItem, DirEntryIter, FileType};
pub use extent::{ExtentItem, InlineRef, EXTENT_FLAG_DATA, EXTENT_FLAG_TREE_BLOCK};
pub use file_extent::{Compression, FileExtent, FileExtentBody, FILE_EXTENT_INLINE_HEADER};
pub use inode::{
    InodeExtref, InodeItem, InodeRef, Timespec, INODE_FLAGS_KNOWN, INODE_FLAG_NODATACOW,
    INODE_FLAG_NODATASUM,
};
pub use root::{RootItem, RootRef, ROOT_SUBVOL_RDONLY};
pub use volumes::{
    block_group, BlockGroupItem, ChunkItem, DevExtent, DevItem, FreeSpaceInfo, Stripe,
};
