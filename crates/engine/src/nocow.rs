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
//! change of its extents. A write the checks refuse (shared, compressed, prealloc, past
//! the end of file) takes the copy-on-write path, which copies once; the new extent is
//! then this file's alone and takes later writes in place.
//!
//! Durability: nothing in the trees records an in-place write, so the file goes into
//! `unsynced` and its next fsync flushes the device even when it has nothing to log.

use crate::delayed_ref::DataRef;
use crate::error::Result;
use crate::file::Mapping;
use crate::filesystem::Filesystem;
use crate::fs::{FileKind, FsCore, InodeId, Timespec};
use crate::inode_ops::SetAttr;
use crate::reservation::Reserve;
use oleo_format::items::{
    Compression, ExtentItem, InlineRef, INODE_FLAG_APPEND, INODE_FLAG_IMMUTABLE,
    INODE_FLAG_NODATACOW,
};
use oleo_format::key::{item, objectid, Key};
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::collections::HashSet;
use std::ops::Range;

/// In-place writers against what would share their extents (the kernel's drew lock):
/// in-place writes hold it shared while their data goes out; a snapshot or a subvolume
/// deletion holds it alone. Taken after the inode locks, before the filesystem's.
#[derive(Default)]
pub(crate) struct NocowWriters {
    lock: RwLock<()>,
    /// Files written in place since their last fsync.
    unsynced: parking_lot::Mutex<HashSet<InodeId>>,
    /// File ranges whose prealloc items are being turned into written ones: writes that
    /// fill prealloc share the file's lock, so each holds its range alone.
    filling: parking_lot::Mutex<Vec<(InodeId, u64, u64)>>,
    filled: parking_lot::Condvar,
}

/// A range of a file held by one prealloc fill.
pub(crate) struct RangeGuard<'a> {
    owner: &'a NocowWriters,
    range: (InodeId, u64, u64),
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut held = self.owner.filling.lock();
        if let Some(i) = held.iter().position(|r| *r == self.range) {
            held.swap_remove(i);
        }
        self.owner.filled.notify_all();
    }
}

impl NocowWriters {
    pub(crate) fn shared(&self) -> RwLockReadGuard<'_, ()> {
        self.lock.try_read().unwrap_or_else(|| {
            crate::blocking::will_wait();
            self.lock.read()
        })
    }

    pub(crate) fn exclusive(&self) -> RwLockWriteGuard<'_, ()> {
        self.lock.try_write().unwrap_or_else(|| {
            crate::blocking::will_wait();
            self.lock.write()
        })
    }

    /// True if `id` was written in place since the last call (an fsync must flush).
    pub(crate) fn take_unsynced(&self, id: InodeId) -> bool {
        self.unsynced.lock().remove(&id)
    }

    /// `[start, end)` of `id` alone among prealloc fills.
    fn lock_range(&self, id: InodeId, start: u64, end: u64) -> RangeGuard<'_> {
        let mut held = self.filling.lock();
        while held
            .iter()
            .any(|&(i, s, e)| i == id && s < end && start < e)
        {
            crate::blocking::will_wait();
            self.filled.wait(&mut held);
        }
        held.push((id, start, end));
        RangeGuard {
            owner: self,
            range: (id, start, end),
        }
    }

    pub(crate) fn mark_unsynced(&self, id: InodeId) {
        self.unsynced.lock().insert(id);
    }
}

/// An in-place write worked out: where each part of the data goes, and the time stamps
/// to set first (None while the coarse clock has not moved since the last write).
struct InPlace {
    pieces: Vec<(u64, Range<usize>)>,
    touch: Option<Timespec>,
    io: std::sync::Arc<crate::disk_io::DiskIo>,
    _pin: crate::commit_pipe::ReadPin,
}

/// The clock file times come from in the kernel (jiffies): an in-place write updates
/// the inode only when it moved, so a stream of writes changes no item between ticks.
fn coarse_now() -> Timespec {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    Timespec {
        sec: ts.tv_sec,
        nsec: ts.tv_nsec as u32,
    }
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
    fn plan_in_place(&self, id: InodeId, offset: u64, len: usize) -> Result<Option<InPlace>> {
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
        let last_snapshot = self.last_snapshot_of(id.subvol)?;
        let mut pieces = Vec::new();
        let mut at = offset;
        for m in self.mappings(id, offset, end)? {
            let file_end = m.file_start.saturating_add(m.file_len).min(end);
            if file_end <= at {
                continue;
            }
            if m.file_start > at {
                return Ok(None); // a hole (NO_HOLES)
            }
            let Some(logical) = self.nocow_target(id, &m, last_snapshot, false)? else {
                return Ok(None);
            };
            let Some(logical) = logical.checked_add(at - m.file_start) else {
                return Ok(None);
            };
            pieces.push((
                logical,
                (at - offset) as usize..(file_end - offset) as usize,
            ));
            at = file_end;
        }
        if at < end || !self.no_csums(&pieces)? {
            return Ok(None);
        }
        let now = coarse_now();
        let touch = (attr.mtime != now || attr.ctime != now).then_some(now);
        Ok(Some(InPlace {
            pieces,
            touch,
            io: std::sync::Arc::clone(&self.io),
            _pin: self.pipe.pin_read(self.running_transid()),
        }))
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

impl Filesystem {
    /// `write`'s in-place path for a NODATACOW file: Ok(None) when the write must take the
    /// copy-on-write path.
    pub(crate) fn write_in_place(
        &self,
        id: InodeId,
        offset: u64,
        data: &[u8],
        uncached: bool,
    ) -> Result<Option<usize>> {
        let _file = self.inode_locks().lock_shared(id);
        let _nocow = self.nocow_writers().shared();
        let Some(plan) = self.lookup_op(|core| core.plan_in_place(id, offset, data.len()))? else {
            return Ok(None);
        };
        if let Some(t) = plan.touch {
            let set = SetAttr {
                mtime: Some(t),
                ctime: Some(t),
                ..SetAttr::default()
            };
            self.core_mut().setattr(id, &set)?;
        }
        for (logical, r) in &plan.pieces {
            plan.io
                .write_logical_mode(*logical, &data[r.clone()], uncached)?;
        }
        self.nocow_writers().mark_unsynced(id);
        Ok(Some(data.len()))
    }
}

/// A prealloc range filled in place: its file offset and length, and its extent
/// (disk_bytenr, disk_num_bytes, and the offset of the range's first byte in it).
struct Filled {
    at: u64,
    len: u64,
    bytenr: u64,
    disk_len: u64,
    ext_off: u64,
}

/// A write into preallocated extents worked out: the sector-aligned buffer for
/// `[start, start + len)` (zeros around the data, as prealloc reads) and where it goes.
struct FillPlan {
    start: u64,
    buf: crate::device::IoBuf,
    len: usize,
    pieces: Vec<Filled>,
    sums: bool,
}

impl FsCore {
    /// The write of `data` at `offset` into preallocated extents of `id`, if every sector
    /// it touches is one this file alone references (the kernel's can_nocow_extent).
    fn plan_prealloc_fill(
        &self,
        id: InodeId,
        offset: u64,
        data: &[u8],
    ) -> Result<Option<FillPlan>> {
        let attr = self.getattr(id)?;
        let sector = u64::from(self.sb.sectorsize);
        let Some(end) = offset.checked_add(data.len() as u64) else {
            return Ok(None);
        };
        // Growing past a partial last sector needs it zeroed first: the copy path's job.
        if attr.kind != FileKind::File
            || data.is_empty()
            || end > i64::MAX as u64
            || end > attr.size && !attr.size.is_multiple_of(sector)
        {
            return Ok(None);
        }
        let (a, b) = (offset - offset % sector, end.next_multiple_of(sector));
        let last_snapshot = self.last_snapshot_of(id.subvol)?;
        let mut pieces = Vec::new();
        let mut at = a;
        for m in self.mappings(id, a, b)? {
            let file_end = m.file_start.saturating_add(m.file_len).min(b);
            if file_end <= at {
                continue;
            }
            if m.file_start > at || self.nocow_target(id, &m, last_snapshot, true)?.is_none() {
                return Ok(None);
            }
            let Some((_, bytenr, disk_len, ext_off)) = m.extent else {
                return Ok(None);
            };
            pieces.push(Filled {
                at,
                len: file_end - at,
                bytenr,
                disk_len,
                ext_off: ext_off + (at - m.file_start),
            });
            at = file_end;
        }
        if at < b {
            return Ok(None);
        }
        let len = (b - a) as usize;
        let mut buf = self.take_staging(len);
        buf[..len].fill(0);
        buf[(offset - a) as usize..(end - a) as usize].copy_from_slice(data);
        Ok(Some(FillPlan {
            start: a,
            buf,
            len,
            pieces,
            sums: attr.flags & oleo_format::items::INODE_FLAG_NODATASUM == 0,
        }))
    }
}

impl crate::transaction::Transaction<'_> {
    /// The kernel's btrfs_mark_extent_written: the filled ranges of prealloc items become
    /// regular items on the same extents (the rest stays prealloc), with their checksums;
    /// the file grows to `end` if it was smaller.
    fn mark_extent_written(
        &mut self,
        id: InodeId,
        pieces: &[Filled],
        sums: &[Vec<u8>],
        end: u64,
    ) -> Result<()> {
        let mut inode = self.read_inode(id)?;
        for (i, p) in pieces.iter().enumerate() {
            let dropped = self.drop_extents(id, p.at, p.at + p.len)?;
            inode.nbytes = inode.nbytes.saturating_sub(dropped);
            let body = oleo_format::items::FileExtent {
                generation: self.transid,
                ram_bytes: p.disk_len,
                compression: Compression::None,
                body: oleo_format::items::FileExtentBody::Extent {
                    prealloc: false,
                    disk_bytenr: p.bytenr,
                    disk_num_bytes: p.disk_len,
                    offset: p.ext_off,
                    num_bytes: p.len,
                },
            }
            .to_bytes();
            self.insert_item(id.subvol, Key::new(id.ino, item::EXTENT_DATA, p.at), &body)?;
            let r = DataRef {
                root: id.subvol,
                objectid: id.ino,
                offset: p.at - p.ext_off,
            };
            self.add_data_ref(p.bytenr, p.disk_len, r)?;
            inode.nbytes = inode.nbytes.saturating_add(p.len);
            if let Some(s) = sums.get(i).filter(|s| !s.is_empty()) {
                self.insert_csum_bytes(p.bytenr + p.ext_off, s)?;
            }
        }
        let t = crate::inode_item::now();
        inode.size = inode.size.max(end);
        inode.mtime = t;
        inode.ctime = t;
        self.write_inode(id, &mut inode)
    }
}

impl Filesystem {
    /// `write`'s path into preallocated extents: the data goes where fallocate put its
    /// space, then the items say it is written. Ok(None) when the range is not all
    /// prealloc this file alone references.
    pub(crate) fn fill_prealloc(
        &self,
        id: InodeId,
        offset: u64,
        data: &[u8],
        uncached: bool,
    ) -> Result<Option<usize>> {
        // Fills of other ranges (and in-place writes) go on beside this one; changes of
        // the file's items from anything else wait for the file's lock.
        let _file = self.inode_locks().lock_shared(id);
        let sector = u64::from(self.core_read().sb.sectorsize);
        let end = offset.saturating_add(data.len() as u64);
        let _range = self.nocow_writers().lock_range(
            id,
            offset - offset % sector,
            end.saturating_add(sector - 1) / sector * sector,
        );
        let _nocow = self.nocow_writers().shared();
        let Some(plan) = self.lookup_op(|core| core.plan_prealloc_fill(id, offset, data))? else {
            return Ok(None);
        };
        let r = self.write_fill(id, offset + data.len() as u64, &plan, uncached);
        self.core_read().give_back_staging(plan.buf);
        r.map(|()| Some(data.len()))
    }

    fn write_fill(&self, id: InodeId, end: u64, plan: &FillPlan, uncached: bool) -> Result<()> {
        let (io, csum, sector) = {
            let core = self.core_read();
            core.check_subvol_writable(id.subvol)?;
            core.check_not_immutable(id)?;
            let sb = core.superblock();
            (
                std::sync::Arc::clone(&core.io),
                sb.csum_type(),
                sb.sectorsize as usize,
            )
        };
        let mut sums = Vec::with_capacity(plan.pieces.len());
        for p in &plan.pieces {
            let from = (p.at - plan.start) as usize;
            let piece = &plan.buf[from..from + p.len as usize];
            io.write_logical_mode(p.bytenr + p.ext_off, piece, uncached)?;
            sums.push(if plan.sums {
                crate::file_item::data_csums(csum, sector, piece)
            } else {
                Vec::new()
            });
        }
        debug_assert_eq!(
            plan.len as u64,
            plan.pieces.iter().map(|p| p.len).sum::<u64>()
        );
        let csums: u64 = sums.iter().map(|s| s.len() as u64).sum();
        let need = Reserve::items(4 * plan.pieces.len() as u64 + 4).bulk(csums);
        self.core_mut().write_op(need, |t| {
            t.mark_extent_written(id, &plan.pieces, &sums, end)
        })
    }
}
