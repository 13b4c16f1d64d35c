//! Delayed refs: changes to the back references of extents are queued while operations run
//! and applied at commit (`extent_tree::run_delayed_refs`), in extent order, so each
//! extent's item is read and written once however many references changed in the
//! transaction, and an operation holds the filesystem no longer than its own trees need.
//! - Tree blocks: one queued insert or delete of the block's METADATA_ITEM (applying them
//!   allocates and frees extent tree blocks, which queues more: run until empty).
//! - Data extents: a net count per reference (root, inode, offset), so a reference added
//!   and dropped in the same transaction (a file overwritten, truncated, deleted) costs
//!   nothing in the extent tree.
//!
//! Anything that reads or changes a data extent's item directly (shared references of
//! snapshots) first applies that extent's queued changes (`Transaction::run_data_head`).

use crate::error::{Error, Result};
use crate::transaction::Transaction;
use std::collections::BTreeMap;

/// Where one reference to a data extent comes from: file extent items of inode `objectid`
/// in tree `root` whose `key.offset - extent offset` is `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct DataRef {
    pub root: u64,
    pub objectid: u64,
    pub offset: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TreeRefOp {
    /// A new block of tree `owner`: insert its METADATA_ITEM.
    Add { owner: u64, level: u8 },
    /// A block of an earlier commit (or one whose item is already in): remove its item.
    Drop { level: u8 },
}

/// The queued changes of one data extent.
#[derive(Debug, Default)]
pub(crate) struct DataHead {
    pub len: u64,
    /// Net change per reference; zero when the changes cancelled out.
    pub refs: BTreeMap<DataRef, i64>,
}

/// Uncompressed data extents allocated in the running transaction whose one file extent
/// item maps them whole: by address and by end address, so a write can tell at once
/// whether its piece touches one (`Transaction::join_previous`, `absorb_next`).
#[derive(Default)]
pub(crate) struct FreshExtents {
    by_start: foldhash::HashMap<u64, u64>,
    by_end: foldhash::HashMap<u64, u64>,
}

impl FreshExtents {
    pub(crate) fn insert(&mut self, start: u64, len: u64) {
        if let Some(old) = self.by_start.insert(start, len) {
            self.by_end.remove(&(start + old));
        }
        self.by_end.insert(start + len, start);
    }

    pub(crate) fn remove(&mut self, start: u64) {
        if let Some(len) = self.by_start.remove(&start) {
            self.by_end.remove(&(start + len));
        }
    }

    /// The length of the fresh extent at `start`.
    pub(crate) fn len_of(&self, start: u64) -> Option<u64> {
        self.by_start.get(&start).copied()
    }

    /// True if a fresh extent ends at `end`.
    pub(crate) fn ends_at(&self, end: u64) -> bool {
        self.by_end.contains_key(&end)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }
}

#[derive(Default)]
pub(crate) struct DelayedRefs {
    tree: BTreeMap<u64, TreeRefOp>,
    data: BTreeMap<u64, DataHead>,
}

impl DelayedRefs {
    /// Queues the METADATA_ITEM of a new tree block.
    pub(crate) fn add_tree_block(&mut self, bytenr: u64, owner: u64, level: u8) -> Result<()> {
        if self
            .tree
            .insert(bytenr, TreeRefOp::Add { owner, level })
            .is_some()
        {
            return Err(Error::corrupt(bytenr, "tree block allocated twice"));
        }
        Ok(())
    }

    /// Queues the removal of the block's item; a block whose item was never inserted just
    /// loses its queued insertion (true: nothing about it reaches the extent tree).
    pub(crate) fn drop_tree_block(&mut self, bytenr: u64, level: u8) -> Result<bool> {
        match self.tree.remove(&bytenr) {
            Some(TreeRefOp::Add { .. }) => Ok(true),
            Some(TreeRefOp::Drop { .. }) => Err(Error::corrupt(bytenr, "tree block freed twice")),
            None => {
                self.tree.insert(bytenr, TreeRefOp::Drop { level });
                Ok(false)
            }
        }
    }

    /// Queues `delta` references from `r` to the data extent `[bytenr, bytenr + len)`.
    fn change_data(&mut self, bytenr: u64, len: u64, r: DataRef, delta: i64) -> Result<()> {
        let head = self.data.entry(bytenr).or_insert_with(|| DataHead {
            len,
            refs: BTreeMap::new(),
        });
        if head.len != len {
            return Err(Error::corrupt(
                bytenr,
                format!(
                    "data extent referenced with two lengths ({} and {len})",
                    head.len
                ),
            ));
        }
        *head.refs.entry(r).or_insert(0) += delta;
        Ok(())
    }

    /// Grows the queued new data extent `bytenr` from `len` to `new_len` bytes, if its
    /// only reference is `r` once (its item not in the extent tree yet); false otherwise.
    pub(crate) fn grow_new_data(
        &mut self,
        bytenr: u64,
        len: u64,
        r: DataRef,
        new_len: u64,
    ) -> bool {
        let Some(head) = self.data.get_mut(&bytenr) else {
            return false;
        };
        if head.len != len || !only_ref(head, r) {
            return false;
        }
        head.len = new_len;
        true
    }

    /// Forgets the queued new data extent `bytenr` of `len` bytes, if its only reference
    /// is `r` once (another extent grows over it); false otherwise.
    pub(crate) fn take_new_data(&mut self, bytenr: u64, len: u64, r: DataRef) -> bool {
        let Some(head) = self.data.get(&bytenr) else {
            return false;
        };
        if head.len != len || !only_ref(head, r) {
            return false;
        }
        self.data.remove(&bytenr);
        true
    }

    pub(crate) fn take_tree(&mut self) -> BTreeMap<u64, TreeRefOp> {
        std::mem::take(&mut self.tree)
    }

    pub(crate) fn take_data(&mut self) -> BTreeMap<u64, DataHead> {
        std::mem::take(&mut self.data)
    }

    pub(crate) fn take_data_head(&mut self, bytenr: u64) -> Option<DataHead> {
        self.data.remove(&bytenr)
    }

    /// True if a queued change drops a data reference (a commit may then free data space).
    /// An extent whose every queued reference cancelled out counts too: written in this
    /// transaction and overwritten since, the commit frees it (a file overwritten in a
    /// loop holds twice its size until then). An older extent dropped and referenced again
    /// looks the same: one commit too many, near full only.
    pub(crate) fn drops_data(&self) -> bool {
        self.data
            .values()
            .any(|h| h.refs.values().any(|&d| d < 0) || h.refs.values().all(|&d| d == 0))
    }

    /// The queued changes to data extent `bytenr`'s references.
    pub(crate) fn data_head(&self, bytenr: u64) -> Option<&DataHead> {
        self.data.get(&bytenr)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.tree.is_empty() && self.data.is_empty()
    }
}

/// True if `r` holds the extent once and nothing else does.
fn only_ref(head: &DataHead, r: DataRef) -> bool {
    head.refs.get(&r) == Some(&1)
        && head
            .refs
            .iter()
            .all(|(k, &d)| if *k == r { d == 1 } else { d == 0 })
}

impl Transaction<'_> {
    /// Adds one reference to the data extent `[bytenr, bytenr + len)` (applied at commit;
    /// the first one creates its EXTENT_ITEM).
    pub(crate) fn add_data_ref(&mut self, bytenr: u64, len: u64, r: DataRef) -> Result<()> {
        self.refs.change_data(bytenr, len, r, 1)
    }

    /// Drops one reference (applied at commit; the last one deletes the extent item,
    /// frees the space and deletes its checksums).
    pub(crate) fn drop_data_ref(&mut self, bytenr: u64, len: u64, r: DataRef) -> Result<()> {
        self.refs.change_data(bytenr, len, r, -1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(objectid: u64) -> DataRef {
        DataRef {
            root: 5,
            objectid,
            offset: 0,
        }
    }

    #[test]
    fn data_changes_are_netted_per_reference() {
        let mut q = DelayedRefs::default();
        q.change_data(1 << 20, 4096, r(257), 1).unwrap();
        q.change_data(1 << 20, 4096, r(258), 1).unwrap();
        q.change_data(1 << 20, 4096, r(257), -1).unwrap();
        assert!(!q.drops_data(), "258 still holds the extent");
        q.change_data(2 << 20, 4096, r(260), 1).unwrap();
        q.change_data(2 << 20, 4096, r(260), -1).unwrap();
        assert!(
            q.drops_data(),
            "an extent added and dropped is freed at commit"
        );
        q.take_data_head(2 << 20).unwrap();
        assert!(!q.drops_data());
        q.change_data(1 << 20, 4096, r(259), -1).unwrap();
        assert!(q.drops_data());
        let head = q.take_data_head(1 << 20).unwrap();
        assert_eq!(head.refs[&r(257)], 0);
        assert_eq!(head.refs[&r(258)], 1);
        assert_eq!(head.refs[&r(259)], -1);
        assert!(q.is_empty());
    }

    #[test]
    fn fresh_extents_are_found_by_start_and_by_end() {
        let mut f = FreshExtents::default();
        assert!(f.is_empty());
        f.insert(1 << 20, 4096);
        assert!(f.ends_at((1 << 20) + 4096));
        assert_eq!(f.len_of(1 << 20), Some(4096));
        // Grown: the old end is no end any more.
        f.insert(1 << 20, 8192);
        assert!(!f.ends_at((1 << 20) + 4096));
        assert!(f.ends_at((1 << 20) + 8192));
        f.remove(1 << 20);
        assert!(!f.ends_at((1 << 20) + 8192));
        assert_eq!(f.len_of(1 << 20), None);
        assert!(f.is_empty());
    }

    #[test]
    fn one_extent_two_lengths_is_refused() {
        let mut q = DelayedRefs::default();
        q.change_data(1 << 20, 4096, r(257), 1).unwrap();
        assert!(q.change_data(1 << 20, 8192, r(257), 1).is_err());
    }

    #[test]
    fn tree_block_freed_in_its_transaction_leaves_nothing() {
        let mut q = DelayedRefs::default();
        q.add_tree_block(4 << 20, 5, 0).unwrap();
        assert!(q.drop_tree_block(4 << 20, 0).unwrap());
        assert!(q.is_empty());
        q.drop_tree_block(8 << 20, 1).unwrap();
        assert!(q.drop_tree_block(8 << 20, 1).is_err());
    }
}
