//! Orphans: an inode whose last name goes while it is open lives on, with an ORPHAN_ITEM
//! (`inode_ops`), until its last user lets go; a mount deletes those a previous session
//! left behind, as the kernel does.

use crate::error::{Error, Result};
use crate::transaction::fs::{FsCore, InodeId};
use crate::transaction::space::reservation::Reserve;
use crate::transaction::Transaction;
use oleo_format::key::{item, objectid, Key};

impl FsCore {
    /// Undoes one pin (`OpenInodes`); the last one deletes the inode if it has no names
    /// left.
    pub(crate) fn unpin_open(&mut self, id: InodeId) -> Result<()> {
        if self.open_inodes.unpin(id) {
            self.delete_if_unlinked(id)
        } else {
            Ok(())
        }
    }

    /// Deletes `id` if it has no names left and nothing pins it (an orphan whose last user
    /// went away).
    pub(crate) fn delete_if_unlinked(&mut self, id: InodeId) -> Result<()> {
        if self.open_inodes.is_open(id) || self.aborted.is_some() || !self.io.device().is_writable()
        {
            return Ok(());
        }
        match self.inode_item(id) {
            Ok(inode) if inode.nlink == 0 => {
                self.write_op(Reserve::items(8), |t| t.delete_inode(id))
            }
            _ => Ok(()),
        }
    }

    /// Deletes inodes left as orphans (unlinked while open when the last session ended),
    /// as the kernel does at mount.
    pub(crate) fn remove_orphans(&mut self, subvol: u64) -> Result<usize> {
        let orphans = self.write_op(Reserve::items(1), |t| t.orphans(subvol))?;
        for &ino in &orphans {
            let id = InodeId { subvol, ino };
            self.write_op(Reserve::items(8), |t| t.delete_inode(id))?;
        }
        Ok(orphans.len())
    }
}

impl Transaction<'_> {
    /// Deletes every item of inode `id` (its data extents dropped first) and its orphan item.
    pub(crate) fn delete_inode(&mut self, id: InodeId) -> Result<()> {
        self.forget_delayed(id);
        self.filesystem().default_acls.lock().remove(&id);
        self.drop_extents(id, 0, u64::MAX)?;
        let min = Key::new(id.ino, 0, 0);
        let max = Key::new(id.ino, u8::MAX, u64::MAX);
        self.delete_items_in_range(id.subvol, min, max)?;
        match self.delete_item(
            id.subvol,
            &Key::new(objectid::ORPHAN, item::ORPHAN_ITEM, id.ino),
        ) {
            Err(Error::NotFound) => {}
            r => r?,
        }
        self.filesystem().inodes.remove(&id);
        Ok(())
    }
}

impl FsCore {
    /// Drops every open pin (deleting orphans) and commits: the end of a mount.
    /// Closes a filesystem: open files are closed (unlinked ones deleted) and the running
    /// transaction committed. Returns the commit's result; dropping a `FsCore` does the
    /// same but can only log a failure.
    pub(crate) fn close(mut self) -> Result<()> {
        let r = self.finish();
        if let Err(e) = &r {
            // Nothing more to try in drop.
            self.aborted
                .get_or_insert_with(|| format!("close failed: {e}"));
        }
        r
    }

    /// What `close` and drop do; nothing for a read-only or aborted filesystem.
    pub(crate) fn finish(&mut self) -> Result<()> {
        self.pipe.write_deferred()?;
        let (syncs, fsyncs) = self.pipe.log.counts();
        if syncs > 0 {
            log::info!("{fsyncs} fsyncs went through the log tree, in {syncs} log syncs");
        }
        let skips = self.io.skips();
        if skips.count() > 0 {
            log::warn!(
                "rescue: went around {} unreadable things at {} places (each logged once above)",
                skips.count(),
                skips.places()
            );
        }
        let idle = self.running.is_none() && self.open_inodes.lock().is_empty();
        if idle || self.aborted.is_some() || !self.io.device().is_writable() {
            return Ok(());
        }
        self.close_all_and_sync().map(|_| ())
    }

    pub(crate) fn close_all_and_sync(&mut self) -> Result<u64> {
        let open: Vec<InodeId> = self.open_inodes.lock().keys().copied().collect();
        for id in open {
            self.open_inodes.lock().insert(id, 1);
            self.unpin_open(id)?;
        }
        self.sync()
    }
}
