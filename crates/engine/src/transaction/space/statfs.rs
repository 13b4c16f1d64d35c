//! statfs: the device's blocks, what no block group uses, and what new file data can
//! still get, from the block groups as reads see them now.

use crate::error::Result;
use crate::transaction::fs::{FsCore, StatFs};
use oleo_format::items::block_group as bg;
use oleo_format::items::BlockGroupItem;
use oleo_format::key::{item, objectid, Key};
use oleo_format::superblock::compat_ro;

/// Copies of each byte a block group of these flags keeps on one device.
fn copies(flags: u64) -> u64 {
    match flags & bg::PROFILE_MASK {
        bg::DUP | bg::RAID1 | bg::RAID10 => 2,
        bg::RAID1C3 => 3,
        bg::RAID1C4 => 4,
        _ => 1,
    }
}

impl FsCore {
    /// (flags, length, used) of every block group as reads see them now.
    fn block_group_usage(&self) -> Result<Vec<(u64, u64, u64)>> {
        if let Some(t) = &self.running {
            return Ok(t.block_groups.summary().collect());
        }
        Ok(self
            .committed_block_groups()?
            .into_iter()
            .map(|(_, f, l, u)| (f, l, u))
            .collect())
    }

    /// (start, flags, length, used) of every block group as last committed.
    pub(crate) fn committed_block_groups(&self) -> Result<Vec<(u64, u64, u64, u64)>> {
        let tree = if self.sb.has_compat_ro(compat_ro::BLOCK_GROUP_TREE) {
            objectid::BLOCK_GROUP_TREE
        } else {
            objectid::EXTENT_TREE
        };
        let Some((root, _)) = self.read_root_item(tree)? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for (&start, chunk) in self.io.chunks().chunks() {
            let key = Key::new(start, item::BLOCK_GROUP_ITEM, chunk.length);
            let used = match crate::ctree::lookup(self, &root, &key)? {
                Some(body) => BlockGroupItem::parse(&body).map_or(0, |b| b.used),
                None => 0,
            };
            out.push((start, chunk.chunk_type, chunk.length, used));
        }
        Ok(out)
    }

    /// Bytes new file data can still get (statfs's available space).
    pub(crate) fn data_available(&self) -> Result<u64> {
        let s = self.statfs()?;
        Ok(s.blocks_avail * u64::from(s.block_size))
    }

    /// statfs as the kernel's btrfs computes it in spirit: blocks is the device, free is
    /// what is not used by any block group (counting every copy), available is what new
    /// file data can still get (free data block group space plus unallocated space).
    pub(crate) fn statfs(&self) -> Result<StatFs> {
        let bs = u64::from(self.sb.sectorsize);
        let groups = self.block_group_usage()?;
        let total = self.sb.total_bytes;
        let used_raw: u64 = groups.iter().map(|&(f, _, u)| u * copies(f)).sum();
        let allocated_raw: u64 = groups.iter().map(|&(f, l, _)| l * copies(f)).sum();
        let data: Vec<_> = groups.iter().filter(|g| g.0 & bg::DATA != 0).collect();
        let data_copies = data.first().map_or(1, |g| copies(g.0));
        let data_free: u64 = data.iter().map(|&&(_, l, u)| l.saturating_sub(u)).sum();
        let unallocated = total.saturating_sub(allocated_raw);
        let avail = data_free + unallocated / data_copies;
        let free = total.saturating_sub(used_raw).min(total);
        Ok(StatFs {
            block_size: bs as u32,
            blocks: total / bs,
            blocks_free: free / bs,
            blocks_avail: (avail / bs).min(free / bs),
            files: 0,
            files_free: 0,
            name_max: 255,
        })
    }
}
