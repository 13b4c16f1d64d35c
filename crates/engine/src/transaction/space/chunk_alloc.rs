//! Chunk allocation: when the block groups of a type fill up, a transaction carves a new
//! chunk (a logical range mapped to device stripes) and its block group out of unallocated
//! device space. The kernel keeps this in volumes.c (`btrfs_create_chunk`: sizing, device
//! holes, CHUNK_ITEM / DEV_EXTENT / DEV_ITEM) and block-group.c (`btrfs_make_block_group`,
//! `btrfs_chunk_alloc`).
//!
//! Only what one device allows: SINGLE and DUP. Everything the new chunk needs goes into the
//! trees at once (chunk tree, dev tree, block group items, free space tree); the superblock
//! learns the rest (its copy of the DEV_ITEM, sys_chunk_array) at commit, through
//! `apply_to_superblock`.
//!
//! Not re-entrant: call it between B-tree operations, never from inside one.

use crate::error::{Error, Result};
use crate::transaction::fs::FsCore;
use crate::transaction::Transaction;
use oleo_format::items::{
    block_group as bg, BlockGroupItem, ChunkItem, DevExtent, DevItem, FreeSpaceInfo, Stripe,
};
use oleo_format::key::{item, objectid, Key, KEY_SIZE};
use oleo_format::superblock::{incompat, Superblock, SYS_CHUNK_ARRAY_MAX};
use std::ops::ControlFlow;

const SZ_16M: u64 = 16 << 20;
const SZ_32M: u64 = 32 << 20;
const SZ_256M: u64 = 256 << 20;
const SZ_1G: u64 = 1 << 30;
/// Every chunk's stripe length; stripe sizes are multiples of it.
const STRIPE_LEN: u64 = 64 * 1024;
/// The first MiB of a device is never allocated (boot loaders, primary superblock).
const DEVICE_RANGE_RESERVED: u64 = 1 << 20;
/// The kernel's data chunk limit (several stripes on several devices; one device: 1 GiB).
const MAX_DATA_CHUNK: u64 = 10 * SZ_1G;
/// Tree height bound the kernel sizes its reservations with (BTRFS_MAX_LEVEL).
const MAX_LEVEL: u64 = 8;

/// What the new superblock must reflect of the chunks made in this transaction.
#[derive(Default)]
pub(crate) struct PendingChunks {
    /// Each device's DEV_ITEM after them (its superblock embeds it).
    dev_items: std::collections::BTreeMap<u64, DevItem>,
    /// New SYSTEM chunks: the superblock's sys_chunk_array must map the chunk tree.
    sys_chunks: Vec<(u64, ChunkItem)>,
}

impl PendingChunks {
    /// Device `devid`'s DEV_ITEM as this transaction left it, if it changed it.
    pub(crate) fn dev_item(&self, devid: u64) -> Option<&DevItem> {
        self.dev_items.get(&devid)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.dev_items.is_empty() && self.sys_chunks.is_empty()
    }

    fn sys_array_bytes(&self) -> usize {
        self.sys_chunks
            .iter()
            .map(|(_, c)| KEY_SIZE + ChunkItem::size_for(c.stripes.len()))
            .sum()
    }
}

/// Brings the superblocks of this commit in line with the chunks created in it: `sb` (the
/// set's) and each device's embedded DEV_ITEM.
pub(crate) fn apply_to_superblock(
    p: &PendingChunks,
    sb: &mut Superblock,
    devices: &crate::io::devices::DeviceSet,
) -> Result<()> {
    for item in p.dev_items.values() {
        if item.devid == sb.dev_item.devid {
            sb.dev_item = item.clone();
        }
        devices.set_dev_item(item.clone());
    }
    if !p.sys_chunks.is_empty() {
        let bad = |e: oleo_format::FormatError| Error::corrupt(0, format!("sys_chunk_array: {e}"));
        let new = Superblock::encode_sys_chunks(&p.sys_chunks).map_err(bad)?;
        let mut array = sb.sys_chunk_array.clone();
        array.extend_from_slice(&new);
        if array.len() > SYS_CHUNK_ARRAY_MAX {
            return Err(Error::corrupt(0, "sys_chunk_array would overflow"));
        }
        sb.sys_chunk_array_size = array.len() as u32;
        sb.sys_chunk_array = array;
    }
    Ok(())
}

/// Tree space inserting `items` items may take at worst: a copied path with a split at
/// every level, per item (the kernel's btrfs_calc_insert_metadata_size).
fn insert_reserve(nodesize: u64, items: u64) -> u64 {
    nodesize * MAX_LEVEL * 2 * items
}

/// Where the new chunk goes.
#[derive(Debug, PartialEq, Eq)]
struct Plan {
    /// Type and profile bits.
    flags: u64,
    logical: u64,
    /// Bytes per stripe (the chunk's length is this times its data stripes).
    stripe_size: u64,
    /// Logical length: `stripe_size` times the data stripes.
    length: u64,
    /// Device and physical start of each stripe, in chunk order.
    stripes: Vec<(u64, u64)>,
}

/// What a profile asks of a new chunk (the kernel's btrfs_raid_array): stripes per device,
/// devices at least / at most (0: any) / in steps of, copies.
struct RaidAttr {
    dev_stripes: u64,
    devs_min: usize,
    devs_max: usize,
    devs_increment: usize,
    ncopies: u64,
    sub_stripes: u16,
}

fn raid_attr(profile: u64) -> RaidAttr {
    let a = |dev_stripes, devs_min, devs_max, devs_increment, ncopies, sub_stripes| RaidAttr {
        dev_stripes,
        devs_min,
        devs_max,
        devs_increment,
        ncopies,
        sub_stripes,
    };
    match profile {
        bg::DUP => a(2, 1, 1, 1, 2, 1),
        bg::RAID0 => a(1, 1, 0, 1, 1, 1),
        bg::RAID1 => a(1, 2, 2, 2, 2, 1),
        bg::RAID1C3 => a(1, 3, 3, 3, 3, 1),
        bg::RAID1C4 => a(1, 4, 4, 4, 4, 1),
        bg::RAID10 => a(1, 2, 0, 2, 2, 2),
        _ => a(1, 1, 1, 1, 1, 1),
    }
}

/// The most redundant of the profiles in `flags` that `devices` writable devices allow;
/// SINGLE when none (the kernel's btrfs_reduce_alloc_profile: a degraded RAID1 mount
/// makes SINGLE chunks).
pub(crate) fn reduce_profile(flags: u64, devices: usize) -> u64 {
    let order = [
        bg::RAID1C4,
        bg::RAID6,
        bg::RAID1C3,
        bg::RAID5,
        bg::RAID10,
        bg::RAID1,
        bg::DUP,
        bg::RAID0,
    ];
    order
        .into_iter()
        .find(|&p| flags & p != 0 && devices >= raid_attr(p).devs_min)
        .unwrap_or(0)
}

/// The block group type and profile for a new chunk of `kind`: the profile the filesystem
/// already uses for that type (the kernel follows the existing chunks' profile too).
fn chunk_flags(fs: &FsCore, kind: u64) -> Result<u64> {
    let mixed = fs.sb.has_incompat(incompat::MIXED_GROUPS);
    let ty = match kind {
        bg::SYSTEM => bg::SYSTEM,
        // Mixed filesystems keep data and metadata in the same block groups.
        bg::DATA | bg::METADATA if mixed => bg::DATA | bg::METADATA,
        k if k == bg::DATA | bg::METADATA && mixed => k,
        bg::DATA | bg::METADATA => kind,
        _ => {
            return Err(Error::InvalidArgument(format!(
                "chunk type {kind:#x}: expected DATA, METADATA or SYSTEM"
            )))
        }
    };
    // Every profile the type has chunks in (system follows metadata and back when it has
    // none, as mkfs sets them up), reduced to what the writable devices allow.
    let profiles_of = |t: u64| {
        fs.io
            .chunks()
            .chunks()
            .filter(|(_, c)| c.chunk_type & bg::TYPE_MASK == t)
            .fold(None, |acc: Option<u64>, (_, c)| {
                Some(acc.unwrap_or(0) | (c.chunk_type & bg::PROFILE_MASK))
            })
    };
    let profiles = profiles_of(ty)
        .or_else(|| match ty {
            bg::SYSTEM => profiles_of(bg::METADATA),
            bg::METADATA => profiles_of(bg::SYSTEM),
            _ => None,
        })
        .unwrap_or(0);
    let writable = fs.io.devices().members().count();
    let profile = reduce_profile(profiles, writable);
    if profile & (bg::RAID5 | bg::RAID6) != 0 {
        return Err(Error::Unsupported(format!(
            "allocating a {} chunk: RAID5/6 is read only",
            bg::describe(ty | profile)
        )));
    }
    Ok(ty | profile)
}

/// The largest chunk the kernel makes of this type (space-info.c calc_chunk_size): data
/// 10 GiB (but 1 GiB per stripe), system 32 MiB, metadata 256 MiB or 1 GiB above 50 GiB.
fn max_chunk_size(flags: u64, total_rw: u64) -> u64 {
    if flags & bg::DATA != 0 {
        MAX_DATA_CHUNK
    } else if flags & bg::SYSTEM != 0 {
        SZ_32M
    } else if total_rw > 50 * SZ_1G {
        SZ_1G
    } else {
        SZ_256M
    }
}

/// The kernel's find_free_dev_extent: the lowest hole of at least `want` bytes in
/// `[start, end)`, else the largest hole; as (start, usable bytes, capped at `want`).
/// `extents` are (physical start, length), sorted. Holes start 64 KiB aligned.
fn find_hole(extents: &[(u64, u64)], start: u64, end: u64, want: u64) -> (u64, u64) {
    let mut cur = start.next_multiple_of(STRIPE_LEN);
    let mut best = (cur, 0);
    let gaps = extents
        .iter()
        .map(|&(s, l)| (s, s.saturating_add(l)))
        .chain(std::iter::once((end, end)));
    for (s, e) in gaps {
        let s = s.min(end);
        if s > cur {
            let hole = s - cur;
            if hole >= want {
                return (cur, want);
            }
            if hole > best.1 {
                best = (cur, hole);
            }
        }
        cur = cur.max(e.next_multiple_of(STRIPE_LEN));
    }
    best
}

/// The per-stripe size from the smallest usable hole of the devices chosen (volumes.c
/// decide_stripe_size_regular). When the chunk (stripe times data stripes) would pass
/// `max_chunk` (10% of the filesystem, or the type's limit) the stripe drops to
/// max_chunk / data stripes rounded *up* to 16 MiB; never over 1 GiB; rounded down to
/// the stripe length.
fn stripe_size(avail: u64, dev_stripes: u64, data_stripes: u64, max_chunk: u64) -> u64 {
    let mut stripe = avail / dev_stripes;
    if stripe * data_stripes > max_chunk {
        stripe = stripe.min((max_chunk / data_stripes).next_multiple_of(SZ_16M));
    }
    stripe.min(SZ_1G) / STRIPE_LEN * STRIPE_LEN
}

impl Transaction<'_> {
    /// Bytes new allocations of type `kind` (block group flag: DATA, METADATA, SYSTEM) can
    /// still get in this transaction without a new chunk.
    pub fn available(&self, kind: u64) -> u64 {
        self.block_groups.available(kind)
    }

    /// Creates a chunk and its empty block group of type `kind` (DATA, METADATA or SYSTEM
    /// from `oleo::format::items::block_group`) in the filesystem's profile for that type,
    /// usable by allocations at once. Returns its logical start. `Error::NoSpace` (nothing
    /// changed) when the device has no room left; `Error::Unsupported` for profiles that
    /// need several devices.
    ///
    /// Like the kernel, it first makes a SYSTEM chunk when the chunk tree may not have room
    /// for the new items, and (for DATA) a METADATA chunk when the other trees may not.
    /// Call it between operations (when `available(kind)` runs low), never from inside a
    /// tree operation.
    pub fn alloc_chunk(&mut self, kind: u64) -> Result<u64> {
        if let Some(why) = self.poisoned() {
            return Err(Error::Unsupported(format!(
                "the transaction failed earlier ({why}); it cannot continue"
            )));
        }
        let flags = chunk_flags(self.filesystem(), kind)?;
        let nodesize = u64::from(self.filesystem().sb.nodesize);
        // A new block group serves its own items (it is usable before they go in), but the
        // chunk tree lives in SYSTEM groups and a data chunk's items in METADATA ones.
        if flags & bg::SYSTEM == 0 {
            self.make_room(bg::SYSTEM, insert_reserve(nodesize, 2), nodesize)?;
        }
        if flags & (bg::SYSTEM | bg::METADATA) == 0 {
            self.make_room(bg::METADATA, insert_reserve(nodesize, 4), nodesize)?;
        }
        let plan = self.plan(flags)?;
        self.create(&plan)?;
        // The committed chunk tree knows nothing of it: a log replay could not reach data
        // or log blocks placed there (the kernel's btrfs_make_block_group does the same).
        self.log.full_commit.get_or_insert_with(|| {
            format!("block group {} was made in this transaction", plan.logical)
        });
        Ok(plan.logical)
    }

    /// Allocates a chunk of `kind` when fewer than `want` bytes of it are left; without
    /// device room that is fine while a tree path (`MAX_LEVEL` blocks) still fits.
    fn make_room(&mut self, kind: u64, want: u64, nodesize: u64) -> Result<()> {
        if self.available(kind) >= want {
            return Ok(());
        }
        match self.alloc_chunk(kind) {
            Ok(_) => Ok(()),
            Err(Error::NoSpace) if self.available(kind) >= nodesize * MAX_LEVEL => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Device `devid`'s unallocated space, the holes the kernel's btrfs_trim_free_extents
    /// discards: (physical start, length) between its DEV_EXTENTs (those of chunks made
    /// in this transaction too), from the end of the reserved first MiB to the
    /// DEV_ITEM's total_bytes.
    pub(crate) fn unallocated_ranges(&mut self, devid: u64) -> Result<Vec<(u64, u64)>> {
        let end = self.dev_item(devid)?.total_bytes;
        let mut extents = Vec::new();
        self.for_each_in_range(
            objectid::DEV_TREE,
            Key::new(devid, item::DEV_EXTENT, 0),
            Key::new(devid, item::DEV_EXTENT, u64::MAX),
            |key, body| {
                let de = DevExtent::parse(body)
                    .map_err(|e| Error::corrupt(0, format!("dev extent {key:?}: {e}")))?;
                extents.push((key.offset, key.offset.saturating_add(de.length)));
                Ok(ControlFlow::Continue(()))
            },
        )?;
        extents.sort_unstable();
        let mut holes = Vec::new();
        let mut cur = DEVICE_RANGE_RESERVED;
        for (s, e) in extents.into_iter().chain(std::iter::once((end, end))) {
            let s = s.min(end);
            if s > cur {
                holes.push((cur, s - cur));
            }
            cur = cur.max(e);
        }
        Ok(holes)
    }

    /// The device's DEV_ITEM as the chunk tree holds it.
    fn dev_item(&mut self, devid: u64) -> Result<DevItem> {
        let key = Key::new(objectid::DEV_ITEMS, item::DEV_ITEM, devid);
        let body = self
            .lookup(objectid::CHUNK_TREE, &key)?
            .ok_or_else(|| Error::corrupt(0, format!("device {devid} has no DEV_ITEM")))?;
        DevItem::parse(&body).map_err(|e| Error::corrupt(0, format!("DEV_ITEM {devid}: {e}")))
    }

    /// Sizes and places a chunk of `flags`, changing nothing. NoSpace when it cannot. As
    /// the kernel's btrfs_create_chunk: each writable device's largest fitting hole, the
    /// devices with the most room first, as many as the profile takes, the stripe sized by
    /// the smallest of those holes.
    fn plan(&mut self, flags: u64) -> Result<Plan> {
        let attr = raid_attr(flags & bg::PROFILE_MASK);
        let dev_stripes = attr.dev_stripes;
        let devids: Vec<u64> = self
            .filesystem()
            .io
            .devices()
            .members()
            .map(|(d, _)| d)
            .collect();
        let mut devs = Vec::new();
        for &devid in &devids {
            devs.push(self.dev_item(devid)?);
        }
        // The kernel sizes chunks from the writable devices' total size.
        let total_rw: u64 = devs.iter().map(|d| d.total_bytes).sum();
        let chunk_limit = max_chunk_size(flags, total_rw);
        let max_stripe = chunk_limit.min(SZ_1G);
        // No chunk over 10% of the filesystem.
        let max_chunk = chunk_limit.min(total_rw / 10);
        let dev_extent_min = STRIPE_LEN * dev_stripes;
        // (devid, hole start, usable, unallocated)
        let mut holes: Vec<(u64, u64, u64, u64)> = Vec::new();
        for dev in &devs {
            let unallocated = dev.total_bytes.saturating_sub(dev.bytes_used);
            if unallocated < dev_extent_min {
                continue;
            }
            let mut extents = Vec::new();
            self.for_each_in_range(
                objectid::DEV_TREE,
                Key::new(dev.devid, item::DEV_EXTENT, 0),
                Key::new(dev.devid, item::DEV_EXTENT, u64::MAX),
                |key, body| {
                    let de = DevExtent::parse(body)
                        .map_err(|e| Error::corrupt(0, format!("dev extent {key:?}: {e}")))?;
                    extents.push((key.offset, de.length));
                    Ok(ControlFlow::Continue(()))
                },
            )?;
            // DUP takes both stripes from one hole, back to back.
            let (hole, avail) = find_hole(
                &extents,
                DEVICE_RANGE_RESERVED,
                dev.total_bytes,
                max_stripe * dev_stripes,
            );
            if avail >= dev_extent_min {
                holes.push((dev.devid, hole, avail, unallocated));
            }
        }
        holes.sort_by(|a, b| b.2.cmp(&a.2).then(b.3.cmp(&a.3)));
        let mut ndevs = holes.len() / attr.devs_increment * attr.devs_increment;
        if attr.devs_max > 0 {
            ndevs = ndevs.min(attr.devs_max);
        }
        if ndevs < attr.devs_min || ndevs == 0 {
            log::debug!(
                "no {} chunk: {ndevs} devices have room, it needs {} (holes {holes:?})",
                bg::describe(flags),
                attr.devs_min
            );
            return Err(Error::NoSpace);
        }
        let num_stripes = ndevs as u64 * dev_stripes;
        let data_stripes = num_stripes / attr.ncopies;
        let stripe = stripe_size(holes[ndevs - 1].2, dev_stripes, data_stripes, max_chunk);
        if stripe == 0 {
            return Err(Error::NoSpace);
        }
        if flags & bg::SYSTEM != 0 {
            // Every SYSTEM chunk must also fit the superblock's sys_chunk_array.
            let have =
                self.filesystem().sb.sys_chunk_array.len() + self.new_chunks.sys_array_bytes();
            if have + KEY_SIZE + ChunkItem::size_for(num_stripes as usize) > SYS_CHUNK_ARRAY_MAX {
                log::warn!("no new SYSTEM chunk: the superblock's sys_chunk_array is full");
                return Err(Error::NoSpace);
            }
        }
        // Logical addresses only grow: after the highest chunk (find_next_chunk).
        let logical = self
            .filesystem()
            .io
            .chunks()
            .chunks()
            .last()
            .map(|(&s, c)| s + c.length)
            .unwrap_or(DEVICE_RANGE_RESERVED);
        let stripes = holes[..ndevs]
            .iter()
            .flat_map(|&(devid, hole, _, _)| {
                (0..dev_stripes).map(move |i| (devid, hole + i * stripe))
            })
            .collect();
        Ok(Plan {
            flags,
            logical,
            stripe_size: stripe,
            length: stripe * data_stripes,
            stripes,
        })
    }

    /// Makes the planned chunk: usable at once, then its items in every tree.
    fn create(&mut self, plan: &Plan) -> Result<()> {
        let sectorsize = self.filesystem().sb.sectorsize;
        let mut devs: std::collections::BTreeMap<u64, DevItem> = Default::default();
        for &(devid, _) in &plan.stripes {
            if let std::collections::btree_map::Entry::Vacant(e) = devs.entry(devid) {
                e.insert(self.dev_item(devid)?);
            }
        }
        let chunk = ChunkItem {
            length: plan.length,
            owner: objectid::EXTENT_TREE,
            stripe_len: STRIPE_LEN,
            chunk_type: plan.flags,
            io_align: STRIPE_LEN as u32,
            io_width: STRIPE_LEN as u32,
            sector_size: sectorsize,
            num_stripes: plan.stripes.len() as u16,
            sub_stripes: raid_attr(plan.flags & bg::PROFILE_MASK).sub_stripes,
            stripes: plan
                .stripes
                .iter()
                .map(|&(devid, offset)| Stripe {
                    devid,
                    offset,
                    dev_uuid: devs[&devid].uuid,
                })
                .collect(),
        };
        let chunk_bytes = chunk
            .to_bytes()
            .map_err(|e| Error::corrupt(plan.logical, format!("chunk item: {e}")))?;
        for (&devid, dev) in devs.iter_mut() {
            let n = plan.stripes.iter().filter(|(d, _)| *d == devid).count() as u64;
            dev.bytes_used = dev
                .bytes_used
                .checked_add(plan.stripe_size * n)
                .filter(|&u| u <= dev.total_bytes)
                .ok_or_else(|| {
                    Error::corrupt(
                        0,
                        format!("device {devid}: bytes_used would exceed its size"),
                    )
                })?;
        }
        // Registered before its items go in, so that the tree blocks those need can come
        // from the new group itself (a full metadata space can still grow).
        self.filesystem()
            .io
            .add_chunk(plan.logical, chunk.clone())?;
        self.block_groups
            .insert_new(plan.logical, &chunk, u64::from(sectorsize))?;

        self.insert_item(
            objectid::CHUNK_TREE,
            Key::new(objectid::FIRST_CHUNK_TREE, item::CHUNK_ITEM, plan.logical),
            &chunk_bytes,
        )?;
        for (&devid, dev) in &devs {
            let used = dev.bytes_used;
            let dev_key = Key::new(objectid::DEV_ITEMS, item::DEV_ITEM, devid);
            self.update_item(objectid::CHUNK_TREE, &dev_key, |b| {
                if b.len() >= 24 {
                    b[16..24].copy_from_slice(&used.to_le_bytes());
                }
            })?;
        }
        let chunk_tree_uuid = self.chunk_tree_uuid;
        for &(devid, phys) in &plan.stripes {
            let de = DevExtent {
                chunk_tree: objectid::CHUNK_TREE,
                chunk_objectid: objectid::FIRST_CHUNK_TREE,
                chunk_offset: plan.logical,
                length: plan.stripe_size,
                chunk_tree_uuid,
            };
            self.insert_item(
                objectid::DEV_TREE,
                Key::new(devid, item::DEV_EXTENT, phys),
                &de.to_bytes(),
            )?;
        }
        let bgi = BlockGroupItem {
            used: 0,
            chunk_objectid: objectid::FIRST_CHUNK_TREE,
            flags: plan.flags,
        };
        let bg_tree = self.bg_items_tree;
        self.insert_item(
            bg_tree,
            Key::new(plan.logical, item::BLOCK_GROUP_ITEM, plan.length),
            &bgi.to_bytes(),
        )?;
        // Its free extents follow at commit (free_space::sync), with the count.
        let info = FreeSpaceInfo {
            extent_count: 0,
            flags: 0,
        };
        self.insert_item(
            objectid::FREE_SPACE_TREE,
            Key::new(plan.logical, item::FREE_SPACE_INFO, plan.length),
            &info.to_bytes(),
        )?;
        self.new_chunks.dev_items.extend(devs);
        if plan.flags & bg::SYSTEM != 0 {
            self.new_chunks.sys_chunks.push((plan.logical, chunk));
        }
        log::debug!(
            "new chunk {} at logical {} ({} bytes), stripes {:?}",
            bg::describe(plan.flags),
            plan.logical,
            plan.length,
            plan.stripes
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn sizes_follow_the_kernel() {
        // 1 GiB device: 10% rounded up to 16 MiB, what a 6.x kernel makes there (112 MiB
        // data, and 112 MiB per DUP metadata stripe, seen in images it wrote).
        let total = SZ_1G;
        let max = |f| max_chunk_size(f, total).min(total / 10);
        assert_eq!(stripe_size(SZ_1G, 1, 1, max(bg::DATA)), 112 * MIB);
        assert_eq!(stripe_size(2 * SZ_256M, 2, 1, max(bg::METADATA)), 112 * MIB);
        assert_eq!(stripe_size(2 * SZ_32M, 2, 1, max(bg::SYSTEM)), 32 * MIB);
        // Large filesystem: the type limits.
        let total = 100 * SZ_1G;
        let max = |f| max_chunk_size(f, total).min(total / 10);
        assert_eq!(stripe_size(SZ_1G, 1, 1, max(bg::DATA)), SZ_1G);
        assert_eq!(
            stripe_size(2 * SZ_1G, 2, 1, max(bg::METADATA | bg::DUP)),
            SZ_1G
        );
        assert_eq!(max_chunk_size(bg::METADATA, 50 * SZ_1G), SZ_256M);
        // Little room left: what there is, to the stripe length.
        assert_eq!(stripe_size(3 * MIB + 4096, 1, 1, 100 * MIB), 3 * MIB);
        assert_eq!(stripe_size(3 * MIB, 2, 1, 100 * MIB), 1536 * 1024);
    }

    #[test]
    fn holes_first_fit_else_largest() {
        let ext = [(MIB, 8 * MIB), (20 * MIB, 4 * MIB), (40 * MIB, MIB)];
        // The gap 9..20 MiB fits 8 MiB.
        assert_eq!(find_hole(&ext, MIB, 100 * MIB, 8 * MIB), (9 * MIB, 8 * MIB));
        // 30 MiB: only the tail (41..100) fits.
        assert_eq!(
            find_hole(&ext, MIB, 100 * MIB, 30 * MIB),
            (41 * MIB, 30 * MIB)
        );
        // Nothing fits 100 MiB: the largest hole.
        assert_eq!(
            find_hole(&ext, MIB, 100 * MIB, 100 * MIB),
            (41 * MIB, 59 * MIB)
        );
        // A full device.
        assert_eq!(find_hole(&[(MIB, 99 * MIB)], MIB, 100 * MIB, MIB).1, 0);
        // Nothing below the reserved first MiB, and no extents at all.
        assert_eq!(find_hole(&[], MIB, 10 * MIB, 4 * MIB), (MIB, 4 * MIB));
    }
}
