//! ENOSPC that reaches write(2) through the kernel's writeback cache.
//!
//! Under the writeback cache write(2) only dirties the kernel's page cache; the data reaches
//! us later, and an ENOSPC then can only fail fsync or close, while the kernel already counts
//! the lost bytes in the file's size. The kernel keeps at most `dirty_limit` bytes dirty for
//! a FUSE mount (a strict per-device limit), so near full we stop taking data through the
//! cache while what it holds still fits:
//! - with free data space above `low_water` (twice `dirty_limit`), opens are cached;
//! - below it, opens for writing get FOPEN_DIRECT_IO: their writes come to us synchronously
//!   and fail, or come back short, exactly where space ends, leaving `dirty_limit` free as
//!   long as a cached writer is open (its dirty pages must still fit);
//! - a handle opened for writing through the cache before that goes on while its dirty pages
//!   still fit (free space above `dirty_limit`: the kernel's cap covers all of a mount's
//!   writers together); below that we invalidate its attributes, the kernel then asks GETATTR
//!   (with the handle) before its next write(2), and we answer ENOSPC. Reopening the file
//!   gives a direct handle that writes to the last block.
//!
//! A write-back that fails anyway (a single write(2) larger than the margin, metadata
//! exhaustion) is reported by the kernel at fsync and close, and once more at the handle's
//! next write(2). The kernel's cached size of that file may then claim the lost bytes until
//! it forgets the inode: the size on disk never does.

use crate::transport::Notifier;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Handles of files that are not open for writing share this value.
pub(crate) const READ_HANDLE: u64 = 0;

/// Where the mount sets the notifier once its session exists (the server is built first).
pub type NotifierSlot = Arc<OnceLock<Notifier>>;

#[derive(Debug)]
struct Handle {
    ino: u64,
    /// Writes go through the kernel's page cache (opened when space was plentiful).
    cached: bool,
    /// Opened O_DIRECT: its write(2)s come to us as they are made, and it dirties no
    /// pages of its own (an mmap of it aside, which the cached rules still cover).
    o_direct: bool,
    /// A write-back through this handle's file failed: say so at its next write(2).
    failed: bool,
}

#[derive(Debug)]
pub(crate) struct SpaceGuard {
    dirty_limit: AtomicU64,
    /// Below low water: new opens for writing go direct.
    low: AtomicBool,
    /// Below `dirty_limit`: cached writers must stop.
    critical: AtomicBool,
    handles: Mutex<Handles>,
    /// Signalled when a handle is released.
    released: Condvar,
    notifier: NotifierSlot,
}

#[derive(Debug, Default)]
struct Handles {
    next: u64,
    open: HashMap<u64, Handle>,
}

/// What an open handle may do (decided at open).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpenMode {
    Read,
    Cached,
    Direct,
}

impl SpaceGuard {
    pub(crate) fn new(dirty_limit: u64) -> SpaceGuard {
        SpaceGuard {
            dirty_limit: AtomicU64::new(dirty_limit),
            low: AtomicBool::new(false),
            critical: AtomicBool::new(false),
            handles: Mutex::new(Handles {
                next: READ_HANDLE + 1,
                open: HashMap::new(),
            }),
            released: Condvar::new(),
            notifier: Arc::new(OnceLock::new()),
        }
    }

    pub(crate) fn notifier_slot(&self) -> NotifierSlot {
        Arc::clone(&self.notifier)
    }

    pub(crate) fn low_water(&self) -> u64 {
        2 * self.dirty_limit.load(Ordering::Relaxed)
    }

    /// The kernel now keeps at most `per_mount` bytes dirty for this mount (its per-device
    /// max_bytes was set): a smaller margin will do.
    pub(crate) fn set_kernel_dirty_bytes(&self, per_mount: u64) {
        self.dirty_limit.store(margin(per_mount), Ordering::Relaxed);
    }

    pub(crate) fn is_low(&self) -> bool {
        self.low.load(Ordering::Relaxed)
    }

    /// How a new open goes: writers get direct IO in low space.
    pub(crate) fn open_mode(&self, writing: bool) -> OpenMode {
        match (writing, self.is_low()) {
            (false, _) => OpenMode::Read,
            (true, true) => OpenMode::Direct,
            (true, false) => OpenMode::Cached,
        }
    }

    /// Registers an open handle (`o_direct`: opened O_DIRECT); returns its file handle
    /// number.
    pub(crate) fn opened(&self, ino: u64, mode: OpenMode, o_direct: bool) -> u64 {
        if mode == OpenMode::Read {
            return READ_HANDLE;
        }
        let mut h = self.handles.lock();
        let fh = h.next;
        h.next += 1;
        h.open.insert(
            fh,
            Handle {
                ino,
                cached: mode == OpenMode::Cached,
                o_direct,
                failed: false,
            },
        );
        fh
    }

    pub(crate) fn released(&self, fh: u64) {
        if fh != READ_HANDLE {
            self.handles.lock().open.remove(&fh);
            self.released.notify_all();
        }
    }

    pub(crate) fn is_direct(&self, fh: u64) -> bool {
        self.handles.lock().open.get(&fh).is_some_and(|h| !h.cached)
    }

    /// Whether `ino` is open for writing through the page cache (it may have dirty pages),
    /// after waiting up to `wait` for such handles to be released: a RELEASE the kernel sent before the request asking may still be on its way, as
    /// requests travel on several queues and are served in parallel.
    pub(crate) fn has_cached_writer_after(&self, ino: u64, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        let mut h = self.handles.lock();
        loop {
            if !h.open.values().any(|x| x.cached && x.ino == ino) {
                return false;
            }
            if self.released.wait_until(&mut h, deadline).timed_out() {
                return h.open.values().any(|x| x.cached && x.ino == ino);
            }
        }
    }

    /// Data space a write that is not a write-back (a direct handle's, an O_DIRECT one's)
    /// must leave free: cached writers' dirty pages need it. O_DIRECT handles have none.
    pub(crate) fn keep_free(&self) -> u64 {
        let any_cached = self
            .handles
            .lock()
            .open
            .values()
            .any(|h| h.cached && !h.o_direct);
        if any_cached {
            self.dirty_limit.load(Ordering::Relaxed)
        } else {
            0
        }
    }

    /// Records free data space after a change; when it no longer holds what cached writers
    /// may have dirty, makes every cached writer's next write(2) ask us first.
    pub(crate) fn update(&self, available: u64) {
        let low = self.low_water();
        if available < low {
            if !self.low.swap(true, Ordering::Relaxed) {
                log::info!(
                    "free data space is down to {available} bytes: files opened for writing \
                     from now on write straight to the filesystem so that ENOSPC reaches \
                     write(2)"
                );
            }
        } else if available > low + low / 4 && self.low.swap(false, Ordering::Relaxed) {
            log::info!("free data space is back to {available} bytes: writes are cached again");
        }
        let critical = self.dirty_limit.load(Ordering::Relaxed);
        if available < critical {
            if !self.critical.swap(true, Ordering::Relaxed) {
                log::info!(
                    "free data space is down to {available} bytes: files opened for writing \
                     through the page cache must be reopened to write on"
                );
                self.invalidate_cached_writers(|_| true);
            }
        } else if available > critical + critical / 4 {
            self.critical.store(false, Ordering::Relaxed);
        }
    }

    /// A write-back of `ino` failed for lack of space.
    pub(crate) fn writeback_failed(&self, ino: u64) {
        {
            let mut h = self.handles.lock();
            for handle in h.open.values_mut().filter(|h| h.ino == ino && h.cached) {
                handle.failed = true;
            }
        }
        self.invalidate_cached_writers(|i| i == ino);
    }

    /// Whether a GETATTR through handle `fh` (the kernel sends one before a cached write(2)
    /// once attributes are invalid) must fail with ENOSPC.
    pub(crate) fn refuse_cached_write(&self, fh: u64) -> bool {
        let mut h = self.handles.lock();
        let Some(handle) = h.open.get_mut(&fh) else {
            return false;
        };
        if !handle.cached {
            return false;
        }
        // An O_DIRECT handle's writes come to us as write(2) makes them and keep the margin
        // there: refusing its GETATTR would only fail its reads (the kernel asks one before
        // a direct read near EOF, fuse_cache_read_iter), as fstests generic/299 found.
        std::mem::take(&mut handle.failed)
            || (!handle.o_direct && self.critical.load(Ordering::Relaxed))
    }

    fn invalidate_cached_writers(&self, which: impl Fn(u64) -> bool) {
        let inodes: Vec<u64> = {
            let h = self.handles.lock();
            let mut v: Vec<u64> = h
                .open
                .values()
                .filter(|h| h.cached && which(h.ino))
                .map(|h| h.ino)
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let Some(notifier) = self.notifier.get() else {
            return;
        };
        for ino in inodes {
            // Offset -1: attributes only, the page cache stays.
            if let Err(e) = notifier.inval_inode(ino, -1, 0) {
                // ENOENT: the kernel has already forgotten the inode; nothing to stop.
                if e.raw_os_error() != Some(libc::ENOENT) {
                    log::warn!("cannot tell the kernel to recheck inode {ino}: {e}");
                }
            }
        }
    }
}

/// The most the kernel may hold dirty for one FUSE mount and still send us, with margin:
/// FUSE mounts get 1% of the global dirty limit (a strict limit), plus what is in flight.
pub(crate) fn kernel_dirty_limit() -> u64 {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    let global = match read("/proc/sys/vm/dirty_bytes") {
        Some(b) if b > 0 => b,
        _ => {
            let ratio = read("/proc/sys/vm/dirty_ratio").unwrap_or(20);
            let total = std::fs::read_to_string("/proc/meminfo")
                .ok()
                .and_then(|m| {
                    m.lines()
                        .find_map(|l| l.strip_prefix("MemTotal:"))
                        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                })
                .map_or(16 << 30, |kib| kib * 1024);
            total / 100 * ratio
        }
    };
    margin(global / 100)
}

/// What to keep free for a mount whose kernel dirty share is `per_mount`: twice it, for the
/// slack of the dirty throttle, plus a full queue of 1 MiB write-backs in flight.
fn margin(per_mount: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    (2 * per_mount + 16 * MIB).max(32 * MIB)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn opens_turn_direct_below_low_water_and_back_with_hysteresis() {
        let g = SpaceGuard::new(10 * MIB);
        assert_eq!(g.open_mode(false), OpenMode::Read);
        g.update(100 * MIB);
        assert_eq!(g.open_mode(true), OpenMode::Cached);
        g.update(19 * MIB);
        assert_eq!(g.open_mode(true), OpenMode::Direct);
        assert_eq!(g.open_mode(false), OpenMode::Read);
        // Between low water and its hysteresis the mode stays.
        g.update(21 * MIB);
        assert_eq!(g.open_mode(true), OpenMode::Direct);
        g.update(26 * MIB);
        assert_eq!(g.open_mode(true), OpenMode::Cached);
    }

    #[test]
    fn cached_writers_are_refused_in_low_space_and_after_a_failed_writeback() {
        let g = SpaceGuard::new(10 * MIB);
        let cached = g.opened(7, g.open_mode(true), false);
        let reader = g.opened(7, g.open_mode(false), false);
        assert_eq!(reader, READ_HANDLE);
        assert!(!g.refuse_cached_write(cached));
        assert_eq!(g.keep_free(), 10 * MIB);
        g.writeback_failed(7);
        assert!(g.refuse_cached_write(cached), "the failure is reported");
        assert!(!g.refuse_cached_write(cached), "once");
        g.update(15 * MIB);
        assert!(
            !g.refuse_cached_write(cached),
            "below low water a cached writer's dirty pages still fit"
        );
        g.update(5 * MIB);
        assert!(g.refuse_cached_write(cached));
        let direct = g.opened(7, g.open_mode(true), false);
        assert!(g.is_direct(direct));
        assert!(!g.refuse_cached_write(direct));
        g.released(cached);
        assert_eq!(g.keep_free(), 0, "no cached writer left to keep space for");
        g.released(direct);
        assert!(!g.is_direct(direct));
    }

    #[test]
    fn o_direct_handles_dirty_no_pages_but_leave_room_for_those_that_do() {
        let g = SpaceGuard::new(10 * MIB);
        g.update(100 * MIB);
        let o_direct = g.opened(7, g.open_mode(true), true);
        assert_eq!(g.keep_free(), 0, "an O_DIRECT writer alone needs no margin");
        let cached = g.opened(8, g.open_mode(true), false);
        assert_eq!(
            g.keep_free(),
            10 * MIB,
            "a buffered writer's dirty pages need it"
        );
        g.update(5 * MIB);
        assert!(
            g.refuse_cached_write(cached),
            "below the margin a cached writer stops"
        );
        assert!(
            !g.refuse_cached_write(o_direct),
            "an O_DIRECT handle's GETATTR (before a read, too) is never refused for space"
        );
        g.released(cached);
        assert_eq!(g.keep_free(), 0);
        g.released(o_direct);
    }

    #[test]
    fn the_limit_covers_at_least_a_queue_of_writebacks() {
        assert!(kernel_dirty_limit() >= 32 * MIB);
    }
}
