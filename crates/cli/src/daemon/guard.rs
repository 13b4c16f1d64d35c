//! Keeping other programs off an image oleo writes, with a fanotify permission mark on it
//! (needs CAP_SYS_ADMIN). While the mount serves, other processes' opens of the image for
//! writing are refused (losetup, `mount -o loop`, a second O_RDWR): the flock in the
//! engine's claim stops only other oleos. Once the mount is gone (unmounted, or a stop
//! signal), every open of the image by another process waits until the final commit is on
//! disk: `umount` returns before a FUSE server has finished, and `btrfs check` or a kernel
//! mount right after it must not see a half-written filesystem.
//!
//! fanotify does not say how the file is being opened: the opener is asleep in its open
//! call, so /proc/TID/syscall shows the flags (FAN_REPORT_TID gives the thread).

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Tests set it to play a server without CAP_SYS_ADMIN.
const NO_FANOTIFY_ENV: &str = "OLEO_NO_FANOTIFY";

pub struct Guard {
    shared: Arc<Shared>,
}

struct Shared {
    fan: OwnedFd,
    image: PathBuf,
    /// The FUSE connection: while it is mounted, the mount serves.
    conn: Option<u64>,
    /// A stop signal came: the mount is going away.
    stopping: AtomicBool,
    /// The final commit is on disk: let everyone in.
    finished: AtomicBool,
    /// Opens waiting for the final commit (their event descriptors).
    held: std::sync::Mutex<Vec<OwnedFd>>,
    /// This executable: another oleo is refused by the claim's lock, with a better message.
    exe: Option<(u64, u64)>,
}

/// Marks `image` (opened for writing by this process) and starts answering its opens.
/// None where fanotify is not allowed (no CAP_SYS_ADMIN): then the engine's loop-device
/// check is what notices a loop device attached to the image.
pub fn start(image: &Path, conn: Option<u64>) -> Option<Guard> {
    if std::env::var_os(NO_FANOTIFY_ENV).is_some() {
        log::info!("{NO_FANOTIFY_ENV} is set: other programs' opens of the image are not refused");
        return None;
    }
    let flags = libc::FAN_CLASS_CONTENT | libc::FAN_CLOEXEC | libc::FAN_REPORT_TID;
    let event_flags = libc::O_RDONLY | libc::O_LARGEFILE | libc::O_CLOEXEC;
    // SAFETY: plain syscall.
    let fd = unsafe { libc::fanotify_init(flags, event_flags as libc::c_uint) };
    if fd < 0 {
        log::info!(
            "fanotify unavailable ({}): other programs' opens of {} for writing are not refused",
            std::io::Error::last_os_error(),
            image.display()
        );
        return None;
    }
    // SAFETY: just created and owned here only.
    let fan = unsafe { OwnedFd::from_raw_fd(fd) };
    let Ok(path) = std::ffi::CString::new(image.as_os_str().as_bytes()) else {
        return None;
    };
    // SAFETY: a valid fanotify descriptor and a NUL-terminated path.
    let r = unsafe {
        libc::fanotify_mark(
            fan.as_raw_fd(),
            libc::FAN_MARK_ADD,
            libc::FAN_OPEN_PERM,
            libc::AT_FDCWD,
            path.as_ptr(),
        )
    };
    if r != 0 {
        log::warn!(
            "cannot watch opens of {} ({}): other programs' opens for writing are not refused",
            image.display(),
            std::io::Error::last_os_error()
        );
        return None;
    }
    let shared = Arc::new(Shared {
        fan,
        image: image.to_path_buf(),
        conn,
        stopping: AtomicBool::new(false),
        finished: AtomicBool::new(false),
        held: std::sync::Mutex::new(Vec::new()),
        exe: std::fs::metadata("/proc/self/exe")
            .ok()
            .map(|m| (m.dev(), m.ino())),
    });
    let s = Arc::clone(&shared);
    let spawned = std::thread::Builder::new()
        .name("oleo-guard".into())
        .spawn(move || s.serve());
    if let Err(e) = spawned {
        log::warn!("cannot start the image guard thread: {e}");
        return None;
    }
    Some(Guard { shared })
}

impl Guard {
    /// From now on opens wait for `finish` (the mount is going away).
    pub fn stopping(&self) -> impl Fn() + Send + Sync + 'static {
        let s = Arc::clone(&self.shared);
        move || s.stopping.store(true, Ordering::SeqCst)
    }

    /// The final commit is on disk and the image closed: let the waiting opens through.
    pub fn finish(self) {
        self.shared.finished.store(true, Ordering::SeqCst);
        let held = std::mem::take(&mut *self.shared.held.lock().unwrap_or_else(|e| e.into_inner()));
        for fd in held {
            self.shared.respond(fd.as_raw_fd(), libc::FAN_ALLOW);
        }
    }
}

const META_LEN: usize = std::mem::size_of::<libc::fanotify_event_metadata>();

impl Shared {
    fn serve(&self) {
        let mut buf = vec![0u8; 64 * META_LEN];
        loop {
            let n = match nix::unistd::read(&self.fan, &mut buf) {
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    log::warn!("image guard: {e}");
                    return;
                }
            };
            let mut at = 0;
            while at + META_LEN <= n {
                // SAFETY: the kernel wrote a whole metadata record here; read unaligned.
                let m: libc::fanotify_event_metadata =
                    unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
                if m.event_len < META_LEN as u32 {
                    break;
                }
                at += m.event_len as usize;
                if m.fd < 0 {
                    continue;
                }
                // SAFETY: the kernel installed this descriptor for us.
                let fd = unsafe { OwnedFd::from_raw_fd(m.fd) };
                self.decide(fd, m.pid);
            }
        }
    }

    fn decide(&self, fd: OwnedFd, tid: i32) {
        let ours = Path::new(&format!("/proc/self/task/{tid}")).exists();
        if ours || self.finished.load(Ordering::SeqCst) {
            return self.respond(fd.as_raw_fd(), libc::FAN_ALLOW);
        }
        let gone = self.stopping.load(Ordering::SeqCst)
            || self
                .conn
                .is_some_and(|c| !crate::daemon::stop::still_mounted(c));
        if gone {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            // `finish` may have run since the check above.
            if !self.finished.load(Ordering::SeqCst) {
                log::info!(
                    "{} opens {}: it waits for the final commit",
                    who(tid),
                    self.image.display()
                );
                held.push(fd);
                return;
            }
            drop(held);
            return self.respond(fd.as_raw_fd(), libc::FAN_ALLOW);
        }
        if self.is_oleo(tid) || opens_for_reading(tid) {
            return self.respond(fd.as_raw_fd(), libc::FAN_ALLOW);
        }
        log::warn!(
            "refused {} opening {} for writing: oleo is writing it",
            who(tid),
            self.image.display()
        );
        self.respond(fd.as_raw_fd(), libc::FAN_DENY);
    }

    fn is_oleo(&self, tid: i32) -> bool {
        let exe = std::fs::metadata(format!("/proc/{tid}/exe")).ok();
        exe.is_some_and(|m| Some((m.dev(), m.ino())) == self.exe)
    }

    fn respond(&self, fd: RawFd, response: u32) {
        let r = libc::fanotify_response { fd, response };
        // SAFETY: `r` is a plain struct of the size written.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&r as *const libc::fanotify_response).cast::<u8>(),
                std::mem::size_of::<libc::fanotify_response>(),
            )
        };
        if let Err(e) = nix::unistd::write(&self.fan, bytes) {
            log::warn!("image guard: answering an open: {e}");
        }
    }
}

/// Whether thread `tid`, asleep in an open of the image, opens it read-only. Anything
/// unclear (an open through io_uring) counts as writing.
fn opens_for_reading(tid: i32) -> bool {
    open_flags(tid).is_some_and(|f| f & libc::O_ACCMODE == libc::O_RDONLY && f & libc::O_TRUNC == 0)
}

fn open_flags(tid: i32) -> Option<i32> {
    let text = std::fs::read_to_string(format!("/proc/{tid}/syscall")).ok()?;
    let mut f = text.split_whitespace();
    let nr: libc::c_long = f.next()?.parse().ok()?;
    let args: Vec<u64> = f
        .take(6)
        .filter_map(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok())
        .collect();
    let arg = |i: usize| args.get(i).copied();
    #[cfg(target_arch = "x86_64")]
    match nr {
        libc::SYS_open => return arg(1).map(|a| a as i32),
        libc::SYS_creat => return Some(libc::O_WRONLY),
        _ => {}
    }
    match nr {
        libc::SYS_openat => arg(2).map(|a| a as i32),
        // open_how.flags, the first u64 of the struct it points to.
        libc::SYS_openat2 => {
            let mut mem = std::fs::File::open(format!("/proc/{tid}/mem")).ok()?;
            use std::io::{Seek, SeekFrom};
            mem.seek(SeekFrom::Start(arg(2)?)).ok()?;
            let mut b = [0u8; 8];
            mem.read_exact(&mut b).ok()?;
            Some(u64::from_ne_bytes(b) as i32)
        }
        _ => None,
    }
}

/// "losetup (pid 12)".
fn who(tid: i32) -> String {
    let comm = std::fs::read_to_string(format!("/proc/{tid}/comm"))
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|_| "a process".into());
    let pid = std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Tgid:"))
                .map(|p| p.trim().to_string())
        })
        .unwrap_or_else(|| tid.to_string());
    format!("{comm} (pid {pid})")
}
