//! Extended attributes (the kernel's xattr.c): XATTR_ITEMs keyed by name hash, collisions
//! chained in one item; reading, listing, setting and removing them, with the access ACL
//! kept in line with the mode and the btrfs.compression property applied to the flags.

use crate::ctree::{for_each_in_range, lookup};
use crate::error::{Error, Result};
use crate::inode::acl::{self, Acl};
use crate::inode::dir_item::xattr_entry;
use crate::inode::inode_item::now;
use crate::transaction::fs::{FsCore, InodeId};
use crate::transaction::Transaction;
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

/// xattr set semantics (XATTR_CREATE / XATTR_REPLACE).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XattrSet {
    /// Create the xattr or replace its value (flags 0).
    #[default]
    Either,
    /// XATTR_CREATE: fail with `Error::AlreadyExists` if it exists.
    Create,
    /// XATTR_REPLACE: fail with `Error::NoXattr` if it does not exist.
    Replace,
}

impl Transaction<'_> {
    pub(crate) fn set_xattr(
        &mut self,
        id: InodeId,
        name: &[u8],
        value: &[u8],
        how: XattrSet,
    ) -> Result<()> {
        if name.is_empty() {
            return Err(Error::InvalidArgument("empty xattr name".into()));
        }
        if name.len() > 255 {
            return Err(Error::NameTooLong);
        }
        let mut inode = self.read_inode(id)?;
        // The btrfs. namespace holds properties, checked and applied as the kernel does.
        if name.starts_with(b"btrfs.") {
            if name != crate::inode::props::PROPERTY {
                return Err(Error::InvalidArgument(format!(
                    "unknown property xattr {}",
                    String::from_utf8_lossy(name)
                )));
            }
            crate::inode::props::validate_property(inode.flags, value)?;
        }
        // One xattr must fit one leaf, as in the kernel (which says ENOSPC too, before it
        // looks for the name).
        let entry = xattr_entry(self.transid, name, value)?;
        if entry.len() > oleo_format::leaf_builder::max_item_size(self.filesystem().sb.nodesize) {
            return Err(Error::NoSpace);
        }
        self.filesystem().default_acls.lock().remove(&id);
        let exists = match self.filesystem().getxattr(id, name) {
            Ok(_) => true,
            Err(Error::NoXattr) => false,
            Err(e) => return Err(e),
        };
        match (how, exists) {
            (XattrSet::Create, true) => return Err(Error::AlreadyExists),
            (XattrSet::Replace, false) => return Err(Error::NoXattr),
            _ => {}
        }
        let key = Key::new(id.ino, item::XATTR_ITEM, name_hash(name));
        if exists {
            self.remove_hashed_entry(id.subvol, key, name)?;
        }
        if name == acl::ACCESS {
            // The mode carries the ACL's owner/group/other bits; an ACL that says no more
            // than the mode is not stored (as posix_acl_update_mode decides).
            let a = Acl::parse(value)?;
            let (bits, needed) = a.mode_bits();
            inode.mode = (inode.mode & !0o777) | bits;
            inode.ctime = now();
            if !needed {
                return self.write_inode(id, &mut inode);
            }
        }
        self.add_hashed_entry(id.subvol, key, &entry, name)?;
        if name == crate::inode::props::PROPERTY {
            let (flags, bit) = crate::inode::props::apply_property(inode.flags, Some(value));
            inode.flags = flags;
            self.incompat_needed |= bit;
        }
        inode.ctime = now();
        self.write_inode(id, &mut inode)
    }

    pub(crate) fn remove_xattr(&mut self, id: InodeId, name: &[u8]) -> Result<()> {
        let mut inode = self.read_inode(id)?;
        self.filesystem().default_acls.lock().remove(&id);
        let key = Key::new(id.ino, item::XATTR_ITEM, name_hash(name));
        match self.remove_hashed_entry(id.subvol, key, name) {
            // Removing an ACL that is not there succeeds in the kernel (set_acl(NULL)).
            Err(Error::NotFound) if name == acl::ACCESS || name == acl::DEFAULT => return Ok(()),
            Err(Error::NotFound) => return Err(Error::NoXattr),
            r => r?,
        }
        if name == crate::inode::props::PROPERTY {
            inode.flags = crate::inode::props::apply_property(inode.flags, None).0;
        }
        inode.ctime = now();
        self.write_inode(id, &mut inode)
    }
}
