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

/// How reads move a file's atime: the mount's atime flags, as the kernel's touch_atime
/// applies them (`noatime` and `nodiratime` are the caller's: it does not ask then).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AtimeRule {
    /// `relatime`, the kernel's default: only while atime is not newer than mtime or
    /// ctime, or once it is a day old.
    #[default]
    Relative,
    /// `strictatime`: at every read (at most once per tick of the coarse clock).
    Strict,
}

/// A day: relatime moves an older atime even when it is newer than mtime and ctime.
const RELATIME_MAX_AGE: i64 = 24 * 60 * 60;

/// Whether a read at `now` moves the atime of an inode with these times and flags (the
/// kernel's atime_needs_update and relatime_need_update): never for a NOATIME inode
/// (chattr +A), never twice in one tick.
fn atime_due(
    rule: AtimeRule,
    flags: u64,
    atime: Timespec,
    mtime: Timespec,
    ctime: Timespec,
    now: Timespec,
) -> bool {
    if flags & oleo_format::items::INODE_FLAG_NOATIME != 0 {
        return false;
    }
    let key = |t: Timespec| (t.sec, t.nsec);
    let due = match rule {
        AtimeRule::Strict => true,
        AtimeRule::Relative => {
            key(mtime) >= key(atime)
                || key(ctime) >= key(atime)
                || now.sec.saturating_sub(atime.sec) >= RELATIME_MAX_AGE
        }
    };
    due && key(atime) != key(now)
}

impl FsCore {
    /// Whether a read of `id` now would move its atime under `rule`: false in a read-only
    /// subvolume (a read-only snapshot keeps its times, as in the kernel).
    pub(crate) fn atime_due(&self, id: InodeId, rule: AtimeRule) -> Result<bool> {
        let a = self.getattr(id)?;
        if !atime_due(rule, a.flags, a.atime, a.mtime, a.ctime, now_ts()) {
            return Ok(false);
        }
        Ok(self.check_subvol_writable(id.subvol).is_ok())
    }

    /// A read of `id` happened: moves its atime to now if `rule` says so (the kernel's
    /// btrfs_update_time for S_ATIME). Only the inode item changes, in the running
    /// transaction, like any other change: no commit of its own, no new ctime, no new
    /// sequence number. True if it moved.
    pub(crate) fn touch_atime(&mut self, id: InodeId, rule: AtimeRule) -> Result<bool> {
        if !self.atime_due(id, rule)? {
            return Ok(false);
        }
        self.write_op(Reserve::items(1), |t| {
            let mut inode = t.read_inode(id)?;
            inode.atime = disk_time(now_ts());
            t.write_inode_atime(id, &mut inode)
        })?;
        Ok(true)
    }
}

fn now_ts() -> Timespec {
    let t = now();
    Timespec {
        sec: t.sec,
        nsec: t.nsec,
    }
}

#[cfg(test)]
mod atime_tests {
    use super::*;

    fn t(sec: i64) -> Timespec {
        Timespec { sec, nsec: 0 }
    }

    #[test]
    fn relatime_as_the_kernel_decides() {
        let r = AtimeRule::Relative;
        // Not newer than mtime or ctime: moves.
        assert!(atime_due(r, 0, t(100), t(100), t(50), t(200)));
        assert!(atime_due(r, 0, t(100), t(50), t(150), t(200)));
        // Newer than both and younger than a day: stays.
        assert!(!atime_due(r, 0, t(100), t(50), t(50), t(200)));
        // A day old: moves.
        assert!(atime_due(
            r,
            0,
            t(100),
            t(50),
            t(50),
            t(100 + RELATIME_MAX_AGE)
        ));
        // strictatime moves it always, but not twice in one tick.
        assert!(atime_due(
            AtimeRule::Strict,
            0,
            t(100),
            t(50),
            t(50),
            t(101)
        ));
        assert!(!atime_due(
            AtimeRule::Strict,
            0,
            t(101),
            t(50),
            t(50),
            t(101)
        ));
        // chattr +A: never.
        let noatime = oleo_format::items::INODE_FLAG_NOATIME;
        assert!(!atime_due(
            AtimeRule::Strict,
            noatime,
            t(100),
            t(150),
            t(150),
            t(200)
        ));
    }
}
