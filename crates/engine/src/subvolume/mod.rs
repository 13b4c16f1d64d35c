//! Subvolumes and snapshots: finding their trees, crossing from a directory entry into a
//! subvolume, the default subvolume, and listing them.

pub(crate) mod create;
pub(crate) mod default;
pub(crate) mod delete;
pub(crate) mod drop;
pub(crate) mod readonly;
pub(crate) mod received;
pub(crate) mod uuid_tree;

use crate::ctree::{for_each_in_range, lookup};
use crate::error::{Error, Result};
use crate::transaction::fs::{FsCore, InodeId, SubvolumeInfo};
use crate::transaction::options::OpenOptions;
use crate::transaction::Transaction;
use oleo_format::csum::name_hash;
use oleo_format::items::{DirEntryIter, RootItem, ROOT_ITEM_SIZE, ROOT_SUBVOL_RDONLY};
use oleo_format::key::{item, objectid, Key};
use std::ops::ControlFlow;

impl FsCore {
    /// The subvolume the caller asked for, or the default one.
    pub(crate) fn resolve_mount_subvolume(&self, options: &OpenOptions) -> Result<InodeId> {
        let by_id = |id: u64| -> Result<InodeId> {
            if self.subvol_root(id)?.is_none() {
                return Err(Error::InvalidArgument(format!("no subvolume with id {id}")));
            }
            Ok(InodeId {
                subvol: id,
                ino: objectid::FIRST_FREE,
            })
        };
        let chosen = match (&options.subvol, options.subvolid) {
            (Some(path), id) => {
                let found = self
                    .resolve_path(
                        InodeId {
                            subvol: objectid::FS_TREE,
                            ino: objectid::FIRST_FREE,
                        },
                        path,
                    )
                    .map_err(|e| match e {
                        Error::NotFound | Error::NotDir => Error::InvalidArgument(format!(
                            "subvolume `{}` not found",
                            String::from_utf8_lossy(path)
                        )),
                        e => e,
                    })?;
                if found.ino != objectid::FIRST_FREE {
                    return Err(Error::InvalidArgument(format!(
                        "{} is not a subvolume",
                        String::from_utf8_lossy(path)
                    )));
                }
                if id.is_some_and(|id| id != found.subvol) {
                    return Err(Error::InvalidArgument(
                        "subvol= and subvolid= name different subvolumes".into(),
                    ));
                }
                found
            }
            (None, Some(id)) => by_id(if id == 0 { objectid::FS_TREE } else { id })?,
            (None, None) => by_id(self.default_subvolume()?)?,
        };
        Ok(chosen)
    }

    /// Follows a '/'-separated path from `start`.
    pub(crate) fn resolve_path(&self, start: InodeId, path: &[u8]) -> Result<InodeId> {
        let mut cur = start;
        for comp in path
            .split(|&c| c == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
        {
            cur = self.lookup(cur, comp)?;
        }
        Ok(cur)
    }

    /// The subvolume named by the `default` entry of the root tree directory.
    pub(crate) fn default_subvolume(&self) -> Result<u64> {
        let key = Key::new(
            objectid::ROOT_TREE_DIR,
            item::DIR_ITEM,
            name_hash(b"default"),
        );
        if let Some(body) = lookup(self, &self.root_tree(), &key)? {
            for e in DirEntryIter::new(&body) {
                let e = e.map_err(|e| Error::corrupt(0, format!("default dir item: {e}")))?;
                if e.name == b"default" && e.location.item_type == item::ROOT_ITEM {
                    return Ok(e.location.objectid);
                }
            }
        }
        Ok(objectid::FS_TREE)
    }

    /// Every live subvolume and snapshot, with its place in the tree of subvolumes.
    pub(crate) fn list_subvolumes(&self) -> Result<Vec<SubvolumeInfo>> {
        let mut out = Vec::new();
        let min = Key::new(objectid::FS_TREE, item::ROOT_ITEM, 0);
        let max = Key::new(objectid::LAST_FREE, item::ROOT_ITEM, u64::MAX);
        let mut ids = Vec::new();
        for_each_in_range(self, &self.root_tree(), min, max, |key, data| {
            if key.item_type == item::ROOT_ITEM && objectid::is_fs_tree(key.objectid) {
                if let Ok(ri) = oleo_format::items::RootItem::parse(data) {
                    if ri.refs > 0 {
                        ids.push((key.objectid, ri));
                    }
                }
            }
            Ok(ControlFlow::Continue(()))
        })?;
        for (id, ri) in ids {
            let backref = self.root_backref(id)?;
            out.push(SubvolumeInfo {
                id,
                parent: backref.as_ref().map(|(p, r)| (*p, r.dirid)),
                name: backref
                    .as_ref()
                    .map(|(_, r)| r.name.clone())
                    .unwrap_or_default(),
                path: None,
                uuid: ri.uuid,
                parent_uuid: ri.parent_uuid,
                generation: ri.generation,
                ctransid: ri.ctransid,
                readonly: ri.flags & ROOT_SUBVOL_RDONLY != 0,
                received_uuid: ri.received_uuid,
                otransid: ri.otransid,
                stransid: ri.stransid,
                rtransid: ri.rtransid,
                otime: (ri.otime.sec, ri.otime.nsec),
                stime: (ri.stime.sec, ri.stime.nsec),
                rtime: (ri.rtime.sec, ri.rtime.nsec),
            });
        }
        // Paths: parent's path + the directory path inside the parent + name.
        for i in 0..out.len() {
            out[i].path = self.subvolume_path(&out, out[i].id, 0);
        }
        Ok(out)
    }

    fn subvolume_path(&self, all: &[SubvolumeInfo], id: u64, depth: usize) -> Option<Vec<u8>> {
        if id == objectid::FS_TREE {
            return Some(Vec::new());
        }
        if depth > 64 {
            return None; // a cycle in hostile metadata
        }
        let info = all.iter().find(|s| s.id == id)?;
        let (parent, dirid) = info.parent?;
        let mut path = self.subvolume_path(all, parent, depth + 1)?;
        let dir_path = self
            .inode_path(InodeId {
                subvol: parent,
                ino: dirid,
            })
            .ok()?;
        for part in [dir_path.as_slice(), info.name.as_slice()] {
            if !part.is_empty() {
                if !path.is_empty() {
                    path.push(b'/');
                }
                path.extend_from_slice(part);
            }
        }
        Some(path)
    }
}

impl Transaction<'_> {
    /// Subvolume `id`'s ROOT_ITEM as this transaction sees it, and its key.
    pub(crate) fn subvol_item(&mut self, id: u64) -> Result<(Key, RootItem)> {
        let (_, key) = self.recorded_key(id)?;
        let body = self
            .lookup(objectid::ROOT_TREE, &key)?
            .ok_or_else(|| Error::corrupt(0, format!("subvolume {id} has no ROOT_ITEM")))?;
        let ri = RootItem::parse(&body)
            .map_err(|e| Error::corrupt(0, format!("root item of tree {id}: {e}")))?;
        Ok((key, ri))
    }

    /// Writes `ri` into the ROOT_ITEM at `key` (a legacy short item keeps its size and
    /// the fields it has room for).
    pub(crate) fn put_subvol_item(&mut self, key: &Key, ri: &RootItem) -> Result<()> {
        let bytes = ri.to_bytes();
        self.update_item(objectid::ROOT_TREE, key, |b| {
            let n = b.len().min(ROOT_ITEM_SIZE);
            b[..n].copy_from_slice(&bytes[..n]);
        })
    }
}
