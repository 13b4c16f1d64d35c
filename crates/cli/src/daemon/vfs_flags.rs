//! The kernel's VFS mount flags by the names mount(8) gives them: the MS_* bits they set or
//! clear in mount(2), the names fusermount3 takes for them, how they read back from
//! mountinfo, and what `-v` prints. Every one is passed to the kernel (or to fusermount3),
//! which enforces it, and the server acts on those FUSE leaves to it (see
//! `oleo_fuse::MountFlags`): none is accepted and dropped.

use std::path::Path;

type Ms = libc::c_ulong;

/// One flag: its name, its MS_* bit, whether the name sets or clears it, and whether
/// fusermount3 lets a user ask for it (it forces nosuid and nodev on users' mounts).
struct Flag {
    name: &'static str,
    bit: Ms,
    set: bool,
    user_may: bool,
}

const fn flag(name: &'static str, bit: Ms, set: bool, user_may: bool) -> Flag {
    Flag {
        name,
        bit,
        set,
        user_may,
    }
}

const FLAGS: &[Flag] = &[
    flag("nosuid", libc::MS_NOSUID, true, true),
    flag("suid", libc::MS_NOSUID, false, false),
    flag("nodev", libc::MS_NODEV, true, true),
    flag("dev", libc::MS_NODEV, false, false),
    flag("noexec", libc::MS_NOEXEC, true, true),
    flag("exec", libc::MS_NOEXEC, false, true),
    flag("sync", libc::MS_SYNCHRONOUS, true, true),
    flag("async", libc::MS_SYNCHRONOUS, false, true),
    flag("dirsync", libc::MS_DIRSYNC, true, true),
    flag("noatime", libc::MS_NOATIME, true, true),
    flag("atime", libc::MS_NOATIME, false, true),
    flag("nodiratime", libc::MS_NODIRATIME, true, true),
    flag("diratime", libc::MS_NODIRATIME, false, true),
    flag("relatime", libc::MS_RELATIME, true, true),
    flag("norelatime", libc::MS_RELATIME, false, true),
    flag("strictatime", libc::MS_STRICTATIME, true, true),
    flag("nostrictatime", libc::MS_STRICTATIME, false, true),
    flag("lazytime", libc::MS_LAZYTIME, true, true),
    flag("nolazytime", libc::MS_LAZYTIME, false, true),
    flag("nosymfollow", libc::MS_NOSYMFOLLOW, true, true),
    flag("symfollow", libc::MS_NOSYMFOLLOW, false, true),
];

/// The flags asked for, in order (a later name wins over an earlier one), as mount(8)
/// reads them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VfsFlags {
    /// MS_* bits set.
    pub ms: Ms,
    /// Names given that clear a bit a user may not clear (`suid`, `dev`).
    unsafe_for_users: Vec<&'static str>,
}

impl VfsFlags {
    /// Takes `opt` if it is a VFS flag; false if it is not one.
    pub fn apply(&mut self, opt: &str) -> bool {
        let Some(f) = FLAGS.iter().find(|f| f.name == opt) else {
            return false;
        };
        if f.set {
            self.ms |= f.bit;
        } else {
            self.ms &= !f.bit;
        }
        self.unsafe_for_users.retain(|n| {
            FLAGS
                .iter()
                .find(|g| g.name == *n)
                .is_some_and(|g| g.bit != f.bit)
        });
        if !f.user_may {
            self.unsafe_for_users.push(f.name);
        }
        true
    }

    /// The names asked for that a user's mount cannot have: fusermount3 forces nosuid and
    /// nodev. Refused rather than silently not given.
    pub fn check_user_may(&self) -> Result<(), String> {
        match self.unsafe_for_users.first() {
            None => Ok(()),
            Some(n) => Err(format!(
                "{n}: only root can mount with {n} (a user's FUSE mount is always nosuid,nodev)"
            )),
        }
    }

    /// Starts from the flags a mount has now (`mount -o remount,...` changes only what it
    /// names, as mount(8) does).
    pub fn of_mount(mountpoint: &Path) -> Result<VfsFlags, String> {
        let (mount_opts, super_opts) = mount_options(mountpoint)?;
        let mut f = VfsFlags::default();
        for o in mount_opts.split(',').chain(super_opts.split(',')) {
            f.apply(o);
        }
        // mountinfo says relatime, noatime or nothing: nothing is strictatime.
        if f.ms & (libc::MS_RELATIME | libc::MS_NOATIME) == 0 {
            f.ms |= libc::MS_STRICTATIME;
        }
        f.unsafe_for_users.clear();
        Ok(f)
    }

    /// The names for fusermount3's -o (it passes each to mount(2) as its bit).
    pub fn fusermount_names(&self) -> Vec<&'static str> {
        FLAGS
            .iter()
            .filter(|f| f.set && self.ms & f.bit != 0)
            .map(|f| f.name)
            .collect()
    }

    /// What the server acts on.
    pub fn server(&self) -> oleo_fuse::MountFlags {
        oleo_fuse::MountFlags::from_ms(to_u64(self.ms))
    }
}

/// mount(2)'s flags as the u64 the server takes (c_ulong is narrower on 32-bit targets).
#[allow(clippy::useless_conversion)]
fn to_u64(ms: Ms) -> u64 {
    u64::from(ms)
}

/// The per-mount and per-superblock options mountinfo shows for `mountpoint` (the last
/// mount there).
pub fn mount_options(mountpoint: &Path) -> Result<(String, String), String> {
    // The parent resolved, not the mount point: a stat of it would wait on the server,
    // which may be this very process, not serving yet.
    let abs =
        std::path::absolute(mountpoint).map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    let want = match (abs.parent(), abs.file_name()) {
        (Some(p), Some(n)) => std::fs::canonicalize(p)
            .map_err(|e| format!("{}: {e}", p.display()))?
            .join(n),
        _ => abs,
    };
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
    info.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mut left = left.split(' ');
            let point = crate::daemon::fuse_mount::unescape(left.nth(4)?);
            let opts = left.next()?;
            let sopts = right.split(' ').nth(2)?;
            (Path::new(&point) == want).then(|| (opts.to_string(), sopts.to_string()))
        })
        .next_back()
        .ok_or_else(|| format!("{}: not a mount point", mountpoint.display()))
}

/// What `-v` prints: the flags the kernel shows for the mount, as /proc/mounts has them
/// (the per-mount ones, then sync, dirsync and lazytime from the superblock's).
pub fn effective(mountpoint: &Path) -> Result<String, String> {
    let (mount_opts, super_opts) = mount_options(mountpoint)?;
    let mut all: Vec<&str> = mount_opts.split(',').collect();
    all.extend(
        super_opts
            .split(',')
            .filter(|o| matches!(*o, "sync" | "dirsync" | "lazytime")),
    );
    Ok(all.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_names_win_and_users_are_refused_suid() {
        let mut f = VfsFlags::default();
        for o in ["nosuid", "noexec", "exec", "noatime", "strictatime"] {
            assert!(f.apply(o));
        }
        assert!(!f.apply("commit"));
        assert_eq!(
            f.ms,
            libc::MS_NOSUID | libc::MS_NOATIME | libc::MS_STRICTATIME
        );
        assert_eq!(f.fusermount_names(), ["nosuid", "noatime", "strictatime"]);
        assert!(f.check_user_may().is_ok());
        f.apply("suid");
        assert!(f.check_user_may().unwrap_err().contains("suid"));
        f.apply("nosuid");
        assert!(f.check_user_may().is_ok());
        assert_eq!(f.server().atime, oleo_fuse::Atime::Strict);
    }
}
