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

    /// (total_bytes, bytes_used) of each present device, as reads see them now (a chunk
    /// made in the running transaction counts).
    fn device_space(&self) -> Vec<(u64, u64)> {
        let devices = self.io.devices();
        devices
            .members()
            .filter_map(|(devid, _)| {
                let pending = self
                    .running
                    .as_ref()
                    .and_then(|t| t.new_chunks.dev_item(devid).cloned());
                pending.or_else(|| devices.dev_item(devid))
            })
            .map(|d| (d.total_bytes, d.bytes_used))
            .collect()
    }

    /// The global block reserve's size (`reserve_of_trees`), kept while the root tree is
    /// the one it was read from (the ROOT_ITEMs it sums change only in a commit, which
    /// copies the root tree): the FUSE server's space guard asks for statfs after every
    /// write, and reading those items was two thirds of it.
    fn global_reserve(&self) -> Result<u64> {
        let root = self.root_tree();
        let key = (root.bytenr, root.generation);
        if let Some((b, g, v)) = *self.reserve_cache.lock() {
            if (b, g) == key {
                return Ok(v);
            }
        }
        let v = self.reserve_of_trees()?;
        *self.reserve_cache.lock() = Some((key.0, key.1, v));
        Ok(v)
    }

    /// The global block reserve's size, as btrfs_update_global_block_rsv sizes it: what
    /// the extent, checksum, free space (and block group) trees use, at least room for
    /// inserting one item into each of them and the root tree and an unlink's items with
    /// their delayed refs, at most 512 MiB.
    fn reserve_of_trees(&self) -> Result<u64> {
        let mut trees = vec![
            objectid::EXTENT_TREE,
            objectid::CSUM_TREE,
            objectid::FREE_SPACE_TREE,
        ];
        if self.sb.has_compat_ro(compat_ro::BLOCK_GROUP_TREE) {
            trees.push(objectid::BLOCK_GROUP_TREE);
        }
        let mut used = 0u64;
        // One for the root tree (checked against the kernel's "Global reserve").
        let mut items = 1u64;
        for id in trees {
            if let Some((_, ri)) = self.read_root_item(id)? {
                used = used.saturating_add(ri.bytes_used);
                items += 1;
            }
        }
        // btrfs_calc_insert_metadata_size: a path of BTRFS_MAX_LEVEL blocks, twice.
        let insert = |n: u64| u64::from(self.sb.nodesize) * MAX_LEVEL * 2 * n;
        let mut refs = insert(UNLINK_METADATA_UNITS);
        if self.sb.has_compat_ro(compat_ro::FREE_SPACE_TREE) {
            refs *= 2;
        }
        let least = insert(items + UNLINK_METADATA_UNITS) + refs;
        Ok(used.max(least).min(512 << 20))
    }

    /// statfs as the kernel's btrfs_statfs computes it: blocks is the device (divided by
    /// the data profile's copies); free is what no block group uses, less the global
    /// reserve; available is the free space of the data block groups plus the data chunks
    /// the unallocated space would still give (btrfs_calc_avail_data_space: the first MiB
    /// of each device is never allocated), and none once metadata can neither grow nor
    /// hold the global reserve.
    pub(crate) fn statfs(&self) -> Result<StatFs> {
        let bs = u64::from(self.sb.sectorsize);
        let groups = self.block_group_usage()?;
        let mixed = groups
            .iter()
            .any(|g| g.0 & bg::DATA != 0 && g.0 & bg::METADATA != 0);
        let mut used_raw = 0u64;
        let mut data_free_raw = 0u64;
        let mut meta_free_raw = 0u64;
        let mut data_profile = None;
        // Saturating: a damaged image may say anything.
        for &(f, l, u) in &groups {
            used_raw = used_raw.saturating_add(u.saturating_mul(copies(f)));
            let free = l.saturating_sub(u).saturating_mul(copies(f));
            if f & bg::DATA != 0 {
                data_free_raw = data_free_raw.saturating_add(free);
                data_profile = Some(f & bg::PROFILE_MASK);
            } else if f & bg::METADATA != 0 && !mixed {
                meta_free_raw = meta_free_raw.saturating_add(free);
            }
        }
        let data_profile = data_profile.unwrap_or(0);
        let factor = copies(data_profile);
        let devices = self.device_space();
        let blocks = self.sb.total_bytes / factor / bs;
        let reserve = self.global_reserve()?;
        let blocks_free = blocks
            .saturating_sub(used_raw / factor / bs)
            .saturating_sub(reserve / bs);
        // New chunks take the profile the writable devices allow (`reduce_profile`): on a
        // degraded RAID1 mount, SINGLE chunks on the devices present. Counted in RAID1
        // there, the unallocated space gave nothing, the FUSE space guard saw the disk
        // full once the data chunks filled, and writes failed with ENOSPC that the
        // allocator would have placed (mount_multi's degraded copy, 2 runs in 12).
        let grown = |profile: u64| {
            let p = super::chunk_alloc::reduce_profile(profile, devices.len());
            unallocated_for(p, &devices) / copies(p)
        };
        let mut avail = (data_free_raw / factor).saturating_add(grown(data_profile));
        // The kernel's guess at a metadata space that cannot take the reserve any more.
        let meta_profile = groups
            .iter()
            .find(|g| g.0 & bg::METADATA != 0)
            .map_or(0, |g| g.0 & bg::PROFILE_MASK);
        let meta_full = grown(meta_profile) == 0;
        if !mixed && meta_full && meta_free_raw.saturating_sub(4 << 20) < reserve {
            avail = 0;
        }
        Ok(StatFs {
            block_size: bs as u32,
            blocks,
            blocks_free,
            blocks_avail: avail / bs,
            files: 0,
            files_free: 0,
            name_max: 255,
        })
    }
}

/// BTRFS_MAX_LEVEL.
const MAX_LEVEL: u64 = 8;
/// BTRFS_UNLINK_METADATA_UNITS: the items an unlink changes.
const UNLINK_METADATA_UNITS: u64 = 6;
/// BTRFS_STRIPE_LEN.
const STRIPE_LEN: u64 = 64 << 10;
/// The first MiB of each device, never allocated.
const DEVICE_RESERVED: u64 = 1 << 20;

/// What chunks of `profile` the unallocated space of `devices` ((total, allocated) each)
/// would still hold, counting every copy, as btrfs_calc_avail_data_space estimates it:
/// each device's room past its first MiB, in stripes, filled smallest first across as many
/// devices as the profile stripes over.
fn unallocated_for(profile: u64, devices: &[(u64, u64)]) -> u64 {
    let (devs_min, stripes_per_dev) = match profile {
        bg::RAID1 | bg::RAID10 => (2, 1),
        bg::RAID1C3 => (3, 1),
        bg::RAID1C4 => (4, 1),
        bg::RAID5 => (2, 1),
        bg::RAID6 => (3, 1),
        bg::DUP => (1, 2),
        _ => (1, 1),
    };
    let mut num_stripes = match profile {
        bg::RAID0 => devices.len() as u64,
        bg::RAID1 => 2,
        bg::RAID1C3 => 3,
        bg::RAID1C4 => 4,
        bg::RAID10 => 4,
        _ => 1,
    };
    let min_stripe = stripes_per_dev * STRIPE_LEN;
    let mut room: Vec<u64> = devices
        .iter()
        .map(|&(total, used)| total.saturating_sub(used) / STRIPE_LEN * STRIPE_LEN)
        .filter(|&a| a > DEVICE_RESERVED + min_stripe)
        .map(|a| a - DEVICE_RESERVED)
        .collect();
    room.sort_unstable_by(|a, b| b.cmp(a));
    let mut n = room.len() as u64;
    let mut total = 0u64;
    while n >= devs_min && n > 0 {
        num_stripes = num_stripes.min(n);
        let i = (n - 1) as usize;
        if room[i] >= min_stripe {
            let take = room[i];
            total = total.saturating_add(take.saturating_mul(num_stripes));
            for r in &mut room[i + 1 - num_stripes as usize..=i] {
                *r -= take;
            }
        }
        n -= 1;
    }
    total
}
