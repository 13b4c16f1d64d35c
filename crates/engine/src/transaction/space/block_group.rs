//! Block groups as a transaction sees them: which metadata/system block groups exist, how
//! many bytes each has in use (BLOCK_GROUP_ITEM.used), their free ranges, and where a new
//! tree block may go. Space freed in this transaction stays pinned: the last committed
//! trees may still point at it until the new superblock is on disk. Loaded once and
//! carried from one transaction to the next; what a commit still writing in the background
//! freed stays pinned (in `CommitPins`) until its superblock is durable.

use crate::ctree::{self, BlockSource, TreeRoot};
use crate::error::{Error, Result};
use crate::io::volumes::ChunkMap;
use crate::transaction::space::free_space::FreeSpace;
use crate::transaction::Transaction;
use oleo_format::items::{block_group as bg, BlockGroupItem};
use oleo_format::key::{item, Key};
use oleo_format::superblock;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Space freed by transactions whose commit is not durable yet: start -> (length,
/// generation). Shared with the commits, which release their part once on disk.
pub(crate) type CommitPins = Arc<Mutex<PinSet>>;

/// Pinned ranges and their total length (an upper bound of what they take from the free
/// space, read on every operation's reservation without walking them).
#[derive(Default)]
pub(crate) struct PinSet {
    map: BTreeMap<u64, (u64, u64)>,
    bytes: u64,
}

impl PinSet {
    pub(crate) fn insert(&mut self, start: u64, (len, generation): (u64, u64)) {
        if let Some((old, _)) = self.map.insert(start, (len, generation)) {
            self.bytes -= old;
        }
        self.bytes += len;
    }

    /// Keeps the ranges freed in generation `keep_from` or later.
    pub(crate) fn retain_from(&mut self, keep_from: u64) {
        let bytes = &mut self.bytes;
        self.map.retain(|_, &mut (len, g)| {
            let keep = g >= keep_from;
            if !keep {
                *bytes -= len;
            }
            keep
        });
    }
}

impl std::ops::Deref for PinSet {
    type Target = BTreeMap<u64, (u64, u64)>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

/// Where the kernel never puts an extent: a superblock copy (a 64 KiB stripe each) and the
/// first MiB of the device.
const SUPER_STRIPE: u64 = 64 * 1024;
const RESERVED_START: u64 = 1024 * 1024;
const SUPER_MIRRORS: usize = 3;

pub(crate) struct BlockGroup {
    pub length: u64,
    pub flags: u64,
    pub used: u64,
    used_on_disk: u64,
    /// Bytes of it in `BlockGroups::reserved` (all free in `free`): kept as a sum so that
    /// `available`, asked on every operation, does not walk every reservation.
    reserved: u64,
    free: FreeSpace,
    /// Logical ranges never to allocate from (superblock copies).
    avoid: Vec<(u64, u64)>,
    /// False when we cannot tell where the superblock copies land (striped profiles).
    allocatable: bool,
}

pub(crate) struct BlockGroups {
    groups: BTreeMap<u64, BlockGroup>,
    /// Freed in this transaction: start -> length. Never reused before the commit.
    pinned: BTreeMap<u64, u64>,
    /// Total length of `pinned`.
    pinned_bytes: u64,
    /// Freed by earlier transactions whose commit is still being written.
    committing: CommitPins,
    /// Data extents reserved for writes whose data is on its way to the device (ordered
    /// extents): neither free for others nor counted used until their items go in.
    reserved: BTreeMap<u64, u64>,
    /// Per block group type, where the last allocation ended.
    cursor: BTreeMap<u64, u64>,
    /// Net change of all `used` counters (for the superblock's bytes_used).
    pub used_delta: i128,
}

impl BlockGroups {
    /// Loads every block group (data, metadata, system) from `items` (the extent tree, or the block group tree) and the free space tree.
    pub(crate) fn load<S: BlockSource + ?Sized>(
        io: &S,
        chunks: &ChunkMap,
        items: &TreeRoot,
        fst: &TreeRoot,
        sectorsize: u64,
        committing: CommitPins,
    ) -> Result<BlockGroups> {
        let mut groups = BTreeMap::new();
        for (&start, chunk) in chunks.chunks() {
            let key = Key::new(start, item::BLOCK_GROUP_ITEM, chunk.length);
            let body = ctree::lookup(io, items, &key)?
                .ok_or_else(|| Error::Unusable(format!("chunk {start} has no block group item")))?;
            let bgi = BlockGroupItem::parse(&body).map_err(|e| Error::corrupt(0, e.to_string()))?;
            let free = FreeSpace::load(io, fst, start, chunk.length, sectorsize)?;
            let (avoid, allocatable) = super_ranges(start, chunk);
            groups.insert(
                start,
                BlockGroup {
                    length: chunk.length,
                    flags: bgi.flags,
                    used: bgi.used,
                    used_on_disk: bgi.used,
                    reserved: 0,
                    free,
                    avoid,
                    allocatable,
                },
            );
        }
        Ok(BlockGroups {
            groups,
            pinned: BTreeMap::new(),
            pinned_bytes: 0,
            committing,
            reserved: BTreeMap::new(),
            cursor: BTreeMap::new(),
            used_delta: 0,
        })
    }

    /// Transaction `transid` closed with these counters written: what it freed stays
    /// pinned until its commit is durable, and the next transaction starts from here.
    pub(crate) fn carry_over(&mut self, transid: u64) {
        let mut committing = self.committing.lock();
        for (start, len) in std::mem::take(&mut self.pinned) {
            committing.insert(start, (len, transid));
        }
        self.pinned_bytes = 0;
        self.used_delta = 0;
    }

    /// Adds a block group created in this transaction: nothing used, everything free but
    /// the superblock copies (the kernel never hands those out, and the free space tree
    /// leaves them out). Allocations can use it at once.
    pub(crate) fn insert_new(
        &mut self,
        start: u64,
        chunk: &oleo_format::items::ChunkItem,
        sectorsize: u64,
    ) -> Result<()> {
        if self.groups.contains_key(&start) {
            return Err(Error::corrupt(start, "a block group already starts here"));
        }
        let (avoid, allocatable) = super_ranges(start, chunk);
        let end = start + chunk.length;
        let mut holes: Vec<(u64, u64)> = avoid
            .iter()
            .map(|&(s, l)| (s.max(start), (s + l).min(end)))
            .filter(|(s, e)| s < e)
            .collect();
        holes.sort_unstable();
        let mut free = Vec::new();
        let mut cur = start;
        for (s, e) in holes {
            if s > cur {
                free.push((cur, s - cur));
            }
            cur = cur.max(e);
        }
        if cur < end {
            free.push((cur, end - cur));
        }
        self.groups.insert(
            start,
            BlockGroup {
                length: chunk.length,
                flags: chunk.chunk_type,
                used: 0,
                used_on_disk: 0,
                reserved: 0,
                free: FreeSpace::new_block_group(free, sectorsize),
                avoid,
                allocatable,
            },
        );
        Ok(())
    }

    fn group_of(&mut self, bytenr: u64, len: u64) -> Result<(u64, &mut BlockGroup)> {
        self.groups
            .range_mut(..=bytenr)
            .next_back()
            .filter(|(&s, g)| bytenr.checked_add(len).is_some_and(|e| e <= s + g.length))
            .map(|(&s, g)| (s, g))
            .ok_or_else(|| {
                Error::corrupt(bytenr, "tree block is not inside a metadata block group")
            })
    }

    /// A free, unpinned, `len`-aligned range of `len` bytes in a block group of type `kind`
    /// (METADATA or SYSTEM); marked used.
    pub(crate) fn alloc(&mut self, kind: u64, len: u64) -> Result<u64> {
        self.alloc_aligned(kind, len, len)
    }

    /// Reserves `len` bytes of data space aligned to `align` for a write whose data goes
    /// to the device before its items go in; `use_reserved` or `cancel_reserved` ends it.
    pub(crate) fn reserve_data(&mut self, len: u64, align: u64) -> Result<u64> {
        self.reserve(bg::DATA, len, align)
    }

    /// Reserves `len` bytes of type `kind` aligned to `align`: neither free for others nor
    /// counted used (data on its way to the device, log tree blocks) until
    /// `use_reserved` or `cancel_reserved`.
    pub(crate) fn reserve(&mut self, kind: u64, len: u64, align: u64) -> Result<u64> {
        let from = self.cursor.get(&kind).copied().unwrap_or(0);
        let (start, bytenr) = self
            .find(kind, len, align, from)
            .or_else(|| self.find(kind, len, align, 0))
            .ok_or(Error::NoSpace)?;
        self.reserved.insert(bytenr, len);
        if let Some(g) = self.groups.get_mut(&start) {
            g.reserved += len;
        }
        self.cursor.insert(kind, bytenr + len);
        Ok(bytenr)
    }

    /// Reserves exactly `[bytenr, bytenr + len)` of data space if all of it is free in one
    /// allocatable data block group (the continuation of a file's last extent, so that
    /// a file written in order lies in order); false, and nothing reserved, otherwise.
    pub(crate) fn reserve_data_at(&mut self, bytenr: u64, len: u64) -> bool {
        let Some(end) = bytenr.checked_add(len) else {
            return false;
        };
        let Some((&start, g)) = self.groups.range(..=bytenr).next_back() else {
            return false;
        };
        if g.flags & bg::DATA == 0
            || !g.allocatable
            || len == 0
            || end > start + g.length
            || g.free.free_within(bytenr, len) != len
            || blocked(&g.avoid, &self.pinned, bytenr, len).is_some()
            || blocked(&[], &self.reserved, bytenr, len).is_some()
            || blocked_by_commits(&self.committing.lock(), bytenr, len).is_some()
        {
            return false;
        }
        self.reserved.insert(bytenr, len);
        if let Some(g) = self.groups.get_mut(&start) {
            g.reserved += len;
        }
        self.cursor.insert(bg::DATA, end);
        true
    }

    /// True if `[bytenr, bytenr + len)` lies inside one block group.
    pub(crate) fn within_one_group(&self, bytenr: u64, len: u64) -> bool {
        self.groups
            .range(..=bytenr)
            .next_back()
            .is_some_and(|(&s, g)| bytenr.checked_add(len).is_some_and(|e| e <= s + g.length))
    }

    /// The reserved extent's items are going in: it becomes used like any allocation.
    pub(crate) fn use_reserved(&mut self, bytenr: u64, len: u64) -> Result<()> {
        if self.reserved.remove(&bytenr) != Some(len) {
            return Err(Error::corrupt(bytenr, "data extent was not reserved"));
        }
        let (_, g) = self.group_of(bytenr, len)?;
        g.reserved -= len;
        g.free.remove(bytenr, len)?;
        g.used += len;
        self.used_delta += len as i128;
        Ok(())
    }

    /// The write gave up: the space is free again.
    pub(crate) fn cancel_reserved(&mut self, bytenr: u64) {
        if let Some(len) = self.reserved.remove(&bytenr) {
            if let Ok((_, g)) = self.group_of(bytenr, len) {
                g.reserved -= len;
            }
        }
    }

    /// Like `alloc`, for `len` bytes aligned to `align` (data extents: the sector size).
    pub(crate) fn alloc_aligned(&mut self, kind: u64, len: u64, align: u64) -> Result<u64> {
        // Next fit: continue after the last allocation, so a transaction's blocks end up
        // together and the search does not walk this transaction's pinned blocks again.
        let from = self.cursor.get(&kind).copied().unwrap_or(0);
        let found = self
            .find(kind, len, align, from)
            .or_else(|| self.find(kind, len, align, 0));
        let (start, bytenr) = found.ok_or(Error::NoSpace)?;
        let g = self
            .groups
            .get_mut(&start)
            .ok_or_else(|| Error::corrupt(bytenr, "block group vanished"))?;
        g.free.remove(bytenr, len)?;
        g.used += len;
        self.cursor.insert(kind, bytenr + len);
        self.used_delta += len as i128;
        Ok(bytenr)
    }

    /// The first fitting place at or after `from`: (block group start, address).
    fn find(&self, kind: u64, len: u64, align: u64, from: u64) -> Option<(u64, u64)> {
        let committing = self.committing.lock();
        for (&start, g) in self.groups.range(..) {
            if g.flags & kind == 0
                || !g.allocatable
                || g.length.saturating_sub(g.used) < len
                || start + g.length <= from
            {
                continue;
            }
            for (s, l) in g.free.ranges_from(from) {
                let end = s + l;
                let mut cand = s.max(from).next_multiple_of(align);
                while cand + len <= end {
                    let skip = blocked(&g.avoid, &self.pinned, cand, len)
                        .or_else(|| blocked(&[], &self.reserved, cand, len))
                        .or_else(|| blocked_by_commits(&committing, cand, len));
                    match skip {
                        Some(skip) => cand = skip.next_multiple_of(align),
                        None => return Some((start, cand)),
                    }
                }
            }
        }
        None
    }

    /// Returns `[bytenr, bytenr + len)` to its block group; it stays pinned (not reusable)
    /// until the transaction ends.
    pub(crate) fn free(&mut self, bytenr: u64, len: u64) -> Result<()> {
        self.free_unpinned(bytenr, len)?;
        self.pin_range(bytenr, len);
        Ok(())
    }

    /// Returns `[bytenr, bytenr + len)`, allocated in this transaction and never written,
    /// to its block group, reusable at once.
    pub(crate) fn free_unpinned(&mut self, bytenr: u64, len: u64) -> Result<()> {
        let (_, g) = self.group_of(bytenr, len)?;
        g.used = g
            .used
            .checked_sub(len)
            .ok_or_else(|| Error::corrupt(bytenr, "block group used would go below zero"))?;
        g.free.add(bytenr, len)?;
        self.used_delta -= len as i128;
        Ok(())
    }

    /// Keeps `[bytenr, bytenr + len)` from being allocated until this transaction's commit
    /// is durable, without counting it used: space the committed state calls free but
    /// something on disk still needs (a pending log's blocks).
    pub(crate) fn pin(&mut self, bytenr: u64, len: u64) -> Result<()> {
        // Inside a block group: the end does not overflow.
        self.group_of(bytenr, len)?;
        self.pin_range(bytenr, len);
        Ok(())
    }

    /// Marks the free range `[bytenr, bytenr + len)` used, as if allocated here (data a
    /// replayed log refers to). An error if any of it is not free.
    pub(crate) fn claim(&mut self, bytenr: u64, len: u64) -> Result<()> {
        if len == 0 || bytenr.checked_add(len).is_none() {
            return Err(Error::corrupt(bytenr, format!("no such range (+{len})")));
        }
        if blocked(&[], &self.pinned, bytenr, len).is_some()
            || blocked(&[], &self.reserved, bytenr, len).is_some()
        {
            return Err(Error::corrupt(bytenr, "range is pinned or reserved"));
        }
        let (_, g) = self.group_of(bytenr, len)?;
        if g.flags & bg::DATA == 0 {
            return Err(Error::corrupt(bytenr, "range is not in a data block group"));
        }
        g.free.remove(bytenr, len)?;
        g.used += len;
        self.used_delta += len as i128;
        Ok(())
    }

    fn pin_range(&mut self, bytenr: u64, len: u64) {
        if let Some(old) = self.pinned.insert(bytenr, len) {
            self.pinned_bytes -= old;
        }
        self.pinned_bytes += len;
    }

    /// True if allocations of type `kind` can still get `bytes` (`available(kind) >=
    /// bytes`), answered from running totals when there is room to spare: every
    /// operation asks, and `available` walks every pinned range.
    pub(crate) fn has_available(&self, kind: u64, bytes: u64) -> bool {
        let mut free = 0u64;
        for g in self.groups.values() {
            if g.flags & kind == 0 || !g.allocatable {
                continue;
            }
            let avoided: u64 = g.avoid.iter().map(|&(_, l)| l).sum();
            free += g.free.total().saturating_sub(g.reserved + avoided);
        }
        let pinned = self.pinned_bytes + self.committing.lock().bytes;
        free.saturating_sub(pinned) >= bytes || self.available(kind) >= bytes
    }

    /// Bytes that allocations of type `kind` can still get in this transaction: free
    /// space not pinned, in allocatable block groups.
    pub(crate) fn available(&self, kind: u64) -> u64 {
        let committing = self.committing.lock();
        let mut total = 0u64;
        for (&start, g) in &self.groups {
            if g.flags & kind == 0 || !g.allocatable {
                continue;
            }
            let end = start + g.length;
            // Free space allocations can get: neither pinned nor a superblock copy (those
            // are neither used nor free, so `length - used` would count them).
            let pinned: u64 = self
                .pinned
                .range(start..end)
                .map(|(&s, &l)| g.free.free_within(s, l))
                .chain(
                    committing
                        .range(start..end)
                        .map(|(&s, &(l, _))| g.free.free_within(s, l)),
                )
                .sum::<u64>()
                + g.reserved;
            let avoided: u64 = g.avoid.iter().map(|&(s, l)| g.free.free_within(s, l)).sum();
            total += g.free.total().saturating_sub(pinned + avoided);
        }
        total
    }

    /// True if a commit would make freed space of type `kind` reusable.
    pub(crate) fn has_pinned(&self, kind: u64) -> bool {
        let of_kind = |s: u64| {
            self.groups
                .range(..=s)
                .next_back()
                .is_some_and(|(_, g)| g.flags & kind != 0)
        };
        self.pinned.keys().any(|&s| of_kind(s))
            || self.committing.lock().keys().any(|&s| of_kind(s))
    }

    /// The block groups overlapping `[start, end)`: (start, length), in address order.
    pub(crate) fn overlapping(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        self.groups
            .iter()
            .filter(|(&s, g)| s < end && s.saturating_add(g.length) > start)
            .map(|(&s, g)| (s, g.length))
            .collect()
    }

    /// The first half of the kernel's btrfs_trim_block_group: the free ranges of the block
    /// group at `group` inside `[start, end)` that nothing else holds, each at least
    /// `minlen` bytes, reserved (as `reserve` does) so that nothing is allocated there
    /// until `cancel_reserved` gives each back. Left out: space freed by this transaction
    /// or by a commit not yet durable (the last durable trees may still point there, and
    /// read pins hold it), reservations (data on its way to the device, log tree blocks),
    /// and the superblock stripes. A group whose superblock stripes we cannot place
    /// (RAID5/6) gives nothing.
    pub(crate) fn reserve_trimmable(
        &mut self,
        group: u64,
        start: u64,
        end: u64,
        minlen: u64,
    ) -> Vec<(u64, u64)> {
        let Some(g) = self.groups.get(&group) else {
            return Vec::new();
        };
        let (lo, hi) = (start.max(group), end.min(group + g.length));
        if !g.allocatable || lo >= hi {
            return Vec::new();
        }
        let overlaps = |s: u64, l: u64| s < hi && s.saturating_add(l) > lo;
        let mut held: Vec<(u64, u64)> = g
            .avoid
            .iter()
            .copied()
            .filter(|&(s, l)| overlaps(s, l))
            .collect();
        for map in [&self.pinned, &self.reserved] {
            held.extend(
                map.range(..hi)
                    .map(|(&s, &l)| (s, l))
                    .filter(|&(s, l)| overlaps(s, l)),
            );
        }
        held.extend(
            self.committing
                .lock()
                .range(..hi)
                .map(|(&s, &(l, _))| (s, l))
                .filter(|&(s, l)| overlaps(s, l)),
        );
        held.sort_unstable();
        let mut out = Vec::new();
        for (s, l) in g.free.ranges_from(lo) {
            if s >= hi {
                break;
            }
            let (mut cur, e) = (s.max(lo), (s + l).min(hi));
            for &(hs, hl) in &held {
                let he = hs.saturating_add(hl);
                if he <= cur {
                    continue;
                }
                if hs >= e {
                    break;
                }
                if hs > cur {
                    out.push((cur, hs - cur));
                }
                cur = he;
                if cur >= e {
                    break;
                }
            }
            if cur < e {
                out.push((cur, e - cur));
            }
        }
        out.retain(|&(_, l)| l >= minlen.max(1));
        let mut total = 0;
        for &(s, l) in &out {
            self.reserved.insert(s, l);
            total += l;
        }
        if let Some(g) = self.groups.get_mut(&group) {
            g.reserved += total;
        }
        out
    }

    /// (type flags, length, used) of every block group, for statfs.
    pub(crate) fn summary(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.groups.values().map(|g| (g.flags, g.length, g.used))
    }

    /// Block groups whose free space differs from the tree: (start, length).
    pub(crate) fn unsynced_free_space(&self) -> Vec<(u64, u64)> {
        self.groups
            .iter()
            .filter(|(_, g)| g.free.needs_sync())
            .map(|(&s, g)| (s, g.length))
            .collect()
    }

    pub(crate) fn free_space_mut(&mut self, start: u64) -> Option<&mut FreeSpace> {
        self.groups.get_mut(&start).map(|g| &mut g.free)
    }
}

/// The first blocked byte's end if `[cand, cand + len)` hits a superblock range or a
/// pinned range: allocation resumes there.
fn blocked(avoid: &[(u64, u64)], pinned: &BTreeMap<u64, u64>, cand: u64, len: u64) -> Option<u64> {
    for &(s, l) in avoid {
        if s < cand + len && s + l > cand {
            return Some(s + l);
        }
    }
    pinned
        .range(..cand + len)
        .next_back()
        .filter(|(&s, &l)| s + l > cand)
        .map(|(&s, &l)| s + l)
}

/// Like `blocked`, for space pinned by commits still being written.
fn blocked_by_commits(pins: &BTreeMap<u64, (u64, u64)>, cand: u64, len: u64) -> Option<u64> {
    pins.range(..cand + len)
        .next_back()
        .filter(|(&s, &(l, _))| s + l > cand)
        .map(|(&s, &(l, _))| s + l)
}

/// Logical ranges of the block group at `start` that hold superblock copies (or the first
/// MiB of the device), and whether we could work that out.
fn super_ranges(start: u64, chunk: &oleo_format::items::ChunkItem) -> (Vec<(u64, u64)>, bool) {
    let mut out = Vec::new();
    if start < RESERVED_START {
        out.push((start, RESERVED_START - start));
    }
    let profile = chunk.chunk_type & bg::PROFILE_MASK;
    if profile & (bg::RAID5 | bg::RAID6) != 0 {
        return (out, false);
    }
    if profile & (bg::RAID0 | bg::RAID10) != 0 {
        // Striped: the 64 KiB strip holding a superblock copy maps back to one logical
        // strip (the kernel's btrfs_rmap_block); the RAID10 pair shares it.
        const STRIP: u64 = 64 * 1024;
        let n = chunk.stripes.len() as u64;
        let (factor, sub) = if profile == bg::RAID10 {
            (n / 2, 2)
        } else {
            (n, 1)
        };
        let per_dev = chunk.length / factor.max(1);
        let end = start + chunk.length;
        for (i, stripe) in chunk.stripes.iter().enumerate() {
            for mirror in 0..SUPER_MIRRORS {
                let off = superblock::mirror_offset(mirror);
                if off < stripe.offset || off >= stripe.offset.saturating_add(per_dev) {
                    continue;
                }
                let rel = off - stripe.offset;
                let l = (rel / STRIP) * factor + i as u64 / sub;
                let logical = start + l * STRIP;
                if logical < end && !out.iter().any(|&(s, _)| s == logical) {
                    out.push((logical, STRIP.min(end - logical)));
                }
            }
        }
        return (out, true);
    }
    // Single, DUP and RAID1*: each stripe is a plain copy of the whole chunk.
    for stripe in &chunk.stripes {
        let phys_end = stripe.offset.saturating_add(chunk.length);
        for mirror in 0..SUPER_MIRRORS {
            let off = superblock::mirror_offset(mirror);
            let (lo, hi) = (off.max(stripe.offset), (off + SUPER_STRIPE).min(phys_end));
            if lo < hi {
                out.push((start + (lo - stripe.offset), hi - lo));
            }
        }
    }
    (out, true)
}

/// Writes every changed `used` counter into its BLOCK_GROUP_ITEM. Returns true if it
/// changed anything.
pub(crate) fn sync(txn: &mut Transaction<'_>, items_tree: u64) -> Result<bool> {
    let todo: Vec<(u64, u64, u64)> = txn
        .block_groups
        .groups
        .iter()
        .filter(|(_, g)| g.used != g.used_on_disk)
        .map(|(&s, g)| (s, g.length, g.used))
        .collect();
    for &(start, length, used) in &todo {
        let key = Key::new(start, item::BLOCK_GROUP_ITEM, length);
        txn.update_item(items_tree, &key, |body| {
            if body.len() >= 8 {
                body[..8].copy_from_slice(&used.to_le_bytes());
            }
        })?;
        if let Some(g) = txn.block_groups.groups.get_mut(&start) {
            g.used_on_disk = used;
        }
    }
    Ok(!todo.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One data block group at 1 GiB of 64 MiB, free where `free` says.
    fn groups(free: Vec<(u64, u64)>, avoid: Vec<(u64, u64)>) -> BlockGroups {
        let mut groups = BTreeMap::new();
        groups.insert(
            1 << 30,
            BlockGroup {
                length: 64 << 20,
                flags: bg::DATA,
                used: 0,
                used_on_disk: 0,
                reserved: 0,
                free: FreeSpace::new_block_group(free, 4096),
                avoid,
                allocatable: true,
            },
        );
        BlockGroups {
            groups,
            pinned: BTreeMap::new(),
            pinned_bytes: 0,
            committing: Default::default(),
            reserved: BTreeMap::new(),
            cursor: BTreeMap::new(),
            used_delta: 0,
        }
    }

    #[test]
    fn trimmable_space_leaves_out_what_is_held_and_is_reserved_meanwhile() {
        const G: u64 = 1 << 30;
        const M: u64 = 1 << 20;
        let mut g = groups(
            vec![(G, 10 * M), (G + 20 * M, 44 * M)],
            vec![(G + 30 * M, M)],
        );
        g.pin_range(G + 2 * M, M);
        g.reserved.insert(G + 40 * M, M);
        g.committing.lock().insert(G + 50 * M, (M, 7));
        let got = g.reserve_trimmable(G, G + M, G + 60 * M, 0);
        assert_eq!(
            got,
            vec![
                (G + M, M),
                (G + 3 * M, 7 * M),
                (G + 20 * M, 10 * M),
                (G + 31 * M, 9 * M),
                (G + 41 * M, 9 * M),
                (G + 51 * M, 9 * M),
            ]
        );
        // Reserved until given back: nothing is allocated there (the lowest free space left
        // is the MiB at the group's start, outside the range), nor trimmed twice: only the tail
        // past the first range is left.
        assert_eq!(g.alloc_aligned(bg::DATA, M, 4096).unwrap(), G);
        assert_eq!(
            g.reserve_trimmable(G, G, G + 64 * M, 0),
            vec![(G + 60 * M, 4 * M)]
        );
        // A minimum length drops the short ranges.
        let mut g = groups(vec![(G, 10 * M), (G + 20 * M, 44 * M)], vec![]);
        g.pin_range(G + 2 * M, M);
        assert_eq!(
            g.reserve_trimmable(G, 0, u64::MAX, 4 * M),
            vec![(G + 3 * M, 7 * M), (G + 20 * M, 44 * M)]
        );
        for s in [G + 3 * M, G + 20 * M] {
            g.cancel_reserved(s);
        }
        assert!(g.reserved.is_empty());
        assert_eq!(g.groups[&G].reserved, 0);
    }
}
