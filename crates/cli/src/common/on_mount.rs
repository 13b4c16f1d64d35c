//! The subvolume commands on a mounted oleo filesystem: fixed-size ioctls on a file of the
//! mount (`oleo_fuse::subvol_ioctl`), which the daemon serves.

use oleo_fuse::subvol_ioctl as cmd;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

fn open(path: &Path) -> Result<File, String> {
    File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))
}

/// One ioctl with `buf` as its argument (in and out).
pub fn raw_ioctl(f: &File, c: u32, buf: &mut [u8]) -> std::io::Result<()> {
    // SAFETY: `buf` is as long as the size encoded in `c`, and lives across the call.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), c as libc::Ioctl, buf.as_mut_ptr()) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `raw_ioctl`, its error said in a user's terms.
fn ioctl(f: &File, path: &Path, c: u32, buf: &mut [u8]) -> Result<(), String> {
    let Err(e) = raw_ioctl(f, c, buf) else {
        return Ok(());
    };
    Err(match e.raw_os_error() {
        Some(libc::ENOTTY) | Some(libc::EINVAL) if c == cmd::SUBVOL_OF => format!(
            "{} is not on a mounted oleo filesystem (an image needs --image)",
            path.display()
        ),
        _ => format!("{}: {e}", path.display()),
    })
}

/// Which subvolume `path` is in.
pub fn subvol_of(path: &Path) -> Result<cmd::SubvolOf, String> {
    let f = open(path)?;
    let mut b = vec![0u8; cmd::SUBVOL_OF_SIZE];
    ioctl(&f, path, cmd::SUBVOL_OF, &mut b)?;
    Ok(cmd::SubvolOf::parse(&b))
}

/// The subvolume whose root directory `path` is; an error if it is not one.
pub fn subvolume_root(path: &Path) -> Result<cmd::SubvolOf, String> {
    let s = subvol_of(path)?;
    if s.ino != oleo::format::key::objectid::FIRST_FREE {
        return Err(format!("Not a Btrfs subvolume: {}", path.display()));
    }
    Ok(s)
}

/// Creates subvolume `name` in directory `dir`.
pub fn create(dir: &Path, name: &str) -> Result<(), String> {
    subvol_of(dir)?;
    let mut b = cmd::create_arg(name.as_bytes()).ok_or_else(|| format!("bad name: {name}"))?;
    ioctl(&open(dir)?, dir, cmd::CREATE, &mut b)
}

/// Deletes the subvolume `name` in directory `dir`.
pub fn delete(dir: &Path, name: &str) -> Result<(), String> {
    subvol_of(dir)?;
    let mut b = cmd::create_arg(name.as_bytes()).ok_or_else(|| format!("bad name: {name}"))?;
    ioctl(&open(dir)?, dir, cmd::DELETE, &mut b).map_err(|e| {
        // The daemon's reason travels as an errno only: say what each one means here.
        if e.ends_with("(os error 16)") {
            format!("cannot delete {name}: it is the default subvolume or the mounted one")
        } else if e.ends_with("(os error 39)") {
            format!("cannot delete {name}: it holds other subvolumes")
        } else if e.ends_with("(os error 1)") {
            format!("cannot delete {name}: not permitted (is it being sent?)")
        } else {
            e
        }
    })
}

/// Snapshots the subvolume whose root is `source` as `name` in directory `dir`. What the
/// kernel still holds of the source in its page cache goes to the daemon first
/// (`push_page_cache`).
pub fn snapshot(source: &Path, dir: &Path, name: &str, readonly: bool) -> Result<(), String> {
    let src = subvolume_root(source)?;
    subvol_of(dir)?;
    push_page_cache(source)?;
    let mut b = cmd::SnapshotArgs {
        source: src.id,
        flags: if readonly { cmd::RO } else { 0 },
        name: name.as_bytes().to_vec(),
    }
    .to_bytes()
    .ok_or_else(|| format!("bad name: {name}"))?;
    ioctl(&open(dir)?, dir, cmd::SNAPSHOT, &mut b)
}

/// Makes the daemon hold what the kernel's page cache still holds for files under `dir`.
/// syncfs(2) does not do it on FUSE (the kernel neither waits for the writes it starts nor
/// tells the server), but a close(2) of a descriptor of the file does: with the writeback
/// cache the kernel writes every page dirty at that moment back and waits for the
/// server's answers before close returns (fuse_flush). A FUSE file is written back when
/// it is closed, so only open files can hold dirty pages: those found in /proc under `dir`
/// are opened and closed again.
fn push_page_cache(dir: &Path) -> Result<(), String> {
    let root = std::fs::canonicalize(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut seen = std::collections::BTreeSet::new();
    let procs = std::fs::read_dir("/proc").map_err(|e| format!("/proc: {e}"))?;
    for p in procs.flatten() {
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue; // gone, or not ours to look at
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                if target.starts_with(&root) && target != root {
                    seen.insert(target);
                }
            }
        }
    }
    // Each file's writeback waits on the daemon: all at once, so it has them all to work on.
    std::thread::scope(|scope| {
        let pushes: Vec<_> = seen
            .iter()
            .map(|path| scope.spawn(move || push_file(path)))
            .collect();
        pushes.into_iter().try_for_each(|p| {
            p.join()
                .unwrap_or_else(|_| Err("fsync thread panicked".into()))
        })
    })
}

/// Opens and closes `path` if it is still a regular file: its close writes its dirty
/// pages back to the daemon and waits for them. Not fsync(2): that writes them back too,
/// but then makes them durable apart (a log tree and a flush of the device) when the
/// snapshot's commit will, and a writer going on meanwhile leaves the close that follows
/// the same again to write: four random writers' snapshot (bench snapshot-under-write)
/// spent 0.26-0.47 s in the fsyncs and as long again in the closes after them.
fn push_file(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    // Only regular files hold pages (and an open of a FIFO would wait for its other end).
    // A file deleted since, or no longer a file: nothing of it goes into a snapshot.
    if !std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file()) {
        return Ok(());
    }
    // Opened for writing where we may: an open for reading can make the server tell the
    // kernel to drop the file's pages (under relatime, so that the next read reaches it
    // and moves the atime), and the kernel then writes each dirty page back on its own,
    // one round trip per page, while the writer goes on dirtying more: seconds for a file
    // being written (snapshot-under-write's sequential writer: 8 s, 0.06 s this way).
    let open = |write: bool| {
        std::fs::OpenOptions::new()
            .read(!write)
            .write(write)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
            .open(path)
    };
    let Ok(f) = open(true).or_else(|_| open(false)) else {
        return Ok(());
    };
    if !f.metadata().is_ok_and(|m| m.is_file()) {
        return Ok(());
    }
    let fd = std::os::fd::IntoRawFd::into_raw_fd(f);
    // SAFETY: `fd` is ours alone (taken from the File above) and closed once.
    if unsafe { libc::close(fd) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!(
            "{}: writing back its cached pages: {e}",
            path.display()
        ));
    }
    Ok(())
}

/// Sets the read-only flag of the subvolume whose root is `path`.
pub fn set_readonly(path: &Path, readonly: bool, force: bool) -> Result<(), String> {
    subvolume_root(path)?;
    let flags = (u64::from(readonly) * cmd::RO) | (u64::from(force) * cmd::FORCE);
    ioctl(&open(path)?, path, cmd::SET_FLAGS, &mut flags.to_le_bytes()).map_err(|e| {
        if e.ends_with("(os error 1)") && !readonly {
            format!("{}: not permitted (is it being sent?)", path.display())
        } else {
            e
        }
    })
}

/// Makes subvolume `id` the default of the filesystem `path` is on.
pub fn set_default(path: &Path, id: u64) -> Result<(), String> {
    subvol_of(path)?;
    ioctl(&open(path)?, path, cmd::SET_DEFAULT, &mut id.to_le_bytes())
}

/// The default subvolume of the filesystem `path` is on.
pub fn get_default(path: &Path) -> Result<u64, String> {
    subvol_of(path)?;
    let mut b = [0u8; 8];
    ioctl(&open(path)?, path, cmd::GET_DEFAULT, &mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// Every subvolume of the filesystem `path` is on, by id.
pub fn list(path: &Path) -> Result<Vec<cmd::SubvolInfo>, String> {
    subvol_of(path)?;
    let f = open(path)?;
    let mut out = Vec::new();
    let mut next = 0u64;
    loop {
        let mut b = vec![0u8; cmd::INFO_SIZE];
        b[..8].copy_from_slice(&next.to_le_bytes());
        match raw_ioctl(&f, cmd::NEXT_SUBVOL, &mut b) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        }
        let s = cmd::SubvolInfo::parse(&b);
        next = s.id + 1;
        out.push(s);
    }
}

/// The extents of file `path` on a mount: its size, the sector size and every extent.
/// Cached writes go to the daemon first (an fsync, as filefrag's FIEMAP_FLAG_SYNC).
pub fn extents(path: &Path) -> Result<(u64, u32, Vec<cmd::Extent>), String> {
    let f = open(path)?;
    f.sync_all()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut all = Vec::new();
    let mut from = 0u64;
    loop {
        let mut b = vec![0u8; cmd::EXTENTS_SIZE];
        b[..8].copy_from_slice(&from.to_le_bytes());
        ioctl(&f, path, cmd::EXTENTS, &mut b)?;
        let page = cmd::ExtentsPage::parse(&b);
        let last_end = page.extents.last().map(|e| e.file_offset + e.len);
        all.extend(page.extents);
        match last_end {
            Some(end) if page.more && end > from => from = end,
            _ => return Ok((page.size, page.sectorsize, all)),
        }
    }
}

/// The devices, chunks and superblock numbers of the mounted filesystem `path` is on, read
/// in pages; started over when the report changes between two pages.
pub fn fs_usage(path: &Path) -> Result<cmd::FsUsage, String> {
    subvol_of(path)?;
    let f = open(path)?;
    'again: for _ in 0..10 {
        let mut report = Vec::new();
        let mut stamp = None;
        loop {
            let mut b = vec![0u8; cmd::FS_USAGE_SIZE];
            b[..8].copy_from_slice(&(report.len() as u64).to_le_bytes());
            ioctl(&f, path, cmd::FS_USAGE, &mut b)?;
            let page = cmd::FsUsagePage::parse(&b);
            if stamp.is_some_and(|s| s != page.stamp) {
                continue 'again;
            }
            stamp = Some(page.stamp);
            if page.data.is_empty() && (report.len() as u64) < page.total {
                return Err(format!("{}: short filesystem report", path.display()));
            }
            report.extend(page.data);
            if report.len() as u64 >= page.total {
                return cmd::FsUsage::decode(&report)
                    .ok_or_else(|| format!("{}: bad filesystem report", path.display()));
            }
        }
    }
    Err(format!(
        "{}: the filesystem kept changing while it was read",
        path.display()
    ))
}

/// Starts a scrub in the mount's server (`oleo scrub start PATH`).
pub fn scrub_start(path: &Path, readonly: bool, limit: u64) -> Result<(), String> {
    subvol_of(path)?;
    let f = open(path)?;
    let flags = if readonly { cmd::SCRUB_READONLY } else { 0 };
    let mut buf = [0u8; 16];
    buf[..8].copy_from_slice(&flags.to_le_bytes());
    buf[8..].copy_from_slice(&limit.to_le_bytes());
    raw_ioctl(&f, cmd::SCRUB_START, &mut buf).map_err(|e| match e.raw_os_error() {
        Some(libc::EBUSY) => format!("{}: a scrub is already running", path.display()),
        _ => format!("{}: {e}", path.display()),
    })
}

/// Where the mount's scrub stands.
pub fn scrub_status(path: &Path) -> Result<cmd::ScrubStatus, String> {
    subvol_of(path)?;
    let f = open(path)?;
    let mut buf = vec![0u8; cmd::SCRUB_STATUS_SIZE];
    ioctl(&f, path, cmd::SCRUB_STATUS, &mut buf)?;
    Ok(cmd::ScrubStatus::parse(&buf))
}

/// The devices' error counters on the mount; zeroed after reading with `reset`.
pub fn dev_stats(path: &Path, reset: bool) -> Result<cmd::DevStatsReply, String> {
    subvol_of(path)?;
    let f = open(path)?;
    let mut buf = vec![0u8; cmd::DEV_STATS_SIZE];
    buf[..8].copy_from_slice(&u64::from(reset).to_le_bytes());
    ioctl(&f, path, cmd::DEV_STATS, &mut buf)?;
    Ok(cmd::DevStatsReply::parse(&buf))
}
