//! The free space tree (tree 10): per block group, a FREE_SPACE_INFO item and one
//! FREE_SPACE_EXTENT item per maximal free range. A transaction keeps each touched block
//! group's free ranges in memory (`FreeSpace`), changes them on every allocation and free,
//! and at commit rewrites only the items that differ from what the tree holds.

use crate::ctree::{self, BlockSource, TreeRoot};
use crate::error::{Error, Result};
use crate::transaction::Transaction;
use oleo_format::items::{FreeSpaceInfo, FREE_SPACE_USING_BITMAPS};
use oleo_format::key::{item, objectid, Key};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::{Bound, ControlFlow};

/// Free ranges of one block group: start -> length, merged maximally.
#[derive(Clone, Debug, Default)]
pub(crate) struct FreeSpace {
    ranges: BTreeMap<u64, u64>,
    /// What the tree holds (as of the last sync): the diff against `ranges` is the work.
    on_disk: BTreeMap<u64, u64>,
    /// The block group keeps bitmaps: the FREE_SPACE_BITMAP items (start, length) that tile
    /// it. We keep the representation the kernel chose (switching is policy only).
    bitmaps: Option<Vec<(u64, u64)>>,
    sectorsize: u64,
    /// Sum of `ranges`' lengths.
    total: u64,
    /// Starts of ranges added or removed since the last sync: the only places `ranges`
    /// can differ from `on_disk`, so a commit compares those, not every range.
    touched: BTreeSet<u64>,
}

impl FreeSpace {
    /// Reads the block group `[start, start + length)` from the free space tree.
    pub(crate) fn load<S: BlockSource + ?Sized>(
        io: &S,
        fst: &TreeRoot,
        start: u64,
        length: u64,
        sectorsize: u64,
    ) -> Result<FreeSpace> {
        let info_key = Key::new(start, item::FREE_SPACE_INFO, length);
        let info = ctree::lookup(io, fst, &info_key)?.ok_or_else(|| {
            Error::Unusable(format!(
                "block group {start} has no FREE_SPACE_INFO in the free space tree"
            ))
        })?;
        let info = FreeSpaceInfo::parse(&info).map_err(|e| Error::corrupt(0, e.to_string()))?;
        let using_bitmaps = info.flags & FREE_SPACE_USING_BITMAPS != 0;
        let mut bitmaps = Vec::new();
        let mut ranges = BTreeMap::new();
        // A free run open at the end of the previous bitmap: (start, length).
        let mut run: Option<(u64, u64)> = None;
        let end = start.saturating_add(length);
        let mut bad = None;
        ctree::for_each_in_range(
            io,
            fst,
            Key::new(start, item::FREE_SPACE_EXTENT, 0),
            Key::new(end.saturating_sub(1), item::FREE_SPACE_BITMAP, u64::MAX),
            |key, body| {
                let want = if using_bitmaps {
                    item::FREE_SPACE_BITMAP
                } else {
                    item::FREE_SPACE_EXTENT
                };
                if key.item_type != want
                    || key.objectid.checked_add(key.offset).is_none_or(|e| e > end)
                    || key.offset == 0
                {
                    bad = Some(key);
                    return Ok(ControlFlow::Break(()));
                }
                if !using_bitmaps {
                    ranges.insert(key.objectid, key.offset);
                    return Ok(ControlFlow::Continue(()));
                }
                let bits = key.offset / sectorsize;
                if key.offset % sectorsize != 0 || (body.len() as u64) * 8 < bits {
                    bad = Some(key);
                    return Ok(ControlFlow::Break(()));
                }
                bitmaps.push((key.objectid, key.offset));
                for i in 0..bits {
                    let addr = key.objectid + i * sectorsize;
                    let free = body[(i / 8) as usize] & (1 << (i % 8)) != 0;
                    run = match (run, free) {
                        (Some((s, l)), true) if s + l == addr => Some((s, l + sectorsize)),
                        (Some((s, l)), true) => {
                            ranges.insert(s, l);
                            Some((addr, sectorsize))
                        }
                        (None, true) => Some((addr, sectorsize)),
                        (Some((s, l)), false) => {
                            ranges.insert(s, l);
                            None
                        }
                        (None, false) => None,
                    };
                }
                Ok(ControlFlow::Continue(()))
            },
        )?;
        if let Some((s, l)) = run {
            ranges.insert(s, l);
        }
        if let Some(key) = bad {
            return Err(Error::Unsupported(format!(
                "free space item {key:?} of block group {start} is out of range or malformed"
            )));
        }
        if using_bitmaps && bitmaps.iter().map(|b| b.1).sum::<u64>() != length {
            return Err(Error::Unsupported(format!(
                "the free space bitmaps of block group {start} do not tile it"
            )));
        }
        if ranges.len() != info.extent_count as usize {
            return Err(Error::corrupt(
                0,
                format!(
                    "block group {start}: FREE_SPACE_INFO counts {} extents, the tree has {}",
                    info.extent_count,
                    ranges.len()
                ),
            ));
        }
        Ok(FreeSpace {
            on_disk: ranges.clone(),
            total: ranges.values().sum(),
            ranges,
            bitmaps: using_bitmaps.then_some(bitmaps),
            sectorsize,
            touched: BTreeSet::new(),
        })
    }

    /// A block group created in this transaction: `free` (start, length) ranges are free and
    /// the tree holds none of them yet, so the next sync inserts them all (its new, empty
    /// FREE_SPACE_INFO is the creator's to insert).
    pub(crate) fn new_block_group(
        free: impl IntoIterator<Item = (u64, u64)>,
        sectorsize: u64,
    ) -> FreeSpace {
        let ranges: BTreeMap<u64, u64> = free.into_iter().filter(|&(_, l)| l > 0).collect();
        FreeSpace {
            total: ranges.values().sum(),
            touched: ranges.keys().copied().collect(),
            ranges,
            on_disk: BTreeMap::new(),
            bitmaps: None,
            sectorsize,
        }
    }

    /// Free bytes in all.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// Free bytes inside `[start, start + len)`.
    pub(crate) fn free_within(&self, start: u64, len: u64) -> u64 {
        let end = start.saturating_add(len);
        self.ranges
            .range(..end)
            .rev()
            .take_while(|(&s, &l)| s + l > start)
            .map(|(&s, &l)| (s + l).min(end).saturating_sub(s.max(start)))
            .sum()
    }

    /// The free ranges that end after `from`, in order: a search resuming at `from` does
    /// not walk the (many, on a fragmented group) ranges before it.
    pub(crate) fn ranges_from(&self, from: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let first = self
            .ranges
            .range(..=from)
            .next_back()
            .filter(|(&s, &l)| s + l > from);
        let rest = self.ranges.range(from.saturating_add(1)..);
        first.into_iter().chain(rest).map(|(&s, &l)| (s, l))
    }

    /// Marks `[start, start + len)` used; it must lie inside one free range.
    pub(crate) fn remove(&mut self, start: u64, len: u64) -> Result<()> {
        let (&s, &l) = self
            .ranges
            .range(..=start)
            .next_back()
            .filter(|(&s, &l)| s + l >= start + len)
            .ok_or_else(|| {
                Error::corrupt(start, "allocating space the free space tree says is used")
            })?;
        self.ranges.remove(&s);
        self.touched.insert(s);
        if start > s {
            self.ranges.insert(s, start - s);
        }
        if s + l > start + len {
            self.ranges.insert(start + len, s + l - start - len);
            self.touched.insert(start + len);
        }
        self.total -= len;
        Ok(())
    }

    /// Marks `[start, start + len)` free, merging with its neighbours.
    pub(crate) fn add(&mut self, start: u64, len: u64) -> Result<()> {
        let end = start + len;
        let mut new_start = start;
        let mut new_end = end;
        if let Some((&s, &l)) = self.ranges.range(..end).next_back() {
            if s + l > start {
                return Err(Error::corrupt(start, "freeing space that is already free"));
            }
            if s + l == start {
                new_start = s;
                self.ranges.remove(&s);
            }
        }
        if let Some(&l) = self.ranges.get(&end) {
            new_end = end + l;
            self.ranges.remove(&end);
            self.touched.insert(end);
        }
        self.ranges.insert(new_start, new_end - new_start);
        self.touched.insert(new_start);
        self.total += len;
        Ok(())
    }

    /// The item changes that bring the tree in line with `ranges`, judged at the touched
    /// starts only; None if there are none. The touched set is taken: what changes while
    /// the plan is applied is the next round's work.
    fn sync_plan(&mut self) -> Option<SyncPlan> {
        let touched = std::mem::take(&mut self.touched);
        let target: Vec<(u64, Option<u64>)> = touched
            .iter()
            .map(|&s| (s, self.ranges.get(&s).copied()))
            .filter(|&(s, want)| self.on_disk.get(&s).copied() != want)
            .collect();
        let bitmaps: Vec<(Key, Vec<u8>)> = match &self.bitmaps {
            Some(bitmaps) if !target.is_empty() => bitmaps
                .iter()
                .filter_map(|&(s, l)| {
                    let want = bitmap_of(&self.ranges, s, l, self.sectorsize);
                    (want != bitmap_of(&self.on_disk, s, l, self.sectorsize))
                        .then(|| (Key::new(s, item::FREE_SPACE_BITMAP, l), want))
                })
                .collect(),
            _ => Vec::new(),
        };
        if target.is_empty() {
            return None;
        }
        let extent = |s: u64, l: u64| Key::new(s, item::FREE_SPACE_EXTENT, l);
        let (mut deletes, mut inserts) = (Vec::new(), Vec::new());
        if self.bitmaps.is_none() {
            for &(s, want) in &target {
                if let Some(&l) = self.on_disk.get(&s) {
                    deletes.push(extent(s, l));
                }
                if let Some(l) = want {
                    inserts.push(extent(s, l));
                }
            }
        }
        // A range that only moved or shrank (the usual effect of an allocation) keeps its
        // item under a new key: a delete and an insert could merge and split a leaf, which
        // frees and allocates blocks, which changes the ranges again, round after round.
        // A move must keep the key between its neighbours among this group's items.
        let (mut gone, mut added) = (BTreeSet::new(), BTreeSet::new());
        let mut moves = Vec::new();
        let (mut left_deletes, mut left_inserts) = (Vec::new(), Vec::new());
        for (i, old) in deletes.iter().enumerate() {
            let Some(new) = inserts.get(i) else {
                left_deletes.push(*old);
                continue;
            };
            let prev = self
                .on_disk
                .range(..old.objectid)
                .rev()
                .map(|(&s, &l)| extent(s, l))
                .find(|k| !gone.contains(k))
                .max(added.range(..*old).next_back().copied());
            let next = [
                self.on_disk
                    .range((Bound::Excluded(old.objectid), Bound::Unbounded))
                    .map(|(&s, &l)| extent(s, l))
                    .find(|k| !gone.contains(k)),
                added
                    .range((Bound::Excluded(*old), Bound::Unbounded))
                    .next()
                    .copied(),
            ]
            .into_iter()
            .flatten()
            .min();
            if prev.is_none_or(|p| p < *new) && next.is_none_or(|n| n > *new) {
                moves.push((*old, *new));
                gone.insert(*old);
                added.insert(*new);
            } else {
                left_deletes.push(*old);
                left_inserts.push(*new);
            }
        }
        left_inserts.extend(inserts.iter().skip(deletes.len()));
        let count = self.ranges.len();
        for (s, want) in target {
            match want {
                Some(l) => self.on_disk.insert(s, l),
                None => self.on_disk.remove(&s),
            };
        }
        Some(SyncPlan {
            bitmaps,
            moves,
            deletes: left_deletes,
            inserts: left_inserts,
            count,
        })
    }
}

/// What one block group's sync changes in the free space tree.
struct SyncPlan {
    bitmaps: Vec<(Key, Vec<u8>)>,
    moves: Vec<(Key, Key)>,
    deletes: Vec<Key>,
    inserts: Vec<Key>,
    /// FREE_SPACE_INFO.extent_count.
    count: usize,
}

/// Brings the free space tree in line with every block group's in-memory ranges. Returns
/// true if it changed anything (the changes may have allocated blocks: run it again).
pub(crate) fn sync(txn: &mut Transaction<'_>) -> Result<bool> {
    let mut changed = false;
    for (start, length) in txn.block_groups.unsynced_free_space() {
        let Some(plan) = txn
            .block_groups
            .free_space_mut(start)
            .and_then(FreeSpace::sync_plan)
        else {
            continue;
        };
        for (key, want) in &plan.bitmaps {
            txn.update_item(objectid::FREE_SPACE_TREE, key, |body| {
                if body.len() == want.len() {
                    body.copy_from_slice(want);
                }
            })?;
        }
        for (old, new) in &plan.moves {
            txn.set_item_key(objectid::FREE_SPACE_TREE, old, *new)?;
        }
        for key in &plan.deletes {
            txn.delete_item(objectid::FREE_SPACE_TREE, key)?;
        }
        for key in &plan.inserts {
            txn.insert_item(objectid::FREE_SPACE_TREE, *key, &[])?;
        }
        let count = u32::try_from(plan.count)
            .map_err(|_| Error::Unsupported("too many free space extents".into()))?;
        let info_key = Key::new(start, item::FREE_SPACE_INFO, length);
        txn.update_item(objectid::FREE_SPACE_TREE, &info_key, |body| {
            if body.len() >= 4 {
                body[..4].copy_from_slice(&count.to_le_bytes());
            }
        })?;
        changed = true;
    }
    Ok(changed)
}

impl FreeSpace {
    /// Something changed since the last sync (it may have changed back: `sync_plan`
    /// tells).
    pub(crate) fn needs_sync(&self) -> bool {
        !self.touched.is_empty()
    }
}

/// The FREE_SPACE_BITMAP body for `[start, start + len)`: bit i set = sector i free.
fn bitmap_of(ranges: &BTreeMap<u64, u64>, start: u64, len: u64, sectorsize: u64) -> Vec<u8> {
    let bits = len / sectorsize;
    let mut out = vec![0u8; bits.div_ceil(8) as usize];
    let end = start + len;
    let first = ranges
        .range(..=start)
        .next_back()
        .map(|(&s, _)| s)
        .unwrap_or(start);
    for (&s, &l) in ranges.range(first..end) {
        let (lo, hi) = (s.max(start), (s + l).min(end));
        let mut a = lo;
        while a < hi {
            let i = (a - start) / sectorsize;
            out[(i / 8) as usize] |= 1 << (i % 8);
            a += sectorsize;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(ranges: &[(u64, u64)]) -> FreeSpace {
        let ranges: BTreeMap<u64, u64> = ranges.iter().copied().collect();
        FreeSpace {
            on_disk: ranges.clone(),
            total: ranges.values().sum(),
            ranges,
            bitmaps: None,
            sectorsize: 4096,
            touched: BTreeSet::new(),
        }
    }

    #[test]
    fn ranges_from_starts_at_the_range_holding_it() {
        let fs = space(&[(0, 4096), (8192, 8192), (32768, 4096)]);
        let from = |at| fs.ranges_from(at).collect::<Vec<_>>();
        assert_eq!(from(0), [(0, 4096), (8192, 8192), (32768, 4096)]);
        assert_eq!(from(4096), [(8192, 8192), (32768, 4096)]);
        assert_eq!(from(8192), [(8192, 8192), (32768, 4096)]);
        assert_eq!(from(12288), [(8192, 8192), (32768, 4096)]);
        assert_eq!(from(16384), [(32768, 4096)]);
        assert_eq!(from(36864), []);
    }

    #[test]
    fn total_and_free_within_follow_changes() {
        let mut fs = space(&[(0, 65536), (131072, 8192)]);
        assert_eq!(fs.total(), 73728);
        assert_eq!(fs.free_within(60000, 80000), 5536 + 8192);
        fs.remove(4096, 4096).unwrap();
        assert_eq!(fs.total(), 69632);
        assert_eq!(fs.free_within(0, 16384), 12288);
        fs.add(4096, 4096).unwrap();
        assert_eq!(fs.total(), 73728);
        assert_eq!(fs.free_within(139264, 4096), 0);
    }

    #[test]
    fn remove_splits_and_add_merges() {
        let mut fs = space(&[(0, 65536)]);
        fs.remove(16384, 16384).unwrap();
        assert_eq!(
            fs.ranges_from(0).collect::<Vec<_>>(),
            [(0, 16384), (32768, 32768)]
        );
        assert!(fs.needs_sync());
        assert!(fs.remove(20480, 4096).is_err(), "space already used");
        assert!(fs.add(8192, 4096).is_err(), "space already free");
        fs.add(16384, 16384).unwrap();
        assert_eq!(fs.ranges_from(0).collect::<Vec<_>>(), [(0, 65536)]);
        assert!(fs.sync_plan().is_none(), "back as the tree has it");
        assert!(!fs.needs_sync());
        fs.remove(0, 4096).unwrap();
        fs.remove(61440, 4096).unwrap();
        assert_eq!(fs.ranges_from(0).collect::<Vec<_>>(), [(4096, 57344)]);
    }

    /// A sync judges only the touched ranges, and what it plans is exactly the difference:
    /// items change key where the order of keys allows (no leaf splits and merges),
    /// else they are deleted and inserted.
    #[test]
    fn sync_plans_the_difference_at_touched_ranges() {
        let mut fs = space(&[(0, 65536), (131072, 65536), (262144, 8192)]);
        fs.remove(0, 4096).unwrap();
        fs.remove(131072 + 16384, 16384).unwrap();
        fs.remove(262144, 8192).unwrap();
        let plan = fs.sync_plan().expect("changes");
        let ext = |s, l| Key::new(s, item::FREE_SPACE_EXTENT, l);
        assert_eq!(
            plan.moves,
            [
                (ext(0, 65536), ext(4096, 61440)),
                (ext(131072, 65536), ext(131072, 16384)),
                (ext(262144, 8192), ext(163840, 32768))
            ]
        );
        assert!(plan.deletes.is_empty() && plan.inserts.is_empty());
        assert_eq!(plan.count, 3);
        assert_eq!(fs.on_disk, fs.ranges, "the plan is what the tree will hold");
        // A range that appears between two others cannot take a key from past them.
        fs.add(0, 4096).unwrap();
        fs.remove(8192, 4096).unwrap();
        let plan = fs.sync_plan().expect("changes");
        assert_eq!(
            (plan.moves.len(), plan.deletes.len(), plan.inserts.len()),
            (1, 0, 1),
            "{:?}",
            (plan.moves, plan.deletes, plan.inserts)
        );
        assert_eq!(plan.count, 4);
        assert_eq!(fs.on_disk, fs.ranges, "the plan is what the tree will hold");
        assert!(!fs.needs_sync());
        assert!(fs.sync_plan().is_none());
    }

    #[test]
    fn bitmap_bits_are_lsb_first() {
        let ranges: BTreeMap<u64, u64> = [(4096, 8192), (40960, 4096)].into_iter().collect();
        let bm = bitmap_of(&ranges, 0, 16 * 4096, 4096);
        assert_eq!(bm, [0b0000_0110, 0b0000_0100]);
        // A window that starts inside a free range.
        let bm = bitmap_of(&ranges, 8192, 8 * 4096, 4096);
        assert_eq!(bm, [0b0000_0001]);
    }
}
