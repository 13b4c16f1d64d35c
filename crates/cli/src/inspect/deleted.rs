//! `oleo inspect IMAGE deleted` and `undelete`: inodes found only in old tree leaves, listed
//! or copied out. They go through the rescue open, so an image the normal open refuses
//! still works. Every line says "deleted": none of this is a live file.

use super::{col, jopt, js, utc};
use oleo::format::items::Timespec;
use oleo::rescue::{DeletedInode, Undelete};
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::fs::{File, FileTimes, OpenOptions, Permissions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime};

const S_IFMT: u32 = 0o170_000;
const S_IFREG: u32 = 0o100_000;
const S_IFDIR: u32 = 0o040_000;
const S_IFLNK: u32 = 0o120_000;

fn scan(image: &Path) -> Result<Undelete, String> {
    let u = Undelete::scan(image, None).map_err(|e| format!("{}: {e}", image.display()))?;
    for w in &u.warnings {
        eprintln!("oleo inspect: {w}");
    }
    Ok(u)
}

fn kind(mode: u32) -> &'static str {
    match mode & S_IFMT {
        S_IFREG => "file",
        S_IFDIR => "dir",
        S_IFLNK => "symlink",
        0o020_000 => "chardev",
        0o060_000 => "blockdev",
        0o010_000 => "fifo",
        0o140_000 => "socket",
        _ => "unknown",
    }
}

fn time(t: &Timespec) -> String {
    match utc(t.sec) {
        Some(s) if t.nsec == 0 => s,
        Some(s) => format!("{}.{:09}Z", s.trim_end_matches('Z'), t.nsec),
        None => "-".into(),
    }
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The best-known path, else the name with its parent's inode number.
fn where_(d: &DeletedInode) -> String {
    match (&d.path, &d.name) {
        (Some(p), _) => format!("/{}", lossy(p)),
        (None, Some((parent, n))) => format!("<dir {parent}>/{}", lossy(n)),
        (None, None) => format!("<ino {}>", d.ino),
    }
}

pub(super) fn list(image: &Path, json: bool) -> Result<(), String> {
    let u = scan(image)?;
    let mut t = String::new();
    if json {
        t.push_str("{\"deleted\": [\n");
        for (i, d) in u.found.iter().enumerate() {
            let xs: Vec<String> = d.xattrs.iter().map(|(n, _)| js(&lossy(n))).collect();
            let _ = writeln!(
                t,
                "  {{\"status\": \"deleted\", \"subvolume\": {}, \"inode\": {}, \
                 \"generation\": {}, \"transid\": {}, \"leaf_generation\": {}, \"kind\": {}, \
                 \"name\": {}, \"parent\": {}, \"path\": {}, \"size\": {}, \"mode\": {}, \
                 \"uid\": {}, \"gid\": {}, \"nlink\": {}, \"atime\": {}, \"mtime\": {}, \
                 \"ctime\": {}, \"otime\": {}, \"data\": {}, \"bytes_verified\": {}, \
                 \"bytes_unverified\": {}, \"bytes_reused\": {}, \"bytes_missing\": {}, \"inconsistent\": {}, \
                 \"subvolume_gone\": {}, \"xattrs\": [{}]}}{}",
                d.subvol,
                d.ino,
                d.inode.generation,
                d.inode.transid,
                d.leaf_generation,
                js(kind(d.inode.mode)),
                jopt(d.name.as_ref().map(|(_, n)| lossy(n))),
                d.name
                    .as_ref()
                    .map_or_else(|| "null".into(), |(p, _)| p.to_string()),
                jopt(d.path.as_ref().map(|p| format!("/{}", lossy(p)))),
                d.inode.size,
                d.inode.mode,
                d.inode.uid,
                d.inode.gid,
                d.inode.nlink,
                js(&time(&d.inode.atime)),
                js(&time(&d.inode.mtime)),
                js(&time(&d.inode.ctime)),
                js(&time(&d.inode.otime)),
                js(d.state.name()),
                d.bytes_verified,
                d.bytes_unverified,
                d.bytes_reused,
                d.bytes_missing,
                d.inconsistent,
                d.subvolume_gone,
                xs.join(", "),
                if i + 1 < u.found.len() { "," } else { "" }
            );
        }
        t.push_str("], \"warnings\": [");
        let ws: Vec<String> = u.warnings.iter().map(|w| js(w)).collect();
        t += &ws.join(", ");
        t.push_str("]}\n");
    } else {
        let _ = writeln!(
            t,
            "{:<8} {:<6} {:<10} {:<8} {:<8} {:<12} {:<7} {:<7} {:<20} {:<10} PATH",
            "STATUS", "SUBVOL", "INO", "GEN", "LEAFGEN", "SIZE", "KIND", "MODE", "MTIME", "DATA"
        );
        for d in &u.found {
            let _ = writeln!(
                t,
                "{:<8} {:<6} {:<10} {:<8} {:<8} {:<12} {:<7} {:<7o} {:<20} {:<10} {}",
                "deleted",
                d.subvol,
                d.ino,
                d.inode.generation,
                d.leaf_generation,
                d.inode.size,
                kind(d.inode.mode),
                d.inode.mode & 0o7777,
                utc(d.inode.mtime.sec).unwrap_or_else(|| "-".into()),
                d.state.name(),
                col(&where_(d))
            );
        }
    }
    print!("{t}");
    Ok(())
}

/// Sets sane permission bits (no set-id) and the old times on a restored file.
fn restore_attrs(f: &File, d: &DeletedInode) {
    let _ = f.set_permissions(Permissions::from_mode(d.inode.mode & 0o777));
    let at = |t: &Timespec| {
        u64::try_from(t.sec).ok().and_then(|s| {
            SystemTime::UNIX_EPOCH.checked_add(Duration::new(s, t.nsec.min(999_999_999)))
        })
    };
    let mut times = FileTimes::new();
    if let Some(a) = at(&d.inode.atime) {
        times = times.set_accessed(a);
    }
    if let Some(m) = at(&d.inode.mtime) {
        times = times.set_modified(m);
    }
    let _ = f.set_times(times);
}

/// Copies one deleted inode to `dest`, which must not exist. Returns a line for the user.
fn copy_one(u: &Undelete, d: &DeletedInode, dest: &Path) -> Result<String, String> {
    let err = |e: std::io::Error| format!("{}: {e}", dest.display());
    match d.inode.mode & S_IFMT {
        S_IFREG => {
            // O_EXCL and O_NOFOLLOW: never over an existing file, never through a link.
            let f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(dest)
                .map_err(err)?;
            let holes = u
                .copy_out(d, &f)
                .map_err(|e| format!("{}: {e}", dest.display()))?;
            restore_attrs(&f, d);
            let left: u64 = holes.iter().map(|(a, b)| b.saturating_sub(*a)).sum();
            Ok(format!(
                "deleted inode {} (subvolume {}) -> {}: {} bytes, data {}{}",
                d.ino,
                d.subvol,
                dest.display(),
                d.inode.size,
                d.state.name(),
                if left > 0 {
                    format!(", {left} bytes left as holes (reused or failing old checksums)")
                } else {
                    String::new()
                }
            ))
        }
        S_IFLNK => {
            let target = u
                .symlink_target(d)
                .ok_or_else(|| format!("deleted symlink {}: its target is lost", d.ino))?;
            std::os::unix::fs::symlink(OsStr::from_bytes(&target), dest).map_err(err)?;
            Ok(format!(
                "deleted symlink {} (subvolume {}) -> {}",
                d.ino,
                d.subvol,
                dest.display()
            ))
        }
        _ => Err(format!(
            "deleted inode {} is a {}: only files and symlinks are copied out",
            d.ino,
            kind(d.inode.mode)
        )),
    }
}

/// A name safe as one path component, else `inode`.
fn safe_name(d: &DeletedInode) -> String {
    let n = d.name.as_ref().map(|(_, n)| lossy(n)).unwrap_or_default();
    if n.is_empty() || n == "." || n == ".." || n.contains(['/', '\0']) {
        "inode".into()
    } else {
        n
    }
}

/// `undelete INO DEST_FILE` or `undelete --all DEST_DIR`.
pub(super) fn undelete(
    image: &Path,
    root: Option<u64>,
    ino: Option<u64>,
    dest: Option<&Path>,
    all: Option<&Path>,
) -> Result<(), String> {
    let u = scan(image)?;
    if let Some(dir) = all {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let empty = std::fs::read_dir(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .next()
            .is_none();
        if !empty {
            return Err(format!("{}: not empty", dir.display()));
        }
        let mut failed = 0;
        for d in u
            .found
            .iter()
            .filter(|d| root.is_none_or(|r| r == d.subvol))
        {
            if !matches!(d.inode.mode & S_IFMT, S_IFREG | S_IFLNK) {
                continue;
            }
            // DEST/<subvol>/<ino>.<gen>/<name>: every directory made here, in an empty DEST.
            let sub = dir.join(d.subvol.to_string());
            let one = sub.join(format!("{}.{}", d.ino, d.inode.generation));
            let made = std::fs::create_dir_all(&sub).and_then(|_| std::fs::create_dir(&one));
            let r = made
                .map_err(|e| format!("{}: {e}", one.display()))
                .and_then(|_| copy_one(&u, d, &one.join(safe_name(d))));
            match r {
                Ok(line) => println!("{line}"),
                Err(e) => {
                    failed += 1;
                    eprintln!("oleo inspect: {e}");
                }
            }
        }
        return match failed {
            0 => Ok(()),
            n => Err(format!("{n} deleted inode(s) could not be copied out")),
        };
    }
    let (Some(ino), Some(dest)) = (ino, dest) else {
        return Err("undelete needs INO and DEST_FILE, or --all DEST_DIR".into());
    };
    let subvol = root.unwrap_or(5);
    let d = u
        .found
        .iter()
        .filter(|d| d.subvol == subvol && d.ino == ino)
        .max_by_key(|d| (d.leaf_generation, d.inode.generation))
        .ok_or_else(|| format!("no deleted inode {ino} found in subvolume {subvol}"))?;
    println!("{}", copy_one(&u, d, dest)?);
    Ok(())
}
