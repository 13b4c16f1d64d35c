//! Deleting a subvolume, its first half (the kernel's btrfs_delete_subvolume): the entry
//! leaves its parent directory, ROOT_REF/ROOT_BACKREF and the uuid items go, the ROOT_ITEM
//! gets refs 0 and the DEAD flag, and an orphan item in the root tree marks the tree as
//! still to drop. The tree's blocks stay allocated until it is dropped (`drop`, or the
//! kernel's cleaner at its next mount).

use crate::error::{Error, Result};
use crate::filesystem::Filesystem;
use crate::fs::InodeId;
use crate::inode_item::now;
use crate::reservation::Reserve;
use crate::transaction::Transaction;
use oleo_format::items::RootRef;
use oleo_format::key::{item, objectid, Key};
use std::ops::ControlFlow;

/// ROOT_ITEM.flags: the subvolume is deleted, its tree waits to be dropped.
const ROOT_SUBVOL_DEAD: u64 = 1 << 48;

impl Filesystem {
    /// Deletes the subvolume whose entry is `name` in directory `parent`; returns its id.
    /// Refused (as the kernel refuses) for the default subvolume, a subvolume holding
    /// others and the one this filesystem was opened at. Files still open in it stay open
    /// (as with the kernel), but writes to them are refused from then on.
    pub fn delete_subvolume(&self, parent: InodeId, name: &[u8]) -> Result<u64> {
        // In-place writes into the dying tree's extents finish before they can be freed.
        let _nocow = self.nocow_writers().exclusive();
        let mut core = self.core_mut();
        core.check_subvol_writable(parent.subvol)?;
        let id = match core.lookup(parent, name)? {
            found if found.ino == objectid::FIRST_FREE && found.subvol != parent.subvol => {
                found.subvol
            }
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "{} is not a subvolume",
                    String::from_utf8_lossy(name)
                )))
            }
        };
        if id == core.default_subvolume()? {
            return Err(Error::Busy(format!(
                "subvolume {id} is the default subvolume (set another default first)"
            )));
        }
        if id == core.root().subvol {
            return Err(Error::Busy(format!(
                "subvolume {id} is where this filesystem is mounted"
            )));
        }
        core.write_op(Reserve::items(12), |t| t.unlink_subvolume(parent, name, id))?;
        core.subvol_roots.write().remove(&id);
        core.readonly_subvols.lock().remove(&id);
        Ok(id)
    }
}

impl Transaction<'_> {
    fn unlink_subvolume(&mut self, parent: InodeId, name: &[u8], id: u64) -> Result<()> {
        let mut children = false;
        self.for_each_in_range(
            objectid::ROOT_TREE,
            Key::new(id, item::ROOT_REF, 0),
            Key::new(id, item::ROOT_REF, u64::MAX),
            |_, _| {
                children = true;
                Ok(ControlFlow::Break(()))
            },
        )?;
        if children {
            return Err(Error::NotEmpty);
        }
        let ref_key = Key::new(parent.subvol, item::ROOT_REF, id);
        let body = self
            .lookup(objectid::ROOT_TREE, &ref_key)?
            .ok_or_else(|| Error::corrupt(0, format!("subvolume {id} has no ROOT_REF")))?;
        let index = RootRef::parse(&body)
            .map_err(|e| Error::corrupt(0, format!("root ref of {id}: {e}")))?
            .sequence;
        let mut dir = self.dir_inode(parent)?;
        self.remove_dir_entry(parent, name, index, None)?;
        dir.size = dir.size.saturating_sub(2 * name.len() as u64);
        let t = now();
        dir.mtime = t;
        dir.ctime = t;
        self.write_inode(parent, &mut dir)?;
        self.delete_item(objectid::ROOT_TREE, &ref_key)?;
        self.delete_item(
            objectid::ROOT_TREE,
            &Key::new(id, item::ROOT_BACKREF, parent.subvol),
        )?;
        let (key, mut ri) = self.subvol_item(id)?;
        ri.refs = 0;
        ri.flags |= ROOT_SUBVOL_DEAD;
        ri.drop_progress = Key::new(0, 0, 0);
        ri.drop_level = 0;
        self.put_subvol_item(&key, &ri)?;
        self.insert_item(
            objectid::ROOT_TREE,
            Key::new(objectid::ORPHAN, item::ORPHAN_ITEM, id),
            &[],
        )?;
        self.remove_uuid(&ri.uuid, item::UUID_KEY_SUBVOL, id)?;
        if ri.received_uuid != [0; 16] {
            self.remove_uuid(&ri.received_uuid, item::UUID_KEY_RECEIVED_SUBVOL, id)?;
        }
        // The log cannot describe an entry that led into another tree.
        self.log
            .full_commit
            .get_or_insert_with(|| format!("subvolume {id} was deleted"));
        Ok(())
    }
}
