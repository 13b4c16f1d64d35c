//! Data checksums in the csum tree: EXTENT_CSUM items keyed by the logical address of
//! their first sector, holding one checksum (of the filesystem's type) per sector.

use crate::error::Result;
use crate::transaction::Transaction;
use oleo_format::key::{item, objectid, Key};
use std::ops::ControlFlow;

fn csum_key(logical: u64) -> Key {
    Key::new(objectid::EXTENT_CSUM, item::EXTENT_CSUM, logical)
}

/// The checksums of `data`, one per sector, as the csum tree stores them. Needs no
/// filesystem state: writes compute them outside any lock.
pub(crate) fn data_csums(csum: oleo_format::csum::CsumType, sector: usize, data: &[u8]) -> Vec<u8> {
    let csize = csum.size();
    let mut out = Vec::with_capacity(data.len() / sector * csize);
    for s in data.chunks(sector) {
        out.extend_from_slice(&csum.compute(s)[..csize]);
    }
    out
}

impl Transaction<'_> {
    /// Sectors one csum item may cover: small enough that items fit leaves comfortably.
    fn csums_per_item(&self) -> usize {
        let csize = self.filesystem().sb.csum_type().size();
        (self.filesystem().sb.nodesize as usize / 2 / csize).max(1)
    }

    /// Inserts the checksums of `data`, which was written at logical `logical`.
    pub(crate) fn insert_csums(&mut self, logical: u64, data: &[u8]) -> Result<()> {
        let sb = &self.filesystem().sb;
        let sums = data_csums(sb.csum_type(), sb.sectorsize as usize, data);
        self.insert_csum_bytes(logical, &sums)
    }

    /// Inserts checksums computed already (`data_csums`) for data at logical `logical`.
    /// The first of them go at the end of the item that ends where they start, while it
    /// and its leaf have room, as the kernel's btrfs_csum_file_blocks extends the item
    /// before: neighbouring extents' sums end in one item, not one each.
    pub(crate) fn insert_csum_bytes(&mut self, logical: u64, sums: &[u8]) -> Result<()> {
        let sb = &self.filesystem().sb;
        let sector = sb.sectorsize as usize;
        let csize = sb.csum_type().size();
        let per_item = self.csums_per_item();
        let took = self.place_csums(logical, sums, per_item * csize)?;
        let (logical, sums) = (logical + (took / csize * sector) as u64, &sums[took..]);
        for (i, body) in sums.chunks(per_item * csize).enumerate() {
            let at = logical + (i * per_item * sector) as u64;
            self.insert_item(objectid::CSUM_TREE, csum_key(at), body)?;
        }
        Ok(())
    }

    /// Puts the first of `sums` (for data at `logical`) in the leaf one search finds: at the
    /// end of the csum item that ends there (`extend_before`), else as a new item of up to
    /// `max` bytes if the leaf has room. One descent for the common write, not two.
    /// Returns the bytes placed (0: none, the caller inserts them all).
    fn place_csums(&mut self, logical: u64, sums: &[u8], max: usize) -> Result<usize> {
        let sb = &self.filesystem().sb;
        let (sector, csize) = (u64::from(sb.sectorsize), sb.csum_type().size());
        if sums.is_empty() {
            return Ok(0);
        }
        self.edit_leaf(
            objectid::CSUM_TREE,
            &csum_key(logical),
            |leaf, slot, found| {
                if found {
                    // An item starts there already: `insert_item` says so.
                    return Ok(0);
                }
                if let Some(took) = extend_before(leaf, slot, logical, sums, max, sector, csize)? {
                    return Ok(took);
                }
                // No item to extend: the first item goes in where the search ended, when
                // the leaf has room (else `insert_item` splits it).
                let len = sums.len().min(max);
                if leaf.free_space() < oleo_format::tree_block::ITEM_SIZE + len {
                    return Ok(0);
                }
                leaf.insert_item(slot, csum_key(logical), len)?
                    .copy_from_slice(&sums[..len]);
                Ok(len)
            },
        )
    }

    /// Deletes the checksums of `[logical, logical + len)`, trimming items that reach
    /// outside it (the kernel merges neighbouring extents' sums into one item).
    pub(crate) fn delete_csums(&mut self, logical: u64, len: u64) -> Result<()> {
        let sector = u64::from(self.filesystem().sb.sectorsize);
        let csize = self.filesystem().sb.csum_type().size() as u64;
        let end = logical + len;
        // Items overlapping the range: the one starting at or before it, and those inside.
        let mut hits: Vec<(Key, Vec<u8>)> = Vec::new();
        if let Some((k, body)) = self.lookup_le(objectid::CSUM_TREE, &csum_key(logical))? {
            if k.offset + body.len() as u64 / csize * sector > logical {
                hits.push((k, body));
            }
        }
        self.for_each_in_range(
            objectid::CSUM_TREE,
            csum_key(logical.saturating_add(1)),
            csum_key(end - 1),
            |k, body| {
                hits.push((k, body.to_vec()));
                Ok(ControlFlow::Continue(()))
            },
        )?;
        hits.dedup_by_key(|(k, _)| *k);
        for (k, body) in hits {
            let start = k.offset;
            let item_end = start + body.len() as u64 / csize * sector;
            if item_end <= logical || start >= end {
                continue;
            }
            self.delete_item(objectid::CSUM_TREE, &k)?;
            if start < logical {
                let keep = ((logical - start) / sector * csize) as usize;
                self.insert_item(objectid::CSUM_TREE, k, &body[..keep])?;
            }
            if item_end > end {
                let skip = ((end - start) / sector * csize) as usize;
                self.insert_item(objectid::CSUM_TREE, csum_key(end), &body[skip..])?;
            }
        }
        Ok(())
    }
}

/// Appends the first of `sums` (for data at `logical`) to the csum item just before `slot`
/// if it ends at `logical`, as far as the item may grow (`max` bytes), the leaf has room
/// and the next item leaves space. None when there is no such item or nothing fits.
fn extend_before(
    leaf: &mut oleo_format::tree_mut::LeafMut<'_>,
    slot: usize,
    logical: u64,
    sums: &[u8],
    max: usize,
    sector: u64,
    csize: usize,
) -> std::result::Result<Option<usize>, oleo_format::FormatError> {
    let Some(c) = slot.checked_sub(1).filter(|&c| c < leaf.nritems()) else {
        return Ok(None);
    };
    let k = leaf.key(c)?;
    let size = leaf.item(c)?.size as usize;
    let is_csum = k.objectid == objectid::EXTENT_CSUM && k.item_type == item::EXTENT_CSUM;
    let ends_here = k.offset.checked_add((size / csize) as u64 * sector) == Some(logical);
    if !is_csum || !ends_here || !size.is_multiple_of(csize) {
        return Ok(None);
    }
    let mut take = sums
        .len()
        .min(max.saturating_sub(size))
        .min(leaf.free_space());
    // Never over the range of the next item (none should start inside the data's).
    if slot < leaf.nritems() {
        let next = leaf.key(slot)?;
        if next.objectid == objectid::EXTENT_CSUM && next.item_type == item::EXTENT_CSUM {
            let gap = next.offset.saturating_sub(logical) / sector;
            take = take.min(
                usize::try_from(gap)
                    .unwrap_or(usize::MAX)
                    .saturating_mul(csize),
            );
        }
    }
    take -= take % csize;
    if take == 0 {
        return Ok(None);
    }
    leaf.resize_item(c, size + take)?;
    leaf.item_body_mut(c)?[size..size + take].copy_from_slice(&sums[..take]);
    Ok(Some(take))
}
