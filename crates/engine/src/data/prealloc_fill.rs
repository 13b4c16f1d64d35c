//! Writes into preallocated extents (fallocate's unwritten space), in place as the kernel
//! writes them: the data goes where fallocate put the space, then the kernel's
//! btrfs_mark_extent_written turns the written range of the prealloc items into regular
//! items on the same extent (the rest stays prealloc), with checksums for a checksummed
//! file. Only extents this file alone references (`nocow::nocow_target`) qualify; others
//! take the copy-on-write path.
//!
//! Fills share the file's lock with each other and with in-place writes, and each holds
//! its own sector range alone (`NocowWriters::lock_range`), so fills of different parts of
//! a file have their data in flight together.
//!
//! The items change later, as the kernel finishes ordered extents after their data IO
//! (btrfs_finish_one_ordered): a fill that does not grow the file queues its item change
//! (`FillQueue`) once its data is on the device, and returns. Queued changes are applied in
//! batches, under one hold of the filesystem's lock, by one writer at a time. Until its
//! change is applied a fill keeps its range, and every other use of the filesystem's state
//! (`Filesystem::core_read`, `core_mut`, `lookup_op`: reads, stat, fsync, fiemap, commits,
//! snapshots, ...) first waits for every change queued before it: nothing sees a range
//! as preallocated after its write returned. Only the write path's own planning looks
//! without waiting: it reads nothing a queued change alters.

use crate::data::file_write::extent_item;
use crate::data::nocow::Owned;
use crate::error::Result;
use crate::sync::{Condvar, Mutex, MutexGuard};
use crate::transaction::fs::{FileKind, FsCore, InodeId};
use crate::transaction::space::delayed_ref::DataRef;
use oleo_format::items::Compression;
use oleo_format::key::{item, Key};
use oleo_format::tree_mut::LeafMut;
use oleo_format::FormatError;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

/// A fill whose data is on the device, waiting for `mark_extent_written`. It holds its
/// range (`NocowWriters::lock_range`) until then.
pub(crate) struct PendingFill {
    pub(crate) id: InodeId,
    pub(crate) pieces: Vec<Owned>,
    pub(crate) sums: Vec<Vec<u8>>,
    pub(crate) end: u64,
    pub(crate) keep_times: bool,
    pub(crate) range: (InodeId, u64, u64),
}

/// Item changes of fills, queued in the order their writes finished and applied in that
/// order. At most one thread applies at a time (the applier); it takes every change
/// queued, applies them, and goes on while more come, unless a writer stands ready to
/// take over (the successor), so that no write waits behind more than about one batch
/// of others. The queue is never left non-empty with nobody to apply it: the applier stops
/// only on an empty queue or with a successor waiting.
#[derive(Default)]
pub(crate) struct FillQueue {
    state: Mutex<QueueState>,
    changed: Condvar,
    /// Changes queued and not yet applied (`next - applied`), read without the mutex.
    outstanding: AtomicU64,
}

#[derive(Default)]
struct QueueState {
    /// Tickets handed out: one per queued change, in queue order.
    next: u64,
    /// Every change with a ticket below this is applied (or failed and aborted).
    applied: u64,
    queued: VecDeque<PendingFill>,
    applying: bool,
    successor: bool,
}

/// Applies a batch of changes, in order. It must not fail: a change it cannot make leaves
/// a write that returned without its items, so it aborts the filesystem instead.
pub(crate) type ApplyFn<'a> = &'a dyn Fn(Vec<PendingFill>);

impl FillQueue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&self, st: MutexGuard<'a, QueueState>) -> MutexGuard<'a, QueueState> {
        crate::blocking::will_wait();
        self.changed.wait(st).unwrap_or_else(|p| p.into_inner())
    }

    /// True while some queued change is not applied.
    pub(crate) fn busy(&self) -> bool {
        self.outstanding.load(Ordering::SeqCst) != 0
    }

    /// Queues `fill`'s change. Returns at once when another thread will apply it; else this
    /// thread applies queued changes (its own among them) before it returns.
    pub(crate) fn push(&self, fill: PendingFill, apply: ApplyFn<'_>) {
        let mut st = self.lock();
        st.queued.push_back(fill);
        st.next += 1;
        self.outstanding
            .store(st.next - st.applied, Ordering::SeqCst);
        if st.applying {
            if st.successor {
                // The applier goes on until the successor takes over, and the successor
                // until the queue is empty: this change is in hand.
                return;
            }
            st.successor = true;
            while st.applying {
                st = self.wait(st);
            }
            st.successor = false;
        }
        st.applying = true;
        drop(self.serve(st, apply));
    }

    /// Returns once every change queued before this call is applied; applies them itself
    /// when nobody is applying.
    pub(crate) fn drain(&self, apply: ApplyFn<'_>) {
        if !self.busy() {
            return;
        }
        let mut st = self.lock();
        let target = st.next;
        while st.applied < target {
            if st.applying {
                st = self.wait(st);
            } else {
                st.applying = true;
                st = self.serve(st, apply);
            }
        }
    }

    /// The applier's loop (`applying` set by the caller): batches until the queue is empty
    /// or a successor waits; then lets go of `applying`.
    fn serve<'a>(
        &'a self,
        mut st: MutexGuard<'a, QueueState>,
        apply: ApplyFn<'_>,
    ) -> MutexGuard<'a, QueueState> {
        // If `apply` unwinds, its batch counts as done and `applying` is let go, or every
        // later write and drain would wait for it.
        struct Stop<'q>(&'q FillQueue, Option<u64>);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                if let Some(through) = self.1 {
                    let mut st = self.0.lock();
                    st.applied = through;
                    self.0
                        .outstanding
                        .store(st.next - st.applied, Ordering::SeqCst);
                    st.applying = false;
                    self.0.changed.notify_all();
                }
            }
        }
        let mut stop = Stop(self, None);
        while !st.queued.is_empty() {
            let batch: Vec<PendingFill> = st.queued.drain(..).collect();
            let through = st.next;
            drop(st);
            stop.1 = Some(through);
            apply(batch);
            stop.1 = None;
            st = self.lock();
            st.applied = through;
            self.outstanding
                .store(st.next - st.applied, Ordering::SeqCst);
            self.changed.notify_all();
            if st.successor {
                break;
            }
        }
        st.applying = false;
        self.changed.notify_all();
        st
    }
}

/// A write into preallocated extents worked out: the sector-aligned buffer for
/// `[start, start + len)` (zeros around the data, as prealloc reads; None when the data
/// itself is sector-aligned and goes out as it is) and where it goes.
pub(crate) struct FillPlan {
    pub(crate) start: u64,
    pub(crate) buf: Option<crate::io::device::IoBuf>,
    pub(crate) len: usize,
    pub(crate) pieces: Vec<Owned>,
    pub(crate) sums: bool,
}

impl FsCore {
    /// The write of `data` at `offset` into preallocated extents of `id`, if every sector
    /// it touches is one this file alone references (the kernel's can_nocow_extent).
    pub(crate) fn plan_prealloc_fill(
        &self,
        id: InodeId,
        offset: u64,
        data: &[u8],
        may_grow: bool,
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
            || end > attr.size && (!may_grow || !attr.size.is_multiple_of(sector))
        {
            return Ok(None);
        }
        let (a, b) = (offset - offset % sector, end.next_multiple_of(sector));
        let Some(pieces) = self.owned_range(id, a, b, true)? else {
            return Ok(None);
        };
        let len = (b - a) as usize;
        // Only a write that starts or ends inside a sector is staged: the rest of those
        // sectors reads as zeros.
        let buf = (a != offset || b != end).then(|| {
            let mut buf = self.take_staging(len);
            let (from, to) = ((offset - a) as usize, (end - a) as usize);
            buf[..from].fill(0);
            buf[from..to].copy_from_slice(data);
            buf[to..len].fill(0);
            buf
        });
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
    pub(crate) fn mark_extent_written(
        &mut self,
        id: InodeId,
        pieces: &[Owned],
        sums: &[Vec<u8>],
        end: u64,
        keep_times: bool,
    ) -> Result<()> {
        let mut inode = self.read_inode(id)?;
        // Growing (the file's lock held alone): where the format wants explicit holes, the
        // old end up to the range gets one, as a write past the end gets it.
        if let Some(first) = pieces.first().filter(|_| end > inode.size) {
            let sector = u64::from(self.filesystem().sb.sectorsize);
            let dropped = self.insert_hole(id, inode.size.next_multiple_of(sector), first.at)?;
            inode.nbytes = inode.nbytes.saturating_sub(dropped);
        }
        for (i, p) in pieces.iter().enumerate() {
            // A piece inside one prealloc item of a leaf with room is done in that leaf
            // (nbytes stays: prealloc bytes count as written ones do); else item by item.
            if !self.mark_written_in_leaf(id, p)? {
                let dropped = self.drop_extents(id, p.at, p.at + p.len)?;
                inode.nbytes = inode.nbytes.saturating_sub(dropped);
                self.insert_written(id, p)?;
                inode.nbytes = inode.nbytes.saturating_add(p.len);
            }
            if let Some(s) = sums.get(i).filter(|s| !s.is_empty()) {
                self.insert_csum_bytes(p.bytenr + p.ext_off, s)?;
            }
        }
        inode.size = inode.size.max(end);
        if !keep_times {
            let t = crate::inode::inode_item::now();
            inode.mtime = t;
            inode.ctime = t;
        }
        self.write_inode(id, &mut inode)
    }

    /// `mark_extent_written` for a piece that lies inside one prealloc item, done under one
    /// descent as the kernel does it: the item is cut where the piece starts and ends, and
    /// the written part joins a mergeable regular neighbour in the same leaf (the kernel
    /// merges within the leaf only, too). False, with nothing changed, when the item is
    /// not in the leaf the search ends in, the piece reaches past it, or the leaf has no
    /// room for the items a cut adds: the caller then goes item by item.
    fn mark_written_in_leaf(&mut self, id: InodeId, p: &Owned) -> Result<bool> {
        let transid = self.transid;
        let key = Key::new(id.ino, item::EXTENT_DATA, p.at);
        let edit = self.edit_leaf(id.subvol, &key, |leaf, slot, found| {
            written_in_leaf(leaf, slot, found, id.ino, p, transid)
        })?;
        let Some(edit) = edit else {
            return Ok(false);
        };
        self.note_file_range(id.subvol, id.ino, edit.from, edit.to);
        let r = DataRef {
            root: id.subvol,
            objectid: id.ino,
            offset: p.at - p.ext_off,
        };
        for _ in 0..edit.refs.max(0) {
            self.add_data_ref(p.bytenr, p.disk_len, r)?;
        }
        for _ in 0..(-edit.refs).max(0) {
            self.drop_data_ref(p.bytenr, p.disk_len, r)?;
        }
        Ok(true)
    }

    /// The regular item for the written piece `p` (its range emptied by the caller),
    /// joined with a regular neighbour on either side that maps the same extent at the
    /// same shift, as the kernel's btrfs_mark_extent_written merges them (extent_mergeable):
    /// a file filled piece by piece ends as one item, not one per write. Each item holds
    /// one reference to the extent, so a join that leaves one item where there were two
    /// drops one.
    fn insert_written(&mut self, id: InodeId, p: &Owned) -> Result<()> {
        // The file offset at which the extent would begin under this mapping; every
        // item mergeable with this one maps the extent from the same place.
        let base = p.at - p.ext_off;
        let key = |at: u64| Key::new(id.ino, item::EXTENT_DATA, at);
        let prev = match p.at.checked_sub(1) {
            Some(before) => self
                .lookup_le(id.subvol, &key(before))?
                .and_then(|(k, b)| mergeable(&b, p.bytenr, k.offset, base).map(|n| (k, n)))
                .filter(|(k, n)| k.offset + n == p.at),
            None => None,
        };
        let next_key = key(p.at + p.len);
        let next = self
            .lookup(id.subvol, &next_key)?
            .and_then(|b| mergeable(&b, p.bytenr, next_key.offset, base));
        let r = DataRef {
            root: id.subvol,
            objectid: id.ino,
            offset: base,
        };
        // The item starts where the previous one did, or at the piece.
        let (at, before) = prev.map_or((p.at, 0), |(k, n)| (k.offset, n));
        let body = extent_item(
            self.transid,
            p.disk_len,
            Compression::None,
            false,
            p.bytenr,
            p.disk_len,
            at - base,
            before + p.len + next.unwrap_or(0),
        );
        if next.is_some() {
            self.delete_item(id.subvol, &next_key)?;
        }
        match (prev.is_some(), next.is_some()) {
            // The new piece adds an item and a reference.
            (false, false) => {
                self.insert_item(id.subvol, key(at), &body)?;
                self.add_data_ref(p.bytenr, p.disk_len, r)
            }
            // The next item's reference passes to the one that replaces it.
            (false, true) => self.insert_item(id.subvol, key(at), &body),
            // The previous item grows over the piece.
            (true, false) => self.replace_item(id.subvol, &key(at), &body),
            // ... and over the next one, whose reference goes.
            (true, true) => {
                self.replace_item(id.subvol, &key(at), &body)?;
                self.drop_data_ref(p.bytenr, p.disk_len, r)
            }
        }
    }
}

/// What `written_in_leaf` changed: the file range whose items changed, and the references
/// to the extent it added (positive) or dropped (negative), one per item.
struct LeafEdit {
    from: u64,
    to: u64,
    refs: i32,
}

/// The body of an uncompressed EXTENT_DATA item.
#[allow(clippy::too_many_arguments)]
fn put_extent(
    leaf: &mut LeafMut<'_>,
    slot: usize,
    generation: u64,
    ram_bytes: u64,
    prealloc: bool,
    bytenr: u64,
    disk_len: u64,
    offset: u64,
    num_bytes: u64,
) -> std::result::Result<(), FormatError> {
    let body = extent_item(
        generation,
        ram_bytes,
        Compression::None,
        prealloc,
        bytenr,
        disk_len,
        offset,
        num_bytes,
    );
    let dst = leaf.item_body_mut(slot)?;
    if dst.len() != body.len() {
        return Err(FormatError::Invalid(
            "file extent item of an unexpected size".into(),
        ));
    }
    dst.copy_from_slice(&body);
    Ok(())
}

/// The leaf-local half of `mark_written_in_leaf`: `slot` and `found` are where the search
/// for the piece's start ended. None, with the leaf untouched, unless the piece lies inside
/// one prealloc item of this leaf and the leaf has room for what the cut adds.
fn written_in_leaf(
    leaf: &mut LeafMut<'_>,
    slot: usize,
    found: bool,
    ino: u64,
    p: &Owned,
    transid: u64,
) -> std::result::Result<Option<LeafEdit>, FormatError> {
    use oleo_format::items::{FileExtent, FileExtentBody};
    // Item header and body of a regular or prealloc file extent item.
    const ITEM: usize = oleo_format::tree_block::ITEM_SIZE + 53;
    let n = leaf.nritems();
    let c = match (found, slot) {
        (true, s) => s,
        (false, s) if s > 0 => s - 1,
        _ => return Ok(None),
    };
    if c >= n {
        return Ok(None);
    }
    let ck = leaf.key(c)?;
    if ck.objectid != ino || ck.item_type != item::EXTENT_DATA {
        return Ok(None);
    }
    let Ok(fe) = FileExtent::parse(leaf.item_body(c)?) else {
        return Ok(None);
    };
    let FileExtentBody::Extent {
        prealloc: true,
        disk_bytenr,
        disk_num_bytes,
        offset,
        num_bytes,
    } = fe.body
    else {
        return Ok(None);
    };
    let (s, a, b) = (ck.offset, p.at, p.at + p.len);
    let Some(e) = s.checked_add(num_bytes) else {
        return Ok(None);
    };
    if fe.compression != Compression::None
        || disk_bytenr != p.bytenr
        || disk_num_bytes != p.disk_len
        || a < s
        || b > e
        || offset.checked_add(a - s) != Some(p.ext_off)
    {
        return Ok(None);
    }
    let base = a - p.ext_off;
    let (gen, ram) = (fe.generation, fe.ram_bytes);
    // A regular neighbour of the same extent at the same shift, touching the piece.
    let neighbour =
        |leaf: &LeafMut<'_>, at: usize| -> std::result::Result<Option<(u64, u64)>, FormatError> {
            if at >= n {
                return Ok(None);
            }
            let k = leaf.key(at)?;
            if k.objectid != ino || k.item_type != item::EXTENT_DATA {
                return Ok(None);
            }
            Ok(mergeable(leaf.item_body(at)?, p.bytenr, k.offset, base).map(|len| (k.offset, len)))
        };
    let prev = match c.checked_sub(1) {
        Some(before) if a == s => neighbour(leaf, before)?.filter(|(k, len)| k + len == a),
        _ => None,
    };
    let next = if b == e {
        neighbour(leaf, c + 1)?.filter(|(k, _)| *k == b)
    } else {
        None
    };
    let added = match (a == s, b == e) {
        (true, true) => 0,
        (false, false) => 2,
        (true, false) => usize::from(prev.is_none()),
        (false, true) => usize::from(next.is_none()),
    };
    if leaf.free_space() < added * ITEM {
        return Ok(None);
    }
    let written = |leaf: &mut LeafMut<'_>, slot: usize, at: u64, len: u64| {
        put_extent(
            leaf,
            slot,
            transid,
            p.disk_len,
            false,
            p.bytenr,
            p.disk_len,
            at - base,
            len,
        )
    };
    let tail = |leaf: &mut LeafMut<'_>, slot: usize, from: u64| {
        put_extent(
            leaf,
            slot,
            gen,
            ram,
            true,
            p.bytenr,
            p.disk_len,
            offset + (from - s),
            e - from,
        )
    };
    let at_key = |at: u64| Key::new(ino, item::EXTENT_DATA, at);
    let from = prev.map_or(s, |(k, _)| k);
    let to = next.map_or(e, |(k, len)| k + len);
    let refs = match (a == s, b == e) {
        (true, true) => {
            match (prev, next) {
                (Some((pk, plen)), Some((_, nlen))) => {
                    written(leaf, c - 1, pk, plen + p.len + nlen)?;
                    leaf.remove_items(c, 2)?;
                }
                (Some((pk, plen)), None) => {
                    written(leaf, c - 1, pk, plen + p.len)?;
                    leaf.remove_items(c, 1)?;
                }
                (None, Some((_, nlen))) => {
                    written(leaf, c, a, p.len + nlen)?;
                    leaf.remove_items(c + 1, 1)?;
                }
                (None, None) => written(leaf, c, a, p.len)?,
            }
            -i32::from(prev.is_some()) - i32::from(next.is_some())
        }
        (true, false) => {
            // The prealloc item keeps what follows the piece.
            leaf.set_key(c, at_key(b))?;
            tail(leaf, c, b)?;
            match prev {
                Some((pk, plen)) => {
                    written(leaf, c - 1, pk, plen + p.len)?;
                    0
                }
                None => {
                    leaf.insert_item(c, at_key(a), 53)?;
                    written(leaf, c, a, p.len)?;
                    1
                }
            }
        }
        (false, true) => {
            put_extent(leaf, c, gen, ram, true, p.bytenr, p.disk_len, offset, a - s)?;
            match next {
                Some((_, nlen)) => {
                    leaf.set_key(c + 1, at_key(a))?;
                    written(leaf, c + 1, a, p.len + nlen)?;
                    0
                }
                None => {
                    leaf.insert_item(c + 1, at_key(a), 53)?;
                    written(leaf, c + 1, a, p.len)?;
                    1
                }
            }
        }
        (false, false) => {
            put_extent(leaf, c, gen, ram, true, p.bytenr, p.disk_len, offset, a - s)?;
            leaf.insert_items(c + 1, &[(at_key(a), 53), (at_key(b), 53)])?;
            written(leaf, c + 1, a, p.len)?;
            tail(leaf, c + 2, b)?;
            2
        }
    };
    Ok(Some(LeafEdit { from, to, refs }))
}

/// The length of the EXTENT_DATA item `body` at file offset `at` if a written piece of
/// extent `bytenr`, mapped from file offset `base`, may join it: a regular, uncompressed
/// item of the same extent at the same shift (the kernel's extent_mergeable).
fn mergeable(body: &[u8], bytenr: u64, at: u64, base: u64) -> Option<u64> {
    use oleo_format::items::{FileExtent, FileExtentBody};
    let fe = FileExtent::parse(body).ok()?;
    match fe.body {
        FileExtentBody::Extent {
            prealloc: false,
            disk_bytenr,
            offset,
            num_bytes,
            ..
        } if fe.compression == Compression::None
            && disk_bytenr == bytenr
            && at.checked_sub(base) == Some(offset) =>
        {
            Some(num_bytes)
        }
        _ => None,
    }
}

/// An empty change of inode `ino`, for the queue's tests.
#[cfg(test)]
fn test_fill(ino: u64) -> PendingFill {
    let id = InodeId { subvol: 5, ino };
    PendingFill {
        id,
        pieces: Vec::new(),
        sums: Vec::new(),
        end: 0,
        keep_times: false,
        range: (id, 0, 0),
    }
}

/// The fill queue under shuttle: `cargo test -p oleo --features model-check --lib
/// prealloc_fill::model`.
#[cfg(all(test, feature = "model-check"))]
mod model {
    use super::*;
    use shuttle::sync::Arc;
    use shuttle::thread;

    use super::test_fill as fill;

    /// What the model's applications did: the inodes applied, in order, and whether an
    /// application is running.
    #[derive(Default)]
    struct Trees {
        applied: Vec<u64>,
        inside: bool,
    }

    fn apply_into(trees: &Mutex<Trees>, batch: Vec<PendingFill>) {
        assert!(
            !std::mem::replace(&mut trees.lock().unwrap().inside, true),
            "two applications at once"
        );
        thread::yield_now();
        let mut t = trees.lock().unwrap();
        t.applied.extend(batch.iter().map(|f| f.id.ino));
        t.inside = false;
    }

    /// Writers queue changes while another thread drains: every change is applied once, in
    /// queue order, one application at a time; a drain returns only after every change
    /// queued before it began; a writer never waits for ever (shuttle reports a
    /// deadlock), and nothing is left queued at the end.
    fn writers_and_a_drain() {
        let queue = Arc::new(FillQueue::default());
        let trees = Arc::new(Mutex::new(Trees::default()));
        let mut handles = Vec::new();
        for ino in 256..259u64 {
            let (queue, trees) = (Arc::clone(&queue), Arc::clone(&trees));
            handles.push(thread::spawn(move || {
                queue.push(fill(ino), &|b| apply_into(&trees, b));
                queue.push(fill(ino + 100), &|b| apply_into(&trees, b));
            }));
        }
        {
            let (queue, trees) = (Arc::clone(&queue), Arc::clone(&trees));
            handles.push(thread::spawn(move || {
                let queued_before = queue.lock().next;
                queue.drain(&|b| apply_into(&trees, b));
                assert!(
                    trees.lock().unwrap().applied.len() as u64 >= queued_before,
                    "a drain returned before the changes queued ahead of it were applied"
                );
            }));
        }
        for h in handles {
            h.join().unwrap();
        }
        let t = trees.lock().unwrap();
        let mut sorted = t.applied.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![256, 257, 258, 356, 357, 358]);
        for ino in 256..259 {
            let first = t.applied.iter().position(|&i| i == ino).unwrap();
            let second = t.applied.iter().position(|&i| i == ino + 100).unwrap();
            assert!(
                first < second,
                "a writer's changes were applied out of order"
            );
        }
        let st = queue.lock();
        assert!(st.queued.is_empty() && !st.applying && st.applied == st.next);
        assert!(!queue.busy());
    }

    #[test]
    fn queued_fills_are_applied_once_in_order() {
        shuttle::check_random(writers_and_a_drain, 3000);
        shuttle::check_pct(writers_and_a_drain, 3000, 3);
    }
}

#[cfg(all(test, not(feature = "model-check")))]
mod tests {
    use super::*;

    use super::test_fill as fill;

    /// An application that unwinds (a bug) lets the queue go on: later writes and drains
    /// do not wait for it for ever.
    #[test]
    fn an_unwinding_application_does_not_stop_the_queue() {
        let queue = FillQueue::default();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            queue.push(fill(256), &|_| panic!("injected"));
        }));
        assert!(r.is_err());
        assert!(!queue.busy());
        let applied = std::sync::Mutex::new(Vec::new());
        let apply = |b: Vec<PendingFill>| {
            applied.lock().unwrap().extend(b.iter().map(|f| f.id.ino));
        };
        queue.push(fill(257), &apply);
        queue.drain(&apply);
        assert_eq!(*applied.lock().unwrap(), vec![257]);
        assert!(!queue.busy());
    }
}
