//! Extended attributes: XATTR_ITEMs keyed by name hash, collisions chained in one item.

use crate::ctree::{for_each_in_range, lookup};
use crate::error::{Error, Result};
use crate::fs::{FsCore, InodeId};
use oleo_format::csum::name_hash;
use oleo_format::items::DirEntryIter;
use oleo_format::key::{item, objectid, Key};
use std::ops::ControlFlow;

impl FsCore {
    pub fn getxattr(&self, id: InodeId, name: &[u8]) -> Result<Vec<u8>> {
        if id.ino == objectid::EMPTY_SUBVOL_DIR {
            return Err(Error::NoXattr);
        }
        let tree = self.tree_of(id)?;
        let Some(body) = lookup(
            self,
            &tree,
            &Key::new(id.ino, item::XATTR_ITEM, name_hash(name)),
        )?
        else {
            return Err(Error::NoXattr);
        };
        for e in DirEntryIter::new(&body) {
            let e = e.map_err(|e| Error::corrupt(0, format!("xattr of inode {}: {e}", id.ino)))?;
            if e.name == name {
                return Ok(e.data.to_vec());
            }
        }
        Err(Error::NoXattr)
    }

    pub fn listxattr(&self, id: InodeId) -> Result<Vec<Vec<u8>>> {
        let mut names = Vec::new();
        if id.ino == objectid::EMPTY_SUBVOL_DIR {
            return Ok(names);
        }
        let tree = self.tree_of(id)?;
        let (min, max) = (
            Key::new(id.ino, item::XATTR_ITEM, 0),
            Key::new(id.ino, item::XATTR_ITEM, u64::MAX),
        );
        for_each_in_range(self, &tree, min, max, |key, body| {
            for e in DirEntryIter::new(body) {
                let e = e.map_err(|e| Error::corrupt(0, format!("xattr {key:?}: {e}")))?;
                names.push(e.name.to_vec());
            }
            Ok(ControlFlow::Continue(()))
        })?;
        Ok(names)
    }
}
