//! A deleted file's extents: which are still its own (not allocated again since), the old
//! checksums they had, and what a read of them shows.

use super::{CsumLeaf, DataState, DeletedInode, Versions};
use crate::rescue::data::{self, Csums};
use crate::rescue::open::Image;
use oleo_format::items::{Compression, FileExtent, FileExtentBody};
use oleo_format::key::{item, objectid};
use oleo_format::Key;
use std::collections::BTreeMap;

/// Picks the file's extents (newest leaf first where items overlap), leaves out those whose
/// space is allocated again, and gathers old checksums for the rest.
pub(super) fn claim_extents(
    img: &Image,
    d: &mut DeletedInode,
    v: &Versions,
    allocated: Option<&BTreeMap<u64, (u64, u64)>>,
    csum_leaves: &[CsumLeaf],
) {
    let size = d.inode.size;
    // The newest transaction the file is known to have lived in.
    let alive = v
        .values()
        .map(|(g, _)| *g)
        .fold(d.leaf_generation, u64::max);
    let mut all: Vec<(u64, u64, &[u8])> = v
        .iter()
        .filter(|(k, _)| k.item_type == item::EXTENT_DATA)
        .map(|(k, (g, b))| (k.offset, *g, &b[..]))
        .collect();
    all.sort_by_key(|(o, g, _)| (std::cmp::Reverse(*g), *o));
    let mut placed: BTreeMap<u64, u64> = BTreeMap::new();
    let mut sectors: BTreeMap<u64, (u64, Vec<u8>)> = BTreeMap::new();
    let ss = u64::from(img.sb.sectorsize).max(512);
    for (off, _, body) in all {
        let Ok(fe) = FileExtent::parse(body) else {
            d.inconsistent = true;
            continue;
        };
        let end = off.saturating_add(fe.file_len().max(1));
        let overlaps = placed
            .range(..end)
            .next_back()
            .is_some_and(|(_, e)| *e > off);
        if overlaps {
            d.inconsistent = true;
            continue;
        }
        placed.insert(off, end);
        let FileExtentBody::Extent {
            prealloc,
            disk_bytenr,
            disk_num_bytes,
            offset,
            num_bytes,
        } = fe.body
        else {
            d.extents.push((off, body.to_vec()));
            continue;
        };
        if prealloc || disk_bytenr == 0 {
            d.extents.push((off, body.to_vec()));
            continue;
        }
        let disk_end = disk_bytenr.saturating_add(disk_num_bytes);
        let now = allocated.and_then(|m| m.range(..disk_end).next_back());
        let (shared, reused) = match now {
            Some((&s, &(l, g))) if s.saturating_add(l) > disk_bytenr => {
                // Still allocated since before the deletion: the same extent, kept alive by
                // another reference (a reflink or a snapshot).
                let same = s == disk_bytenr && l == disk_num_bytes && g <= alive;
                (same, !same)
            }
            _ => (false, false),
        };
        if reused {
            if off < size {
                d.reused.push((off, end.min(size)));
            }
            continue;
        }
        // The checksums this extent had: written with it, and not after its space was free.
        let window = (fe.generation, if shared { u64::MAX } else { alive });
        let (from, to) = if fe.compression == Compression::None {
            let a = disk_bytenr.saturating_add(offset);
            (a / ss * ss, a.saturating_add(num_bytes))
        } else {
            (disk_bytenr, disk_end)
        };
        gather_csums(img, csum_leaves, (from, to), window, &mut sectors);
        let covered = (from..to)
            .step_by(ss as usize)
            .take(1 << 20)
            .all(|s| sectors.contains_key(&s));
        if covered {
            d.checked.insert(off);
        }
        d.extents.push((off, body.to_vec()));
    }
    d.extents.sort_by_key(|(o, _)| *o);
    // Consecutive sectors' checksums as csum tree items.
    let mut run: Option<(u64, u64, Vec<u8>)> = None;
    for (s, (_, c)) in sectors {
        match run.as_mut() {
            Some((_, next, body)) if *next == s => {
                body.extend_from_slice(&c);
                *next = s + ss;
            }
            _ => {
                if let Some((start, _, body)) = run.take() {
                    d.csums.insert(
                        Key::new(objectid::EXTENT_CSUM, item::EXTENT_CSUM, start),
                        body,
                    );
                }
                run = Some((s, s + ss, c));
            }
        }
    }
    if let Some((start, _, body)) = run {
        d.csums.insert(
            Key::new(objectid::EXTENT_CSUM, item::EXTENT_CSUM, start),
            body,
        );
    }
}

/// The checksum of each sector of `range` from the newest csum leaf whose generation lies
/// in `window`.
fn gather_csums(
    img: &Image,
    leaves: &[CsumLeaf],
    range: (u64, u64),
    window: (u64, u64),
    out: &mut BTreeMap<u64, (u64, Vec<u8>)>,
) {
    let ss = u64::from(img.sb.sectorsize).max(512);
    let csize = img.sb.csum_type().size();
    for leaf in leaves {
        if leaf.range.1 <= range.0 || leaf.range.0 >= range.1 {
            continue;
        }
        if leaf.generation < window.0 || leaf.generation > window.1 {
            continue;
        }
        super::each_item(img, leaf.bytenr, |k, body| {
            if k.objectid != objectid::EXTENT_CSUM || k.item_type != item::EXTENT_CSUM {
                return;
            }
            for (i, c) in body.chunks_exact(csize).enumerate() {
                let s = k.offset.saturating_add(i as u64 * ss);
                if s < range.0 || s >= range.1 {
                    continue;
                }
                if out.get(&s).is_none_or(|(g, _)| leaf.generation > *g) {
                    out.insert(s, (leaf.generation, c.to_vec()));
                }
            }
        });
    }
}

/// Reads the claimed extents once (nothing written) to count verified, unverified and
/// reused bytes.
pub(super) fn check_data(img: &Image, d: &mut DeletedInode) {
    let size = d.inode.size;
    let csums = Csums::new(
        d.csums.clone(),
        img.sb.csum_type(),
        u64::from(img.sb.sectorsize),
    );
    let ext: Vec<(u64, &[u8])> = d.extents.iter().map(|(o, b)| (*o, &b[..])).collect();
    let holes = data::write_file(&img.io, &csums, &ext, size, None).unwrap_or_default();
    let bad: u64 = holes.iter().map(|(a, b)| b.saturating_sub(*a)).sum();
    let ss = u64::from(img.sb.sectorsize).max(512);
    // The bytes the inode says it has allocated, against those its found items hold: with
    // no-holes a lost EXTENT_DATA leaf looks like a hole, and only this tells.
    let mut found: u64 = d.reused.iter().map(|(a, b)| b - a).sum();
    for (off, body) in &d.extents {
        let Ok(fe) = FileExtent::parse(body) else {
            continue;
        };
        let len = fe.file_len().min(size.saturating_sub(*off));
        match fe.body {
            FileExtentBody::Inline { .. } => {
                found = found.saturating_add(fe.ram_bytes.next_multiple_of(ss));
                d.bytes_verified += len;
            }
            FileExtentBody::Extent {
                prealloc,
                disk_bytenr,
                num_bytes,
                ..
            } => {
                if disk_bytenr != 0 {
                    found = found.saturating_add(num_bytes);
                }
                if prealloc || disk_bytenr == 0 {
                    continue;
                }
                if d.checked.contains(off) {
                    d.bytes_verified += len;
                } else {
                    d.bytes_unverified += len;
                }
            }
        }
    }
    d.bytes_verified = d.bytes_verified.saturating_sub(bad);
    d.bytes_reused = bad + d.reused.iter().map(|(a, b)| b - a).sum::<u64>();
    d.bytes_missing = d.inode.nbytes.saturating_sub(found);
    d.state = if d.bytes_reused > 0 {
        DataState::Reused
    } else if d.bytes_missing > 0 {
        DataState::Incomplete
    } else if d.bytes_unverified > 0 {
        DataState::Unverified
    } else if d.bytes_verified > 0 {
        DataState::Verified
    } else {
        DataState::NoData
    };
}
