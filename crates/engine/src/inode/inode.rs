//! Inodes: reading INODE_ITEMs (through a bounded cache) and presenting them as stat does.

use crate::ctree::{for_each_in_range, lookup};
use crate::error::{Error, Result};
use crate::transaction::fs::{Attr, FileKind, FsCore, InodeId, Timespec};
use oleo_format::items::{FileExtent, FileExtentBody, InodeItem, InodeRef, Timespec as DiskTime};
use oleo_format::key::{item, objectid, Key};
use std::ops::ControlFlow;
use std::sync::Arc;

fn ts(t: DiskTime) -> Timespec {
    Timespec {
        sec: t.sec,
        nsec: t.nsec.min(999_999_999),
    }
}

/// btrfs stores the kernel's internal dev_t (major << 20 | minor); stat shows the glibc
/// encoding, which is also what FUSE expects.
pub(crate) fn disk_rdev_to_user(raw: u64) -> u64 {
    let major = (raw >> 20) & 0xfff;
    let minor = raw & 0xfffff;
    ((major & 0xfffff000) << 32)
        | ((major & 0xfff) << 8)
        | ((minor & 0xffffff00) << 12)
        | (minor & 0xff)
}

impl FsCore {
    pub(crate) fn inode_item(&self, id: InodeId) -> Result<Arc<InodeItem>> {
        if let Some(i) = self.running.as_deref().and_then(|t| t.delayed.inode(&id)) {
            return Ok(Arc::clone(i));
        }
        if let Some(i) = self.inodes.get(&id) {
            return Ok(i);
        }
        let tree = self.tree_of(id)?;
        let Some(body) = lookup(self, &tree, &Key::new(id.ino, item::INODE_ITEM, 0))? else {
            if self.io.rescue().ignore_bad_roots {
                let inode = Arc::new(self.made_up_inode(id, &tree)?);
                self.inodes.insert(id, inode.clone());
                return Ok(inode);
            }
            return Err(Error::NotFound);
        };
        let mut inode = InodeItem::parse(&body).map_err(|e| {
            Error::corrupt(
                0,
                format!("inode {} of subvolume {}: {e}", id.ino, id.subvol),
            )
        })?;
        let bad_mode = inode.mode & !0o177777 != 0 || FileKind::from_mode(inode.mode).is_none();
        if bad_mode && self.io.rescue().ignore_bad_roots {
            // The type the other items say, the permissions the item says.
            let made = self.made_up_inode(id, &tree)?;
            inode.mode = (made.mode & 0o170000) | (inode.mode & 0o7777);
        }
        let inode = Arc::new(inode);
        self.inodes.insert(id, inode.clone());
        Ok(inode)
    }

    /// Under `rescue=ignorebadroots`, for an inode whose INODE_ITEM is gone (or whose mode
    /// is not one) but that a directory entry names (as `btrfs restore` writes one): a
    /// directory if it is a subvolume's root or has entries, else a regular file as long
    /// as its extents reach (empty without any).
    fn made_up_inode(&self, id: InodeId, tree: &crate::ctree::TreeRoot) -> Result<InodeItem> {
        let has = |ty| -> Result<bool> {
            let mut any = false;
            for_each_in_range(
                self,
                tree,
                Key::new(id.ino, ty, 0),
                Key::new(id.ino, ty, u64::MAX),
                |_, _| {
                    any = true;
                    Ok(ControlFlow::Break(()))
                },
            )?;
            Ok(any)
        };
        let dir = id.ino == objectid::FIRST_FREE || has(item::DIR_INDEX)? || has(item::DIR_ITEM)?;
        let mut inode = InodeItem {
            nlink: 1,
            mode: if dir { 0o040755 } else { 0o100644 },
            ..InodeItem::default()
        };
        if !dir {
            let last = crate::ctree::lookup_le(
                self,
                tree,
                &Key::new(id.ino, item::EXTENT_DATA, u64::MAX),
            )?;
            if let Some((k, body)) = last {
                let len = match FileExtent::parse(&body).map(|e| (e.ram_bytes, e.body)) {
                    Ok((_, FileExtentBody::Extent { num_bytes, .. })) => num_bytes,
                    Ok((ram, FileExtentBody::Inline { .. })) => ram,
                    Err(_) => 0,
                };
                inode.size = k.offset.saturating_add(len);
                inode.nbytes = inode.size;
            }
        }
        self.io.skips().note("ignorebadroots", id.ino ^ (id.subvol << 48), || {
            format!(
                "inode {} of subvolume {} has no inode item or no valid mode; shown as a {} made up from its other items",
                id.ino,
                id.subvol,
                if dir { "directory" } else { "regular file" }
            )
        });
        Ok(inode)
    }

    pub(crate) fn getattr(&self, id: InodeId) -> Result<Attr> {
        if id.ino == objectid::EMPTY_SUBVOL_DIR {
            return Ok(self.placeholder_attr(id));
        }
        let inode = self.inode_item(id)?;
        let kind = FileKind::from_mode(inode.mode).ok_or_else(|| {
            Error::corrupt(
                0,
                format!("inode {} has invalid mode {:o}", id.ino, inode.mode),
            )
        })?;
        let sector = self.sb.sectorsize as u64;
        Ok(Attr {
            id,
            kind,
            mode: inode.mode,
            nlink: inode.nlink,
            uid: inode.uid,
            gid: inode.gid,
            size: inode.size,
            blocks: inode.nbytes.div_ceil(sector).saturating_mul(sector) / 512,
            blksize: self.sb.sectorsize,
            rdev: if matches!(kind, FileKind::CharDev | FileKind::BlockDev) {
                disk_rdev_to_user(inode.rdev)
            } else {
                0
            },
            atime: ts(inode.atime),
            mtime: ts(inode.mtime),
            ctime: ts(inode.ctime),
            crtime: ts(inode.otime),
            generation: inode.generation,
            flags: inode.flags,
        })
    }

    /// The kernel's stand-in for a subvolume it cannot enter (inode 2): an empty,
    /// read-only directory.
    fn placeholder_attr(&self, id: InodeId) -> Attr {
        Attr {
            id,
            kind: FileKind::Dir,
            mode: 0o040755,
            nlink: 1,
            uid: 0,
            gid: 0,
            size: 0,
            blocks: 0,
            blksize: self.sb.sectorsize,
            rdev: 0,
            atime: Timespec::default(),
            mtime: Timespec::default(),
            ctime: Timespec::default(),
            crtime: Timespec::default(),
            generation: 0,
            flags: 0,
        }
    }

    pub(crate) fn readlink(&self, id: InodeId) -> Result<Vec<u8>> {
        let attr = self.getattr(id)?;
        if attr.kind != FileKind::Symlink {
            return Err(Error::InvalidArgument("not a symlink".into()));
        }
        self.read(id, 0, attr.size.min(1 << 16) as u32)
    }

    /// Path of an inode inside its subvolume, following first INODE_REFs up to the root.
    pub(crate) fn inode_path(&self, id: InodeId) -> Result<Vec<u8>> {
        let tree = self.tree_of(id)?;
        let mut parts: Vec<Vec<u8>> = Vec::new();
        let mut ino = id.ino;
        while ino != objectid::FIRST_FREE {
            if parts.len() > 4096 {
                return Err(Error::corrupt(0, "inode ref chain does not reach the root"));
            }
            let mut next = None;
            for_each_in_range(
                self,
                &tree,
                Key::new(ino, item::INODE_REF, 0),
                Key::new(ino, item::INODE_REF, u64::MAX),
                |key, data| {
                    if let Some(r) = InodeRef::parse_all(data)
                        .ok()
                        .and_then(|v| v.into_iter().next())
                    {
                        next = Some((key.offset, r.name));
                    }
                    Ok(ControlFlow::Break(()))
                },
            )?;
            let (parent, name) = next.ok_or(Error::NotFound)?;
            parts.push(name);
            ino = parent;
        }
        parts.reverse();
        Ok(parts.join(&b'/'))
    }
}

impl FsCore {
    /// A read-only subvolume (a read-only snapshot) refuses every change, as in the kernel.
    pub(crate) fn check_subvol_writable(&self, subvol: u64) -> Result<()> {
        if let Some(&ro) = self.readonly_subvols.lock().get(&subvol) {
            return if ro { Err(Error::ReadOnly) } else { Ok(()) };
        }
        // A deleted subvolume (refs 0, its tree waiting to be dropped) takes no writes.
        let ro = self.read_root_item(subvol)?.is_some_and(|(_, ri)| {
            ri.flags & oleo_format::items::ROOT_SUBVOL_RDONLY != 0 || ri.refs == 0
        });
        self.readonly_subvols.lock().insert(subvol, ro);
        if ro {
            Err(Error::ReadOnly)
        } else {
            Ok(())
        }
    }
}
