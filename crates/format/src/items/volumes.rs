//! Chunk, device, dev-extent, block-group and free-space-info items.

use crate::bytes::{array, u16_at, u32_at, u64_at, u8_at};
use crate::error::Result;
use crate::invalid;

/// Block group / chunk type bits.
pub mod block_group {
    pub const DATA: u64 = 1 << 0;
    pub const SYSTEM: u64 = 1 << 1;
    pub const METADATA: u64 = 1 << 2;
    pub const RAID0: u64 = 1 << 3;
    pub const RAID1: u64 = 1 << 4;
    pub const DUP: u64 = 1 << 5;
    pub const RAID10: u64 = 1 << 6;
    pub const RAID5: u64 = 1 << 7;
    pub const RAID6: u64 = 1 << 8;
    pub const RAID1C3: u64 = 1 << 9;
    pub const RAID1C4: u64 = 1 << 10;
    pub const TYPE_MASK: u64 = DATA | SYSTEM | METADATA;
    pub const PROFILE_MASK: u64 = RAID0 | RAID1 | DUP | RAID10 | RAID5 | RAID6 | RAID1C3 | RAID1C4;

    pub fn describe(flags: u64) -> String {
        let mut parts = Vec::new();
        for (bit, name) in [(DATA, "DATA"), (SYSTEM, "SYSTEM"), (METADATA, "METADATA")] {
            if flags & bit != 0 {
                parts.push(name);
            }
        }
        let profile = match flags & PROFILE_MASK {
            0 => "single",
            RAID0 => "RAID0",
            RAID1 => "RAID1",
            DUP => "DUP",
            RAID10 => "RAID10",
            RAID5 => "RAID5",
            RAID6 => "RAID6",
            RAID1C3 => "RAID1C3",
            RAID1C4 => "RAID1C4",
            _ => "mixed-profiles",
        };
        format!("{}|{}", parts.join("|"), profile)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stripe {
    pub devid: u64,
    pub offset: u64,
    pub dev_uuid: [u8; 16],
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkItem {
    pub length: u64,
    pub owner: u64,
    pub stripe_len: u64,
    pub chunk_type: u64,
    pub io_align: u32,
    pub io_width: u32,
    pub sector_size: u32,
    pub num_stripes: u16,
    pub sub_stripes: u16,
    pub stripes: Vec<Stripe>,
}

impl ChunkItem {
    pub const fn size_for(num_stripes: usize) -> usize {
        48 + 32 * num_stripes
    }

    pub fn parse(b: &[u8]) -> Result<ChunkItem> {
        let num_stripes = u16_at(b, 44)?;
        if num_stripes == 0 {
            invalid!("chunk has no stripes");
        }
        if b.len() != Self::size_for(num_stripes as usize) {
            invalid!(
                "chunk item is {} bytes, {} stripes need {}",
                b.len(),
                num_stripes,
                Self::size_for(num_stripes as usize)
            );
        }
        let mut stripes = Vec::with_capacity(num_stripes as usize);
        for i in 0..num_stripes as usize {
            let o = 48 + 32 * i;
            stripes.push(Stripe {
                devid: u64_at(b, o)?,
                offset: u64_at(b, o + 8)?,
                dev_uuid: array(b, o + 16)?,
            });
        }
        Ok(ChunkItem {
            length: u64_at(b, 0)?,
            owner: u64_at(b, 8)?,
            stripe_len: u64_at(b, 16)?,
            chunk_type: u64_at(b, 24)?,
            io_align: u32_at(b, 32)?,
            io_width: u32_at(b, 36)?,
            sector_size: u32_at(b, 40)?,
            num_stripes,
            sub_stripes: u16_at(b, 46)?,
            stripes,
        })
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DevItem {
    pub devid: u64,
    pub total_bytes: u64,
    pub bytes_used: u64,
    pub io_align: u32,
    pub io_width: u32,
    pub sector_size: u32,
    pub dev_type: u64,
    pub generation: u64,
    pub start_offset: u64,
    pub dev_group: u32,
    pub seek_speed: u8,
    pub bandwidth: u8,
    pub uuid: [u8; 16],
    pub fsid: [u8; 16],
}

impl DevItem {
    pub const SIZE: usize = 98;

    pub fn parse(b: &[u8]) -> Result<DevItem> {
        Ok(DevItem {
            devid: u64_at(b, 0)?,
            total_bytes: u64_at(b, 8)?,
            bytes_used: u64_at(b, 16)?,
            io_align: u32_at(b, 24)?,
            io_width: u32_at(b, 28)?,
            sector_size: u32_at(b, 32)?,
            dev_type: u64_at(b, 36)?,
            generation: u64_at(b, 44)?,
            start_offset: u64_at(b, 52)?,
            dev_group: u32_at(b, 60)?,
            seek_speed: u8_at(b, 64)?,
            bandwidth: u8_at(b, 65)?,
            uuid: array(b, 66)?,
            fsid: array(b, 82)?,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevExtent {
    pub chunk_tree: u64,
    pub chunk_objectid: u64,
    pub chunk_offset: u64,
    pub length: u64,
    pub chunk_tree_uuid: [u8; 16],
}

impl DevExtent {
    pub fn parse(b: &[u8]) -> Result<DevExtent> {
        Ok(DevExtent {
            chunk_tree: u64_at(b, 0)?,
            chunk_objectid: u64_at(b, 8)?,
            chunk_offset: u64_at(b, 16)?,
            length: u64_at(b, 24)?,
            chunk_tree_uuid: array(b, 32)?,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockGroupItem {
    pub used: u64,
    pub chunk_objectid: u64,
    pub flags: u64,
}

impl BlockGroupItem {
    pub fn parse(b: &[u8]) -> Result<BlockGroupItem> {
        Ok(BlockGroupItem {
            used: u64_at(b, 0)?,
            chunk_objectid: u64_at(b, 8)?,
            flags: u64_at(b, 16)?,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FreeSpaceInfo {
    pub extent_count: u32,
    pub flags: u32,
}

impl FreeSpaceInfo {
    pub fn parse(b: &[u8]) -> Result<FreeSpaceInfo> {
        Ok(FreeSpaceInfo {
            extent_count: u32_at(b, 0)?,
            flags: u32_at(b, 4)?,
        })
    }
}
