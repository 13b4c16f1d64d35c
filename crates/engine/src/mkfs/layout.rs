//! Where the first chunks go: their sizes (mkfs.btrfs's chunk sizing policy for a fresh
//! single-device filesystem), their logical and physical placement, and a tree block
//! allocator that keeps clear of the superblock mirrors.

use super::Profile;
use crate::error::{Error, Result};
use oleo_format::items::block_group;
use oleo_format::superblock::{mirror_offset, SUPER_INFO_SIZE};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The stripe length every chunk uses; chunk sizes are kept multiples of it.
pub(crate) const STRIPE_LEN: u64 = 64 * 1024;
/// Nothing is allocated in the first MiB of a device (boot area, primary superblock).
pub(crate) const RESERVED_START: u64 = MIB;
/// Superblock copies the format defines.
pub(crate) const SUPER_MIRRORS: usize = 3;

/// One chunk (and its block group): logical range, type and profile, and the physical start
/// of each stripe on device 1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ChunkPlan {
    /// Block group type and profile bits.
    pub flags: u64,
    pub logical: u64,
    pub length: u64,
    /// Bytes each stripe occupies on the device (== length for single and DUP).
    pub stripe_size: u64,
    pub stripes: Vec<u64>,
}

impl ChunkPlan {
    pub fn end(&self) -> u64 {
        self.logical + self.length
    }

    pub fn contains(&self, logical: u64) -> bool {
        (self.logical..self.end()).contains(&logical)
    }

    /// Logical ranges the kernel keeps unallocated because a superblock copy lives in
    /// them: for each stripe covering a mirror, the 64 KiB stripe unit holding it.
    pub fn super_excluded(&self, device_size: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for m in 0..SUPER_MIRRORS {
            let sb = mirror_offset(m);
            if sb + SUPER_INFO_SIZE as u64 > device_size {
                break;
            }
            for &phys in &self.stripes {
                if (phys..phys + self.stripe_size).contains(&sb) {
                    let unit = (sb - phys) / STRIPE_LEN * STRIPE_LEN;
                    out.push((self.logical + unit, STRIPE_LEN));
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

fn copies(profile: Profile) -> u64 {
    match profile {
        Profile::Single => 1,
        Profile::Dup => 2,
    }
}

/// Per-stripe size of a new chunk, following mkfs.btrfs / the kernel's regular policy:
/// profile-dependent targets, never more than 10% of the filesystem, never tiny stripes.
/// Chunks without a profile bit (single) keep the generic 8 MiB target.
pub(crate) fn stripe_size(kind: u64, profile: Profile, total_bytes: u64) -> u64 {
    let (mut stripe, mut max_chunk, min_stripe) = match profile {
        Profile::Single => (8 * MIB, 32 * MIB, MIB),
        Profile::Dup if kind == block_group::SYSTEM => (8 * MIB, 16 * MIB, MIB),
        Profile::Dup if kind == block_group::DATA => (GIB, 10 * GIB, 64 * MIB),
        Profile::Dup => {
            let max = if total_bytes > 50 * GIB {
                GIB
            } else {
                256 * MIB
            };
            (max, max, 32 * MIB)
        }
    };
    max_chunk = max_chunk.min(total_bytes / 10);
    if stripe > max_chunk {
        stripe = max_chunk / copies(profile) / STRIPE_LEN * STRIPE_LEN;
    }
    stripe.max(min_stripe) / STRIPE_LEN * STRIPE_LEN
}

fn profile_bits(profile: Profile) -> u64 {
    match profile {
        Profile::Single => 0,
        Profile::Dup => block_group::DUP,
    }
}

/// The three chunks of a fresh filesystem: SYSTEM (chunk tree), METADATA (every other tree),
/// DATA (empty). SYSTEM follows the metadata profile, as mkfs.btrfs does. All are placed
/// back to back after the reserved first MiB, physically and logically.
pub(crate) fn plan_chunks(
    total_bytes: u64,
    metadata: Profile,
    data: Profile,
) -> Result<Vec<ChunkPlan>> {
    let wanted = [
        (block_group::SYSTEM, metadata),
        (block_group::METADATA, metadata),
        (block_group::DATA, data),
    ];
    let mut phys = RESERVED_START;
    let mut logical = RESERVED_START;
    let mut chunks = Vec::new();
    for (kind, profile) in wanted {
        let size = stripe_size(kind, profile, total_bytes);
        let mut stripes = Vec::new();
        for _ in 0..copies(profile) {
            stripes.push(phys);
            phys += size;
        }
        chunks.push(ChunkPlan {
            flags: kind | profile_bits(profile),
            logical,
            length: size,
            stripe_size: size,
            stripes,
        });
        logical += size;
    }
    if phys > total_bytes {
        return Err(Error::InvalidArgument(format!(
            "device too small: the initial chunks need {} bytes ({} MiB), the filesystem is {} bytes",
            phys,
            phys.div_ceil(MIB),
            total_bytes
        )));
    }
    Ok(chunks)
}

/// Hands out nodesize blocks from one chunk, lowest address first, skipping the
/// superblock ranges.
pub(crate) struct BlockAllocator {
    next: u64,
    end: u64,
    nodesize: u64,
    excluded: Vec<(u64, u64)>,
}

impl BlockAllocator {
    pub fn new(chunk: &ChunkPlan, nodesize: u32, device_size: u64) -> BlockAllocator {
        BlockAllocator {
            next: chunk.logical,
            end: chunk.end(),
            nodesize: nodesize as u64,
            excluded: chunk.super_excluded(device_size),
        }
    }

    pub fn alloc(&mut self) -> Result<u64> {
        loop {
            let start = self.next;
            let end = start + self.nodesize;
            if end > self.end {
                return Err(Error::InvalidArgument(
                    "the metadata chunk is too small for the initial trees".into(),
                ));
            }
            if let Some(&(s, l)) = self
                .excluded
                .iter()
                .find(|&&(s, l)| start < s + l && s < end)
            {
                self.next = (s + l).div_ceil(self.nodesize) * self.nodesize;
                continue;
            }
            self.next = end;
            return Ok(start);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_sizes_match_mkfs_btrfs() {
        // Values read from mkfs.btrfs v6.14 images of these sizes.
        let meta = |total| stripe_size(block_group::METADATA, Profile::Dup, total);
        assert_eq!(meta(128 * MIB), 32 * MIB);
        assert_eq!(meta(256 * MIB), 32 * MIB);
        assert_eq!(meta(GIB), 53673984);
        assert_eq!(meta(10 * GIB), 256 * MIB);
        assert_eq!(meta(100 * GIB), GIB);
        assert_eq!(
            stripe_size(block_group::SYSTEM, Profile::Dup, 256 * MIB),
            8 * MIB
        );
        assert_eq!(
            stripe_size(block_group::DATA, Profile::Single, 10 * GIB),
            8 * MIB
        );
        assert_eq!(stripe_size(block_group::DATA, Profile::Dup, GIB), 64 * MIB);
    }

    #[test]
    fn allocator_skips_the_superblock_mirror() {
        let chunk = ChunkPlan {
            flags: block_group::METADATA,
            logical: 100 * MIB,
            length: 32 * MIB,
            stripe_size: 32 * MIB,
            stripes: vec![64 * MIB],
        };
        let mut a = BlockAllocator::new(&chunk, 16384, GIB);
        // The mirror at physical 64 MiB is the chunk's first stripe unit.
        assert_eq!(a.alloc().unwrap(), 100 * MIB + STRIPE_LEN);
        assert!(plan_chunks(16 * MIB, Profile::Dup, Profile::Single).is_err());
    }
}
