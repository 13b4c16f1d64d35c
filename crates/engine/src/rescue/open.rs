//! The tolerant open: a chosen superblock copy, whatever of the chunk tree reads, and the
//! first root tree (superblock's, backups', or the user's) whose root block reads.

use super::walk::{self, Items, Start};
use super::Report;
use crate::error::{Error, Result};
use crate::io::devices::DeviceSet;
use crate::io::disk_io::DiskIo;
use crate::io::volumes::ChunkMap;
use oleo_format::items::ChunkItem;
use oleo_format::key::{item, objectid};
use oleo_format::superblock::{self, BackupRoot, Superblock, SUPER_INFO_SIZE};
use oleo_format::validate::FsContext;
use std::path::Path;

/// An image opened for rescue.
pub(crate) struct Image {
    pub io: DiskIo,
    pub sb: Superblock,
    /// ROOT_ITEMs (and refs) of the root tree, what of it could be read.
    pub roots: Items,
    /// The superblock's backup roots, newest first: the last word on tree 5 and the csums.
    pub backups: Vec<BackupRoot>,
    /// Roots of older generations found by scanning (`--older`), newest first.
    pub older: Vec<super::RootCandidate>,
}

const CACHE_BYTES: u64 = 64 << 20;

pub(crate) fn open(
    path: &Path,
    super_copy: Option<usize>,
    tree_root: Option<u64>,
    report: &mut Report,
) -> Result<Image> {
    // Read-only: the devices are opened without write access.
    let (devices, _) = DeviceSet::open_with(&[path.to_path_buf()], false, true)?;
    let (sb, newest_gen) = pick_superblock(&devices, super_copy)?;
    let ctx = FsContext {
        super_generation: newest_gen,
        ..sb.fs_context()
    };
    let mut sys = ChunkMap::default();
    let sys_chunks = sb
        .sys_chunks()
        .map_err(|e| Error::Unusable(format!("sys_chunk_array: {e}")))?;
    for (logical, chunk) in &sys_chunks {
        sys.insert(*logical, chunk.clone())?;
    }
    let io = DiskIo::new(devices, sys, ctx, CACHE_BYTES);
    let mut backups = sb.backup_roots.clone();
    backups.retain(|b| b.tree_root != 0);
    backups.sort_by_key(|b| std::cmp::Reverse(b.tree_root_gen));
    read_chunks(&io, &sb, &sys_chunks, &backups, report);
    let roots = read_root_tree(&io, &sb, &backups, tree_root, report);
    Ok(Image {
        io,
        sb,
        roots,
        backups,
        older: Vec::new(),
    })
}

/// Superblock copy `want`, or the newest valid copy; with the newest generation seen.
/// A copy whose checksum is good but a field of which fails its sanity check is passed
/// over for the copies that pass; where none passes, its fields are mended from the rest
/// of it (its backup roots), as btrfs restore reads on past such a field. Each is said on
/// stderr, naming the field.
fn pick_superblock(devices: &DeviceSet, want: Option<usize>) -> Result<(Superblock, u64)> {
    let dev = devices.primary();
    // (mirror, superblock, passed every check)
    let mut copies = Vec::new();
    for mirror in 0..3 {
        let off = superblock::mirror_offset(mirror);
        if off.saturating_add(SUPER_INFO_SIZE as u64) > dev.size() {
            break;
        }
        let mut buf = vec![0u8; SUPER_INFO_SIZE];
        let parsed = dev
            .read_exact_at(&mut buf, off)
            .map_err(|e| e.to_string())
            .and_then(|_| Superblock::parse_unchecked(&buf).map_err(|e| e.to_string()))
            .and_then(|sb| {
                if sb.bytenr == off {
                    Ok(sb)
                } else {
                    Err(format!("it claims to be at {}", sb.bytenr))
                }
            });
        let mut sb = match parsed {
            Ok(sb) => sb,
            Err(e) => {
                eprintln!("superblock copy {mirror} (at {off}) is unusable: {e}");
                continue;
            }
        };
        let problems = sb.problems();
        if problems.is_empty() {
            copies.push((mirror, sb, true));
            continue;
        }
        eprintln!(
            "superblock copy {mirror} (at {off}) fails its checks: {}",
            problems.join("; ")
        );
        match sb.mend_from_backups() {
            Ok(fixed) => {
                eprintln!(
                    "superblock copy {mirror}: mended from its backup roots: {} (used only \
                     where no copy passes)",
                    fixed.join("; ")
                );
                copies.push((mirror, sb, false));
            }
            Err(left) => eprintln!(
                "superblock copy {mirror} cannot be mended: {}",
                left.join("; ")
            ),
        }
    }
    let newest = copies
        .iter()
        .map(|(_, s, _)| s.generation)
        .max()
        .unwrap_or(0);
    let chosen = match want {
        Some(n) => copies
            .into_iter()
            .find(|(m, _, _)| *m == n)
            .ok_or_else(|| Error::Unusable(format!("superblock copy {n} is missing or invalid")))?,
        None => copies
            .into_iter()
            .max_by_key(|(m, s, ok)| (*ok, s.generation, std::cmp::Reverse(*m)))
            .ok_or_else(|| Error::Unusable("no valid superblock copy".into()))?,
    };
    if !chosen.2 {
        eprintln!("reading superblock copy {} as mended", chosen.0);
    } else if chosen.0 > 0 && want.is_none() {
        eprintln!("using superblock copy {}", chosen.0);
    }
    let sb = chosen.1;
    let unknown = sb.flags & !superblock::super_flags::KERNEL_MOUNTS;
    if unknown != 0 {
        eprintln!(
            "superblock flags {} ({unknown:#x}) are not supported: ignored, as \
             rescue=ignoresuperflags does (restore only reads)",
            superblock::flag_names(unknown, superblock::super_flags::NAMES).join(", ")
        );
    }
    Ok((sb, newest))
}

/// Adds every chunk the chunk tree still holds to the sys chunks; unreadable leaves are
/// skipped (their chunks stay unmapped) and a bad root falls back to the backups' roots.
fn read_chunks(
    io: &DiskIo,
    sb: &Superblock,
    sys: &[(u64, ChunkItem)],
    backups: &[BackupRoot],
    report: &mut Report,
) {
    let mut starts = vec![(sb.chunk_root, sb.chunk_root_level, sb.chunk_root_generation)];
    starts.extend(
        backups
            .iter()
            .map(|b| (b.chunk_root, b.chunk_root_level, b.chunk_root_gen)),
    );
    let keep = |k: &oleo_format::Key| k.item_type == item::CHUNK_ITEM;
    let mut map = ChunkMap::default();
    for (logical, chunk) in sys {
        let _ = map.insert(*logical, chunk.clone());
    }
    let mut tried = Vec::new();
    let mut whole = false;
    for (bytenr, level, generation) in starts {
        if tried.contains(&bytenr) {
            continue;
        }
        tried.push(bytenr);
        let start = Start {
            owner: objectid::CHUNK_TREE,
            bytenr,
            level: Some(level),
            generation: Some(generation),
        };
        let before = report.skipped_blocks.len();
        let items = walk::collect(io, start, &keep, report);
        let root_failed = report.skipped_blocks[before..]
            .iter()
            .any(|s| s.bytenr == bytenr);
        for (key, data) in &items {
            match ChunkItem::parse(data) {
                Ok(c) => {
                    if let Err(e) = map.insert(key.offset, c) {
                        eprintln!("chunk at {}: {e}; left out", key.offset);
                    }
                }
                Err(e) => eprintln!("chunk at {}: {e}; left out", key.offset),
            }
        }
        if !root_failed {
            // A backup root's chunk tree is older: chunks added since are not in it.
            whole |= tried.len() == 1 && report.skipped_blocks.len() == before;
            break;
        }
    }
    if !whole {
        // Chunks of the lost leaves are unmapped: found again by reading the devices.
        let added = super::chunk_scan::recover(io, sb, &mut map);
        eprintln!("the chunk tree is damaged: {added} chunks recovered by scanning the devices");
    }
    io.set_chunks(map);
}

/// The ROOT_ITEMs of the first root tree whose root block reads.
fn read_root_tree(
    io: &DiskIo,
    sb: &Superblock,
    backups: &[BackupRoot],
    user: Option<u64>,
    report: &mut Report,
) -> Items {
    let mut starts = Vec::new();
    if let Some(bytenr) = user {
        starts.push((bytenr, None, None));
    }
    starts.push((sb.root, Some(sb.root_level), Some(sb.generation)));
    starts.extend(
        backups
            .iter()
            .map(|b| (b.tree_root, Some(b.tree_root_level), Some(b.tree_root_gen))),
    );
    let mut tried = Vec::new();
    for (bytenr, level, generation) in starts {
        if tried.contains(&bytenr) {
            continue;
        }
        tried.push(bytenr);
        if let Err(e) = walk::read_block(io, bytenr, level, generation, None) {
            eprintln!("root tree at {bytenr} is unreadable ({e}); trying the next candidate");
            report.skipped_blocks.push(super::SkippedBlock {
                bytenr,
                owner: objectid::ROOT_TREE,
                why: e.to_string(),
            });
            continue;
        }
        let start = Start {
            owner: objectid::ROOT_TREE,
            bytenr,
            level,
            generation,
        };
        let keep = |k: &oleo_format::Key| {
            matches!(
                k.item_type,
                item::ROOT_ITEM | item::ROOT_REF | item::ROOT_BACKREF
            )
        };
        return walk::collect(io, start, &keep, report);
    }
    eprintln!("no root tree is readable: falling back to the backup roots of tree 5");
    Items::new()
}
