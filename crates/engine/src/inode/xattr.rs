//! Extended attributes: XATTR_ITEMs keyed by name hash, collisions chained in one item.

use crate::ctree::{for_each_in_range, lookup};
use crate::error::{Error, Result};
use crate::transaction::fs::{FsCore, InodeId};
use oleo_format::csum::name_hash;
use oleo_format::items::DirEntryIter;
use oleo_format::key::{item, objectid, Key};
use std::ops::ControlFlow;
use std::sync::Arc;

impl FsCore {
    pub(crate) fn getxattr(&self, id: InodeId, name: &[u8]) -> Result<Vec<u8>> {
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

    /// The default ACL of directory `dir` (its `system.posix_acl_default`), if it has one.
    pub(crate) fn default_acl(&self, dir: InodeId) -> Result<Option<Vec<u8>>> {
        /// Directories remembered; past this the cache starts again.
        const CACHED_MAX: usize = 65536;
        if let Some(a) = self.default_acls.lock().get(&dir) {
            return Ok(a.as_deref().map(<[u8]>::to_vec));
        }
        let acl = match self.getxattr(dir, crate::inode::acl::DEFAULT) {
            Ok(v) => Some(v),
            Err(Error::NoXattr) => None,
            Err(e) => return Err(e),
        };
        let mut cache = self.default_acls.lock();
        if cache.len() >= CACHED_MAX {
            cache.clear();
        }
        cache.insert(dir, acl.as_deref().map(Arc::from));
        Ok(acl)
    }

    pub(crate) fn listxattr(&self, id: InodeId) -> Result<Vec<Vec<u8>>> {
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
