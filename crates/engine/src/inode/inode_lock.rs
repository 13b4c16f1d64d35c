//! Per-inode locks: operations that change one file's data or size (write, truncate,
//! fallocate, copy into it or out of it) hold its lock alone across all their steps, so a
//! write whose data goes to the device outside the filesystem's lock (`ordered_extent`)
//! finds the file as it left it. Writes that overwrite data in place (`nocow`) change no
//! item, so they share it with each other. Taken before the filesystem's lock, never
//! while holding it.

use crate::transaction::fs::InodeId;
use parking_lot::{ArcRwLockReadGuard, ArcRwLockWriteGuard, Mutex, RawRwLock, RwLock};
use std::collections::HashMap;
use std::sync::Arc;

type Lock = Arc<RwLock<()>>;

#[derive(Default)]
pub(crate) struct InodeLocks {
    locks: Mutex<HashMap<InodeId, Lock>>,
}

enum Held {
    Alone(ArcRwLockWriteGuard<RawRwLock, ()>),
    Shared(ArcRwLockReadGuard<RawRwLock, ()>),
}

/// Held while an operation works on one inode; the entry goes when nobody wants it.
pub(crate) struct InodeGuard<'a> {
    locks: &'a InodeLocks,
    id: InodeId,
    guard: Option<Held>,
}

impl InodeLocks {
    fn entry(&self, id: InodeId) -> Lock {
        Arc::clone(self.locks.lock().entry(id).or_default())
    }

    /// The inode's lock alone.
    pub(crate) fn lock(&self, id: InodeId) -> InodeGuard<'_> {
        let lock = self.entry(id);
        let guard = lock.try_write_arc().unwrap_or_else(|| {
            crate::blocking::will_wait();
            lock.write_arc()
        });
        self.guard(id, Held::Alone(guard))
    }

    /// The inode's lock shared with other in-place writers.
    pub(crate) fn lock_shared(&self, id: InodeId) -> InodeGuard<'_> {
        let lock = self.entry(id);
        let guard = lock.try_read_arc().unwrap_or_else(|| {
            crate::blocking::will_wait();
            lock.read_arc()
        });
        self.guard(id, Held::Shared(guard))
    }

    /// Two inodes alone (a copy between files), in a fixed order so two copies in
    /// opposite directions cannot wait for each other.
    pub(crate) fn lock_two(
        &self,
        a: InodeId,
        b: InodeId,
    ) -> (InodeGuard<'_>, Option<InodeGuard<'_>>) {
        if a == b {
            return (self.lock(a), None);
        }
        let key = |id: InodeId| (id.subvol, id.ino);
        if key(a) < key(b) {
            let first = self.lock(a);
            (first, Some(self.lock(b)))
        } else {
            let first = self.lock(b);
            (first, Some(self.lock(a)))
        }
    }

    fn guard(&self, id: InodeId, held: Held) -> InodeGuard<'_> {
        InodeGuard {
            locks: self,
            id,
            guard: Some(held),
        }
    }
}

impl Drop for InodeGuard<'_> {
    fn drop(&mut self) {
        let Some(guard) = self.guard.take() else {
            return;
        };
        let lock = match &guard {
            Held::Alone(g) => Arc::clone(ArcRwLockWriteGuard::rwlock(g)),
            Held::Shared(g) => Arc::clone(ArcRwLockReadGuard::rwlock(g)),
        };
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
