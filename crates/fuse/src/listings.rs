//! Where a directory listing ends. Kernel btrfs lists only the entries a directory had at
//! opendir (its last DIR_INDEX then), so a program that renames what it lists, which gives
//! each entry a new and higher index, still comes to an end. We take the kernel's
//! zero-message opendir (no OPENDIR or RELEASEDIR round trips, a third of dbench's
//! requests), so there is no handle to keep that end in: a listing is known instead by
//! its directory and the thread reading it, and begins when that thread reads offset 0.
//! The end is looked up with this map let go (it may read the tree from disk).

use std::collections::HashMap;

/// Listings remembered at most; the oldest is forgotten first (its reader then gets an
/// end from its next read on, which is only later, never earlier).
const MAX: usize = 4096;

#[derive(Default)]
pub(crate) struct Listings {
    /// (directory node, reader's thread id) -> (end, when it began).
    ends: HashMap<(u64, u32), (u64, u64)>,
    clock: u64,
}

impl Listings {
    /// The end of the listing `reader` is reading in `dir` at `offset`, if it is under
    /// way (offset 0 begins a listing anew).
    pub(crate) fn end(&self, dir: u64, reader: u32, offset: u64) -> Option<u64> {
        (offset != 0)
            .then(|| self.ends.get(&(dir, reader)).map(|&(end, _)| end))
            .flatten()
    }

    /// Records where the listing `reader` begins (or resumes, forgotten) in `dir` ends.
    pub(crate) fn begin(&mut self, dir: u64, reader: u32, end: u64) {
        if self.ends.len() >= MAX && !self.ends.contains_key(&(dir, reader)) {
            let oldest = self
                .ends
                .iter()
                .min_by_key(|(_, (_, t))| *t)
                .map(|(k, _)| *k);
            oldest.map(|k| self.ends.remove(&k));
        }
        self.clock += 1;
        self.ends.insert((dir, reader), (end, self.clock));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read at `offset`; `now` is the directory's end at that moment.
    fn at(l: &mut Listings, dir: u64, reader: u32, offset: u64, now: u64) -> u64 {
        l.end(dir, reader, offset).unwrap_or_else(|| {
            l.begin(dir, reader, now);
            now
        })
    }

    #[test]
    fn a_listing_keeps_the_end_it_began_with() {
        let mut l = Listings::default();
        assert_eq!(at(&mut l, 5, 100, 0, 10), 10);
        assert_eq!(
            at(&mut l, 5, 100, 7, 20),
            10,
            "continued: the end from offset 0"
        );
        assert_eq!(at(&mut l, 5, 101, 7, 30), 30, "another reader: its own end");
        assert_eq!(at(&mut l, 6, 100, 3, 40), 40, "another directory");
        assert_eq!(at(&mut l, 5, 100, 0, 50), 50, "rewinddir begins anew");
        assert_eq!(at(&mut l, 5, 100, 9, 60), 50);
    }

    #[test]
    fn the_oldest_listing_is_forgotten_first() {
        let mut l = Listings::default();
        for d in 0..MAX as u64 {
            at(&mut l, d, 1, 0, d);
        }
        at(&mut l, MAX as u64, 1, 0, 99);
        assert_eq!(l.ends.len(), MAX);
        assert_eq!(at(&mut l, 0, 1, 5, 77), 77, "directory 0 was the oldest");
        assert_eq!(
            at(&mut l, 1, 1, 5, 77),
            77,
            "then directory 1, to make room for 0"
        );
        assert_eq!(at(&mut l, 3, 1, 5, 77), 3);
    }
}
