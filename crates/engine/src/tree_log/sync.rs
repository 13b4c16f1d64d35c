//! The log sync (the kernel's btrfs_sync_log): the log blocks an fsync built, a cache
//! flush, superblock copy 0 pointing at the log root tree, a flush. No filesystem lock is
//! held: fsyncs that log while one sync writes queue their blocks, and the next sync writes
//! them all with one pair of flushes (group commit).
//!
//! Order on disk: a log sync of transaction T writes T-1's superblock with `log_root` set,
//! so it waits until commit T-1 is durable and must never land after commit T's superblock
//! (which says `log_root` 0). `io` orders them: the commit pipe writes superblocks while
//! holding it and records the generation in `committed` before letting go, and a log sync
//! that finds its transaction committed writes nothing.

use crate::disk_io::{Block, DiskIo};
use crate::error::Result;
use crate::sync::Mutex;
use oleo_format::superblock::{self, Superblock};
use std::sync::atomic::{AtomicU64, Ordering};

/// What one fsync's logging leaves to write.
pub(crate) struct LogBatch {
    pub transid: u64,
    pub seq: u64,
    pub blocks: Vec<(u64, Block)>,
    /// Commit T-1's superblock with this log's root.
    pub sb: Superblock,
}

/// The log syncs of one filesystem.
#[derive(Default)]
pub(crate) struct LogSyncs {
    next_seq: AtomicU64,
    queue: Mutex<Vec<LogBatch>>,
    io: Mutex<()>,
    /// The newest log sync whose superblock is durable.
    synced: AtomicU64,
    /// The newest generation whose commit wrote its superblocks.
    committed: AtomicU64,
    /// (log syncs, fsyncs they covered) since open.
    counts: Mutex<(u64, u64)>,
    /// A transaction whose log sync failed: its log may miss blocks, so its fsyncs commit.
    broken: AtomicU64,
}

impl LogSyncs {
    /// A number for the next batch; later batches get larger numbers.
    pub(crate) fn next_seq(&self) -> u64 {
        self.next_seq.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The newest log sync known durable.
    pub(crate) fn synced(&self) -> u64 {
        self.synced.load(Ordering::SeqCst)
    }

    /// (log syncs written, fsyncs they made durable) since the filesystem was opened.
    pub(crate) fn counts(&self) -> (u64, u64) {
        *self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn queue(&self, batch: LogBatch) {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(batch);
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

    /// Makes batch `seq` of transaction `transid` durable, with every batch of that
    /// transaction queued so far. The caller has waited for commit `transid - 1`. False
    /// when the log cannot be trusted (a sync of it failed): commit instead.
    pub(crate) fn sync(&self, io: &DiskIo, transid: u64, seq: u64) -> bool {
        let _io = self.io.lock().unwrap_or_else(|e| e.into_inner());
        if self.synced() >= seq || self.committed.load(Ordering::SeqCst) >= transid {
            // A later sync, or the commit of the transaction, covered it.
            return true;
        }
        if self.broken.load(Ordering::SeqCst) == transid {
            return false;
        }
        match self.write_batches(io, transid) {
            Ok(()) => true,
            Err(e) => {
                log::warn!("log sync of transaction {transid} failed ({e}); fsyncs commit instead");
                self.broken.store(transid, Ordering::SeqCst);
                false
            }
        }
    }

    /// Writes every queued batch of `transid`, then the superblock of the newest.
    fn write_batches(&self, io: &DiskIo, transid: u64) -> Result<()> {
        let batches: Vec<LogBatch> = {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            let (ours, rest): (Vec<LogBatch>, Vec<LogBatch>) = std::mem::take(&mut *q)
                .into_iter()
                .partition(|b| b.transid == transid);
            // Older transactions' batches are covered by their commits; newer ones wait
            // for ours to be durable and write themselves.
            *q = rest.into_iter().filter(|b| b.transid > transid).collect();
            ours
        };
        let Some(last) = batches.iter().max_by_key(|b| b.seq) else {
            return Err(crate::error::Error::corrupt(
                0,
                "the log batch to sync is gone",
            ));
        };
        crate::blocking::will_wait();
        for b in &batches {
            for (bytenr, block) in &b.blocks {
                io.write_logical(*bytenr, block)?;
            }
        }
        io.flush()?;
        write_primary_superblock(io, &last.sb)?;
        io.flush()?;
        self.synced.fetch_max(last.seq, Ordering::SeqCst);
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.0 += 1;
        c.1 += batches.len() as u64;
        Ok(())
    }
}

/// Writes superblock copy 0 only, as a log sync does (mirrors keep the last commit).
fn write_primary_superblock(io: &DiskIo, sb: &Superblock) -> Result<()> {
    let mut copy = sb.clone();
    copy.bytenr = superblock::SUPER_PRIMARY_OFFSET;
    let bytes = copy
        .to_bytes()
        .map_err(|e| crate::error::Error::corrupt(copy.bytenr, format!("superblock: {e}")))?;
    io.device().write_all_at(&bytes, copy.bytenr)
}
