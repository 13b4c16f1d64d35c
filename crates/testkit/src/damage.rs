//! Damaging a single-device image at known places, located by btrfs-progs' own dumps (never
//! by oleo): a tree's leaf, a superblock field, every copy of a logical range. And a hash
//! of the image, to show a read-only tool changed nothing.

use crate::cmd::run_stdout;
use crate::multi_device::{chunk_map, copies};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

/// The first non-root leaf of tree `tree` (a `dump-tree -t` name or id) holding an item of
/// objectid `ino` and type `ty`, as `dump-tree` spells them.
pub fn leaf_holding(image: &Path, tree: &str, ino: &str, ty: &str) -> io::Result<u64> {
    let dump = run_stdout(
        Command::new("btrfs")
            .args(["inspect-internal", "dump-tree", "--noscan", "-t", tree])
            .arg(image),
    )?;
    let want = format!("key ({ino} {ty} ");
    let mut leaf = None;
    for line in dump.lines() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("leaf ") {
            leaf = rest.split_whitespace().next().and_then(|w| w.parse().ok());
        } else if t.contains(&want) {
            if let Some(l) = leaf {
                return Ok(l);
            }
        }
    }
    Err(io::Error::other(format!(
        "no leaf of tree {tree} holds ({ino} {ty})"
    )))
}

/// A numeric field of `dump-super` (`root`, `generation`, `chunk_root`, ...).
pub fn super_field(image: &Path, field: &str) -> io::Result<u64> {
    let d = run_stdout(
        Command::new("btrfs")
            .args(["inspect-internal", "dump-super"])
            .arg(image),
    )?;
    d.lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some(field)).then(|| w.next()?.parse().ok())?
        })
        .ok_or_else(|| io::Error::other(format!("dump-super shows no {field}")))
}

/// The physical offsets of every copy of `logical` on a single-device image.
pub fn physical_copies(image: &Path, logical: u64) -> io::Result<Vec<u64>> {
    let v: Vec<u64> = copies(&chunk_map(image)?, logical)
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    if v.is_empty() {
        return Err(io::Error::other(format!("no chunk maps logical {logical}")));
    }
    Ok(v)
}

/// Writes `bytes` at `at` of the image.
pub fn write_at(image: &Path, at: u64, bytes: &[u8]) -> io::Result<()> {
    let f = std::fs::OpenOptions::new().write(true).open(image)?;
    f.write_all_at(bytes, at)
}

/// Writes `bytes` at offset `within` of every copy of the logical address `logical`.
pub fn write_every_copy(image: &Path, logical: u64, within: u64, bytes: &[u8]) -> io::Result<()> {
    for p in physical_copies(image, logical)? {
        write_at(image, p + within, bytes)?;
    }
    Ok(())
}

/// A hash of the image's data regions (holes skipped, so a sparse image is quick).
pub fn image_hash(path: &Path) -> io::Result<u64> {
    use std::hash::Hasher;
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path)?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut pos = 0i64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        // SAFETY: plain lseek calls on an open descriptor.
        let data = unsafe { libc::lseek(f.as_raw_fd(), pos, libc::SEEK_DATA) };
        if data < 0 {
            break;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(f.as_raw_fd(), data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        h.write_i64(data);
        let mut at = data;
        while at < hole {
            let n = ((hole - at) as usize).min(buf.len());
            f.read_exact_at(&mut buf[..n], at as u64)?;
            h.write(&buf[..n]);
            at += n as i64;
        }
        pos = hole;
    }
    Ok(h.finish())
}

/// Every leaf of tree `tree`, in key order.
pub fn leaves_of(image: &Path, tree: &str) -> io::Result<Vec<u64>> {
    let dump = run_stdout(
        Command::new("btrfs")
            .args(["inspect-internal", "dump-tree", "--noscan", "-t", tree])
            .arg(image),
    )?;
    Ok(dump
        .lines()
        .filter_map(|l| {
            l.strip_prefix("leaf ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect())
}

/// Zeroes every copy of the tree block at `logical` (`nodesize` bytes).
pub fn zero_block(image: &Path, logical: u64, nodesize: usize) -> io::Result<()> {
    write_every_copy(image, logical, 0, &vec![0u8; nodesize])
}

/// btrfs-progs' fsck test images: `$OLEO_FSCK_IMAGES`, else `shared/` beside the checkout.
pub fn fsck_image_dir() -> std::path::PathBuf {
    if let Some(d) = std::env::var_os("OLEO_FSCK_IMAGES") {
        return d.into();
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/test-images/btrfs-progs-fsck")
}

/// Every regular file reachable by listing directories from `root` (a mount or a restore's
/// output), with its bytes, or None where the read failed.
pub fn files_under(root: &Path) -> std::collections::BTreeMap<std::path::PathBuf, Option<Vec<u8>>> {
    use std::os::unix::fs::MetadataExt;
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    // Each directory once: a damaged image may name one from two places (a loop).
    let mut seen = std::collections::HashSet::new();
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        if !std::fs::metadata(&d).is_ok_and(|m| seen.insert((m.dev(), m.ino()))) {
            continue;
        }
        for e in rd.flatten() {
            // The inode's own type (lstat), not the entry's: a damaged image may list a
            // FIFO as a file, and opening a FIFO waits for a writer.
            let Ok(t) = std::fs::symlink_metadata(e.path()).map(|m| m.file_type()) else {
                continue;
            };
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                let rel = e
                    .path()
                    .strip_prefix(root)
                    .unwrap_or(&e.path())
                    .to_path_buf();
                out.insert(rel, std::fs::read(e.path()).ok());
            }
        }
    }
    out
}
