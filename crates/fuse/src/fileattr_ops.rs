//! chattr(1) and lsattr(1) on the mount: the kernel's FUSE turns FS_IOC_GETFLAGS/SETFLAGS
//! and FS_IOC_FSGETXATTR/FSSETXATTR into ioctl requests (after checking ownership and
//! CAP_LINUX_IMMUTABLE itself), answered from the engine's `fileattr`.

use crate::transport::Errno;
use crate::{errno, OleoFuse};

/// FS_IOC_GETFLAGS / SETFLAGS (the kernel sends the `long`-sized numbers, 4-byte data).
const GETFLAGS: u32 = 0x8008_6601;
const SETFLAGS: u32 = 0x4008_6602;
/// The same on a 32-bit caller.
const GETFLAGS32: u32 = 0x8004_6601;
const SETFLAGS32: u32 = 0x4004_6602;
/// FS_IOC_FSGETXATTR / FSSETXATTR: struct fsxattr, 28 bytes, xflags first.
const FSGETXATTR: u32 = 0x801c_581f;
const FSSETXATTR: u32 = 0x401c_5820;
const FSXATTR_SIZE: usize = 28;

pub(crate) fn is_fileattr_ioctl(c: u32) -> bool {
    [
        GETFLAGS, SETFLAGS, GETFLAGS32, SETFLAGS32, FSGETXATTR, FSSETXATTR,
    ]
    .contains(&c)
}

fn u32_arg(data: &[u8]) -> Result<u32, Errno> {
    let b: [u8; 4] = data
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .ok_or(Errno::EINVAL)?;
    Ok(u32::from_ne_bytes(b))
}

impl OleoFuse {
    /// Runs fileattr ioctl `c` on `node`; the output bytes.
    pub(crate) fn fileattr_ioctl(&self, node: u64, c: u32, data: &[u8]) -> Result<Vec<u8>, Errno> {
        let id = self.id(node)?;
        match c {
            GETFLAGS | GETFLAGS32 => {
                let f = self.fs.get_fs_flags(id).map_err(errno)?;
                Ok(f.to_ne_bytes().to_vec())
            }
            FSGETXATTR => {
                let x = self.fs.get_xflags(id).map_err(errno)?;
                let mut out = vec![0u8; FSXATTR_SIZE];
                out[..4].copy_from_slice(&x.to_ne_bytes());
                Ok(out)
            }
            SETFLAGS | SETFLAGS32 => {
                let f = u32_arg(data)?;
                self.set_flags(node, id, f)?;
                Ok(Vec::new())
            }
            FSSETXATTR => {
                let x = u32_arg(data)?;
                let old = self.fs.get_fs_flags(id).map_err(errno)?;
                self.set_flags(node, id, oleo::fileattr::with_xflags(old, x))?;
                Ok(Vec::new())
            }
            _ => Err(Errno::ENOTTY),
        }
    }

    /// A regular file's times are the kernel's under WRITEBACK_CACHE: it would keep
    /// showing the old ctime, so the change leaves it (btrfs stamps one; stat showing a
    /// time the disk lacks would be worse). Other inodes take the new ctime.
    fn set_flags(&self, node: u64, id: oleo::InodeId, flags: u32) -> Result<(), Errno> {
        let regular = self.fs.getattr(id).map_err(errno)?.kind == oleo::FileKind::File;
        if regular && self.kernel_owns_times() {
            self.mutate(|fs| fs.set_fs_flags_keep_ctime(id, flags))?;
        } else {
            self.mutate(|fs| fs.set_fs_flags(id, flags))?;
        }
        self.attr_changed(node);
        Ok(())
    }

    /// The kernel's cached attributes (ctime) are stale.
    fn attr_changed(&self, node: u64) {
        if let Some(n) = self.notifier() {
            // Attributes only (a negative offset keeps the page cache).
            let _ = n.inval_inode(node, -1, 0);
        }
    }
}
