//! Chunk, device, dev-extent, block-group and free-space-info items.

use crate::bytes::{array, put_u16, put_u32, put_u64, put_u8, u16_at, u32_at, u64_at, u8_at};
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

impl Stripe {
    pub fn write_into(&self, out: &mut Vec<u8>) {
        put_u64(out, self.devid);
        put_u64(out, self.offset);
        out.extend_from_slice(&self.dev_uuid);
    }
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

    /// Appends the item. `num_stripes` is written as the length of `stripes` (the field is
    /// only there for parsing); more than u16::MAX stripes is an error.
    pub fn write_into(&self, out: &mut Vec<u8>) -> Result<()> {
        let Ok(n) = u16::try_from(self.stripes.len()) else {
            invalid!("chunk with {} stripes", self.stripes.len());
        };
        put_u64(out, self.length);
        put_u64(out, self.owner);
        put_u64(out, self.stripe_len);
        put_u64(out, self.chunk_type);
        put_u32(out, self.io_align);
        put_u32(out, self.io_width);
        put_u32(out, self.sector_size);
        put_u16(out, n);
        put_u16(out, self.sub_stripes);
        for s in &self.stripes {
            s.write_into(out);
        }
        Ok(())
    }

    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(Self::size_for(self.stripes.len()));
        self.write_into(&mut out)?;
        Ok(out)
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

    pub fn write_into(&self, out: &mut Vec<u8>) {
        put_u64(out, self.devid);
        put_u64(out, self.total_bytes);
        put_u64(out, self.bytes_used);
        put_u32(out, self.io_align);
        put_u32(out, self.io_width);
        put_u32(out, self.sector_size);
        put_u64(out, self.dev_type);
        put_u64(out, self.generation);
        put_u64(out, self.start_offset);
        put_u32(out, self.dev_group);
        put_u8(out, self.seek_speed);
        put_u8(out, self.bandwidth);
        out.extend_from_slice(&self.uuid);
        out.extend_from_slice(&self.fsid);
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::SIZE);
        self.write_into(&mut out);
        out
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
    pub const SIZE: usize = 48;

    pub fn parse(b: &[u8]) -> Result<DevExtent> {
        Ok(DevExtent {
            chunk_tree: u64_at(b, 0)?,
            chunk_objectid: u64_at(b, 8)?,
            chunk_offset: u64_at(b, 16)?,
            length: u64_at(b, 24)?,
            chunk_tree_uuid: array(b, 32)?,
        })
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::SIZE);
        put_u64(&mut out, self.chunk_tree);
        put_u64(&mut out, self.chunk_objectid);
        put_u64(&mut out, self.chunk_offset);
        put_u64(&mut out, self.length);
        out.extend_from_slice(&self.chunk_tree_uuid);
        out
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockGroupItem {
    pub used: u64,
    pub chunk_objectid: u64,
    pub flags: u64,
}

impl BlockGroupItem {
    pub const SIZE: usize = 24;

    pub fn parse(b: &[u8]) -> Result<BlockGroupItem> {
        Ok(BlockGroupItem {
            used: u64_at(b, 0)?,
            chunk_objectid: u64_at(b, 8)?,
            flags: u64_at(b, 16)?,
        })
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::SIZE);
        put_u64(&mut out, self.used);
        put_u64(&mut out, self.chunk_objectid);
        put_u64(&mut out, self.flags);
        out
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FreeSpaceInfo {
    pub extent_count: u32,
    pub flags: u32,
}

/// FREE_SPACE_INFO flag: the block group's free space is described by bitmaps.
pub const FREE_SPACE_USING_BITMAPS: u32 = 1 << 0;

impl FreeSpaceInfo {
    pub const SIZE: usize = 8;

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::SIZE);
        put_u32(&mut out, self.extent_count);
        put_u32(&mut out, self.flags);
        out
    }

    pub fn parse(b: &[u8]) -> Result<FreeSpaceInfo> {
        Ok(FreeSpaceInfo {
            extent_count: u32_at(b, 0)?,
            flags: u32_at(b, 4)?,
        })
    }
}
