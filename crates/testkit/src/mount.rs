//! Mounting images: with the kernel's btrfs driver over a loop device, and with oleo over FUSE.
//!
//! Both mount types unmount on drop and are built never to hang a test run: every external
//! command on a cleanup path has a timeout, and a FUSE mount whose daemon is stuck is aborted
//! through fusectl before a lazy unmount.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::cmd::{command, describe, run, run_stdout, run_with_timeout};

/// One line of /proc/self/mountinfo (the fields we use).
#[derive(Debug, Clone)]
pub struct MountInfo {
    /// `major:minor` of the mounted filesystem's st_dev (of its superblock).
    pub dev: (u32, u32),
    /// The subtree of the filesystem that is mounted (e.g. `/sv1` for `subvol=sv1`).
    pub root: PathBuf,
    pub mountpoint: PathBuf,
    pub fstype: String,
    pub source: String,
    pub super_options: String,
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(OsStr::from_bytes(&out))
}

/// All mounts visible to this process.
pub fn mountinfo() -> Vec<MountInfo> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| {
            let (pre, post) = line.split_once(" - ")?;
            let f: Vec<&str> = pre.split(' ').collect();
            let g: Vec<&str> = post.split(' ').collect();
            let (ma, mi) = f.get(2)?.split_once(':')?;
            Some(MountInfo {
                dev: (ma.parse().ok()?, mi.parse().ok()?),
                root: unescape_mountinfo(f.get(3)?),
                mountpoint: unescape_mountinfo(f.get(4)?),
                fstype: g.first()?.to_string(),
                source: g.get(1).map(|s| s.to_string()).unwrap_or_default(),
                super_options: g.get(2).map(|s| s.to_string()).unwrap_or_default(),
            })
        })
        .collect()
}

/// The topmost mount at exactly `path`, if any.
pub fn mount_at(path: &Path) -> Option<MountInfo> {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    mountinfo().into_iter().rev().find(|m| m.mountpoint == path)
}

/// Mount points strictly below (or at) `dir`.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mut v: Vec<PathBuf> = mountinfo()
        .into_iter()
        .map(|m| m.mountpoint)
        .filter(|m| m.starts_with(&dir))
        .collect();
    v.dedup();
    v
}

/// A loop device attached to an image file; detached on drop.
pub struct LoopDevice {
    dev: PathBuf,
}

impl LoopDevice {
    /// `losetup -f --show [-r] IMAGE`, retried because parallel tests race for free devices.
    pub fn attach(image: &Path, read_only: bool) -> io::Result<LoopDevice> {
        let mut last = None;
        for attempt in 0..8 {
            let mut c = Command::new("losetup");
            c.args(["-f", "--show"]);
            if read_only {
                c.arg("-r");
            }
            c.arg(image);
            match run_stdout(&mut c) {
                Ok(out) => {
                    return Ok(LoopDevice {
                        dev: PathBuf::from(out.trim()),
                    });
                }
                Err(e) => last = Some(e),
            }
            std::thread::sleep(Duration::from_millis(50 << attempt.min(4)));
        }
        Err(last.unwrap())
    }

    pub fn path(&self) -> &Path {
        &self.dev
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        // Let the btrfs driver drop its memory of this device path, so a later image on the
        // same /dev/loopN (or another image with the same fsid) is not confused with it.
        let _ = run_with_timeout(
            &mut command(
                "btrfs",
                &[
                    OsStr::new("device"),
                    OsStr::new("scan"),
                    OsStr::new("--forget"),
                    self.dev.as_os_str(),
                ],
            ),
            Duration::from_secs(10),
        );
        for attempt in 0..10 {
            match run_with_timeout(
                &mut command("losetup", &[OsStr::new("-d"), self.dev.as_os_str()]),
                Duration::from_secs(10),
            ) {
                Ok(st) if st.success() => return,
                _ => std::thread::sleep(Duration::from_millis(50 * (attempt + 1))),
            }
        }
        eprintln!("oleo-testkit: could not detach {}", self.dev.display());
    }
}

fn join_opts(opts: &[&str]) -> String {
    opts.iter()
        .filter(|o| !o.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(",")
}

/// Unmounts `mp`, retrying (a just-closed file can keep it busy for a moment), then lazily.
fn unmount_kernel(mp: &Path) -> io::Result<()> {
    let mut last_err = String::new();
    for attempt in 0..10 {
        if mount_at(mp).is_none() {
            return Ok(());
        }
        match run_with_timeout(
            &mut command("umount", &[mp.as_os_str()]),
            Duration::from_secs(60),
        ) {
            Ok(st) if st.success() => return Ok(()),
            Ok(st) => last_err = format!("umount exited with {st}"),
            Err(e) => last_err = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(100 * (attempt + 1)));
    }
    let _ = run_with_timeout(
        &mut command("umount", &[OsStr::new("-l"), mp.as_os_str()]),
        Duration::from_secs(10),
    );
    Err(io::Error::other(format!(
        "cannot unmount {}: {last_err} (detached lazily)",
        mp.display()
    )))
}

/// A kernel btrfs mount of an image through a loop device. Unmounts and detaches on drop.
pub struct KernelMount {
    mountpoint: PathBuf,
    // Declared after mountpoint handling in Drop: the loop device must outlive the mount.
    loopdev: Option<LoopDevice>,
    mounted: bool,
}

impl KernelMount {
    /// The options the comparison tests use: read-only, and atimes never updated, so that
    /// the kernel's view is stable and matches a read-only oleo mount.
    pub const DEFAULT_OPTS: &'static [&'static str] = &["ro", "noatime"];

    /// Mounts `image` at `mountpoint` (created if missing) with exactly `opts`
    /// (`DEFAULT_OPTS` if empty). With `ro` the loop device is attached read-only too, so the
    /// kernel cannot change the image (for example by replaying a log tree).
    pub fn mount(image: &Path, mountpoint: &Path, opts: &[&str]) -> io::Result<KernelMount> {
        let opts = if opts.is_empty() {
            Self::DEFAULT_OPTS
        } else {
            opts
        };
        let read_only = opts.iter().any(|o| o.split(',').any(|x| x == "ro"));
        std::fs::create_dir_all(mountpoint)?;
        let loopdev = LoopDevice::attach(image, read_only)?;
        let mut c = Command::new("mount");
        c.args(["-t", "btrfs", "-o", &join_opts(opts)])
            .arg(loopdev.path())
            .arg(mountpoint);
        run(&mut c)?;
        Ok(KernelMount {
            mountpoint: mountpoint.to_path_buf(),
            loopdev: Some(loopdev),
            mounted: true,
        })
    }

    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// The loop device, e.g. `/dev/loop3`.
    pub fn device(&self) -> &Path {
        self.loopdev.as_ref().expect("attached").path()
    }

    /// `mount -o remount,OPTS`, e.g. to switch `compress=` between populate steps.
    pub fn remount(&self, opts: &[&str]) -> io::Result<()> {
        let o = format!("remount,{}", join_opts(opts));
        run(Command::new("mount").args(["-o", &o]).arg(&self.mountpoint)).map(|_| ())
    }

    /// Commits the running transaction (syncfs on the mount).
    pub fn sync(&self) -> io::Result<()> {
        syncfs(&self.mountpoint)
    }

    /// Unmounts now, reporting failure (drop does the same but can only print).
    pub fn unmount(mut self) -> io::Result<()> {
        self.mounted = false;
        let r = unmount_kernel(&self.mountpoint);
        self.loopdev.take();
        r
    }
}

impl Drop for KernelMount {
    fn drop(&mut self) {
        if self.mounted {
            if let Err(e) = unmount_kernel(&self.mountpoint) {
                eprintln!("oleo-testkit: {e}");
            }
        }
        self.loopdev.take();
    }
}

/// `syncfs(2)` on the filesystem containing `path`: for btrfs, a full transaction commit.
pub fn syncfs(path: &Path) -> io::Result<()> {
    let f = File::open(path)?;
    use std::os::fd::AsRawFd;
    // SAFETY: valid open fd.
    if unsafe { libc::syncfs(f.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `btrfs filesystem sync` (the BTRFS_IOC_SYNC ioctl) on the filesystem holding `path`:
/// a transaction commit, on the kernel's btrfs and on an oleo mount alike (syncfs(2)
/// reaches no FUSE server, and an fsync goes to the log tree).
pub fn btrfs_sync(path: &Path) -> io::Result<()> {
    let f = File::open(path)?;
    use std::os::fd::AsRawFd;
    const BTRFS_IOC_SYNC: libc::c_ulong = 0x9408;
    // SAFETY: valid open fd; the command takes no argument.
    if unsafe { libc::ioctl(f.as_raw_fd(), BTRFS_IOC_SYNC as _, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The btrfs subvolume id (tree id) of the subvolume containing `path`, on a kernel mount.
pub fn subvolume_id(path: &Path) -> io::Result<u64> {
    let out = run_stdout(
        Command::new("btrfs")
            .args(["inspect-internal", "rootid"])
            .arg(path),
    )?;
    out.trim()
        .parse()
        .map_err(|_| io::Error::other(format!("btrfs inspect-internal rootid: bad output {out:?}")))
}

/// How long [`OleoMount::mount`] waits for the mount to appear (`OLEO_MOUNT_TIMEOUT_SECS`).
fn mount_timeout() -> Duration {
    let secs = std::env::var("OLEO_MOUNT_TIMEOUT_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    Duration::from_secs(secs)
}

/// An oleo FUSE mount. Unmounts on drop (`fusermount3 -u`, then abort + `umount -l`).
pub struct OleoMount {
    mountpoint: PathBuf,
    child: Option<Child>,
    log: PathBuf,
    /// The fusectl connection id, for aborting a stuck daemon.
    conn: Option<u64>,
    mounted: bool,
}

impl OleoMount {
    /// Runs `oleo mount -o ro[,opts] IMAGE MOUNTPOINT` and waits (up to ~10 s) until the FUSE
    /// mount shows up in /proc/self/mountinfo. oleo daemonizes by default; a foreground oleo
    /// also works (its process is kept and reaped on drop). Its stdout/stderr go to a log
    /// file whose text is included in the error if the mount fails.
    pub fn mount(
        oleo_bin: &Path,
        image: &Path,
        mountpoint: &Path,
        opts: &[&str],
    ) -> io::Result<OleoMount> {
        Self::mount_with_timeout(oleo_bin, image, mountpoint, opts, mount_timeout())
    }

    /// A read-write mount, served by a foreground oleo that this handle keeps: unmounting
    /// waits until it has exited, i.e. until its final commit is on disk (a daemonized oleo
    /// commits after umount(2) has already returned).
    pub fn mount_rw(
        oleo_bin: &Path,
        image: &Path,
        mountpoint: &Path,
        opts: &[&str],
    ) -> io::Result<OleoMount> {
        let mut all = vec!["rw"];
        all.extend(opts.iter().copied().filter(|o| *o != "rw" && *o != "ro"));
        Self::spawn_mount(oleo_bin, image, mountpoint, &all, true, mount_timeout())
    }

    /// [`OleoMount::mount`] with an explicit wait limit.
    pub fn mount_with_timeout(
        oleo_bin: &Path,
        image: &Path,
        mountpoint: &Path,
        opts: &[&str],
        timeout: Duration,
    ) -> io::Result<OleoMount> {
        let mut all = vec!["ro"];
        all.extend(opts.iter().copied().filter(|o| *o != "ro"));
        Self::spawn_mount(oleo_bin, image, mountpoint, &all, false, timeout)
    }

    fn spawn_mount(
        oleo_bin: &Path,
        image: &Path,
        mountpoint: &Path,
        all: &[&str],
        foreground: bool,
        timeout: Duration,
    ) -> io::Result<OleoMount> {
        static N: AtomicU64 = AtomicU64::new(0);
        std::fs::create_dir_all(mountpoint)?;
        let log = std::env::temp_dir().join(format!(
            "oleo-mount-{}-{}.log",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let logf = File::create(&log)?;
        let mut cmd = Command::new(oleo_bin);
        cmd.arg("mount");
        if foreground {
            cmd.arg("-f");
        }
        cmd.arg("-o").arg(join_opts(all)).arg(image).arg(mountpoint);
        cmd.stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf);
        if std::env::var_os("RUST_BACKTRACE").is_none() {
            cmd.env("RUST_BACKTRACE", "1");
        }
        let described = describe(&cmd);
        let child = cmd
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("{described}: {e}")))?;
        let mut m = OleoMount {
            mountpoint: mountpoint.to_path_buf(),
            child: Some(child),
            log,
            conn: None,
            mounted: false,
        };

        let deadline = Instant::now() + timeout;
        let mut launcher_done = false;
        let mut probe: Option<mpsc::Receiver<io::Result<()>>> = None;
        loop {
            if !m.mounted {
                if let Some(info) = mount_at(mountpoint).filter(|i| i.fstype.starts_with("fuse")) {
                    // From here on, drop unmounts (and aborts if it must).
                    m.mounted = true;
                    m.conn = Some(((info.dev.0 as u64) << 20) | info.dev.1 as u64);
                }
            }
            let exited = match m.child.as_mut() {
                Some(c) => c.try_wait()?,
                None => None,
            };
            if let Some(st) = exited {
                m.child = None;
                if !st.success() {
                    return Err(io::Error::other(format!(
                        "{described} failed ({st}); its output:\n{}",
                        m.log_text()
                    )));
                }
                // A daemonizing oleo exits once its mount is ready.
                launcher_done = true;
            }
            if m.mounted {
                if launcher_done {
                    return Ok(m);
                }
                // Still running: a foreground oleo, or a daemon that is not done yet. Being in
                // mountinfo is not enough (the server may not answer yet, or ever): ready
                // once a stat of the root is answered. The probe runs in a thread because
                // it blocks until the server replies.
                let rx = probe.get_or_insert_with(|| {
                    let (tx, rx) = mpsc::channel();
                    let mp = mountpoint.to_path_buf();
                    std::thread::spawn(move || {
                        let _ = tx.send(std::fs::metadata(&mp).map(|_| ()));
                    });
                    rx
                });
                match rx.try_recv() {
                    Ok(Ok(())) => return Ok(m),
                    Ok(Err(e)) => {
                        return Err(io::Error::other(format!(
                            "{described}: stat of the mounted root failed: {e}; its output:\n{}",
                            m.log_text()
                        )))
                    }
                    Err(_) => {}
                }
            }
            if Instant::now() >= deadline {
                let what = if m.mounted {
                    "mounted, but the root was not answered"
                } else {
                    "no FUSE mount"
                };
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{described}: {what} at {} after {:?}; its output:\n{}",
                        mountpoint.display(),
                        timeout,
                        m.log_text()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// The thread names of the serving process (a foreground mount's; empty otherwise).
    pub fn server_threads(&self) -> Vec<String> {
        let Some(pid) = self.child.as_ref().map(|c| c.id()) else {
            return Vec::new();
        };
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return Vec::new();
        };
        tasks
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
            .map(|c| c.trim().to_string())
            .collect()
    }

    /// What oleo printed so far (stdout and stderr).
    pub fn log_text(&self) -> String {
        std::fs::read(&self.log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Aborts the FUSE connection: every pending and future request fails with ENOTCONN.
    /// The way out when the daemon hangs.
    pub fn abort(&self) {
        if let Some(c) = self.conn {
            abort_fuse_connection(c);
        }
    }

    /// Aborts the connection if the returned guard is not dropped within `limit`, so that a
    /// hung oleo turns into a failing test instead of a CI run that never ends.
    pub fn watchdog(&self, limit: Duration) -> Watchdog {
        let (tx, rx) = mpsc::channel::<()>();
        let conn = self.conn;
        let mp = self.mountpoint.clone();
        let handle = std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
                eprintln!("oleo-testkit: watchdog: {} did not finish within {limit:?}; aborting the FUSE connection", mp.display());
                if let Some(c) = conn {
                    abort_fuse_connection(c);
                }
            }
        });
        Watchdog {
            tx: Some(tx),
            handle: Some(handle),
        }
    }

    /// Unmounts now, reporting failure.
    pub fn unmount(mut self) -> io::Result<()> {
        self.do_unmount()
    }

    fn do_unmount(&mut self) -> io::Result<()> {
        let was_mounted = std::mem::take(&mut self.mounted);
        let mut result = Ok(());
        if was_mounted {
            let mp = self.mountpoint.as_os_str();
            // EBUSY right after a mount is transient (the kernel or the server still holds
            // a reference for a moment, seen without any file open): a few tries.
            let mut tries = 0;
            let run = loop {
                let run = run_with_timeout(
                    &mut command("fusermount3", &[OsStr::new("-u"), mp]),
                    Duration::from_secs(15),
                );
                tries += 1;
                let busy =
                    matches!(&run, Ok(st) if !st.success()) && mount_at(&self.mountpoint).is_some();
                if !busy || tries == 5 {
                    break run;
                }
                std::thread::sleep(Duration::from_millis(200));
            };
            let ok = matches!(&run, Ok(st) if st.success());
            let still = mount_at(&self.mountpoint);
            if !ok || still.is_some() {
                // Why, before the evidence goes: what fusermount3 said, what is mounted
                // there now, what the server logged.
                let why = format!(
                    "fusermount3 -u: {run:?}; mounted there after: {:?}; server log:\n{}",
                    still.map(|i| i.fstype),
                    self.log_text()
                );
                self.abort();
                let _ = run_with_timeout(
                    &mut command("umount", &[OsStr::new("-l"), mp]),
                    Duration::from_secs(10),
                );
                result = Err(io::Error::other(format!(
                    "fusermount3 -u {} failed; aborted the connection and detached lazily ({why})",
                    self.mountpoint.display()
                )));
            }
        }
        // A foreground oleo exits once unmounted (after its final commit when writable): give
        // it time, then make sure. One that never mounted is killed at once.
        if let Some(mut child) = self.child.take() {
            let until = Instant::now()
                + if was_mounted {
                    Duration::from_secs(60)
                } else {
                    Duration::ZERO
                };
            while Instant::now() < until {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        result
    }
}

impl Drop for OleoMount {
    fn drop(&mut self) {
        if let Err(e) = self.do_unmount() {
            eprintln!("oleo-testkit: {e}");
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Guard returned by [`OleoMount::watchdog`]; dropping it disarms the watchdog.
pub struct Watchdog {
    tx: Option<mpsc::Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Writes to /sys/fs/fuse/connections/ID/abort, mounting fusectl first if needed.
fn abort_fuse_connection(id: u64) {
    let dir = Path::new("/sys/fs/fuse/connections");
    if !dir.join(id.to_string()).exists() {
        let _ = run_with_timeout(
            Command::new("mount")
                .args(["-t", "fusectl", "fusectl"])
                .arg(dir),
            Duration::from_secs(5),
        );
    }
    if let Err(e) = std::fs::write(dir.join(id.to_string()).join("abort"), b"1") {
        eprintln!("oleo-testkit: cannot abort FUSE connection {id}: {e}");
    }
}

/// Whether something is mounted at `mp`.
pub fn is_mounted(mp: &Path) -> bool {
    mount_at(mp).is_some()
}

/// Makes a `size_mb` MiB filesystem with the oleo binary `oleo` (`oleo mkfs -q`).
pub fn oleo_mkfs(oleo: &str, image: &Path, size_mb: u64) {
    let out = std::process::Command::new(oleo)
        .args(["mkfs", "-q", "--size", &format!("{size_mb}M")])
        .arg(image)
        .output()
        .unwrap();
    assert!(out.status.success(), "oleo mkfs: {out:?}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(
            unescape_mountinfo(r"/tmp/a\040b\134c"),
            PathBuf::from("/tmp/a b\\c")
        );
        assert_eq!(unescape_mountinfo(r"/x\04"), PathBuf::from(r"/x\04"));
    }

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn failed_oleo_mount_reports_its_output() {
        let t = crate::TempDir::new("mount-unit").unwrap();
        let bin = script(
            t.path(),
            "fails",
            "echo \"args: $*\"; echo boom >&2; exit 3",
        );
        let err = OleoMount::mount(&bin, Path::new("/img"), &t.join("mp"), &["subvol=x"])
            .err()
            .expect("must fail");
        let msg = err.to_string();
        assert!(
            msg.contains("boom") && msg.contains("args: mount -o ro,subvol=x /img"),
            "{msg}"
        );
    }

    #[test]
    fn oleo_mount_that_never_appears_times_out() {
        let t = crate::TempDir::new("mount-unit").unwrap();
        // Exits successfully without mounting, like a daemonizing parent whose child died.
        let bin = script(t.path(), "nomount", "exit 0");
        let start = Instant::now();
        let err = OleoMount::mount_with_timeout(
            &bin,
            Path::new("/img"),
            &t.join("mp"),
            &[],
            Duration::from_millis(300),
        )
        .err()
        .expect("must time out");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(start.elapsed() < Duration::from_secs(5));
        // A foreground process that hangs is killed, not waited for.
        let bin = script(t.path(), "hangs", "exec sleep 1000");
        let start = Instant::now();
        let err = OleoMount::mount_with_timeout(
            &bin,
            Path::new("/img"),
            &t.join("mp"),
            &[],
            Duration::from_millis(300),
        )
        .err()
        .expect("must time out");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(start.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn mountinfo_parses_this_process() {
        // Every Linux process has a root mount.
        assert!(mountinfo().iter().any(|m| m.mountpoint == Path::new("/")));
    }
}
