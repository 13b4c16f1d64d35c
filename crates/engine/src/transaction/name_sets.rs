//! The names of directories this process made, by hash, so that a lookup of a name that is
//! not there answers without the filesystem's lock.
//!
//! Every create looks its name up first (the kernel's LOOKUP before CREATE), and that
//! lookup waited for the lock behind the creates of other threads: with two fs_mark threads
//! the CPUs stood idle a fifth of the time (docs/benchmarks.md). A directory made by mkdir
//! in this process starts with a set of its DIR_ITEM hashes that is complete: empty, and
//! every later DIR_ITEM insertion into it records its hash first (`add_dir_item`, the one
//! way a name enters a directory), under the lock and before the operation ends. A hash
//! absent from a complete set is then a name absent from the directory as every reader
//! sees it now: a create that has not yet recorded its name has not returned either.
//!
//! Nothing is ever taken out of a set: a name that was removed, a failed or aborted
//! insertion, or two names of one hash leave a hash that only sends the lookup the slow
//! way. A directory's set goes when an inode of its number is made again (a reused inode
//! number), when its subvolume is deleted, when a transaction aborts (`clear`), and when
//! the sets grow past their bound, which keeps the memory small: a directory without a set
//! is looked up under the lock, as before.

use super::fs::InodeId;
use parking_lot::Mutex;

/// The most hashes kept, over all directories: about 10 to 18 bytes each in the sets, so
/// at most some 18 MiB (fs_mark's 400,000 files fit).
const MAX_HASHES: usize = 1 << 20;

#[derive(Debug, Default)]
pub(crate) struct NameSets {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    sets: foldhash::HashMap<InodeId, foldhash::HashSet<u64>>,
    hashes: usize,
}

impl NameSets {
    /// True if `dir` holds no name of hash `hash`: `dir` has a complete set without it.
    /// False means "ask the tree", never "present".
    pub(crate) fn surely_absent(&self, dir: InodeId, hash: u64) -> bool {
        self.inner
            .lock()
            .sets
            .get(&dir)
            .is_some_and(|s| !s.contains(&hash))
    }

    /// `dir` was just made, empty, by this process.
    pub(crate) fn made_empty(&self, dir: InodeId) {
        let mut inner = self.inner.lock();
        if let Some(old) = inner.sets.insert(dir, Default::default()) {
            inner.hashes -= old.len();
        }
    }

    /// An inode numbered `id` was just made: whatever set that number had is not its own.
    pub(crate) fn forget(&self, id: InodeId) {
        let mut inner = self.inner.lock();
        if let Some(old) = inner.sets.remove(&id) {
            inner.hashes -= old.len();
        }
    }

    /// Every directory of subvolume `subvol` (deleted).
    pub(crate) fn forget_subvolume(&self, subvol: u64) {
        let mut inner = self.inner.lock();
        let mut dropped = 0;
        inner.sets.retain(|id, s| {
            let keep = id.subvol != subvol;
            if !keep {
                dropped += s.len();
            }
            keep
        });
        inner.hashes -= dropped;
    }

    /// Every set (an aborted transaction: what it inserted is gone, and what it removed is
    /// back, which the sets, never shrinking, would survive, but nothing is assumed there).
    pub(crate) fn clear(&self) {
        let mut inner = self.inner.lock();
        inner.sets.clear();
        inner.hashes = 0;
    }

    /// A DIR_ITEM of hash `hash` is about to be inserted into `dir`. Called before the
    /// insertion, under the filesystem's lock.
    pub(crate) fn adding(&self, dir: InodeId, hash: u64) {
        let mut inner = self.inner.lock();
        let Some(set) = inner.sets.get_mut(&dir) else {
            return;
        };
        if set.insert(hash) {
            inner.hashes += 1;
        }
        if inner.hashes > MAX_HASHES {
            inner.sets.clear();
            inner.hashes = 0;
        }
    }

    #[cfg(test)]
    fn hashes(&self) -> usize {
        self.inner.lock().hashes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(subvol: u64, ino: u64) -> InodeId {
        InodeId { subvol, ino }
    }

    #[test]
    fn only_a_complete_set_answers_and_only_for_hashes_it_lacks() {
        let n = NameSets::default();
        let d = id(5, 300);
        // Not made here: unknown, ask the tree.
        assert!(!n.surely_absent(d, 1));
        n.adding(d, 1);
        assert!(!n.surely_absent(d, 2));
        n.made_empty(d);
        assert!(n.surely_absent(d, 1));
        n.adding(d, 1);
        assert!(!n.surely_absent(d, 1));
        assert!(n.surely_absent(d, 2));
        // Another subvolume's directory of the same number is another directory.
        assert!(!n.surely_absent(id(256, 300), 2));
        assert_eq!(n.hashes(), 1);
    }

    #[test]
    fn sets_go_with_a_reused_number_a_deleted_subvolume_and_an_abort() {
        let n = NameSets::default();
        for (s, i) in [(5, 300), (5, 301), (256, 300)] {
            n.made_empty(id(s, i));
            n.adding(id(s, i), 7);
        }
        n.forget(id(5, 300));
        assert!(!n.surely_absent(id(5, 300), 8));
        assert!(n.surely_absent(id(5, 301), 8));
        n.forget_subvolume(5);
        assert!(!n.surely_absent(id(5, 301), 8));
        assert!(n.surely_absent(id(256, 300), 8));
        assert_eq!(n.hashes(), 1);
        n.clear();
        assert!(!n.surely_absent(id(256, 300), 8));
        assert_eq!(n.hashes(), 0);
    }

    #[test]
    fn past_the_bound_every_set_goes() {
        let n = NameSets::default();
        let d = id(5, 300);
        n.made_empty(d);
        for h in 0..=MAX_HASHES as u64 {
            n.adding(d, h);
        }
        assert!(!n.surely_absent(d, u64::MAX));
        assert_eq!(n.hashes(), 0);
    }
}
