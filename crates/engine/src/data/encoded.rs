//! An encoded write: a compressed extent stored as it comes (a received ENCODED_WRITE, the
//! kernel's BTRFS_IOC_ENCODED_WRITE). The checks that come first, and the reflink that may
//! cross subvolumes, are in vfs/reflink.rs.

use crate::error::Result;
use crate::inode::inode_item::now;
use crate::transaction::fs::InodeId;
use crate::transaction::space::delayed_ref::DataRef;
use crate::transaction::Transaction;
use oleo_format::items::{block_group as bg, Compression};
use oleo_format::key::{item, Key};

/// The most compressed bytes one extent holds (BTRFS_MAX_COMPRESSED).
pub const MAX_COMPRESSED: u64 = 128 * 1024;

/// A compressed extent to store as it is: `len` file bytes at file `offset`, which are
/// bytes `[unencoded_offset, unencoded_offset + len)` of what `data` decompresses to
/// (`unencoded_len` bytes).
#[derive(Clone, Copy, Debug)]
pub struct Encoded<'a> {
    pub offset: u64,
    pub len: u64,
    pub unencoded_len: u64,
    pub unencoded_offset: u64,
    pub compression: Compression,
    pub data: &'a [u8],
}

impl Transaction<'_> {
    pub(crate) fn write_encoded(
        &mut self,
        id: InodeId,
        e: &Encoded<'_>,
        disk_len: u64,
    ) -> Result<()> {
        let sector = self.sector();
        // Space first: failing for want of it must leave the file untouched.
        let bytenr = self
            .block_groups
            .alloc_aligned(bg::DATA, disk_len, sector)?;
        self.spend_data(disk_len);
        let mut disk = e.data.to_vec();
        disk.resize(disk_len as usize, 0);
        self.filesystem().io.write_logical(bytenr, &disk)?;
        self.insert_csums(bytenr, &disk)?;
        let mut inode = self.read_inode(id)?;
        let old = inode.size;
        let end = e.offset + e.len;
        let num_bytes = e.len.next_multiple_of(sector);
        if end > old || self.inline_extent(id)? {
            self.prepare_extend(id, &mut inode, old, e.offset)?;
        }
        let dropped = self.drop_extents(id, e.offset, e.offset + num_bytes)?;
        inode.nbytes = inode.nbytes.saturating_sub(dropped);
        let hole_from = old.next_multiple_of(sector);
        if hole_from < e.offset {
            let h = self.insert_hole(id, hole_from, e.offset)?;
            inode.nbytes = inode.nbytes.saturating_sub(h);
        }
        let body = super::file_write::extent_item(
            self.transid,
            e.unencoded_len.next_multiple_of(sector),
            e.compression,
            false,
            bytenr,
            disk_len,
            e.unencoded_offset,
            num_bytes,
        );
        self.insert_item(
            id.subvol,
            Key::new(id.ino, item::EXTENT_DATA, e.offset),
            &body,
        )?;
        self.incompat_needed |= crate::inode::props::incompat_bit(e.compression);
        self.add_data_ref(
            bytenr,
            disk_len,
            DataRef {
                root: id.subvol,
                objectid: id.ino,
                offset: e.offset.wrapping_sub(e.unencoded_offset),
            },
        )?;
        inode.nbytes = inode.nbytes.saturating_add(num_bytes);
        inode.size = old.max(end);
        let t = now();
        inode.mtime = t;
        inode.ctime = t;
        self.write_inode(id, &mut inode)
    }
}
