//! What the kernel's VFS mount flags ask of the server. The VFS enforces `ro`, `nosuid`,
//! `nodev`, `noexec` and `nosymfollow` by itself; FUSE leaves the rest to the server:
//! - atime: FUSE marks every inode S_NOATIME, so the kernel never moves an atime itself.
//!   The server moves it at READ and READDIR (`noatime`, `relatime`, `strictatime`,
//!   `nodiratime`), and at OPEN it lets the kernel keep a file's cached pages only when a
//!   read would not move the atime (a read served from the cache never reaches the server);
//! - `dirsync` (and `sync`, which implies it, as the kernel's IS_DIRSYNC): a directory
//!   change is durable before it is answered. `sync` makes the kernel send FSYNC after each
//!   write by itself (generic_write_sync); the server also makes setattr and xattr changes
//!   durable before answering;
//! - `lazytime`: on btrfs the kernel dirties the inode in the running transaction for an
//!   atime as it does without it (btrfs_update_time), and so does oleo: an atime is
//!   written with the next commit, never by a commit of its own.
//!
//! A remount changes them (`mount -o remount,...` sends the new flags by `SET_MOUNT_FLAGS`).

use std::sync::atomic::{AtomicU64, Ordering};

// mount(2)'s MS_* bits (uapi linux/mount.h), as the u64 the SET_MOUNT_FLAGS ioctl carries.
const MS_SYNCHRONOUS: u64 = 1 << 4;
const MS_DIRSYNC: u64 = 1 << 7;
const MS_NOATIME: u64 = 1 << 10;
const MS_NODIRATIME: u64 = 1 << 11;
const MS_RELATIME: u64 = 1 << 21;
const MS_STRICTATIME: u64 = 1 << 24;
const MS_LAZYTIME: u64 = 1 << 25;

/// How reads move atimes on this mount.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Atime {
    /// `relatime` (the kernel's default).
    #[default]
    Relative,
    /// `strictatime`.
    Strict,
    /// `noatime`.
    Never,
}

/// The mount flags the server acts on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MountFlags {
    /// How reads move atimes.
    pub atime: Atime,
    /// `nodiratime`: listings never move a directory's atime.
    pub nodiratime: bool,
    /// `lazytime`: accepted; changes nothing on btrfs (see the module's doc).
    pub lazytime: bool,
    /// `sync`: every change durable before it is answered.
    pub sync: bool,
    /// `dirsync`: every directory change durable before it is answered.
    pub dirsync: bool,
}

impl MountFlags {
    /// From mount(2)'s MS_* flags, with the kernel's rules for atime (path_mount):
    /// relatime unless `MS_NOATIME`, and `MS_STRICTATIME` over both.
    pub fn from_ms(ms: u64) -> MountFlags {
        let has = |f: u64| ms & f != 0;
        let atime = if has(MS_STRICTATIME) {
            Atime::Strict
        } else if has(MS_NOATIME) {
            Atime::Never
        } else {
            Atime::Relative
        };
        MountFlags {
            atime,
            nodiratime: has(MS_NODIRATIME),
            lazytime: has(MS_LAZYTIME),
            sync: has(MS_SYNCHRONOUS),
            dirsync: has(MS_DIRSYNC),
        }
    }

    /// The MS_* flags that give these (`from_ms` of them gives them back).
    pub fn to_ms(self) -> u64 {
        let mut ms = match self.atime {
            Atime::Relative => MS_RELATIME,
            Atime::Strict => MS_STRICTATIME,
            Atime::Never => MS_NOATIME,
        };
        for (on, f) in [
            (self.nodiratime, MS_NODIRATIME),
            (self.lazytime, MS_LAZYTIME),
            (self.sync, MS_SYNCHRONOUS),
            (self.dirsync, MS_DIRSYNC),
        ] {
            if on {
                ms |= f;
            }
        }
        ms
    }

    /// The engine's rule for a read of a directory (`dir`) or a file; None: the atime stays.
    pub(crate) fn atime_rule(self, dir: bool) -> Option<oleo::AtimeRule> {
        if dir && self.nodiratime {
            return None;
        }
        match self.atime {
            Atime::Relative => Some(oleo::AtimeRule::Relative),
            Atime::Strict => Some(oleo::AtimeRule::Strict),
            Atime::Never => None,
        }
    }

    /// A directory change must be durable before it is answered.
    pub(crate) fn dir_changes_durable(self) -> bool {
        self.sync || self.dirsync
    }
}

/// The flags in force, changed by a remount while requests run.
#[derive(Debug, Default)]
pub(crate) struct FlagsCell(AtomicU64);

impl FlagsCell {
    pub(crate) fn new(f: MountFlags) -> FlagsCell {
        FlagsCell(AtomicU64::new(f.to_ms()))
    }

    pub(crate) fn get(&self) -> MountFlags {
        MountFlags::from_ms(self.0.load(Ordering::Relaxed))
    }

    pub(crate) fn set(&self, f: MountFlags) {
        self.0.store(f.to_ms(), Ordering::Relaxed)
    }
}

impl crate::OleoFuse {
    /// A READ or READDIR of `id` is being answered: its atime moves as the flags say
    /// (before the answer: the kernel drops its cached atime once the answer is in, and
    /// the stat that follows must see the new one). Best effort, as the kernel's
    /// touch_atime: a failure is logged, the read goes on.
    pub(crate) fn read_happened(&self, id: oleo::InodeId, dir: bool) {
        if !self.settings.writable {
            return;
        }
        let Some(rule) = self.flags.get().atime_rule(dir) else {
            return;
        };
        if let Err(e) = self.fs.touch_atime(id, rule) {
            log::debug!("atime of inode {} of subvolume {}: {e}", id.ino, id.subvol);
        }
    }

    /// Whether an open (for reading) of `id` may keep the kernel's cached pages or
    /// listing: not while a read would move the atime, since a read the kernel answers
    /// from its cache never reaches the server.
    pub(crate) fn may_keep_cache(&self, id: oleo::InodeId, dir: bool) -> bool {
        if !self.settings.writable {
            return true;
        }
        match self.flags.get().atime_rule(dir) {
            None => true,
            Some(rule) => !self.fs.atime_due(id, rule).unwrap_or(false),
        }
    }

    /// Whether the kernel may cache listings without an OPENDIR (NO_OPENDIR_SUPPORT):
    /// not under strictatime, where every listing moves the atime.
    pub(crate) fn listings_cacheable_without_open(&self) -> bool {
        !self.settings.writable || self.flags.get().atime != Atime::Strict
    }

    /// After a directory change: under `dirsync` or `sync` the directories and the inode
    /// named are made durable before the change is answered (an fsync of each, the log
    /// tree's or a commit).
    pub(crate) fn dir_change_done(
        &self,
        dirs: &[oleo::InodeId],
        inode: Option<oleo::InodeId>,
    ) -> Result<(), crate::Errno> {
        if !self.flags.get().dir_changes_durable() {
            return Ok(());
        }
        for &id in inode.iter().chain(dirs) {
            self.fs.fsync(id, false).map_err(crate::errno)?;
        }
        Ok(())
    }

    /// After a change of `id`'s attributes or xattrs: under `sync`, durable before it is
    /// answered.
    pub(crate) fn inode_change_done(&self, id: oleo::InodeId) -> Result<(), crate::Errno> {
        if !self.flags.get().sync {
            return Ok(());
        }
        self.fs.fsync(id, false).map_err(crate::errno)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atime_rules_as_the_kernel_resolves_them() {
        assert_eq!(MountFlags::from_ms(0).atime, Atime::Relative);
        assert_eq!(MountFlags::from_ms(MS_NOATIME).atime, Atime::Never);
        let both = MS_NOATIME | MS_STRICTATIME;
        assert_eq!(MountFlags::from_ms(both).atime, Atime::Strict);
        let f = MountFlags {
            atime: Atime::Strict,
            nodiratime: true,
            lazytime: true,
            sync: false,
            dirsync: true,
        };
        assert_eq!(MountFlags::from_ms(f.to_ms()), f);
        assert_eq!(f.atime_rule(true), None);
        assert_eq!(f.atime_rule(false), Some(oleo::AtimeRule::Strict));
        assert!(f.dir_changes_durable());
    }
}
