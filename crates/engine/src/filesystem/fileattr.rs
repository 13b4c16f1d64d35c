//! Inode flags through the handle (chattr, lsattr, FS_IOC_FSGETXATTR): `vfs::fileattr`
//! under the inode lock.

use crate::error::Result;
use crate::filesystem::Filesystem;
use crate::transaction::fs::InodeId;
use crate::transaction::space::reservation::Reserve;
use crate::vfs::fileattr::to_fs_flags;
use crate::vfs::fileattr::to_xflags;
use crate::vfs::fileattr::with_xflags;

impl Filesystem {
    /// FS_IOC_GETFLAGS: the inode's flags as chattr letters' bits.
    pub fn get_fs_flags(&self, id: InodeId) -> Result<u32> {
        Ok(to_fs_flags(self.lookup_op(|c| c.getattr(id))?.flags))
    }

    /// FS_IOC_SETFLAGS with the kernel's rules (who may set immutable and append-only is
    /// the caller's to check, as the VFS does before btrfs sees the call).
    pub fn set_fs_flags(&self, id: InodeId, flags: u32) -> Result<()> {
        self.set_fs_flags_how(id, flags, false)
    }

    /// `set_fs_flags` leaving ctime as it was: for a caller whose cache owns the file's
    /// times and would never show a ctime changed here (FUSE's writeback cache).
    pub fn set_fs_flags_keep_ctime(&self, id: InodeId, flags: u32) -> Result<()> {
        self.set_fs_flags_how(id, flags, true)
    }

    fn set_fs_flags_how(&self, id: InodeId, flags: u32, keep_ctime: bool) -> Result<()> {
        // A NOCOW change depends on the file being empty: no write may come between.
        let _file = self.inode_locks().lock(id);
        let mut core = self.core_mut();
        core.check_subvol_writable(id.subvol)?;
        let nodatasum = core.mount_nodatasum;
        core.write_op(Reserve::items(4), |t| {
            t.set_fs_flags(id, flags, nodatasum, keep_ctime)
        })
    }

    /// FS_IOC_FSGETXATTR's xflags.
    pub fn get_xflags(&self, id: InodeId) -> Result<u32> {
        Ok(to_xflags(self.get_fs_flags(id)?))
    }

    /// FS_IOC_FSSETXATTR: the xflags' bits change, the others (NOCOW, compression) stay.
    pub fn set_xflags(&self, id: InodeId, x: u32) -> Result<()> {
        let old = self.get_fs_flags(id)?;
        self.set_fs_flags(id, with_xflags(old, x))
    }
}
