//! Writing directory entries: every name lives twice, as a DIR_ITEM keyed by its name hash
//! (lookup; colliding names share one item) and as a DIR_INDEX keyed by a per-directory
//! sequence number (readdir order). xattrs reuse the DIR_ITEM layout (see `xattr`).

use crate::error::{Error, Result};
use crate::transaction::fs::InodeId;
use crate::transaction::Transaction;
use oleo_format::csum::name_hash;
use oleo_format::items::{DirEntryItem, DirEntryIter};
use oleo_format::key::{item, Key};

/// What a directory entry names: the target's key (INODE_ITEM, or ROOT_ITEM for a
/// subvolume) and its file type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EntryTarget {
    pub location: Key,
    pub file_type: u8,
}

fn entry_bytes(
    location: Key,
    transid: u64,
    file_type: u8,
    name: &[u8],
    data: &[u8],
) -> Result<Vec<u8>> {
    DirEntryItem {
        location,
        transid,
        file_type,
        name,
        data,
    }
    .to_bytes()
    .map_err(|e| Error::InvalidArgument(e.to_string()))
}

impl Transaction<'_> {
    /// Adds one entry to the hashed item at `key` (DIR_ITEM or XATTR_ITEM), creating it or
    /// appending to the names that share its hash. AlreadyExists if the name is there.
    pub(crate) fn add_hashed_entry(
        &mut self,
        tree: u64,
        key: Key,
        entry: &[u8],
        name: &[u8],
    ) -> Result<()> {
        // Most names have a hash of their own: try the insertion first, one descent.
        match self.insert_item(tree, key, entry) {
            Err(Error::AlreadyExists) => {}
            r => return r,
        }
        match self.lookup(tree, &key)? {
            None => self.insert_item(tree, key, entry),
            Some(mut body) => {
                for e in DirEntryIter::new(&body) {
                    let e = e.map_err(|e| Error::corrupt(0, format!("dir item {key:?}: {e}")))?;
                    if e.name == name {
                        return Err(Error::AlreadyExists);
                    }
                }
                body.extend_from_slice(entry);
                if body.len()
                    > oleo_format::leaf_builder::max_item_size(self.filesystem().sb.nodesize)
                {
                    return Err(Error::NoSpace);
                }
                self.replace_item(tree, &key, &body)
            }
        }
    }

    /// Removes the entry named `name` from the hashed item at `key`; NotFound if absent.
    pub(crate) fn remove_hashed_entry(&mut self, tree: u64, key: Key, name: &[u8]) -> Result<()> {
        let body = self.lookup(tree, &key)?.ok_or(Error::NotFound)?;
        let mut rest = Vec::with_capacity(body.len());
        let mut found = false;
        for e in DirEntryIter::new(&body) {
            let e = e.map_err(|e| Error::corrupt(0, format!("dir item {key:?}: {e}")))?;
            if e.name == name && !found {
                found = true;
                continue;
            }
            e.write_into(&mut rest)
                .map_err(|e| Error::corrupt(0, e.to_string()))?;
        }
        if !found {
            return Err(Error::NotFound);
        }
        if rest.is_empty() {
            self.delete_item(tree, &key)
        } else {
            self.replace_item(tree, &key, &rest)
        }
    }

    /// The entry `name` in directory `dir`, as this transaction sees it.
    pub(crate) fn find_dir_entry(
        &mut self,
        dir: InodeId,
        name: &[u8],
    ) -> Result<Option<EntryTarget>> {
        let key = Key::new(dir.ino, item::DIR_ITEM, name_hash(name));
        let Some(body) = self.lookup(dir.subvol, &key)? else {
            return Ok(None);
        };
        for e in DirEntryIter::new(&body) {
            let e = e.map_err(|e| Error::corrupt(0, format!("dir item in {}: {e}", dir.ino)))?;
            if e.name == name {
                return Ok(Some(EntryTarget {
                    location: e.location,
                    file_type: e.file_type,
                }));
            }
        }
        Ok(None)
    }

    /// The next free DIR_INDEX number of `dir` (2 and up: 0 and 1 were "." and "..").
    pub(crate) fn next_dir_index(&mut self, dir: InodeId) -> Result<u64> {
        let cached = self.filesystem().next_index.lock().get(&dir).copied();
        let next = match cached {
            Some(n) => n,
            None => self
                .lookup_le(dir.subvol, &Key::new(dir.ino, item::DIR_INDEX, u64::MAX))?
                .map_or(2, |(k, _)| k.offset.saturating_add(1).max(2)),
        };
        if next == u64::MAX {
            return Err(Error::NoSpace);
        }
        self.filesystem().next_index.lock().insert(dir, next + 1);
        Ok(next)
    }

    /// Adds `name` -> `target` to directory `dir` at `index` (both the DIR_ITEM and the
    /// DIR_INDEX). The caller updates the directory's size and times.
    pub(crate) fn add_dir_entry(
        &mut self,
        dir: InodeId,
        name: &[u8],
        target: EntryTarget,
        index: u64,
    ) -> Result<()> {
        let entry = self.add_dir_item(dir, name, target)?;
        self.queue_dir_index(dir, index, entry)
    }

    /// Adds the DIR_ITEM half of `name` -> `target` in `dir`; returns the entry, which is
    /// also the DIR_INDEX body. AlreadyExists, with nothing changed, if the name is taken.
    pub(crate) fn add_dir_item(
        &mut self,
        dir: InodeId,
        name: &[u8],
        target: EntryTarget,
    ) -> Result<Vec<u8>> {
        let transid = self.transid;
        let entry = entry_bytes(target.location, transid, target.file_type, name, &[])?;
        // Before the name can be found: a lookup without the lock must not miss it.
        self.filesystem().names.adding(dir, name_hash(name));
        self.add_hashed_entry(
            dir.subvol,
            Key::new(dir.ino, item::DIR_ITEM, name_hash(name)),
            &entry,
            name,
        )?;
        Ok(entry)
    }

    /// Removes `name` (at `index`, leading to inode `target` of this subvolume, None if
    /// elsewhere) from directory `dir`.
    pub(crate) fn remove_dir_entry(
        &mut self,
        dir: InodeId,
        name: &[u8],
        index: u64,
        target: Option<u64>,
    ) -> Result<()> {
        self.remove_hashed_entry(
            dir.subvol,
            Key::new(dir.ino, item::DIR_ITEM, name_hash(name)),
            name,
        )?;
        self.queue_dir_index_deletion(dir, index, target)
    }
}

/// An xattr entry body (a DIR_ITEM-shaped record with the value as data).
pub(crate) fn xattr_entry(transid: u64, name: &[u8], value: &[u8]) -> Result<Vec<u8>> {
    entry_bytes(
        Key::new(0, 0, 0),
        transid,
        oleo_format::items::FileType::Xattr.raw(),
        name,
        value,
    )
}
