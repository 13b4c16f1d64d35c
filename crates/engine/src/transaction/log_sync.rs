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

use crate::error::Result;
use crate::io::disk_io::{Block, DiskIo};
use crate::sync::{Condvar, Mutex};
use oleo_format::superblock::Superblock;
use std::sync::atomic::{AtomicU64, Ordering};

/// What one log sync writes.
pub(crate) struct LogBatch {
    pub blocks: Vec<(u64, Block)>,
    /// Commit T-1's superblock with this log's root.
    pub sb: Superblock,
}

/// What gathering a batch found (a `LogBatch`; the model checker's stand-in in tests).
pub(crate) enum Gathered<B> {
    Batch {
        seq: u64,
        batch: B,
    },
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
    pub(crate) fn sync<B>(
        &self,
        transid: u64,
        target: u64,
        mut gather: impl FnMut() -> Result<Gathered<B>>,
        mut write: impl FnMut(&B) -> Result<()>,
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
            let r = self.lead(transid, &mut gather, &mut write);
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
    fn lead<B>(
        &self,
        transid: u64,
        gather: &mut impl FnMut() -> Result<Gathered<B>>,
        write: &mut impl FnMut(&B) -> Result<()>,
    ) -> Result<bool> {
        let (seq, batch) = match gather()? {
            Gathered::Batch { seq, batch } => (seq, batch),
            Gathered::Closed => return Ok(false),
        };
        let covered = self.waiting.swap(0, Ordering::SeqCst);
        crate::blocking::will_wait();
        let _io = self.io.lock().unwrap_or_else(|e| e.into_inner());
        if self.committed.load(Ordering::SeqCst) >= transid {
            return Ok(true);
        }
        write(&batch)?;
        self.synced.fetch_max(seq, Ordering::SeqCst);
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.0 += 1;
        c.1 += covered;
        Ok(true)
    }
}

/// A log sync's IO: the blocks, a flush, superblock copy 0, a flush.
pub(crate) fn write_batch(io: &DiskIo, batch: &LogBatch) -> Result<()> {
    for (bytenr, block) in &batch.blocks {
        io.write_logical(*bytenr, block)?;
    }
    io.flush()?;
    write_primary_superblock(io, &batch.sb)?;
    io.flush()
}

/// Writes superblock copy 0 only, on every device, as a log sync does (mirrors keep the
/// last commit).
fn write_primary_superblock(io: &DiskIo, sb: &Superblock) -> Result<()> {
    io.devices().write_superblocks(sb, true)
}

/// The group commit protocol under shuttle: `cargo test -p oleo --features model-check
/// --lib log_sync`. fsyncs log into the running transaction and sync while a
/// committer closes it and writes its superblocks; the disk records every superblock.
#[cfg(all(test, feature = "model-check"))]
mod model {
    use super::*;
    use shuttle::sync::Mutex as SMutex;
    use shuttle::thread;
    use std::sync::Arc;

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Super {
        Log { transid: u64, seq: u64 },
        Commit { transid: u64 },
    }

    /// `fsyncs` threads each log once and sync; a committer closes transaction 1 at any
    /// point. Whatever an fsync was told is durable is on disk when it returns: a log
    /// superblock of its transaction with a sync number at least its own, or the commit.
    /// No log superblock of a transaction lands after that transaction's commit.
    fn fsyncs_against_a_commit(fsyncs: usize) {
        let syncs = Arc::new(LogSyncs::default());
        let running = Arc::new(SMutex::new(1u64)); // the filesystem's lock, and T
        let disk = Arc::new(SMutex::new(Vec::<Super>::new()));
        let mut handles = Vec::new();
        for _ in 0..fsyncs {
            let (syncs, running, disk) = (syncs.clone(), running.clone(), disk.clone());
            handles.push(thread::spawn(move || {
                let (transid, target) = {
                    let t = running.lock().unwrap();
                    (*t, syncs.next())
                };
                let gather = || {
                    let t = running.lock().unwrap();
                    if *t != transid {
                        return Ok(Gathered::Closed);
                    }
                    Ok(Gathered::Batch {
                        seq: syncs.gather(),
                        batch: (transid, syncs.next() - 1),
                    })
                };
                let write = |b: &(u64, u64)| {
                    disk.lock().unwrap().push(Super::Log {
                        transid: b.0,
                        seq: b.1,
                    });
                    Ok(())
                };
                // As `Filesystem::fsync` does: commit T-1 durable before a log sync of T.
                while syncs.committed.load(Ordering::SeqCst) + 1 < transid {
                    thread::yield_now();
                }
                let r = syncs.sync(transid, target, gather, write);
                let seen = disk.lock().unwrap().clone();
                match r {
                    Synced::Durable => assert!(
                        seen.iter().any(|s| match *s {
                            Super::Log { transid: t, seq } => t == transid && seq >= target,
                            Super::Commit { transid: t } => t >= transid,
                        }),
                        "told durable, but nothing on disk covers sync {target}: {seen:?}"
                    ),
                    Synced::Closed => {} // waits for the commit, which the committer writes
                    Synced::Broken => panic!("nothing failed"),
                }
            }));
        }
        {
            let (syncs, running, disk) = (syncs.clone(), running.clone(), disk.clone());
            handles.push(thread::spawn(move || {
                *running.lock().unwrap() = 2;
                syncs
                    .commit_superblocks(1, || {
                        disk.lock().unwrap().push(Super::Commit { transid: 1 });
                        Ok(())
                    })
                    .unwrap();
            }));
        }
        for h in handles {
            h.join().unwrap();
        }
        let disk = disk.lock().unwrap().clone();
        let commit = disk
            .iter()
            .position(|s| *s == Super::Commit { transid: 1 })
            .expect("the commit landed");
        assert!(
            !disk[commit..]
                .iter()
                .any(|s| matches!(s, Super::Log { transid: 1, .. })),
            "a log superblock of transaction 1 after its commit: {disk:?}"
        );
    }

    #[test]
    fn log_syncs_cover_their_fsyncs_and_never_follow_the_commit() {
        shuttle::check_random(|| fsyncs_against_a_commit(3), 3000);
        shuttle::check_pct(|| fsyncs_against_a_commit(4), 3000, 3);
    }
}
