//! The second half of a commit, run without the filesystem's lock while the next
//! transaction already takes operations: the closed transaction's blocks, a flush, its
//! superblocks, a flush.
//!
//! Several commits may be writing at once. Their blocks may go out in any order: each
//! transaction allocates only space that is free in the last commit and was not freed by
//! a commit still in flight (`CommitPins`), so no durable tree points there. Superblocks go
//! out strictly in generation order (`CommitOrder`), and a commit's pinned space returns
//! to the allocator only once its superblock is durable. A commit that fails stops every
//! later one: the disk keeps the last durable generation, and the filesystem refuses
//! writes from then on.

use crate::error::{Error, Result};
use crate::io::disk_io::{Block, DiskIo};
use crate::sync::{Condvar, Mutex};
use crate::transaction::space::block_group::CommitPins;
use oleo_format::superblock::Superblock;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Superblocks in generation order, and who waits for which generation.
pub(crate) struct CommitOrder {
    /// The newest generation whose superblock is on disk (and flushed).
    durable: Mutex<u64>,
    done: Condvar,
    failed: Mutex<Option<String>>,
}

impl CommitOrder {
    pub(crate) fn new(durable: u64) -> CommitOrder {
        CommitOrder {
            durable: Mutex::new(durable),
            done: Condvar::new(),
            failed: Mutex::new(None),
        }
    }

    /// Why a commit failed, if one did.
    pub(crate) fn failure(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Waits until `generation` is durable; the newest durable generation, or why it never
    /// will be.
    pub(crate) fn wait_durable(&self, generation: u64) -> Result<u64> {
        let mut durable = self.durable.lock().unwrap_or_else(|e| e.into_inner());
        let mut told = false;
        loop {
            if *durable >= generation {
                return Ok(*durable);
            }
            if let Some(why) = self.failure() {
                return Err(Error::Aborted(why));
            }
            if !std::mem::replace(&mut told, true) {
                crate::blocking::will_wait();
            }
            durable = self.done.wait(durable).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Runs `write` (generation `transid`'s superblock) once every earlier generation is
    /// durable, then records `transid` as durable and runs `after` (still in order).
    pub(crate) fn in_turn(
        &self,
        transid: u64,
        write: impl FnOnce() -> Result<()>,
        after: impl FnOnce(),
    ) -> Result<()> {
        let mut durable = self.durable.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(why) = self.failure() {
                return Err(Error::Aborted(why));
            }
            if *durable + 1 >= transid {
                break;
            }
            durable = self.done.wait(durable).unwrap_or_else(|e| e.into_inner());
        }
        write()?;
        *durable = transid;
        after();
        self.done.notify_all();
        Ok(())
    }

    /// A commit failed: later ones must not write their superblocks.
    pub(crate) fn fail(&self, why: String) {
        self.failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(why);
        let _durable = self.durable.lock().unwrap_or_else(|e| e.into_inner());
        self.done.notify_all();
    }
}

/// Reads in flight that looked up their extents under the lock and read the data after
/// letting go of it (`file_read`): the transaction each looked in, with a count. Space
/// freed in that transaction or later stays pinned while such a read is in flight, so the
/// blocks it reads are not handed out to new data first.
#[derive(Default)]
pub(crate) struct ReadPins {
    active: Mutex<BTreeMap<u64, usize>>,
}

/// One read in flight (see `ReadPins`); dropping it ends the read.
pub(crate) struct ReadPin {
    pins: Arc<CommitPipe>,
    transid: u64,
}

impl ReadPins {
    /// The oldest transaction a read in flight looked in.
    fn oldest(&self) -> Option<u64> {
        self.active
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .next()
            .copied()
    }
}

impl Drop for ReadPin {
    fn drop(&mut self) {
        let mut active = self
            .pins
            .reads
            .active
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = active.get_mut(&self.transid) {
            *n -= 1;
            if *n == 0 {
                active.remove(&self.transid);
            }
        }
    }
}

/// The commits of one filesystem.
pub(crate) struct CommitPipe {
    pub(crate) order: CommitOrder,
    pins: CommitPins,
    reads: ReadPins,
    deferred: Deferred<CommitIo>,
    /// Log syncs, ordered against the commits' superblocks.
    pub(crate) log: crate::transaction::log_sync::LogSyncs,
}

/// A commit that can be left for later and then written: `CommitIo`, or the model's.
pub(crate) trait Commit {
    fn transid(&self) -> u64;
    /// Writes it, waiting for the earlier generations' superblocks.
    fn write_now(self) -> Result<u64>;
}

/// Commits closed under the filesystem's lock whose writing waits for the thread that
/// closed them to let go of it (`defer`). Whoever is about to wait on the order writes
/// these first (`write_all`), so a commit never waits for one that nobody is writing.
pub(crate) struct Deferred<C>(Mutex<Vec<C>>);

impl<C: Commit> Deferred<C> {
    pub(crate) fn new() -> Deferred<C> {
        Deferred(Mutex::new(Vec::new()))
    }

    pub(crate) fn defer(&self, c: C) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(c);
    }

    /// Writes the deferred commits, oldest first; the first failure (the pipe is then
    /// failed and every later commit refused).
    pub(crate) fn write_all(&self) -> Result<()> {
        let mut batch = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        batch.sort_by_key(|c| c.transid());
        let mut r = Ok(());
        for c in batch {
            if let Err(e) = c.write_now() {
                r = r.and(Err(e));
            }
        }
        r
    }

    /// Writes `c` with the commits left before it; returns once it is durable. `c` goes
    /// through the queue like them: writing it straight after taking the queue would take
    /// a later commit another thread closed meanwhile and wait on it for `c`, which this
    /// thread has not written yet. Through the queue, the oldest commit not yet written
    /// is always either in the queue, to be taken by the thread that queued it, or first
    /// unwritten in some thread's batch.
    pub(crate) fn write(&self, c: C, order: &CommitOrder) -> Result<u64> {
        let transid = c.transid();
        self.defer(c);
        self.write_all()?;
        // Another thread may have taken it.
        order.wait_durable(transid).map(|_| transid)
    }
}

impl CommitPipe {
    pub(crate) fn new(durable: u64) -> CommitPipe {
        CommitPipe {
            order: CommitOrder::new(durable),
            pins: Default::default(),
            reads: ReadPins::default(),
            deferred: Deferred::new(),
            log: Default::default(),
        }
    }

    pub(crate) fn pins(&self) -> CommitPins {
        Arc::clone(&self.pins)
    }

    /// Commits up to `durable` are on disk: the space they freed may be handed out again,
    /// except what a read in flight may still read (freed in the transaction it looked in,
    /// or later).
    pub(crate) fn release_pins(&self, durable: u64) {
        let free_below = (durable + 1).min(self.reads.oldest().unwrap_or(u64::MAX));
        self.pins.lock().retain_from(free_below);
    }

    /// Starts a read that looks in running transaction `transid` (see `ReadPins`); call
    /// it under the filesystem's lock, before the lookups.
    pub(crate) fn pin_read(self: &Arc<Self>, transid: u64) -> ReadPin {
        *self
            .reads
            .active
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(transid)
            .or_default() += 1;
        ReadPin {
            pins: Arc::clone(self),
            transid,
        }
    }

    pub(crate) fn failure(&self) -> Option<String> {
        self.order.failure()
    }

    pub(crate) fn wait_durable(&self, generation: u64) -> Result<u64> {
        self.write_deferred()?;
        self.order.wait_durable(generation)
    }

    /// Leaves a closed commit to be written once the lock is let go (see `Deferred`).
    pub(crate) fn defer(&self, io: CommitIo) {
        self.deferred.defer(io)
    }

    /// Writes the deferred commits (see `Deferred::write_all`).
    pub(crate) fn write_deferred(&self) -> Result<()> {
        self.deferred.write_all()
    }
}

/// What a closed transaction still has to write.
#[must_use]
pub(crate) struct CommitIo {
    transid: u64,
    blocks: Vec<(u64, Block)>,
    sb: Superblock,
    io: Arc<DiskIo>,
    pipe: Arc<CommitPipe>,
}

impl CommitIo {
    pub(crate) fn new(
        transid: u64,
        blocks: Vec<(u64, Block)>,
        sb: Superblock,
        io: Arc<DiskIo>,
        pipe: Arc<CommitPipe>,
    ) -> CommitIo {
        CommitIo {
            transid,
            blocks,
            sb,
            io,
            pipe,
        }
    }

    /// Writes it all; returns the generation now durable. Earlier commits left to others
    /// go first: ours waits for their superblocks.
    pub(crate) fn write(self) -> Result<u64> {
        let pipe = Arc::clone(&self.pipe);
        pipe.deferred.write(self, &pipe.order)
    }
}

impl Commit for CommitIo {
    fn transid(&self) -> u64 {
        self.transid
    }

    fn write_now(self) -> Result<u64> {
        crate::blocking::will_wait();
        let r = self.try_write();
        if let Err(e) = &r {
            let why = format!("commit {} failed: {e}", self.transid);
            log::error!(
                "{why}; changes since generation {} are lost and the filesystem is now read-only",
                self.transid - 1
            );
            self.pipe.order.fail(why);
        }
        r.map(|()| self.transid)
    }
}

impl CommitIo {
    fn try_write(&self) -> Result<()> {
        let started = std::time::Instant::now();
        // Nothing of a commit is written beside a loop device attached since the mount.
        self.io.check_claim()?;
        for (bytenr, block) in &self.blocks {
            self.io.write_tree_block(*bytenr, block)?;
        }
        self.io.flush()?;
        log::debug!(
            "commit {}: {} blocks written and flushed in {:?}",
            self.transid,
            self.blocks.len(),
            started.elapsed()
        );
        self.pipe.order.in_turn(
            self.transid,
            || {
                self.pipe.log.commit_superblocks(self.transid, || {
                    crate::transaction::transaction::write_superblocks(&self.io, &self.sb)?;
                    self.io.flush()
                })
            },
            || {
                self.pipe.release_pins(self.transid);
                self.io.written(self.blocks.iter().map(|(b, _)| *b));
            },
        )
    }
}

/// The ordering protocol under shuttle, which runs the threads through many interleavings:
/// `cargo test -p oleo --features model-check --lib commit_pipe`.
#[cfg(all(test, feature = "model-check"))]
mod model {
    use super::*;
    use shuttle::sync::Mutex as SMutex;
    use shuttle::thread;

    /// Commits 1..=n, started in any order, with waiters for random generations:
    /// superblocks land in order, a waiter returns only once its generation landed.
    fn commits_in_order(n: u64, fail_at: Option<u64>) {
        let order = Arc::new(CommitOrder::new(0));
        let landed = Arc::new(SMutex::new(Vec::new()));
        let mut handles = Vec::new();
        for t in (1..=n).rev() {
            let (order, landed) = (Arc::clone(&order), Arc::clone(&landed));
            handles.push(thread::spawn(move || {
                let r = order.in_turn(
                    t,
                    || {
                        if Some(t) == fail_at {
                            return Err(Error::Unsupported("injected".into()));
                        }
                        landed.lock().unwrap().push(t);
                        Ok(())
                    },
                    || {},
                );
                if r.is_err() && Some(t) == fail_at {
                    order.fail(format!("commit {t}"));
                }
                r.is_ok()
            }));
        }
        for g in [1, n] {
            let (order, landed) = (Arc::clone(&order), Arc::clone(&landed));
            handles.push(thread::spawn(move || {
                if order.wait_durable(g).is_ok() {
                    assert!(
                        landed.lock().unwrap().contains(&g),
                        "woke before {g} landed"
                    );
                }
                true
            }));
        }
        let ok: Vec<bool> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let landed = landed.lock().unwrap().clone();
        let want: Vec<u64> = match fail_at {
            None => (1..=n).collect(),
            Some(f) => (1..f).collect(),
        };
        assert_eq!(landed, want, "superblocks out of order or past a failure");
        if fail_at.is_none() {
            assert!(ok.iter().all(|&o| o));
        }
    }

    /// A file's extent X, read by a reader in two steps (look up under the filesystem's
    /// lock, read after) while a writer frees X in the running transaction and commits,
    /// and an allocator hands out any free, unpinned space. Whenever the reader found X,
    /// X is not handed out before the reader's pin goes.
    fn read_pin_against_reuse() {
        const X: u64 = 1 << 20;
        struct Fs {
            running: u64,
            referenced: bool,
            free: bool,
            reused: bool,
        }
        let pipe = Arc::new(CommitPipe::new(0));
        let fs = Arc::new(SMutex::new(Fs {
            running: 1,
            referenced: true,
            free: false,
            reused: false,
        }));
        let reader = {
            let (pipe, fs) = (Arc::clone(&pipe), Arc::clone(&fs));
            thread::spawn(move || {
                let (pin, found) = {
                    let fs = fs.lock().unwrap();
                    (pipe.pin_read(fs.running), fs.referenced)
                };
                thread::yield_now();
                if found {
                    assert!(!fs.lock().unwrap().reused, "X was handed out under a read");
                }
                drop(pin);
            })
        };
        let writer = {
            let (pipe, fs) = (Arc::clone(&pipe), Arc::clone(&fs));
            thread::spawn(move || {
                let closed = {
                    let mut fs = fs.lock().unwrap();
                    fs.referenced = false;
                    fs.free = true;
                    pipe.pins().lock().insert(X, (4096, fs.running));
                    // The commit closes: T+1 runs from here.
                    fs.running += 1;
                    fs.running - 1
                };
                thread::yield_now();
                pipe.release_pins(closed);
            })
        };
        let allocator = {
            let (pipe, fs) = (Arc::clone(&pipe), Arc::clone(&fs));
            thread::spawn(move || {
                for _ in 0..3 {
                    {
                        let mut fs = fs.lock().unwrap();
                        if fs.free && !pipe.pins().lock().contains_key(&X) {
                            fs.free = false;
                            fs.reused = true;
                        }
                    }
                    thread::yield_now();
                }
            })
        };
        for h in [reader, writer, allocator] {
            h.join().unwrap();
        }
        // Whatever the order, nothing stays pinned once the read is over and a commit
        // after it is durable.
        let running = fs.lock().unwrap().running;
        pipe.release_pins(running);
        assert!(
            pipe.pins().lock().is_empty(),
            "space stayed pinned for good"
        );
    }

    /// A commit of the model: writing it lands its superblock in turn.
    struct Fake {
        transid: u64,
        order: Arc<CommitOrder>,
        landed: Arc<SMutex<Vec<u64>>>,
    }

    impl Commit for Fake {
        fn transid(&self) -> u64 {
            self.transid
        }
        fn write_now(self) -> Result<u64> {
            let landed = Arc::clone(&self.landed);
            self.order
                .in_turn(
                    self.transid,
                    || {
                        landed.lock().unwrap().push(self.transid);
                        Ok(())
                    },
                    || {},
                )
                .map(|()| self.transid)
        }
    }

    /// n threads each close a commit under the filesystem's lock; odd ones leave it in
    /// the deferred queue and write the queue once they let go (an operation over the
    /// dirty limit), even ones write theirs after letting go (sync); a waiter writes the
    /// queue and waits for the last generation. Nobody waits for a commit that nobody
    /// writes, and every superblock lands, in order.
    fn deferred_commits(n: u64) {
        let order = Arc::new(CommitOrder::new(0));
        let landed = Arc::new(SMutex::new(Vec::new()));
        let deferred = Arc::new(Deferred::<Fake>::new());
        let running = Arc::new(SMutex::new(1u64));
        let mut handles = Vec::new();
        for t in 0..n {
            let (order, landed, deferred, running) = (
                Arc::clone(&order),
                Arc::clone(&landed),
                Arc::clone(&deferred),
                Arc::clone(&running),
            );
            handles.push(thread::spawn(move || {
                let mut fs = running.lock().unwrap();
                let c = Fake {
                    transid: *fs,
                    order: Arc::clone(&order),
                    landed,
                };
                *fs += 1;
                if t % 2 == 1 {
                    deferred.defer(c);
                    drop(fs);
                    deferred.write_all().unwrap();
                } else {
                    drop(fs);
                    deferred.write(c, &order).unwrap();
                }
            }));
        }
        {
            let (order, deferred) = (Arc::clone(&order), Arc::clone(&deferred));
            handles.push(thread::spawn(move || {
                deferred.write_all().unwrap();
                order.wait_durable(n).unwrap();
            }));
        }
        for h in handles {
            h.join().unwrap();
        }
        let landed = landed.lock().unwrap().clone();
        assert_eq!(landed, (1..=n).collect::<Vec<_>>());
    }

    #[test]
    fn deferred_commits_are_all_written_in_order() {
        shuttle::check_random(|| deferred_commits(4), 3000);
        shuttle::check_pct(|| deferred_commits(4), 3000, 3);
    }

    #[test]
    fn freed_space_waits_for_reads_that_may_still_read_it() {
        shuttle::check_random(read_pin_against_reuse, 3000);
        shuttle::check_pct(read_pin_against_reuse, 3000, 3);
    }

    #[test]
    fn superblocks_land_in_generation_order() {
        shuttle::check_random(|| commits_in_order(3, None), 2000);
        shuttle::check_pct(|| commits_in_order(4, None), 2000, 3);
    }

    #[test]
    fn a_failed_commit_stops_the_later_ones_and_wakes_every_waiter() {
        shuttle::check_random(|| commits_in_order(3, Some(2)), 2000);
        shuttle::check_pct(|| commits_in_order(4, Some(1)), 2000, 3);
    }
}
