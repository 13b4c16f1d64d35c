//! Claiming an image or device: one writer per filesystem, never beside the kernel.
//!
//! A writer takes an exclusive `flock` on the image or device it opened, a reader a shared
//! one: a second writer is refused, and so is a reader beside a writer (it would read a
//! filesystem that changes under it, with no transaction to see it through) and a writer
//! beside readers. The kernel drops the lock with the last descriptor, so a crash leaves
//! nothing to clean up; a daemonized mount inherits the open file and with it the lock.
//!
//! The kernel is kept out with O_EXCL, the block layer's exclusive claim: a block device the
//! kernel has mounted refuses it (EBUSY), and one we hold cannot be mounted. For an image
//! file, the same goes for every loop device that has it as its backing file. Writers hold
//! those claims for as long as the filesystem is open; readers only probe. A loop device
//! attached to the image later is not claimed by anyone: `Claim::check`, called before
//! each commit, finds it, and the writer stops.

use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// What a claim holds on to (released when dropped).
#[derive(Debug)]
pub struct Claim {
    /// O_EXCL descriptors of the block device or the loop devices behind the image.
    _exclusive: Vec<File>,
    /// The locked backing file of a loop device we opened.
    _backing: Option<File>,
    /// A writer's image file: (path, dev, ino, the loop devices over it when claimed).
    watch: Option<(PathBuf, u64, u64, Vec<PathBuf>)>,
    /// `check` failed once (it says why once).
    tripped: std::sync::atomic::AtomicBool,
    /// When sysfs was last read (ms since `born`): a scan costs tens of µs, an fsync's
    /// flush must not pay it every time.
    last_scan: std::sync::atomic::AtomicU64,
    born: std::time::Instant,
}

/// Sysfs is read at most this often (ms); a loop device attached in between is found by
/// the next flush after it.
const SCAN_EVERY_MS: u64 = 100;

impl Claim {
    /// Fails if a loop device has been attached to a writer's image file since it was
    /// claimed: the kernel could mount it, or a program write through it, beside us. A
    /// writer calls it before each commit and stops writing when it fails. A few reads of
    /// sysfs; nothing for block devices and readers.
    /// `every`: read sysfs now (a commit); else at most every `SCAN_EVERY_MS` (a log
    /// sync's flush, which must stay cheap).
    pub fn check(&self, every: bool) -> Result<()> {
        let Some((path, dev, ino, known)) = &self.watch else {
            return Ok(());
        };
        use std::sync::atomic::Ordering::SeqCst;
        if self.tripped.load(SeqCst) {
            return Err(Error::Busy(format!(
                "{}: a loop device was attached while oleo wrote it",
                path.display()
            )));
        }
        let now = self.born.elapsed().as_millis() as u64;
        let last = self.last_scan.load(SeqCst);
        if !every && last != 0 && now.saturating_sub(last) < SCAN_EVERY_MS {
            return Ok(());
        }
        self.last_scan.store(now.max(1), SeqCst);
        let new = loop_devices().into_iter().find(|(loopdev, backing)| {
            !known.contains(loopdev)
                && std::fs::metadata(backing).is_ok_and(|m| m.dev() == *dev && m.ino() == *ino)
        });
        let Some((loopdev, _)) = new else {
            return Ok(());
        };
        let why = format!(
            "{} was attached to {} while oleo writes it: the kernel could mount it beside \
             oleo; writing stops here and the filesystem is read-only (detach it with \
             losetup -d, unmount, and check the image)",
            path.display(),
            loopdev.display()
        );
        if !self.tripped.swap(true, std::sync::atomic::Ordering::SeqCst) {
            log::error!("{why}");
        }
        Err(Error::Busy(why))
    }
}

/// Claims `file` (opened from `path`) for writing or for reading.
pub fn claim(file: &File, path: &Path, writer: bool) -> Result<Claim> {
    let meta = file.metadata()?;
    let mut exclusive = Vec::new();
    let mut backing_lock = None;
    let mut watch = None;
    if meta.file_type().is_block_device() {
        exclusive.push(exclusive_open(path, path, None)?);
        // A loop device's backing file may be open in oleo under its own name.
        if let Some(backing) = loop_backing_file(meta.rdev()) {
            backing_lock = lock_backing(&backing, path, writer)?;
        }
    } else {
        let mut known = Vec::new();
        for (dev, backing) in loop_devices() {
            if same_file(&backing, &meta) {
                exclusive.push(exclusive_open(&dev, path, Some(&dev))?);
                known.push(dev);
            }
        }
        if writer && meta.file_type().is_file() {
            watch = Some((path.to_path_buf(), meta.dev(), meta.ino(), known));
        }
    }
    lock(file, path, writer)?;
    if !writer {
        exclusive.clear();
    }
    Ok(Claim {
        _exclusive: exclusive,
        _backing: backing_lock,
        watch,
        tripped: Default::default(),
        last_scan: Default::default(),
        born: std::time::Instant::now(),
    })
}

fn lock(file: &File, path: &Path, writer: bool) -> Result<()> {
    let op = if writer { libc::LOCK_EX } else { libc::LOCK_SH } | libc::LOCK_NB;
    // A lock released a moment ago may still be held for a moment: a thread of this
    // process forking a child (to exec anything) gives it a copy of every descriptor until
    // the exec closes them, and with them our last open's lock. A real holder holds on.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    let e = loop {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) || std::time::Instant::now() > deadline {
            break e;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
        // Filesystems without flock (some network ones): nothing to enforce with.
        log::warn!("{}: cannot lock: {e}", path.display());
        return Ok(());
    }
    let who = holders(&file.metadata()?);
    Err(Error::Busy(if writer {
        format!(
            "{} is in use by {who}: oleo opens a filesystem for writing only when nothing else has it open",
            path.display()
        )
    } else {
        format!(
            "{} is open for writing by {who}: a read-only open beside a writer would see the \
             filesystem change under it",
            path.display()
        )
    }))
}

/// Locks the backing file of a loop device we open, so that oleo on the image and oleo on
/// the loop device exclude each other too.
fn lock_backing(backing: &Path, path: &Path, writer: bool) -> Result<Option<File>> {
    let Ok(file) = File::open(backing) else {
        return Ok(None);
    };
    lock(&file, backing, writer).map_err(|e| match e {
        Error::Busy(m) => Error::Busy(format!("{} is a loop device over {m}", path.display())),
        e => e,
    })?;
    Ok(Some(file))
}

/// Opens `dev` with O_EXCL; EBUSY becomes a message naming who has it.
fn exclusive_open(dev: &Path, target: &Path, through: Option<&Path>) -> Result<File> {
    let open = || {
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL)
            .open(dev)
    };
    // As with `lock`: our own claim, just dropped, may live on a moment in a forked child.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    let mut r = open();
    while matches!(&r, Err(e) if e.raw_os_error() == Some(libc::EBUSY))
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(10));
        r = open();
    }
    match r {
        Ok(f) => Ok(f),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            let via = through.map_or(String::new(), |d| format!(" (through {})", d.display()));
            Err(Error::Busy(match mount_point_of(dev) {
                Some(at) => format!(
                    "{} is mounted by the kernel at {}{via}: unmount it first",
                    target.display(),
                    at.display()
                ),
                None => {
                    let who = std::fs::metadata(dev)
                        .map(|m| holders(&m))
                        .unwrap_or_else(|_| "another program".into());
                    format!(
                        "{}{via} is claimed exclusively by {who} (a mount, RAID or swap, or \
                         another oleo)",
                        target.display()
                    )
                }
            }))
        }
        Err(e) => Err(Error::Io(std::io::Error::new(
            e.kind(),
            format!("{}: {e}", dev.display()),
        ))),
    }
}

/// Loop devices and their backing files, from sysfs.
fn loop_devices() -> Vec<(PathBuf, PathBuf)> {
    let Ok(dir) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let name = e.ok()?.file_name().into_string().ok()?;
        let backing = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
            .ok()?
            .trim_end_matches('\n')
            .to_string();
        Some((Path::new("/dev").join(name), PathBuf::from(backing)))
    })
    .collect()
}

fn loop_backing_file(rdev: u64) -> Option<PathBuf> {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let text = std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/loop/backing_file"))
        .ok()?;
    Some(PathBuf::from(text.trim_end_matches('\n')))
}

fn same_file(path: &Path, meta: &std::fs::Metadata) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.dev() == meta.dev() && m.ino() == meta.ino())
}

/// Where the kernel has mounted block device `dev`, from this process' mountinfo.
fn mount_point_of(dev: &Path) -> Option<PathBuf> {
    let rdev = std::fs::metadata(dev).ok()?.rdev();
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let point = unescape(left.split(' ').nth(4)?);
        let source = unescape(right.split(' ').nth(1)?);
        let m = std::fs::metadata(&source).ok()?;
        (m.file_type().is_block_device() && m.rdev() == rdev).then(|| PathBuf::from(point))
    })
}

fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// The processes with the file or device open: "oleo (pid 12,
/// `oleo mount d.img m`)", or "another program" when /proc does not tell.
fn holders(meta: &std::fs::Metadata) -> String {
    let is_dev = meta.file_type().is_block_device();
    let matches = |m: &std::fs::Metadata| {
        if is_dev {
            m.file_type().is_block_device() && m.rdev() == meta.rdev()
        } else {
            m.dev() == meta.dev() && m.ino() == meta.ino()
        }
    };
    let me = std::process::id();
    let mut found = Vec::new();
    let mut self_holds = false;
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return "another program".into();
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        let mut open_here = fds
            .flatten()
            .filter(|fd| std::fs::metadata(fd.path()).is_ok_and(|m| matches(&m)));
        if pid == me {
            // One descriptor is the open being refused; more mean this process holds it.
            self_holds = open_here.nth(1).is_some();
        } else if open_here.next().is_some() {
            found.push(describe(pid));
            if found.len() == 3 {
                break;
            }
        }
    }
    if found.is_empty() && self_holds {
        found.push(format!("this process (pid {me})"));
    }
    if found.is_empty() {
        "another program".into()
    } else {
        found.join(", ")
    }
}

fn describe(pid: u32) -> String {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let args: Vec<String> = cmdline
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|_| "a process".into());
    if args.is_empty() {
        format!("{comm} (pid {pid})")
    } else {
        format!("{comm} (pid {pid}, `{}`)", args.join(" "))
    }
}
