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

/// CRC-32C (Castagnoli) as btrfs stores it in a checksum field: little-endian, then zeros.
/// Bitwise: the tests checksum a superblock or a tree block at a time.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Writes the crc32c checksum of `block[32..]` into `block[..32]`; an error for images
/// of another checksum type (`csum_type` as the superblock gives it).
fn set_crc32c(block: &mut [u8], csum_type: u16) -> io::Result<()> {
    if csum_type != 0 {
        return Err(io::Error::other(format!(
            "checksum type {csum_type}: only crc32c images can be rewritten"
        )));
    }
    let c = crc32c(&block[32..]);
    block[..32].fill(0);
    block[..4].copy_from_slice(&c.to_le_bytes());
    Ok(())
}

/// Offset of superblock copy `copy` (0, 1, 2).
fn super_offset(copy: usize) -> u64 {
    if copy == 0 {
        65536
    } else {
        (16 * 1024u64) << (12 * copy as u64)
    }
}

/// Changes superblock copy `copy` with `edit`, then recomputes its checksum (crc32c), so
/// that only the fields changed are wrong: a copy every tool believes.
pub fn rewrite_super(image: &Path, copy: usize, edit: impl FnOnce(&mut [u8])) -> io::Result<()> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)?;
    let at = super_offset(copy);
    let mut sb = vec![0u8; 4096];
    f.read_exact_at(&mut sb, at)?;
    if &sb[64..72] != b"_BHRfS_M" {
        return Err(io::Error::other(format!("no superblock copy {copy}")));
    }
    edit(&mut sb);
    let csum_type = u16::from_le_bytes([sb[196], sb[197]]);
    set_crc32c(&mut sb, csum_type)?;
    f.write_all_at(&sb, at)
}

/// Sets the u64 superblock field at byte `field` (72 generation, 56 flags: btrfs-format.md
/// 1.3) of every copy in `copies` to `value`, checksums recomputed.
pub fn set_super_u64(image: &Path, copies: &[usize], field: usize, value: u64) -> io::Result<()> {
    for &c in copies {
        rewrite_super(image, c, |sb| {
            sb[field..field + 8].copy_from_slice(&value.to_le_bytes())
        })?;
    }
    Ok(())
}

/// How many superblock copies the image has room for (1 to 3).
pub fn super_copies(image: &Path) -> io::Result<Vec<usize>> {
    let size = std::fs::metadata(image)?.len();
    Ok((0..3).filter(|&c| super_offset(c) + 4096 <= size).collect())
}

/// Changes the tree block at `logical` (`nodesize` bytes, read from its first copy) with
/// `edit`, recomputes its checksum (crc32c) and writes it to every copy: damage only the
/// tree checker can see.
pub fn rewrite_block(
    image: &Path,
    logical: u64,
    nodesize: usize,
    edit: impl FnOnce(&mut [u8]),
) -> io::Result<()> {
    let places = physical_copies(image, logical)?;
    let f = std::fs::File::open(image)?;
    let mut block = vec![0u8; nodesize];
    f.read_exact_at(&mut block, places[0])?;
    edit(&mut block);
    let mut sb = vec![0u8; 4096];
    f.read_exact_at(&mut sb, 65536)?;
    set_crc32c(&mut block, u16::from_le_bytes([sb[196], sb[197]]))?;
    write_every_copy(image, logical, 0, &block)
}

/// Makes the last item of the leaf at `leaf` one byte shorter at its start (its data
/// offset one up, its size one down): the leaf is still well formed, but a csum item's
/// size is then no multiple of the checksum size. Returns the item's new size.
pub fn shorten_last_item(image: &Path, leaf: u64, nodesize: usize) -> io::Result<u32> {
    let mut size = 0;
    rewrite_block(image, leaf, nodesize, |b| {
        // Header: 101 bytes, nritems at 96; items of 25 bytes: key (17), offset, size.
        let n = u32::from_le_bytes(b[96..100].try_into().unwrap()) as usize;
        let h = 101 + (n - 1) * 25 + 17;
        let off = u32::from_le_bytes(b[h..h + 4].try_into().unwrap());
        size = u32::from_le_bytes(b[h + 4..h + 8].try_into().unwrap()) - 1;
        b[h..h + 4].copy_from_slice(&(off + 1).to_le_bytes());
        b[h + 4..h + 8].copy_from_slice(&size.to_le_bytes());
    })?;
    Ok(size)
}

#[cfg(test)]
mod tests {
    #[test]
    fn crc32c_check_value() {
        assert_eq!(super::crc32c(b"123456789"), 0xE306_9283);
    }
}
