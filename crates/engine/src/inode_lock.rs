//! Per-inode locks: operations that change one file's data or size (write, truncate,
//! fallocate, copy into it) hold its lock across all their steps, so a write whose data
//! goes to the device outside the filesystem's lock (`ordered_extent`) finds the file as
//! it left it. Taken before the filesystem's lock, never while holding it.

use crate::fs::InodeId;
use parking_lot::{ArcMutexGuard, Mutex, RawMutex};
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Default)]
pub(crate) struct InodeLocks {
    locks: Mutex<HashMap<InodeId, Arc<Mutex<()>>>>,
}

/// Held while an operation works on one inode; the entry goes when nobody wants it.
pub(crate) struct InodeGuard<'a> {
    locks: &'a InodeLocks,
    id: InodeId,
    guard: Option<ArcMutexGuard<RawMutex, ()>>,
}

impl InodeLocks {
    pub(crate) fn lock(&self, id: InodeId) -> InodeGuard<'_> {
        let lock = Arc::clone(self.locks.lock().entry(id).or_default());
        let guard = lock.try_lock_arc().unwrap_or_else(|| {
            crate::blocking::will_wait();
            lock.lock_arc()
        });
        InodeGuard {
            locks: self,
            id,
            guard: Some(guard),
        }
    }
}

impl Drop for InodeGuard<'_> {
    fn drop(&mut self) {
        let Some(guard) = self.guard.take() else {
            return;
        };
        let lock = Arc::clone(ArcMutexGuard::mutex(&guard));
        drop(guard);
        let mut map = self.locks.locks.lock();
        // Only the map's reference and ours: nobody else holds or waits for it, and nobody
        // can get it but through the map, which we hold.
        if Arc::strong_count(&lock) == 2 {
            map.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_per_inode_and_entries_go_away() {
        let locks = Arc::new(InodeLocks::default());
        let id = InodeId {
            subvol: 5,
            ino: 257,
        };
        let counter = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (locks, counter) = (Arc::clone(&locks), Arc::clone(&counter));
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let _g = locks.lock(id);
                        let before = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        assert_eq!(before, 0, "two holders at once");
                        counter.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(locks.locks.lock().is_empty());
    }
}
