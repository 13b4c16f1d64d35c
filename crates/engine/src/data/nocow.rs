//! Writes that overwrite data where it lies (the kernel's NOCOW path, can_nocow_extent):
//! in a NODATACOW file, a range whose extents only this file references, newer than the
//! subvolume's last snapshot, takes the write at the extents' own addresses. No extent is
//! allocated, no checksum computed and no item changed, so such a write reserves nothing
//! and holds the filesystem's lock only shared, to check the extents; it shares the file's
//! lock with other in-place writes to the file (FUSE's parallel direct writes), and the
//! data goes out under neither.
//!
//! What could share an extent while its data goes out waits for that data instead:
//! a snapshot or subvolume deletion takes `NocowWriters` alone (the kernel's
//! snapshot_lock); a reflink out of the file takes the file's lock alone, like every
//! change of its extents. A write the checks refuse (shared, compressed, past the end of
//! file) takes the copy-on-write path, which copies once; the new extent is then this
//! file's alone and takes later writes in place. Prealloc extents take writes in place
//! too, through `prealloc_fill`, which checks them here.
//!
//! Durability: nothing in the trees records an in-place write, so the file goes into
//! `unsynced` and its next fsync flushes the device even when it has nothing to log.

use crate::data::file::Mapping;
use crate::error::Result;
use crate::sync::{Condvar, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use crate::transaction::fs::{FileKind, FsCore, InodeId, Timespec};
use crate::transaction::space::delayed_ref::DataRef;
use oleo_format::items::{
    Compression, ExtentItem, InlineRef, INODE_FLAG_APPEND, INODE_FLAG_IMMUTABLE,
    INODE_FLAG_NODATACOW,
};
use oleo_format::key::{item, objectid, Key};
use std::collections::HashSet;
use std::ops::Range;

/// In-place writers against what would share their extents (the kernel's drew lock):
/// in-place writes hold it shared while their data goes out; a snapshot or a subvolume
/// deletion holds it alone. Taken after the inode locks, before the filesystem's.
#[derive(Default)]
pub(crate) struct NocowWriters {
    lock: RwLock<()>,
    /// Files written in place since their last fsync.
    unsynced: Mutex<HashSet<InodeId>>,
    /// File ranges being written in place or filled (until a queued fill's items are
    /// applied): such writes share the file's lock, so each holds its range alone.
    filling: Mutex<Vec<(InodeId, u64, u64)>>,
    filled: Condvar,
}

/// A range of a file held by one prealloc fill.
pub(crate) struct RangeGuard<'a> {
    owner: &'a NocowWriters,
    range: (InodeId, u64, u64),
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        self.owner.unlock_range(self.range);
    }
}

impl RangeGuard<'_> {
    /// Keeps the range held past this guard: `NocowWriters::unlock_range` lets it go.
    pub(crate) fn keep(self) -> (InodeId, u64, u64) {
        let range = self.range;
        std::mem::forget(self);
        range
    }
}

impl NocowWriters {
    pub(crate) fn shared(&self) -> RwLockReadGuard<'_, ()> {
        self.lock.try_read().unwrap_or_else(|_| {
            crate::blocking::will_wait();
            self.lock.read().unwrap_or_else(|p| p.into_inner())
        })
    }

    pub(crate) fn exclusive(&self) -> RwLockWriteGuard<'_, ()> {
        self.lock.try_write().unwrap_or_else(|_| {
            crate::blocking::will_wait();
            self.lock.write().unwrap_or_else(|p| p.into_inner())
        })
    }

    /// True if `id` was written in place since the last call (an fsync must flush).
    pub(crate) fn take_unsynced(&self, id: InodeId) -> bool {
        self.unsynced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id)
    }

    pub(crate) fn mark_unsynced(&self, id: InodeId) {
        self.unsynced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id);
    }

    /// Lets go of a range `RangeGuard::keep` kept.
    pub(crate) fn unlock_range(&self, range: (InodeId, u64, u64)) {
        let mut held = self.filling.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = held.iter().position(|r| *r == range) {
            held.swap_remove(i);
        }
        self.filled.notify_all();
    }

    /// `[start, end)` of `id` alone among prealloc fills.
    pub(crate) fn lock_range(&self, id: InodeId, start: u64, end: u64) -> RangeGuard<'_> {
        let mut held = self.filling.lock().unwrap_or_else(|p| p.into_inner());
        while held
            .iter()
            .any(|&(i, s, e)| i == id && s < end && start < e)
        {
            crate::blocking::will_wait();
            held = self.filled.wait(held).unwrap_or_else(|p| p.into_inner());
        }
        held.push((id, start, end));
        RangeGuard {
            owner: self,
            range: (id, start, end),
        }
    }
}

/// Part of a file range that may be written in place: its file offset and length, its
/// extent (disk_bytenr, disk_num_bytes), and the offset of its first byte in the extent.
pub(crate) struct Owned {
    pub at: u64,
    pub len: u64,
    pub bytenr: u64,
    pub disk_len: u64,
    pub ext_off: u64,
}

/// An in-place write worked out: where each part of the data goes, and the time stamps
/// to set first (None while the coarse clock has not moved since the last write).
pub(crate) struct InPlace {
    pub(crate) pieces: Vec<(u64, Range<usize>)>,
    pub(crate) touch: Option<Timespec>,
    pub(crate) io: std::sync::Arc<crate::io::disk_io::DiskIo>,
    _pin: crate::transaction::commit_pipe::ReadPin,
}

impl FsCore {
    /// ROOT_ITEM.last_snapshot of subvolume `subvol` as current reads see it.
    fn last_snapshot_of(&self, subvol: u64) -> Result<u64> {
        if let Some(v) = self
            .running
            .as_ref()
            .and_then(|t| t.last_snapshot_seen(subvol))
        {
            return Ok(v);
        }
        Ok(self
            .read_root_item(subvol)?
            .map_or(u64::MAX, |(_, ri)| ri.last_snapshot))
    }

    /// Where `len` bytes at `offset` of `id` go if written in place; None if any part of
    /// the range fails the kernel's conditions.
    pub(crate) fn plan_in_place(
        &self,
        id: InodeId,
        offset: u64,
        len: usize,
    ) -> Result<Option<InPlace>> {
        let attr = self.getattr(id)?;
        let Some(end) = offset.checked_add(len as u64) else {
            return Ok(None);
        };
        if attr.kind != FileKind::File
            || attr.flags & INODE_FLAG_NODATACOW == 0
            || attr.flags & (INODE_FLAG_IMMUTABLE | INODE_FLAG_APPEND) != 0
            || len == 0
            || end > attr.size
            || self.check_subvol_writable(id.subvol).is_err()
        {
            return Ok(None);
        }
        let Some(owned) = self.owned_range(id, offset, end, false)? else {
            return Ok(None);
        };
        let mut pieces = Vec::with_capacity(owned.len());
        for o in &owned {
            let Some(logical) = o.bytenr.checked_add(o.ext_off) else {
                return Ok(None);
            };
            let from = (o.at - offset) as usize;
            pieces.push((logical, from..from + o.len as usize));
        }
        if !self.no_csums(&pieces)? {
            return Ok(None);
        }
        // The kernel's coarse clock: it moves once per tick, so does the inode.
        let t = crate::inode::inode_item::now();
        let now = Timespec {
            sec: t.sec,
            nsec: t.nsec,
        };
        let touch = (attr.mtime != now || attr.ctime != now).then_some(now);
        Ok(Some(InPlace {
            pieces,
            touch,
            io: std::sync::Arc::clone(&self.io),
            _pin: self.pipe.pin_read(self.running_transid()),
        }))
    }

    /// `[start, end)` of `id` cut at its items, if every part lies in an extent this file
    /// alone may write in place (regular extents, or prealloc ones with `prealloc`).
    pub(crate) fn owned_range(
        &self,
        id: InodeId,
        start: u64,
        end: u64,
        prealloc: bool,
    ) -> Result<Option<Vec<Owned>>> {
        let last_snapshot = self.last_snapshot_of(id.subvol)?;
        let mut out = Vec::new();
        let mut at = start;
        for m in self.mappings(id, start, end)? {
            let file_end = m.file_start.saturating_add(m.file_len).min(end);
            if file_end <= at {
                continue;
            }
            // A gap is a hole (NO_HOLES): nothing to write in place.
            if m.file_start > at
                || self
                    .nocow_target(id, &m, last_snapshot, prealloc)?
                    .is_none()
            {
                return Ok(None);
            }
            let Some((_, bytenr, disk_len, ext_off)) = m.extent else {
                return Ok(None);
            };
            let Some(ext_off) = ext_off.checked_add(at - m.file_start) else {
                return Ok(None);
            };
            out.push(Owned {
                at,
                len: file_end - at,
                bytenr,
                disk_len,
                ext_off,
            });
            at = file_end;
        }
        Ok((at >= end).then_some(out))
    }

    /// The logical address of mapping `m`'s first byte if its extent can be written in
    /// place by `id`: regular (or `prealloc`), uncompressed, newer than the last snapshot,
    /// and referenced by this file's items alone with nothing queued against it.
    fn nocow_target(
        &self,
        id: InodeId,
        m: &Mapping,
        last_snapshot: u64,
        prealloc: bool,
    ) -> Result<Option<u64>> {
        let Some((p, bytenr, disk_len, ext_off)) = m.extent else {
            return Ok(None);
        };
        if p != prealloc {
            return Ok(None);
        }
        if bytenr == 0 || m.compression != Compression::None || m.generation <= last_snapshot {
            return Ok(None);
        }
        let Some(ref_offset) = m.file_start.checked_sub(ext_off) else {
            return Ok(None);
        };
        let ours = DataRef {
            root: id.subvol,
            objectid: id.ino,
            offset: ref_offset,
        };
        // References queued in the running transaction: only ours may change.
        let head = self.running.as_ref().and_then(|t| t.refs.data_head(bytenr));
        if head.is_some_and(|h| h.refs.iter().any(|(r, &d)| d != 0 && *r != ours)) {
            return Ok(None);
        }
        let Some(tree) = self
            .running_root(objectid::EXTENT_TREE)
            .map_or_else(|| self.tree_root(objectid::EXTENT_TREE), |r| Ok(Some(r)))?
        else {
            return Ok(None);
        };
        let key = Key::new(bytenr, item::EXTENT_ITEM, disk_len);
        let Some(body) = crate::ctree::lookup(self, &tree, &key)? else {
            // Allocated in this transaction: ours if the queued reference that makes it is.
            let created = head.is_some_and(|h| h.refs.get(&ours).is_some_and(|&d| d > 0));
            return Ok(created.then(|| ext_off.checked_add(bytenr)).flatten());
        };
        let Ok(ei) = ExtentItem::parse(&body, false) else {
            return Ok(None);
        };
        let only_ours = match ei.inline_refs.as_slice() {
            [InlineRef::Data {
                root,
                objectid,
                offset,
                count,
            }] => {
                *root == ours.root
                    && *objectid == ours.objectid
                    && *offset == ours.offset
                    && u64::from(*count) == ei.refs
            }
            _ => false,
        };
        if !only_ours || ei.generation <= last_snapshot {
            return Ok(None);
        }
        Ok(ext_off.checked_add(bytenr))
    }

    /// True if the csum tree has no checksum for any sector the pieces touch (an extent
    /// written while the file had checksums is never overwritten in place).
    fn no_csums(&self, pieces: &[(u64, Range<usize>)]) -> Result<bool> {
        let sector = u64::from(self.sb.sectorsize);
        for (logical, r) in pieces {
            let start = logical - logical % sector;
            let end = (logical + r.len() as u64).next_multiple_of(sector);
            if self.data_csums(start, end)?.iter().any(Option::is_some) {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// The in-place protocols under shuttle, which runs the threads through many
/// interleavings: `cargo test -p oleo --features model-check --lib nocow`.
#[cfg(all(test, feature = "model-check"))]
mod model {
    use super::*;
    use shuttle::sync::Arc;
    use shuttle::thread;

    const FILE: InodeId = InodeId {
        subvol: 5,
        ino: 257,
    };

    /// An extent written in place by two writers (check it is not shared, then write,
    /// holding the shared lock across both) while a snapshot takes the lock alone to
    /// share it: no write lands in the extent once the snapshot shares it, and a write
    /// that found it shared does not write (it would copy).
    fn writes_against_a_snapshot() {
        struct Extent {
            shared: bool,
            data: u64,
            snapshot: Option<u64>,
        }
        let locks = Arc::new(NocowWriters::default());
        let extent = Arc::new(Mutex::new(Extent {
            shared: false,
            data: 0,
            snapshot: None,
        }));
        let mut handles = Vec::new();
        for w in 1..=2u64 {
            let (locks, extent) = (Arc::clone(&locks), Arc::clone(&extent));
            handles.push(thread::spawn(move || {
                let _g = locks.shared();
                let in_place = !extent.lock().unwrap().shared;
                thread::yield_now();
                if in_place {
                    let mut e = extent.lock().unwrap();
                    assert!(!e.shared, "an in-place write went through a snapshot");
                    e.data = w;
                }
            }));
        }
        {
            let (locks, extent) = (Arc::clone(&locks), Arc::clone(&extent));
            handles.push(thread::spawn(move || {
                let _g = locks.exclusive();
                let mut e = extent.lock().unwrap();
                e.shared = true;
                e.snapshot = Some(e.data);
            }));
        }
        for h in handles {
            h.join().unwrap();
        }
        let e = extent.lock().unwrap();
        assert_eq!(
            e.snapshot,
            Some(e.data),
            "the snapshot's data changed after it"
        );
    }

    /// Prealloc fills of overlapping ranges never hold them at once; every fill finishes.
    fn fills_hold_their_ranges_alone() {
        let locks = Arc::new(NocowWriters::default());
        let holding = Arc::new(Mutex::new(Vec::<(u64, u64)>::new()));
        let mut handles = Vec::new();
        for (s, e) in [(0u64, 8u64), (4, 12), (8, 16), (0, 16)] {
            let (locks, holding) = (Arc::clone(&locks), Arc::clone(&holding));
            handles.push(thread::spawn(move || {
                let _r = locks.lock_range(FILE, s, e);
                {
                    let mut h = holding.lock().unwrap();
                    assert!(
                        !h.iter().any(|&(a, b)| a < e && s < b),
                        "two fills hold overlapping ranges"
                    );
                    h.push((s, e));
                }
                thread::yield_now();
                let mut h = holding.lock().unwrap();
                let i = h.iter().position(|&r| r == (s, e)).unwrap();
                h.swap_remove(i);
            }));
        }
        for h in handles {
            h.join().unwrap();
        }
        assert!(locks.filling.lock().unwrap().is_empty());
    }

    #[test]
    fn in_place_writes_never_write_through_a_snapshot() {
        shuttle::check_random(writes_against_a_snapshot, 3000);
        shuttle::check_pct(writes_against_a_snapshot, 3000, 3);
    }

    #[test]
    fn prealloc_fills_hold_their_ranges_alone() {
        shuttle::check_random(fills_hold_their_ranges_alone, 3000);
        shuttle::check_pct(fills_hold_their_ranges_alone, 3000, 3);
    }
}
