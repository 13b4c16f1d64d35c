//! Attaching a FUSE connection at the mount point, with type `fuse.oleo` so that
//! /proc/mounts, findmnt and mount(8) know what it is. Root mounts with mount(2) directly;
//! everyone else goes through fusermount3, the setuid helper FUSE installs for exactly this,
//! which mounts for the user and hands back the /dev/fuse descriptor over a socket.

use std::ffi::CString;
use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// What the kernel (or fusermount3) is asked for.
#[derive(Clone, Debug, Default)]
pub struct FuseOptions {
    /// Shown as the mount's source: the image path.
    pub source: String,
    pub writable: bool,
    pub allow_other: bool,
    pub default_permissions: bool,
    /// fusermount3 stays behind and unmounts when the server goes away.
    pub auto_unmount: bool,
    /// The kernel's VFS flags (nosuid, noexec, noatime, ...), given to mount(2).
    pub vfs: crate::daemon::vfs_flags::VfsFlags,
}

/// A mounted connection: the descriptor to serve, and what must live as long as the
/// server does.
pub struct Mounted {
    pub fd: OwnedFd,
    pub keeper: Keeper,
}

/// fusermount3 waiting with auto_unmount: it unmounts once our end of its socket closes.
pub struct Keeper(#[allow(dead_code)] Option<(Child, UnixStream)>);

const FUSE_DEV: &str = "/dev/fuse";

pub fn mount(mountpoint: &Path, o: &FuseOptions) -> Result<Mounted, String> {
    // The server this mount gets serves `oleo send` and `oleo receive` with the CLI's code.
    crate::daemon::streams::register();
    if !Path::new(FUSE_DEV).exists() {
        return Err(format!(
            "{FUSE_DEV} does not exist: load the FUSE module (modprobe fuse), or in a \
             container pass the device in (e.g. --device /dev/fuse)"
        ));
    }
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        mount_directly(mountpoint, o)
    } else {
        mount_with_fusermount(mountpoint, o)
    }
}

fn mount_directly(mountpoint: &Path, o: &FuseOptions) -> Result<Mounted, String> {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(FUSE_DEV)
        .map_err(|e| format!("{FUSE_DEV}: {e}"))?;
    let fd = OwnedFd::from(dev);
    let root_mode = std::fs::metadata(mountpoint)
        .map_err(|e| format!("{}: {e}", mountpoint.display()))?
        .mode()
        & libc::S_IFMT;
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut data = format!(
        "fd={},rootmode={root_mode:o},user_id={uid},group_id={gid}",
        fd.as_raw_fd()
    );
    if o.allow_other {
        data.push_str(",allow_other");
    }
    if o.default_permissions {
        data.push_str(",default_permissions");
    }
    let flags = o.vfs.ms | if o.writable { 0 } else { libc::MS_RDONLY };
    sys_mount(&o.source, mountpoint, Some("fuse.oleo"), flags, &data)?;
    Ok(Mounted {
        fd,
        keeper: Keeper(None),
    })
}

/// mount(2), with errors that name the mount point.
fn sys_mount(
    source: &str,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: &str,
) -> Result<(), String> {
    sys_mount_errno(source, target, fstype, flags, data).map_err(|(e, _)| e)
}

/// mount(2); an error comes with its errno.
fn sys_mount_errno(
    source: &str,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: &str,
) -> Result<(), (String, Option<i32>)> {
    let c = |s: &[u8]| {
        CString::new(s).map_err(|_| ("a NUL byte in a mount argument".to_string(), None))
    };
    let (src, tgt, dat) = (
        c(source.as_bytes())?,
        c(target.as_os_str().as_bytes())?,
        c(data.as_bytes())?,
    );
    let fstype = fstype.map(|t| c(t.as_bytes())).transpose()?;
    // SAFETY: all pointers are NUL-terminated strings that outlive the call.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            tgt.as_ptr(),
            fstype.as_ref().map_or(std::ptr::null(), |t| t.as_ptr()),
            flags,
            dat.as_ptr().cast(),
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    Err((
        format!("mounting on {}: {e}", target.display()),
        e.raw_os_error(),
    ))
}

/// Takes a mount away again (a server that failed to start).
pub fn unmount(mountpoint: &Path) {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        if let Ok(t) = CString::new(mountpoint.as_os_str().as_bytes()) {
            // SAFETY: t is a NUL-terminated path.
            unsafe { libc::umount2(t.as_ptr(), libc::MNT_DETACH) };
        }
    } else {
        fusermount_unmount(mountpoint, true);
    }
}

/// `fusermount3 -u [-z] MOUNTPOINT`; true if it unmounted.
pub fn fusermount_unmount(mountpoint: &Path, lazy: bool) -> bool {
    let Ok(helper) = find_fusermount() else {
        return false;
    };
    let mut c = Command::new(helper);
    c.arg("-u");
    if lazy {
        c.arg("-z");
    }
    c.arg("--")
        .arg(mountpoint)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// mountinfo's escapes of space, tab, newline and backslash.
pub fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// `mount -o remount,...`: FUSE lets the superblock's read-only flag change, and the VFS
/// flags `vfs` (MS_*, all of those the mount is to have) replace the mount's.
pub fn remount(mountpoint: &Path, writable: bool, vfs: libc::c_ulong) -> Result<(), String> {
    let flags = libc::MS_REMOUNT | vfs | if writable { 0 } else { libc::MS_RDONLY };
    sys_mount_errno("", mountpoint, None, flags, "").map_err(|(e, errno)| {
        let Some(errno) = errno else { return e };
        let e = format!(
            "remounting {}: {}",
            mountpoint.display(),
            std::io::Error::from_raw_os_error(errno)
        );
        // SAFETY: geteuid cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        match errno {
            libc::EPERM if !root => format!(
                "{e} (remounting needs root: FUSE's fusermount3 cannot remount; run `mount -o \
                 remount,{}` as root)",
                if writable { "rw" } else { "ro" }
            ),
            libc::EBUSY if !writable => format!("{e} (is a file on it open for writing?)"),
            _ => e,
        }
    })
}

/// Tells the server of the mount at `mountpoint` which VFS flags are now in force (after a
/// remount): the atime, sync and dirsync ones are its to act on.
pub fn tell_server_flags(
    mountpoint: &Path,
    vfs: &crate::daemon::vfs_flags::VfsFlags,
) -> Result<(), String> {
    let f =
        std::fs::File::open(mountpoint).map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    let mut arg = vfs.server().to_ms().to_le_bytes();
    crate::common::on_mount::raw_ioctl(&f, oleo_fuse::subvol_ioctl::SET_MOUNT_FLAGS, &mut arg)
        .map_err(|e| format!("{}: {e}", mountpoint.display()))
}

/// The mount at `mountpoint` (which cannot be stat'ed: a dead FUSE mount), from mountinfo:
/// its type and source.
pub fn dead_mount(mountpoint: &Path) -> Option<(String, String)> {
    let abs = std::path::absolute(mountpoint).ok()?;
    // The parent resolves; the mount point itself does not.
    let want = match (abs.parent(), abs.file_name()) {
        (Some(p), Some(n)) => std::fs::canonicalize(p).ok()?.join(n),
        _ => abs,
    };
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let point = unescape(left.split(' ').nth(4)?);
            let mut r = right.split(' ');
            let (fstype, source) = (r.next()?, unescape(r.next()?));
            (Path::new(&point) == want).then(|| (fstype.to_string(), source))
        })
        .next_back()
}

/// Sends SIGUSR1 (commit now) to the oleo serving `mountpoint`: the process running this
/// binary that holds the mount's source (the image) open. Best effort: a mount with its own fsname
/// cannot be traced back, and then the periodic commit does it.
pub fn ask_server_to_commit(mountpoint: &Path) {
    let Ok(want) = std::fs::canonicalize(mountpoint) else {
        return;
    };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let source = info.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let point = left.split(' ').nth(4)?.replace("\\040", " ");
        let mut r = right.split(' ');
        let (fstype, source) = (r.next()?, r.next()?);
        (Path::new(&point) == want && fstype == "fuse.oleo").then(|| source.replace("\\040", " "))
    });
    let Some(image) = source.and_then(|s| std::fs::metadata(s).ok()) else {
        return;
    };
    let (Ok(procs), Ok(exe)) = (
        std::fs::read_dir("/proc"),
        std::fs::read_link("/proc/self/exe"),
    ) else {
        return;
    };
    let me = std::process::id() as i32;
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        // The server runs this same binary, under whatever name it was started.
        let is_oleo = pid != me && std::fs::read_link(p.path().join("exe")).is_ok_and(|e| e == exe);
        let holds = is_oleo
            && std::fs::read_dir(p.path().join("fd")).is_ok_and(|fds| {
                fds.flatten().any(|fd| {
                    std::fs::metadata(fd.path()).is_ok_and(|m| {
                        m.dev() == image.dev() && m.ino() == image.ino()
                            || (m.rdev() != 0 && m.rdev() == image.rdev())
                    })
                })
            });
        if holds {
            // SAFETY: kill with a valid signal number.
            unsafe { libc::kill(pid, libc::SIGUSR1) };
        }
    }
}

fn find_fusermount() -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::env::split_paths(&path)
        .chain(["/usr/bin", "/bin", "/usr/sbin", "/sbin"].map(PathBuf::from));
    for dir in dirs {
        let p = dir.join("fusermount3");
        if let Ok(m) = std::fs::metadata(&p) {
            if m.uid() != 0 || m.permissions().mode() & 0o4000 == 0 {
                return Err(format!(
                    "{} is not setuid root, so it cannot mount for an unprivileged user \
                     (chown root:root and chmod u+s it, or mount as root)",
                    p.display()
                ));
            }
            return Ok(p);
        }
    }
    Err(
        "fusermount3 was not found: an unprivileged mount needs FUSE's setuid helper \
         (install the fuse3 package), or mount as root"
            .into(),
    )
}

/// fusermount3 escapes: `,` separates options and `\` escapes.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace(',', "\\,")
}

fn mount_with_fusermount(mountpoint: &Path, o: &FuseOptions) -> Result<Mounted, String> {
    let helper = find_fusermount()?;
    // fusermount3 forces nosuid and nodev on a user's mount; they are said anyway.
    let mut opts = vec![
        if o.writable { "rw" } else { "ro" }.to_string(),
        "nosuid".into(),
        "nodev".into(),
        "subtype=oleo".into(),
        format!("fsname={}", escape(&o.source)),
    ];
    for n in o.vfs.fusermount_names() {
        if !opts.iter().any(|o| o == n) {
            opts.push(n.into());
        }
    }
    if o.allow_other {
        opts.push("allow_other".into());
    }
    if o.default_permissions {
        opts.push("default_permissions".into());
    }
    if o.auto_unmount {
        opts.push("auto_unmount".into());
    }
    let (ours, theirs) = UnixStream::pair().map_err(|e| format!("socketpair: {e}"))?;
    // fusermount3 finds its end through _FUSE_COMMFD: it must survive exec.
    // SAFETY: fcntl on a descriptor we own.
    unsafe { libc::fcntl(theirs.as_raw_fd(), libc::F_SETFD, 0) };
    let mut child = Command::new(&helper)
        .env("_FUSE_COMMFD", theirs.as_raw_fd().to_string())
        .arg("-o")
        .arg(opts.join(","))
        .arg("--")
        .arg(mountpoint)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", helper.display()))?;
    drop(theirs);
    let received = receive_fd(&ours);
    let why = |child: &mut Child| {
        let mut text = String::new();
        if let Some(mut err) = child.stderr.take() {
            use std::io::Read;
            let _ = err.read_to_string(&mut text);
        }
        let _ = child.wait();
        explain_fusermount(text.trim(), mountpoint)
    };
    let fd = match received {
        Ok(fd) => fd,
        Err(e) => {
            let text = why(&mut child);
            return Err(if text.is_empty() { e } else { text });
        }
    };
    if o.auto_unmount {
        // It waits for our end to close, then unmounts.
        return Ok(Mounted {
            fd,
            keeper: Keeper(Some((child, ours))),
        });
    }
    match child.wait() {
        Ok(st) if st.success() => Ok(Mounted {
            fd,
            keeper: Keeper(None),
        }),
        _ => Err(why(&mut child)),
    }
}

/// fusermount3's own words, with what to do about the usual ones.
fn explain_fusermount(text: &str, mountpoint: &Path) -> String {
    let hint = if text.contains("user_allow_other") {
        " (allow_other for an unprivileged user needs `user_allow_other` in /etc/fuse.conf)"
    } else if text.contains("/dev/fuse") && text.contains("Permission denied") {
        " (users need read and write access to /dev/fuse: mode 0666, as udev normally sets it)"
    } else if text.contains("/dev/fuse") {
        " (is the fuse module loaded, and /dev/fuse passed into this container?)"
    } else if text.contains("write access") || text.contains("Permission denied") {
        " (mount on a directory you own)"
    } else {
        ""
    };
    if text.is_empty() {
        format!("fusermount3 could not mount on {}", mountpoint.display())
    } else {
        format!("{text}{hint}")
    }
}

/// The /dev/fuse descriptor fusermount3 sends as SCM_RIGHTS.
fn receive_fd(sock: &UnixStream) -> Result<OwnedFd, String> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, UnixAddr};
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!(RawFd);
    let msg = loop {
        match recvmsg::<UnixAddr>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::empty(),
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            r => break r.map_err(|e| format!("receiving the FUSE descriptor: {e}"))?,
        }
    };
    let cmsgs = msg
        .cmsgs()
        .map_err(|e| format!("receiving the FUSE descriptor: {e}"))?;
    for c in cmsgs {
        if let ControlMessageOwned::ScmRights(fds) = c {
            if let Some(&fd) = fds.first() {
                // SAFETY: the kernel just installed this descriptor for us.
                return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    Err("fusermount3 sent no FUSE descriptor".into())
}
