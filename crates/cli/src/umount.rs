//! `oleo umount MOUNTPOINT...`: unmount, then wait until the oleo serving each mount has
//! written its final commit and let go of the image, and exit with its status.
//!
//! `umount` and `fusermount3 -u` return as soon as the kernel lets go of the mount; the
//! server writes its final commit after that. A copy of the image taken right away can miss
//! the last writes. This command waits for the server process to end.
//!
//! How the server's result reaches us, though it is not our child: once mounted, the server
//! makes a memfd named after its FUSE connection (`oleo-serving:MAJOR:MINOR`, the mount's
//! device number, which mountinfo gives for the mount point), and just before it exits it
//! writes its exit code and, on failure, the reason into it ([`announce`], [`record_exit`]).
//! Before unmounting, `oleo umount` finds that memfd among the descriptors of the processes
//! in /proc, opens it through /proc/PID/fd (the open keeps it readable after the process is
//! gone) and takes a pidfd of the process. Then it unmounts, waits on the pidfd until the
//! process has exited (by then its descriptors, the image's among them, are closed), and
//! reads the record. An empty record means the server died before it could write one
//! (killed): a failure. A mount with other mounts of its connection left here (a second
//! mount of the same image is a bind mount of the first) is only unmounted: its server
//! goes on serving the others, as the kernel's filesystem lives until its last mount goes. This needs no root and no shared directory: the same user, or root,
//! may open another process's descriptors.

use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct UmountArgs {
    /// Lazy: detach the mount now, even if files on it are open; the server finishes (and
    /// this command returns) once the last of them is closed.
    #[arg(short = 'l', long)]
    lazy: bool,
    /// Mount points of oleo mounts (or the image a mount serves).
    #[arg(required = true, value_name = "MOUNTPOINT")]
    paths: Vec<PathBuf>,
}

const PREFIX: &str = "oleo-serving:";

/// The serving process's record, made by [`announce`].
static RECORD: OnceLock<File> = OnceLock::new();

/// The memfd's name for the connection `conn` (the mount's device number, as
/// `stop::connection_of` gives it).
fn record_name(conn: u64) -> String {
    format!("{PREFIX}{}:{}", conn >> 20, conn & 0xf_ffff)
}

/// Called by the serving process once mounted: makes the record `oleo umount` finds it by.
/// Best effort: without it `oleo umount` refuses to unmount (it cannot wait).
pub fn announce(conn: Option<u64>) {
    let Some(conn) = conn else { return };
    let Ok(name) = CString::new(record_name(conn)) else {
        return;
    };
    // SAFETY: a NUL-terminated name; the descriptor returned is ours alone.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        log::info!(
            "memfd_create: {} (oleo umount cannot wait for this server)",
            std::io::Error::last_os_error()
        );
        return;
    }
    // SAFETY: just created, owned here.
    let _ = RECORD.set(unsafe { File::from_raw_fd(fd) });
}

/// Called by the serving process just before it exits: its exit code and why it failed.
pub fn record_exit(result: &Result<(), String>) {
    let Some(f) = RECORD.get() else { return };
    let text = match result {
        Ok(()) => "exit 0\n".to_string(),
        Err(e) => format!("exit 1\n{e}\n"),
    };
    let _ = f.write_all_at(text.as_bytes(), 0);
}

/// A mount as mountinfo shows it.
struct MountEntry {
    point: PathBuf,
    /// The mount's device number, as `stop::connection_of` gives it.
    conn: u64,
    fstype: String,
    source: String,
}

fn mounts() -> Vec<MountEntry> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let f: Vec<&str> = left.split(' ').collect();
            let (major, minor) = f.get(2)?.split_once(':')?;
            let conn = (major.parse::<u64>().ok()? << 20) | minor.parse::<u64>().ok()?;
            let mut r = right.split(' ');
            Some(MountEntry {
                point: PathBuf::from(crate::daemon::fuse_mount::unescape(f.get(4)?)),
                conn,
                fstype: r.next()?.to_string(),
                source: crate::daemon::fuse_mount::unescape(r.next()?),
            })
        })
        .collect()
}

/// The mount at `path` (the topmost one there), or the oleo mount serving the image `path`.
/// The mount point itself is not looked at where its parent resolves: on a mount whose
/// server hangs or is gone, that would hang or fail.
fn find_mount(path: &Path) -> Result<MountEntry, String> {
    let mut all = mounts();
    let abs = std::path::absolute(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut candidates = Vec::new();
    if let (Some(parent), Some(name)) = (abs.parent(), abs.file_name()) {
        if let Ok(p) = std::fs::canonicalize(parent) {
            candidates.push(p.join(name));
        }
    }
    candidates.push(abs.clone());
    for want in &candidates {
        if let Some(i) = all.iter().rposition(|m| &m.point == want) {
            return Ok(all.swap_remove(i));
        }
    }
    let canonical = std::fs::canonicalize(&abs).map_err(|e| format!("{}: {e}", path.display()))?;
    if let Some(i) = all.iter().rposition(|m| m.point == canonical) {
        return Ok(all.swap_remove(i));
    }
    // An image: the one oleo mount that serves it.
    let canonical_str = canonical.to_string_lossy();
    let serving: Vec<usize> = (0..all.len())
        .filter(|&i| is_oleo(&all[i]) && all[i].source == canonical_str)
        .collect();
    match serving[..] {
        [i] => Ok(all.swap_remove(i)),
        [] => Err(format!("{}: not mounted", path.display())),
        _ => Err(format!(
            "{}: served by several oleo mounts; name the mount point",
            path.display()
        )),
    }
}

fn is_oleo(m: &MountEntry) -> bool {
    m.fstype == "fuse.oleo"
}

/// The serving process of one mount, found before unmounting.
struct Server {
    pid: i32,
    pidfd: OwnedFd,
    record: File,
}

/// The process holding the record of connection `conn`. Two can hold one name for a moment
/// when a device number is reused while an older server is still finishing: the newest
/// process is then the one serving the mount there now.
fn find_server(conn: u64) -> Option<Server> {
    let want = format!("/memfd:{} (deleted)", record_name(conn));
    let mut found: Vec<(u64, i32, PathBuf)> = Vec::new();
    for p in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path())
                .is_ok_and(|l| l.as_os_str().as_bytes() == want.as_bytes())
            {
                found.push((start_time(pid).unwrap_or(0), pid, fd.path()));
                break;
            }
        }
    }
    found.sort();
    let (_, pid, fd_path) = found.pop()?;
    let record = File::open(&fd_path).ok()?;
    let pidfd = pidfd_open(pid)?;
    // The pid could have been reused between the scan and pidfd_open: the pidfd is of the
    // process that holds the record only if it still does.
    std::fs::read_link(&fd_path)
        .is_ok_and(|l| l.as_os_str().as_bytes() == want.as_bytes())
        .then_some(Server { pid, pidfd, record })
}

/// The process's start time in clock ticks since boot (field 22 of /proc/PID/stat).
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: plain syscall; a descriptor is returned on success, owned here.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Waits until the process behind `pidfd` has exited, saying once that it is waiting when
/// that takes a while.
fn wait_exit(pidfd: &OwnedFd, what: impl Fn() -> String) {
    let start = Instant::now();
    let mut said = false;
    loop {
        let mut p = libc::pollfd {
            fd: pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, 1000) };
        if r > 0 {
            return;
        }
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
        if !said && start.elapsed() > Duration::from_secs(5) {
            eprintln!("oleo: {}", what());
            said = true;
        }
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// umount2 as root, `fusermount3 -u` otherwise. A mount is busy for a moment whenever
/// another process walks a path into it (a stat of /proc/PID/fd/N, as tools that look for
/// open files do): "busy" is tried again for a second before it is believed.
fn unmount(point: &Path, lazy: bool) -> Result<(), String> {
    let mut tries = 0;
    loop {
        match unmount_once(point, lazy) {
            Err((e, true)) if tries < 10 => {
                tries += 1;
                log::debug!("{e}; trying again");
                std::thread::sleep(Duration::from_millis(100));
            }
            r => return r.map_err(|(e, _)| e),
        }
    }
}

/// One unmount; an error says whether the mount was busy.
fn unmount_once(point: &Path, lazy: bool) -> Result<(), (String, bool)> {
    if is_root() {
        let t = CString::new(point.as_os_str().as_bytes()).map_err(|_| {
            (
                format!("{}: a NUL byte in the path", point.display()),
                false,
            )
        })?;
        let flags = if lazy { libc::MNT_DETACH } else { 0 };
        // SAFETY: t is a NUL-terminated path.
        if unsafe { libc::umount2(t.as_ptr(), flags) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EBUSY) => (
                format!(
                    "{}: target is busy (files are open on it; -l detaches it now and waits \
                     until they are closed)",
                    point.display()
                ),
                true,
            ),
            _ => (format!("{}: {e}", point.display()), false),
        });
    }
    let mut c = Command::new("fusermount3");
    c.arg("-u");
    if lazy {
        c.arg("-z");
    }
    let out = c
        .arg("--")
        .arg(point)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| (format!("fusermount3: {e}"), false))?;
    if out.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&out.stderr).trim().to_string();
    let busy = said.contains("busy");
    Err(if said.is_empty() {
        (
            format!("fusermount3 could not unmount {}", point.display()),
            false,
        )
    } else {
        (said, busy)
    })
}

/// One mount point's unmount, up to waiting.
enum Step {
    /// Unmounted; its server is to be waited for.
    Wait(MountEntry, Server),
    /// Done, with this exit code.
    Done(u8),
}

pub fn run(args: &UmountArgs) -> ExitCode {
    // Every server is found before anything is unmounted, and all are unmounted before
    // waiting, so that several mounts finish their final commits together.
    let found: Vec<Result<(MountEntry, Option<Server>), String>> = args
        .paths
        .iter()
        .map(|p| {
            let m = find_mount(p)?;
            if !is_oleo(&m) {
                return Err(format!(
                    "{}: not an oleo mount ({} of {}); use umount",
                    m.point.display(),
                    m.fstype,
                    m.source
                ));
            }
            let server = find_server(m.conn);
            Ok((m, server))
        })
        .collect();
    // A mount bound elsewhere too (`oleo mount` of an image already mounted, see
    // daemon/twice.rs) is one FUSE connection with its other mounts: its server ends only
    // with the last of them. Those that stay mounted after this command are not waited for;
    // of several unmounted here, one waits.
    let leaving: Vec<(PathBuf, u64)> = found
        .iter()
        .flatten()
        .map(|(m, _)| (m.point.clone(), m.conn))
        .collect();
    let all = mounts();
    let mut waiting_for: Vec<u64> = Vec::new();
    let steps: Vec<Step> = found
        .into_iter()
        .map(|f| {
            let (m, server) = match f {
                Ok(x) => x,
                Err(e) => {
                    eprintln!("oleo: {e}");
                    return Step::Done(1);
                }
            };
            let stays = all
                .iter()
                .any(|o| o.conn == m.conn && !leaving.contains(&(o.point.clone(), o.conn)));
            if stays || waiting_for.contains(&m.conn) {
                return match unmount(&m.point, args.lazy) {
                    Ok(()) => Step::Done(0),
                    Err(e) => {
                        eprintln!("oleo: {e}");
                        Step::Done(1)
                    }
                };
            }
            waiting_for.push(m.conn);
            let Some(server) = server else {
                // A mount whose server is gone can only be taken away; the image keeps its
                // last commit. One whose server is alive but out of sight (another user's,
                // or an older oleo) is left alone: we could not wait for it.
                let dead = std::fs::metadata(&m.point).is_err_and(|e| {
                    matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED))
                });
                if dead {
                    let r = unmount(&m.point, args.lazy);
                    eprintln!(
                        "oleo: {}: the oleo that served it is gone; {} (the image keeps its \
                         last commit)",
                        m.point.display(),
                        match r {
                            Ok(()) => "unmounted".to_string(),
                            Err(e) => format!("cannot unmount: {e}"),
                        }
                    );
                } else {
                    eprintln!(
                        "oleo: {}: cannot find the oleo process serving it (run this as its \
                         owner or root); not unmounted",
                        m.point.display()
                    );
                }
                return Step::Done(1);
            };
            match unmount(&m.point, args.lazy) {
                Ok(()) => Step::Wait(m, server),
                Err(e) => {
                    eprintln!("oleo: {e}");
                    Step::Done(1)
                }
            }
        })
        .collect();
    let mut code = 0u8;
    for step in steps {
        let c = match step {
            Step::Done(c) => c,
            Step::Wait(m, mut server) => {
                wait_exit(&server.pidfd, || {
                    format!(
                        "waiting for the oleo serving {} (pid {}) to finish{}",
                        m.point.display(),
                        server.pid,
                        if args.lazy {
                            " (a lazy unmount ends once no file on it is open)"
                        } else {
                            ""
                        }
                    )
                });
                outcome(&m, &mut server)
            }
        };
        if code == 0 {
            code = c;
        }
    }
    ExitCode::from(code)
}

/// What the server's record says, told on stderr when it failed; its exit code.
fn outcome(m: &MountEntry, server: &mut Server) -> u8 {
    let mut text = String::new();
    let _ = server.record.read_to_string(&mut text);
    let mut lines = text.lines();
    let code = lines
        .next()
        .and_then(|l| l.strip_prefix("exit "))
        .and_then(|c| c.parse::<u8>().ok());
    match code {
        Some(0) => 0,
        Some(c) => {
            let why: Vec<&str> = lines.collect();
            eprintln!(
                "oleo: {}: the oleo that served it failed: {}",
                m.point.display(),
                if why.is_empty() {
                    "(no reason given)".to_string()
                } else {
                    why.join("; ")
                }
            );
            c
        }
        None => {
            eprintln!(
                "oleo: {}: the oleo that served it (pid {}) ended without its final word \
                 (killed?); the image may lack the last writes",
                m.point.display(),
                server.pid
            );
            1
        }
    }
}
