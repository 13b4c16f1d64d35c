//! The operations that change an inode's attributes: setattr (the kernel's btrfs_setattr:
//! mode, owner, size and times, with the POSIX rules on setuid/setgid and ACLs, and
//! truncation through the data layer), and setting or removing an xattr (checked and
//! reserved here, written by `inode::xattr`).

use crate::error::{Error, Result};
use crate::inode::acl::{self, Acl};
use crate::inode::dir_item::xattr_entry;
use crate::inode::inode_item::now;
use crate::inode::xattr::XattrSet;
use crate::transaction::fs::{Attr, FsCore, InodeId, Timespec};
use crate::transaction::space::reservation::Reserve;
use crate::transaction::Transaction;
use crate::vfs::inode_ops::{disk_time, S_IFDIR, S_IFMT, S_IFREG, S_ISGID, S_ISUID};
use oleo_format::csum::name_hash;
use oleo_format::key::{item, Key};

/// What to change in `setattr`; `None` leaves a field alone.
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    /// chmod: new permission bits (the type bits are kept); a POSIX access ACL is
    /// brought in line with them.
    pub mode: Option<u32>,
    /// chown's owner. A chown drops set-user-ID (and set-group-ID of a group-executable
    /// file), as chown(2) does, unless `mode` is set in the same call.
    pub uid: Option<u32>,
    /// chown's group (see `uid`).
    pub gid: Option<u32>,
    /// truncate: the new size of a regular file; data past it is freed, growth is a hole.
    /// mtime changes with it when the size does.
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<Timespec>,
    /// New modification time.
    pub mtime: Option<Timespec>,
    /// New change time; None stamps the time of the call, as every setattr changes ctime.
    pub ctime: Option<Timespec>,
}

impl Transaction<'_> {
    fn setattr(&mut self, id: InodeId, set: &SetAttr) -> Result<()> {
        let mut inode = self.read_inode(id)?;
        let t = now();
        if let Some(size) = set.size {
            if inode.mode & S_IFMT != S_IFREG {
                return Err(if inode.mode & S_IFMT == S_IFDIR {
                    Error::IsDir
                } else {
                    Error::InvalidArgument("not a regular file".into())
                });
            }
            // Times change with the size (POSIX); ftruncate's own time update arrives as
            // explicit mtime/ctime.
            let changed = size != inode.size;
            self.truncate_file(id, &mut inode, size)?;
            if changed {
                inode.mtime = t;
            }
        }
        if let Some(mode) = set.mode {
            inode.mode = (inode.mode & S_IFMT) | (mode & !S_IFMT);
            // An access ACL follows the new permission bits.
            if let Ok(raw) = self.filesystem().getxattr(id, acl::ACCESS) {
                if let Ok(mut a) = Acl::parse(&raw) {
                    a.chmod(inode.mode);
                    let key = Key::new(id.ino, item::XATTR_ITEM, name_hash(acl::ACCESS));
                    self.remove_hashed_entry(id.subvol, key, acl::ACCESS)?;
                    let entry = xattr_entry(self.transid, acl::ACCESS, &a.to_bytes())?;
                    self.add_hashed_entry(id.subvol, key, &entry, acl::ACCESS)?;
                }
            }
        }
        if set.uid.is_some() || set.gid.is_some() {
            // chown drops set-user-ID (and set-group-ID on group-executables), as chown(2)
            // does even when the owner stays, unless the caller set the mode in the same call.
            if set.mode.is_none() && inode.mode & S_IFMT != S_IFDIR {
                inode.mode &= !S_ISUID;
                if inode.mode & 0o010 != 0 {
                    inode.mode &= !S_ISGID;
                }
            }
        }
        if let Some(uid) = set.uid {
            inode.uid = uid;
        }
        if let Some(gid) = set.gid {
            inode.gid = gid;
        }
        if let Some(a) = set.atime {
            inode.atime = disk_time(a);
        }
        if let Some(m) = set.mtime {
            inode.mtime = disk_time(m);
        }
        inode.ctime = set.ctime.map_or(t, disk_time);
        self.write_inode(id, &mut inode)
    }
}

impl FsCore {
    pub(crate) fn setattr(&mut self, id: InodeId, set: &SetAttr) -> Result<Attr> {
        self.check_subvol_writable(id.subvol)?;
        // Times alone may change on an append-only file (its writes move them).
        if set.size.is_some() || set.mode.is_some() || set.uid.is_some() || set.gid.is_some() {
            self.check_may_modify(id)?;
        } else {
            self.check_not_immutable(id)?;
        }
        // Growing a file rewrites its partial last sector (or its inline extent) as data.
        // Only a size change reads the inode here: chmod and utimens stay one lookup.
        let grows = match set.size {
            Some(to) => {
                let size = self.getattr(id)?.size;
                to > size && size > 0
            }
            None => false,
        };
        let need = if grows {
            Reserve::items(8)
                .bulk(256)
                .data(u64::from(self.sb.sectorsize))
        } else {
            Reserve::items(8)
        };
        self.write_op(need, |t| t.setattr(id, set))?;
        self.getattr(id)
    }
}

impl FsCore {
    pub(crate) fn setxattr(
        &mut self,
        id: InodeId,
        name: &[u8],
        value: &[u8],
        how: XattrSet,
    ) -> Result<()> {
        self.check_subvol_writable(id.subvol)?;
        self.check_may_modify(id)?;
        self.write_op(Reserve::items(4), |t| t.set_xattr(id, name, value, how))
    }

    pub(crate) fn removexattr(&mut self, id: InodeId, name: &[u8]) -> Result<()> {
        self.check_subvol_writable(id.subvol)?;
        self.check_may_modify(id)?;
        self.write_op(Reserve::items(4), |t| t.remove_xattr(id, name))
    }
}
