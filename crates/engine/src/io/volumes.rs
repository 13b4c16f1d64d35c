//! The chunk map: logical addresses -> (device, physical offset), per profile.

use crate::error::{Error, Result};
use oleo_format::items::{block_group as bg, ChunkItem};
use std::collections::BTreeMap;

const STRIPE_LEN: u64 = 65536;

/// One physically contiguous piece of a logical range, in one copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PhysRange {
    pub devid: u64,
    pub physical: u64,
    pub len: u64,
}

/// A piece of a RAID5/6 read: its row's strips (data in order, then P, then Q) as
/// (devid, physical) at the piece's offset inside them, and which one holds the piece.
#[derive(Clone, Debug)]
pub struct RowPiece {
    pub len: u64,
    pub target: usize,
    pub nparity: usize,
    pub stripes: Vec<(u64, u64)>,
}

#[derive(Default)]
pub struct ChunkMap {
    chunks: BTreeMap<u64, ChunkItem>,
}

impl ChunkMap {
    pub fn insert(&mut self, logical: u64, chunk: ChunkItem) -> Result<()> {
        let end = logical
            .checked_add(chunk.length)
            .ok_or_else(|| Error::Unusable(format!("chunk at {logical} overflows")))?;
        if let Some((&s, c)) = self.chunks.range(..end).next_back() {
            if s + c.length > logical && s != logical {
                return Err(Error::Unusable(format!(
                    "chunk at {logical} overlaps chunk at {s}"
                )));
            }
        }
        let profile = chunk.chunk_type & bg::PROFILE_MASK;
        let n = chunk.num_stripes as usize;
        let ok = match profile {
            0 => n == 1,
            bg::DUP | bg::RAID1 => n == 2,
            bg::RAID1C3 => n == 3,
            bg::RAID1C4 => n == 4,
            bg::RAID0 => n >= 1,
            bg::RAID10 => n >= 2 && n.is_multiple_of(2) && chunk.sub_stripes == 2,
            bg::RAID5 => n >= 2,
            bg::RAID6 => n >= 3,
            _ => false,
        };
        if !ok || chunk.stripe_len != STRIPE_LEN {
            return Err(Error::Unusable(format!(
                "chunk at {logical}: profile {:#x} with {n} stripes is invalid",
                profile
            )));
        }
        self.chunks.insert(logical, chunk);
        Ok(())
    }

    pub fn chunks(&self) -> impl Iterator<Item = (&u64, &ChunkItem)> {
        self.chunks.iter()
    }

    pub fn lookup(&self, logical: u64) -> Option<(u64, &ChunkItem)> {
        let (&start, chunk) = self.chunks.range(..=logical).next_back()?;
        (logical < start + chunk.length).then_some((start, chunk))
    }

    /// Number of ways a read of `logical` can be answered (the kernel's
    /// btrfs_num_copies): the copies of a mirrored profile; for RAID5 the stripe itself and
    /// its rebuild from parity; for RAID6 also a rebuild for each other stripe that could be
    /// bad too (`num_stripes` in all).
    pub fn num_mirrors(&self, logical: u64) -> usize {
        match self.lookup(logical) {
            Some((_, c)) => match c.chunk_type & bg::PROFILE_MASK {
                bg::DUP | bg::RAID1 | bg::RAID10 | bg::RAID5 => 2,
                bg::RAID1C3 => 3,
                bg::RAID1C4 => 4,
                bg::RAID6 => c.stripes.len(),
                _ => 1,
            },
            None => 0,
        }
    }

    /// The profile bits of the chunk holding `logical`.
    pub fn profile(&self, logical: u64) -> Option<u64> {
        self.lookup(logical)
            .map(|(_, c)| c.chunk_type & bg::PROFILE_MASK)
    }

    /// For a RAID5/6 chunk: `[logical, logical+len)` cut at strip boundaries, each piece
    /// with its whole row (every data strip in order, then P, then Q) at the same offset
    /// inside the strips, and the index of the piece's own strip in that row.
    pub fn map_rows(&self, logical: u64, len: u64) -> Result<Vec<RowPiece>> {
        let (start, c) = self
            .lookup(logical)
            .ok_or_else(|| Error::corrupt(logical, "logical address is not in any chunk"))?;
        let profile = c.chunk_type & bg::PROFILE_MASK;
        let nparity = match profile {
            bg::RAID5 => 1,
            bg::RAID6 => 2,
            _ => return Err(Error::corrupt(logical, "not a RAID5/6 chunk")),
        };
        if logical
            .checked_add(len)
            .is_none_or(|end| end > start + c.length)
        {
            return Err(Error::corrupt(
                logical,
                format!("range of {len} bytes crosses the end of its chunk"),
            ));
        }
        let n = c.stripes.len() as u64;
        let d = n - nparity;
        let mut out = Vec::new();
        let (mut cur, end) = (logical - start, logical - start + len);
        while cur < end {
            let stripe_nr = cur / STRIPE_LEN;
            let stripe_off = cur % STRIPE_LEN;
            let piece = (STRIPE_LEN - stripe_off).min(end - cur);
            let row = stripe_nr / d;
            let mut stripes = Vec::with_capacity(n as usize);
            for i in 0..n {
                let s = &c.stripes[((row + i) % n) as usize];
                stripes.push((
                    s.devid,
                    phys(logical, s.offset, row * STRIPE_LEN + stripe_off)?,
                ));
            }
            out.push(RowPiece {
                len: piece,
                target: (stripe_nr % d) as usize,
                nparity: nparity as usize,
                stripes,
            });
            cur += piece;
        }
        Ok(out)
    }

    /// Maps `[logical, logical+len)` in copy `mirror` to physical pieces. The range must lie
    /// within one chunk.
    pub fn map(&self, logical: u64, len: u64, mirror: usize) -> Result<Vec<PhysRange>> {
        let (start, c) = self
            .lookup(logical)
            .ok_or_else(|| Error::corrupt(logical, "logical address is not in any chunk"))?;
        // Checked: `len` comes from the caller and stripe offsets from the image.
        if logical
            .checked_add(len)
            .is_none_or(|end| end > start + c.length)
        {
            return Err(Error::corrupt(
                logical,
                format!("range of {len} bytes crosses the end of its chunk"),
            ));
        }
        let off = logical - start;
        let profile = c.chunk_type & bg::PROFILE_MASK;
        let n = c.stripes.len() as u64;
        match profile {
            0 | bg::DUP | bg::RAID1 | bg::RAID1C3 | bg::RAID1C4 => {
                let s = c
                    .stripes
                    .get(mirror)
                    .ok_or_else(|| Error::corrupt(logical, "no such mirror"))?;
                Ok(vec![PhysRange {
                    devid: s.devid,
                    physical: phys(logical, s.offset, off)?,
                    len,
                }])
            }
            bg::RAID0 | bg::RAID10 | bg::RAID5 | bg::RAID6 => {
                // Walk stripe by stripe: each 64 KiB strip lands on its own device slot.
                let mut out = Vec::new();
                let (mut cur, end) = (off, off + len);
                while cur < end {
                    let stripe_nr = cur / STRIPE_LEN;
                    let stripe_off = cur % STRIPE_LEN;
                    let piece = (STRIPE_LEN - stripe_off).min(end - cur);
                    let (slot, row) = match profile {
                        bg::RAID0 => (stripe_nr % n, stripe_nr / n),
                        bg::RAID10 => {
                            let f = n / 2;
                            ((stripe_nr % f) * 2 + mirror as u64 % 2, stripe_nr / f)
                        }
                        _ => {
                            let d = if profile == bg::RAID5 { n - 1 } else { n - 2 };
                            let row = stripe_nr / d;
                            ((row + stripe_nr % d) % n, row)
                        }
                    };
                    let s = &c.stripes[slot as usize];
                    out.push(PhysRange {
                        devid: s.devid,
                        physical: phys(logical, s.offset, row * STRIPE_LEN + stripe_off)?,
                        len: piece,
                    });
                    cur += piece;
                }
                Ok(out)
            }
            _ => Err(Error::corrupt(logical, "unknown chunk profile")),
        }
    }
}

/// `stripe_offset + off`: a hostile chunk item can put a stripe at the very end of the address
/// space, where the sum would overflow (a panic in debug builds, a wrong address in release).
fn phys(logical: u64, stripe_offset: u64, off: u64) -> Result<u64> {
    stripe_offset
        .checked_add(off)
        .ok_or_else(|| Error::corrupt(logical, "chunk stripe offset overflows"))
}
