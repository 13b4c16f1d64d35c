//! The default subvolume (`btrfs subvolume get-default | set-default`): the one a mount
//! without subvol= or subvolid= shows, named by the `default` entry of the root tree's
//! directory. Setting it rewrites that entry's location and sets the DEFAULT_SUBVOL
//! incompat bit, as the kernel's btrfs_ioctl_default_subvol.

use crate::error::{Error, Result};
use crate::transaction::Transaction;
use oleo_format::csum::name_hash;
use oleo_format::items::{DirEntryItem, DirEntryIter};
use oleo_format::key::{item, objectid, Key};
use oleo_format::superblock::incompat;

impl Transaction<'_> {
    pub(crate) fn set_default(&mut self, id: u64) -> Result<()> {
        let (_, root_key) = self.recorded_key(id)?;
        let key = Key::new(
            objectid::ROOT_TREE_DIR,
            item::DIR_ITEM,
            name_hash(b"default"),
        );
        let body = self
            .lookup(objectid::ROOT_TREE, &key)?
            .ok_or_else(|| Error::corrupt(0, "the root tree has no `default` entry"))?;
        let mut new = Vec::with_capacity(body.len());
        let mut found = false;
        for e in DirEntryIter::new(&body) {
            let e = e.map_err(|e| Error::corrupt(0, format!("default dir item: {e}")))?;
            let e = if e.name == b"default" && !found {
                found = true;
                DirEntryItem {
                    location: Key::new(id, item::ROOT_ITEM, root_key.offset),
                    ..e
                }
            } else {
                e
            };
            e.write_into(&mut new)
                .map_err(|e| Error::corrupt(0, e.to_string()))?;
        }
        if !found {
            return Err(Error::corrupt(0, "the root tree has no `default` entry"));
        }
        self.replace_item(objectid::ROOT_TREE, &key, &new)?;
        self.incompat_needed |= incompat::DEFAULT_SUBVOL;
        Ok(())
    }
}
