//! The log sync (the kernel's btrfs_sync_log): every log block changed since the last sync,
//! a cache flush, superblock copy 0 pointing at the log root tree, a flush.
//!
//! Group commit: an fsync logs its inode under the filesystem's lock and learns the number
//! of the sync that will carry it (`next`). Then, without the lock, one fsync at a time
//! leads: it takes the lock again for a moment to gather every log block changed so far
//! (the batch covers every fsync that logged before it), lets go, and writes. fsyncs that
//! log meanwhile wait for that sync, then one of them leads the next, so one pair of
//! flushes serves them all, and a block changed by many of them is written once.
//!
//! Order on disk: a log sync of transaction T writes T-1's superblock with `log_root` set,
//! so it waits until commit T-1 is durable and must never land after commit T's superblock
//! (which says `log_root` 0). `io` orders them: the commit pipe writes superblocks while
//! holding it and records the generation in `committed` before letting go, and a log sync
//! that finds its transaction committed writes nothing.

use crate::disk_io::{Block, DiskIo};
use crate::error::{Error, Result};
use crate::sync::{Condvar, Mutex};
use oleo_format::superblock::{self, Superblock};
use std::sync::atomic::{AtomicU64, Ordering};

/// What one log sync writes.
pub(crate) struct LogBatch {
    pub seq: u64,
    pub blocks: Vec<(u64, Block)>,
    /// Commit T-1's superblock with this log's root.
    pub sb: Superblock,
}

/// What gathering a batch found.
pub(crate) enum Gathered {
    Batch(Box<LogBatch>),
    /// The transaction closed: its commit makes everything durable.
    Closed,
}

/// How an fsync's wait for its log sync ended.
pub(crate) enum Synced {
    Durable,
    /// Its transaction closed first: wait for that commit.
    Closed,
    /// The log cannot be trusted (a sync of it failed): commit instead.
    Broken,
}

/// The log syncs of one filesystem.
#[derive(Default)]
pub(crate) struct LogSyncs {
    /// Batches gathered so far (changed under the filesystem's lock only).
    gathered: AtomicU64,
    /// The newest log sync whose superblock is durable.
    synced: AtomicU64,
    /// The newest generation whose commit wrote its superblocks.
    committed: AtomicU64,
    /// A transaction whose log sync failed: its log may miss blocks.
    broken: AtomicU64,
    /// True while an fsync leads a sync.
    leading: Mutex<bool>,
    led: Condvar,
    io: Mutex<()>,
    /// (log syncs, fsyncs they covered) since open.
    counts: Mutex<(u64, u64)>,
    /// fsyncs waiting, counted into the next sync.
    waiting: AtomicU64,
}

impl LogSyncs {
    /// The sync that will carry what is logged now.
    pub(crate) fn next(&self) -> u64 {
        self.gathered.load(Ordering::SeqCst) + 1
    }

    /// Numbers a batch being gathered (under the filesystem's lock).
    pub(crate) fn gather(&self) -> u64 {
        self.gathered.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The newest log sync known durable: blocks it no longer reaches may be reused.
    pub(crate) fn synced(&self) -> u64 {
        self.synced.load(Ordering::SeqCst)
    }

    /// (log syncs written, fsyncs they made durable) since the filesystem was opened.
    pub(crate) fn counts(&self) -> (u64, u64) {
        *self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes commit `transid`'s superblocks (`write`) so that no log sync of `transid`
    /// lands after them.
    pub(crate) fn commit_superblocks(
        &self,
        transid: u64,
        write: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let _io = self.io.lock().unwrap_or_else(|e| e.into_inner());
        write()?;
        self.committed.fetch_max(transid, Ordering::SeqCst);
        Ok(())
    }

    /// Waits until log sync `target` of transaction `transid` is durable, leading syncs
    /// (with `gather`, which takes the filesystem's lock) while no other fsync does. The
    /// caller has waited for commit `transid - 1`.
    pub(crate) fn sync(
        &self,
        io: &DiskIo,
        transid: u64,
        target: u64,
        mut gather: impl FnMut() -> Result<Gathered>,
    ) -> Synced {
        let mut leading = self.leading.lock().unwrap_or_else(|e| e.into_inner());
        let mut counted = false;
        loop {
            if self.synced() >= target {
                return Synced::Durable;
            }
            if self.committed.load(Ordering::SeqCst) >= transid {
                return Synced::Durable;
            }
            if self.broken.load(Ordering::SeqCst) == transid {
                return Synced::Broken;
            }
            if !std::mem::replace(&mut counted, true) {
                self.waiting.fetch_add(1, Ordering::SeqCst);
            }
            if *leading {
                crate::blocking::will_wait();
                leading = self.led.wait(leading).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            *leading = true;
            drop(leading);
            let r = self.lead(io, transid, &mut gather);
            leading = self.leading.lock().unwrap_or_else(|e| e.into_inner());
            *leading = false;
            self.led.notify_all();
            match r {
                Ok(true) => {}
                Ok(false) => return Synced::Closed,
                Err(e) => {
                    log::warn!(
                        "log sync of transaction {transid} failed ({e}); fsyncs commit instead"
                    );
                    self.broken.store(transid, Ordering::SeqCst);
                    return Synced::Broken;
                }
            }
        }
    }

    /// Gathers and writes one sync; false if the transaction closed first.
    fn lead(
        &self,
        io: &DiskIo,
        transid: u64,
        gather: &mut impl FnMut() -> Result<Gathered>,
    ) -> Result<bool> {
        let batch = match gather()? {
            Gathered::Batch(b) => b,
            Gathered::Closed => return Ok(false),
        };
        let covered = self.waiting.swap(0, Ordering::SeqCst);
        crate::blocking::will_wait();
        let _io = self.io.lock().unwrap_or_else(|e| e.into_inner());
        if self.committed.load(Ordering::SeqCst) >= transid {
            return Ok(true);
        }
        for (bytenr, block) in &batch.blocks {
            io.write_logical(*bytenr, block)?;
        }
        io.flush()?;
        write_primary_superblock(io, &batch.sb)?;
        io.flush()?;
        self.synced.fetch_max(batch.seq, Ordering::SeqCst);
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.0 += 1;
        c.1 += covered;
        Ok(true)
    }
}

/// Writes superblock copy 0 only, as a log sync does (mirrors keep the last commit).
fn write_primary_superblock(io: &DiskIo, sb: &Superblock) -> Result<()> {
    let mut copy = sb.clone();
    copy.bytenr = superblock::SUPER_PRIMARY_OFFSET;
    let bytes = copy
        .to_bytes()
        .map_err(|e| Error::corrupt(copy.bytenr, format!("superblock: {e}")))?;
    io.device().write_all_at(&bytes, copy.bytenr)
}
