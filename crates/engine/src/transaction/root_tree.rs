//! The root tree's view of subvolumes (the kernel's root-tree.c): the live tree of a
//! subvolume, and the ROOT_REF / ROOT_BACKREF items that link a subvolume to the
//! directory entry naming it. Every layer above finds an inode's tree here.

use crate::ctree::{for_each_in_range, lookup, TreeRoot};
use crate::error::{Error, Result};
use crate::transaction::fs::{FsCore, InodeId};
use oleo_format::items::RootRef;
use oleo_format::key::{item, objectid, Key};
use std::ops::ControlFlow;

impl FsCore {
    /// The tree of subvolume `id`, if it exists and is live.
    pub(crate) fn subvol_root(&self, id: u64) -> Result<Option<TreeRoot>> {
        if !objectid::is_fs_tree(id) {
            return Ok(None);
        }
        if let Some(r) = self.running_root(id) {
            return Ok(Some(r));
        }
        if let Some(r) = self.rescue_roots.get(&id) {
            return Ok(Some(*r));
        }
        if let Some(r) = self.subvol_roots.read().get(&id) {
            return Ok(*r);
        }
        let root = self
            .read_root_item(id)?
            .filter(|(_, ri)| ri.refs > 0)
            .map(|(r, _)| r);
        self.subvol_roots.write().insert(id, root);
        Ok(root)
    }

    pub(crate) fn tree_of(&self, id: InodeId) -> Result<TreeRoot> {
        self.subvol_root(id.subvol)?.ok_or(Error::NotFound)
    }

    /// Resolves a directory entry that points at subvolume `child` from directory `dir`.
    /// Like the kernel, the entry is only followed when a ROOT_REF confirms it (a snapshot's
    /// copy of a nested subvolume's entry does not); otherwise it is an empty placeholder.
    pub(crate) fn cross_into_subvolume(
        &self,
        dir: InodeId,
        child: u64,
        name: &[u8],
    ) -> Result<InodeId> {
        let placeholder = InodeId {
            subvol: dir.subvol,
            ino: objectid::EMPTY_SUBVOL_DIR,
        };
        let Some(body) = lookup(
            self,
            &self.root_tree(),
            &Key::new(dir.subvol, item::ROOT_REF, child),
        )?
        else {
            return Ok(placeholder);
        };
        let r = RootRef::parse(&body)
            .map_err(|e| Error::corrupt(0, format!("root ref {}->{child}: {e}", dir.subvol)))?;
        if r.dirid != dir.ino || r.name != name || self.subvol_root(child)?.is_none() {
            return Ok(placeholder);
        }
        Ok(InodeId {
            subvol: child,
            ino: objectid::FIRST_FREE,
        })
    }

    /// The subvolume holding `id`'s entry and that entry (its directory and name).
    pub(crate) fn root_backref(&self, id: u64) -> Result<Option<(u64, RootRef)>> {
        let mut found = None;
        for_each_in_range(
            self,
            &self.root_tree(),
            Key::new(id, item::ROOT_BACKREF, 0),
            Key::new(id, item::ROOT_BACKREF, u64::MAX),
            |key, data| {
                if let Ok(r) = RootRef::parse(data) {
                    found = Some((key.offset, r));
                }
                Ok(ControlFlow::Break(()))
            },
        )?;
        Ok(found)
    }
}
