//! Deleting a subvolume, its first half (the kernel's btrfs_delete_subvolume): the entry
//! leaves its parent directory, ROOT_REF/ROOT_BACKREF and the uuid items go, the ROOT_ITEM
//! gets refs 0 and the DEAD flag, and an orphan item in the root tree marks the tree as
//! still to drop. The tree's blocks stay allocated until it is dropped (`drop`, or the
//! kernel's cleaner at its next mount).

use crate::error::{Error, Result};
use crate::inode::inode_item::now;
use crate::transaction::fs::InodeId;
use crate::transaction::Transaction;
use oleo_format::items::RootRef;
use oleo_format::key::{item, objectid, Key};
use std::ops::ControlFlow;

/// ROOT_ITEM.flags: the subvolume is deleted, its tree waits to be dropped.
const ROOT_SUBVOL_DEAD: u64 = 1 << 48;

impl Transaction<'_> {
    pub(crate) fn unlink_subvolume(&mut self, parent: InodeId, name: &[u8], id: u64) -> Result<()> {
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
        // Its directories' names go with it (`name_sets`).
        self.filesystem().names.forget_subvolume(id);
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
