//! Inode flags as chattr(1) and lsattr(1) see them (the kernel's btrfs_fileattr_get and
//! btrfs_fileattr_set): FS_IOC_GETFLAGS/SETFLAGS bits and FS_IOC_FSGETXATTR's xflags,
//! mapped to btrfs's INODE_ITEM flags with the kernel's rules. The flags that restrict
//! changes (immutable, append-only) are enforced where the kernel's VFS enforces them
//! (`check_may_modify`, `check_may_delete`).

use crate::error::{Error, Result};
use crate::inode::inode_item::now;
use crate::inode::xattr::XattrSet;
use crate::transaction::fs::{FsCore, InodeId};
use crate::transaction::Transaction;
use oleo_format::items::*;
pub use oleo_format::items::{INODE_FLAG_APPEND, INODE_FLAG_IMMUTABLE, INODE_FLAG_SYNC};

/// FS_IOC_GETFLAGS bits (include/uapi/linux/fs.h).
pub mod fs_flags {
    /// FS_SYNC_FL, chattr +S: writes are synchronous (INODE_FLAG_SYNC).
    pub const SYNC: u32 = 0x8;
    /// FS_IMMUTABLE_FL, chattr +i: no change at all, not even a new name
    /// (INODE_FLAG_IMMUTABLE).
    pub const IMMUTABLE: u32 = 0x10;
    /// FS_APPEND_FL, chattr +a: data may only be appended (INODE_FLAG_APPEND).
    pub const APPEND: u32 = 0x20;
    /// FS_NODUMP_FL, chattr +d: skipped by dump(8) (INODE_FLAG_NODUMP).
    pub const NODUMP: u32 = 0x40;
    /// FS_NOATIME_FL, chattr +A: reads do not update atime (INODE_FLAG_NOATIME).
    pub const NOATIME: u32 = 0x80;
    /// FS_COMPR_FL, chattr +c: compress new data (INODE_FLAG_COMPRESS, and the
    /// `btrfs.compression` property).
    pub const COMPR: u32 = 0x4;
    /// FS_NOCOMP_FL, chattr +m: never compress (INODE_FLAG_NOCOMPRESS).
    pub const NOCOMP: u32 = 0x400;
    /// FS_DIRSYNC_FL, chattr +D: directory changes are synchronous (INODE_FLAG_DIRSYNC).
    pub const DIRSYNC: u32 = 0x10000;
    /// FS_NOCOW_FL, chattr +C: data is overwritten in place, without checksums
    /// (INODE_FLAG_NODATACOW and NODATASUM). It changes only on an empty file (elsewhere
    /// it is ignored, as by the kernel) or a directory, whose new files inherit it.
    pub const NOCOW: u32 = 0x80_0000;
    /// The bits FS_IOC_FSSETXATTR's xflags can say (the rest stay as they were).
    pub const COMMON: u32 = SYNC | IMMUTABLE | APPEND | NODUMP | NOATIME;
}

/// FS_IOC_FSGETXATTR's xflags for the bits above.
pub(crate) mod xflags {
    pub const IMMUTABLE: u32 = 0x8;
    pub const APPEND: u32 = 0x10;
    pub const SYNC: u32 = 0x20;
    pub const NOATIME: u32 = 0x40;
    pub const NODUMP: u32 = 0x80;
}

/// (INODE_ITEM bit, FS_IOC_GETFLAGS bit) for every flag that maps one to one.
const PLAIN: [(u64, u32); 7] = [
    (INODE_FLAG_SYNC, fs_flags::SYNC),
    (INODE_FLAG_IMMUTABLE, fs_flags::IMMUTABLE),
    (INODE_FLAG_APPEND, fs_flags::APPEND),
    (INODE_FLAG_NODUMP, fs_flags::NODUMP),
    (INODE_FLAG_NOATIME, fs_flags::NOATIME),
    (INODE_FLAG_DIRSYNC, fs_flags::DIRSYNC),
    (INODE_FLAG_NODATACOW, fs_flags::NOCOW),
];

const XPLAIN: [(u32, u32); 5] = [
    (fs_flags::SYNC, xflags::SYNC),
    (fs_flags::IMMUTABLE, xflags::IMMUTABLE),
    (fs_flags::APPEND, xflags::APPEND),
    (fs_flags::NODUMP, xflags::NODUMP),
    (fs_flags::NOATIME, xflags::NOATIME),
];

/// What FS_IOC_GETFLAGS reports for INODE_ITEM flags `flags`.
pub(crate) fn to_fs_flags(flags: u64) -> u32 {
    let mut out = 0;
    for (b, f) in PLAIN {
        if flags & b != 0 {
            out |= f;
        }
    }
    if flags & INODE_FLAG_NOCOMPRESS != 0 {
        out |= fs_flags::NOCOMP;
    } else if flags & INODE_FLAG_COMPRESS != 0 {
        out |= fs_flags::COMPR;
    }
    out
}

/// FS_IOC_FSGETXATTR's xflags for FS_IOC_GETFLAGS bits `f`.
pub(crate) fn to_xflags(f: u32) -> u32 {
    XPLAIN
        .iter()
        .filter(|(b, _)| f & b != 0)
        .fold(0, |acc, (_, x)| acc | x)
}

/// FS_IOC_GETFLAGS bits for xflags `x` (the bits xflags can say).
pub(crate) fn from_xflags(x: u32) -> u32 {
    XPLAIN
        .iter()
        .filter(|(_, xb)| x & xb != 0)
        .fold(0, |acc, (b, _)| acc | b)
}

/// The kernel's check_fsflags: unknown bits, and compression beside NOCOW.
fn check_fs_flags(old: u32, new: u32) -> Result<()> {
    use fs_flags::*;
    let known = COMMON | DIRSYNC | COMPR | NOCOMP | NOCOW;
    if new & !known != 0 {
        return Err(Error::Unsupported(format!(
            "inode flags {:#x} (btrfs knows {known:#x})",
            new & !known
        )));
    }
    let bad = |why: &str| Err(Error::InvalidArgument(why.into()));
    if new & NOCOMP != 0 && new & COMPR != 0 {
        return bad("compress and nocompress together");
    }
    if new & COMPR != 0 && new & NOCOW != 0 {
        return bad("compress and nocow together");
    }
    if old & NOCOW != 0 && new & (COMPR | NOCOMP) != 0 {
        return bad("compression flags on a nocow inode");
    }
    if new & NOCOW != 0 && old & (COMPR | NOCOMP) != 0 {
        return bad("nocow on an inode with compression flags");
    }
    Ok(())
}

/// Chattr flags `old` with the xflags bits of FS_IOC_FSSETXATTR's `x` (NOCOW and
/// compression stay).
pub fn with_xflags(old: u32, x: u32) -> u32 {
    (old & !fs_flags::COMMON) | from_xflags(x)
}

const S_IFMT: u32 = 0o170000;
const S_IFREG: u32 = 0o100000;
/// The property chattr +c sets (and any other change of flags removes).
const COMPRESSION_PROP: &[u8] = crate::inode::props::PROPERTY;

impl Transaction<'_> {
    pub(crate) fn set_fs_flags(
        &mut self,
        id: InodeId,
        new: u32,
        nodatasum_mount: bool,
        keep_ctime: bool,
    ) -> Result<()> {
        let inode = self.read_inode(id)?;
        let old_ctime = inode.ctime;
        let old = to_fs_flags(inode.flags);
        check_fs_flags(old, new)?;
        let regular = inode.mode & S_IFMT == S_IFREG;
        let mut flags = inode.flags;
        for (b, f) in PLAIN {
            if b == INODE_FLAG_NODATACOW {
                continue;
            }
            if new & f != 0 {
                flags |= b;
            } else {
                flags &= !b;
            }
        }
        // NOCOW changes only where no extent could disagree: an empty file (which loses
        // checksums with it) or a directory (new files inherit it).
        let nocow = new & fs_flags::NOCOW != 0;
        if regular && inode.size == 0 {
            if nocow {
                flags |= INODE_FLAG_NODATACOW | INODE_FLAG_NODATASUM;
            } else {
                flags &= !INODE_FLAG_NODATACOW;
                if !nodatasum_mount {
                    flags &= !INODE_FLAG_NODATASUM;
                }
            }
        } else if !regular {
            if nocow {
                flags |= INODE_FLAG_NODATACOW;
            } else {
                flags &= !INODE_FLAG_NODATACOW;
            }
        }
        let compression: Option<&[u8]> = if new & fs_flags::NOCOMP != 0 {
            flags = (flags & !INODE_FLAG_COMPRESS) | INODE_FLAG_NOCOMPRESS;
            None
        } else if new & fs_flags::COMPR != 0 {
            flags = (flags & !INODE_FLAG_NOCOMPRESS) | INODE_FLAG_COMPRESS;
            // The mount's algorithm, zlib without one.
            Some(
                self.filesystem()
                    .compress
                    .map_or("zlib", |c| crate::transaction::options::type_name(c.kind))
                    .as_bytes(),
            )
        } else {
            flags &= !(INODE_FLAG_COMPRESS | INODE_FLAG_NOCOMPRESS);
            None
        };
        match compression {
            Some(v) => self.set_xattr(id, COMPRESSION_PROP, v, XattrSet::Either)?,
            None => match self.remove_xattr(id, COMPRESSION_PROP) {
                Err(Error::NoXattr) => {}
                r => r?,
            },
        }
        let mut inode = self.read_inode(id)?;
        inode.flags = flags;
        inode.ctime = if keep_ctime { old_ctime } else { now() };
        self.write_inode(id, &mut inode)
    }
}

impl FsCore {
    /// EPERM for a change of an immutable or append-only inode's data, size, owner, mode,
    /// times, names or xattrs (what the VFS refuses for them; appending is checked at
    /// open or by the writer).
    pub(crate) fn check_may_modify(&self, id: InodeId) -> Result<()> {
        let flags = self.getattr(id)?.flags;
        if flags & (INODE_FLAG_IMMUTABLE | INODE_FLAG_APPEND) != 0 {
            return Err(Error::NotPermitted(format!(
                "inode {} of subvolume {} is {}",
                id.ino,
                id.subvol,
                if flags & INODE_FLAG_IMMUTABLE != 0 {
                    "immutable"
                } else {
                    "append-only"
                }
            )));
        }
        Ok(())
    }

    /// EPERM for any change of an immutable inode's data or attributes.
    pub(crate) fn check_not_immutable(&self, id: InodeId) -> Result<()> {
        if self.getattr(id)?.flags & INODE_FLAG_IMMUTABLE != 0 {
            return Err(Error::NotPermitted(format!(
                "inode {} of subvolume {} is immutable",
                id.ino, id.subvol
            )));
        }
        Ok(())
    }

    /// EPERM if the entry `name` in `dir` exists and may not go.
    pub(crate) fn check_entry_may_go(&self, dir: InodeId, name: &[u8]) -> Result<()> {
        match self.lookup(dir, name) {
            Ok(victim) => self.check_may_delete(dir, victim),
            Err(_) => Ok(()),
        }
    }

    /// EPERM unless `id` may gain entries: an immutable directory may not.
    pub(crate) fn check_may_add_entry(&self, dir: InodeId) -> Result<()> {
        if self.getattr(dir)?.flags & INODE_FLAG_IMMUTABLE != 0 {
            return Err(Error::NotPermitted(format!(
                "directory {} of subvolume {} is immutable",
                dir.ino, dir.subvol
            )));
        }
        Ok(())
    }

    /// EPERM unless the entry of `victim` in `dir` may go (unlink, rmdir, rename from or
    /// over it): neither may be immutable or append-only, as the VFS's may_delete says.
    pub(crate) fn check_may_delete(&self, dir: InodeId, victim: InodeId) -> Result<()> {
        self.check_may_modify(dir)?;
        self.check_may_modify(victim)
    }
}
