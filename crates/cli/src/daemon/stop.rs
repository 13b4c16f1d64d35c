//! Stopping a serving oleo with a signal. SIGTERM, SIGINT and SIGHUP unmount the mount and
//! any bind mounts of it (or,
//! when files on it are still open, detach it and end the FUSE connection), so that the
//! session ends the way an unmount ends it: requests in flight finish, the final commit is
//! written, the image is released and the process exits 0. A second signal during that
//! exits at once, as a crash would (the image holds the last commit).
//!
//! The signals are blocked in every thread and taken by one thread with sigwait, so nothing
//! runs in a signal handler.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

/// The first stop signal taken (0: none yet).
static STOPPED_BY: AtomicI32 = AtomicI32::new(0);

fn stop_set() -> libc::sigset_t {
    // SAFETY: sigemptyset initializes the set; sigaddset takes valid signal numbers.
    unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut set);
        for s in STOP_SIGNALS {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Blocks the stop signals in this thread and in every thread it starts from now on: call
/// it before the first thread exists. Children started with std's Command get an empty
/// mask again.
/// Returns the mask before, for `restore`.
pub fn block() -> libc::sigset_t {
    let set = stop_set();
    // SAFETY: valid sets; `old` is written by the call.
    unsafe {
        let mut old = std::mem::zeroed::<libc::sigset_t>();
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        old
    }
}

/// Puts back the mask `block` returned.
pub fn restore(old: libc::sigset_t) {
    // SAFETY: a mask pthread_sigmask gave us.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
}

/// The signal that stopped the server, if one did.
pub fn stopped_by() -> Option<&'static str> {
    match STOPPED_BY.load(Ordering::SeqCst) {
        0 => None,
        s => Some(name(s)),
    }
}

fn name(sig: libc::c_int) -> &'static str {
    match sig {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

/// What a stop needs to know about the mount.
pub struct Mount {
    pub mountpoint: PathBuf,
    /// The fusectl connection id (the mount's device number), to end the connection.
    pub conn: Option<u64>,
    /// Told when a stop begins (the image guard holds opens of the image from then on).
    pub on_stop: Option<Arc<dyn Fn() + Send + Sync>>,
}

/// Starts the thread that takes the stop signals (they must be blocked already).
pub fn spawn(mount: Mount) {
    let mount = Arc::new(mount);
    let spawned = std::thread::Builder::new()
        .name("oleo-signals".into())
        .spawn(move || loop {
            let set = stop_set();
            let mut sig = 0;
            // SAFETY: a valid set and a valid out pointer.
            if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                continue;
            }
            if STOPPED_BY
                .compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                die(sig);
            }
            if let Some(f) = &mount.on_stop {
                f();
            }
            // The unmount waits for the server (the kernel writes back first): in a thread
            // of its own, so that a second signal is still taken meanwhile.
            let m = Arc::clone(&mount);
            let _ = std::thread::Builder::new()
                .name("oleo-stop".into())
                .spawn(move || unmount(&m, sig));
        });
    if let Err(e) = spawned {
        log::warn!("cannot start the signal thread ({e}): signals stop the server at once");
        // SAFETY: unblocking a valid set.
        unsafe {
            let set = stop_set();
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        }
    }
}

/// The second signal: end now, by that signal, without the final commit.
fn die(sig: libc::c_int) -> ! {
    log::error!(
        "{} during the stop: exiting without the final commit (the image keeps its last commit)",
        name(sig)
    );
    log::logger().flush();
    // SAFETY: default action, unblocked, raised: the process ends by the signal.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
        libc::_exit(128 + sig)
    }
}

fn unmount(m: &Mount, sig: libc::c_int) {
    log::debug!(
        "{}: unmounting {} (final commit follows)",
        name(sig),
        m.mountpoint.display()
    );
    // Every mount of this connection (a second mount of the image is a bind mount of the
    // first, see daemon/twice.rs), the newest first: the server ends with the last.
    let mut points = m.conn.map(points_of).unwrap_or_default();
    if points.is_empty() {
        points.push(m.mountpoint.clone());
    }
    let mut busy = Vec::new();
    for p in points.iter().rev() {
        if !plain_unmount(p) {
            busy.push(p.clone());
        }
    }
    if busy.is_empty() {
        return;
    }
    for p in &busy[1..] {
        lazy_unmount(p);
    }
    let m = &Mount {
        mountpoint: busy[0].clone(),
        conn: m.conn,
        on_stop: None,
    };
    // Busy: files are open on it. Push what the kernel still caches for them to us, then
    // free the mount point and end the connection: their owners get ENOTCONN, and what
    // oleo has by then is committed.
    if let Ok(f) = std::fs::File::open(&m.mountpoint) {
        use std::os::fd::AsRawFd;
        // SAFETY: syncfs on a descriptor we own.
        unsafe { libc::syncfs(f.as_raw_fd()) };
    }
    lazy_unmount(&m.mountpoint);
    match m.conn.map(abort_connection) {
        Some(Ok(())) => log::warn!(
            "{} was busy: detached it and ended the FUSE connection (files open on it see \
             ENOTCONN; what they had not written back is lost)",
            m.mountpoint.display()
        ),
        Some(Err(e)) => log::warn!(
            "{} is busy and detached; the server ends when the last file on it is closed \
             (cannot end the FUSE connection: {e})",
            m.mountpoint.display()
        ),
        None => log::warn!(
            "{} is busy and detached; the server ends when the last file on it is closed",
            m.mountpoint.display()
        ),
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// umount(2) as root, else `fusermount3 -u`; false if it is busy (or failed).
fn plain_unmount(mp: &Path) -> bool {
    if is_root() {
        let Ok(t) = CString::new(mp.as_os_str().as_bytes()) else {
            return false;
        };
        // SAFETY: t is a NUL-terminated path.
        let r = unsafe { libc::umount2(t.as_ptr(), 0) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            log::info!("umount {}: {e}", mp.display());
        }
        return r == 0;
    }
    crate::daemon::fuse_mount::fusermount_unmount(mp, false)
}

fn lazy_unmount(mp: &Path) {
    if is_root() {
        if let Ok(t) = CString::new(mp.as_os_str().as_bytes()) {
            // SAFETY: t is a NUL-terminated path.
            unsafe { libc::umount2(t.as_ptr(), libc::MNT_DETACH) };
        }
    } else {
        crate::daemon::fuse_mount::fusermount_unmount(mp, true);
    }
}

const FUSECTL: &str = "/sys/fs/fuse/connections";

/// Ends the FUSE connection through fusectl (its files belong to the mount's owner; root
/// mounts fusectl where it is missing).
pub fn abort_connection(conn: u64) -> std::io::Result<()> {
    let dir = Path::new(FUSECTL).join(conn.to_string());
    if !dir.exists() && is_root() {
        let c = |s: &str| CString::new(s).expect("no NUL");
        let (src, tgt, ty) = (c("fusectl"), c(FUSECTL), c("fusectl"));
        // SAFETY: NUL-terminated strings that outlive the call; no data.
        unsafe { libc::mount(src.as_ptr(), tgt.as_ptr(), ty.as_ptr(), 0, std::ptr::null()) };
    }
    std::fs::write(dir.join("abort"), b"1")
}

/// The mount's fusectl connection id: its device number, from mountinfo (a stat would ask
/// the server itself).
pub fn connection_of(canonical_mountpoint: &Path) -> Option<u64> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let point = crate::daemon::fuse_mount::unescape(f.get(4)?);
            if Path::new(&point) != canonical_mountpoint {
                return None;
            }
            let (major, minor) = f.get(2)?.split_once(':')?;
            Some((major.parse::<u64>().ok()? << 20) | minor.parse::<u64>().ok()?)
        })
        .next_back()
}

/// The mount points of connection `conn` here, in mountinfo's order.
pub fn points_of(conn: u64) -> Vec<PathBuf> {
    let dev = format!("{}:{}", conn >> 20, conn & 0xf_ffff);
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            if f.get(2) != Some(&dev.as_str()) {
                return None;
            }
            Some(PathBuf::from(crate::daemon::fuse_mount::unescape(
                f.get(4)?,
            )))
        })
        .collect()
}

/// Whether the FUSE mount with connection `conn` is still mounted anywhere here.
pub fn still_mounted(conn: u64) -> bool {
    let dev = format!("{}:{}", conn >> 20, conn & 0xf_ffff);
    std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|info| {
        info.lines()
            .any(|l| l.split(' ').nth(2) == Some(dev.as_str()))
    })
}
