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
    pub(crate) fn insert_csum_bytes(&mut self, logical: u64, sums: &[u8]) -> Result<()> {
        let sb = &self.filesystem().sb;
        let sector = sb.sectorsize as usize;
        let csize = sb.csum_type().size();
        let per_item = self.csums_per_item();
        for (i, body) in sums.chunks(per_item * csize).enumerate() {
            let at = logical + (i * per_item * sector) as u64;
            self.insert_item(objectid::CSUM_TREE, csum_key(at), body)?;
        }
        Ok(())
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
