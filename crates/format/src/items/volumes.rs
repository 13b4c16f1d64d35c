//! Chunk, device, dev-extent, block-group and free-space-info items.

use crate::bytes::{array, put_u16, put_u32, put_u64, put_u8, u16_at, u32_at, u64_at, u8_at};
use crate::error::Result;
use crate::invalid;

/// Type and profile bits of chunks and block groups (`BTRFS_BLOCK_GROUP_*`); no profile bit
/// means SINGLE.
pub mod block_group {
    /// Type: holds file data.
    pub const DATA: u64 = 1 << 0;
    /// Type: holds the chunk tree.
    pub const SYSTEM: u64 = 1 << 1;
    /// Type: holds all other tree blocks.
    pub const METADATA: u64 = 1 << 2;
    /// Profile: striped over devices, no redundancy.
    pub const RAID0: u64 = 1 << 3;
    /// Profile: two copies on different devices.
    pub const RAID1: u64 = 1 << 4;
    /// Profile: two copies on the same device.
    pub const DUP: u64 = 1 << 5;
    /// Profile: striped over mirrored pairs.
    pub const RAID10: u64 = 1 << 6;
    /// Profile: striped with one parity stripe.
    pub const RAID5: u64 = 1 << 7;
    /// Profile: striped with two parity stripes.
    pub const RAID6: u64 = 1 << 8;
    /// Profile: three copies on different devices.
    pub const RAID1C3: u64 = 1 << 9;
    /// Profile: four copies on different devices.
    pub const RAID1C4: u64 = 1 << 10;
    /// All type bits.
    pub const TYPE_MASK: u64 = DATA | SYSTEM | METADATA;
    /// All profile bits.
    pub const PROFILE_MASK: u64 = RAID0 | RAID1 | DUP | RAID10 | RAID5 | RAID6 | RAID1C3 | RAID1C4;

    /// `flags` as btrfs-progs prints them: the types joined by `|`, then the profile
    /// (`DATA|single`, `METADATA|DUP`).
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

/// One stripe of a chunk (`btrfs_stripe`): where a copy or a slice of the chunk is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stripe {
    /// The device holding the stripe.
    pub devid: u64,
    /// Physical start of the stripe on that device.
    pub offset: u64,
    /// UUID of that device.
    pub dev_uuid: [u8; 16],
}

impl Stripe {
    /// Appends the 32-byte stripe record.
    pub fn write_into(&self, out: &mut Vec<u8>) {
        put_u64(out, self.devid);
        put_u64(out, self.offset);
        out.extend_from_slice(&self.dev_uuid);
    }
}

/// A CHUNK_ITEM body (`btrfs_chunk`), key `(FIRST_CHUNK_TREE, CHUNK_ITEM, logical start)`:
/// how a range of logical addresses maps to device stripes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkItem {
    /// Logical size of the chunk.
    pub length: u64,
    /// Id of the tree referencing the chunk: always 2 (the extent tree).
    pub owner: u64,
    /// Length of one stripe: always 64 KiB.
    pub stripe_len: u64,
    /// Type and profile bits ([`block_group`]).
    pub chunk_type: u64,
    /// Optimal I/O alignment for the chunk (mkfs and the kernel write 64 KiB).
    pub io_align: u32,
    /// Optimal I/O width for the chunk (mkfs and the kernel write 64 KiB).
    pub io_width: u32,
    /// Minimal I/O size for the chunk: the filesystem's sectorsize.
    pub sector_size: u32,
    /// Number of stripes, as parsed (writing uses the length of `stripes`).
    pub num_stripes: u16,
    /// 2 for RAID10, 1 otherwise.
    pub sub_stripes: u16,
    /// Where the chunk lives on the devices.
    pub stripes: Vec<Stripe>,
}

impl ChunkItem {
    /// On-disk size of a chunk item with `num_stripes` stripes.
    pub const fn size_for(num_stripes: usize) -> usize {
        48 + 32 * num_stripes
    }

    /// Parses an item body; its length must match `num_stripes`.
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

    /// The item body (see [`ChunkItem::write_into`]).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(Self::size_for(self.stripes.len()));
        self.write_into(&mut out)?;
        Ok(out)
    }
}

/// A DEV_ITEM body (`btrfs_dev_item`), key `(DEV_ITEMS, DEV_ITEM, devid)` in the chunk tree,
/// and embedded in the superblock: one device of the filesystem.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DevItem {
    /// Device id (from 1); equals the key offset.
    pub devid: u64,
    /// Usable size of the device.
    pub total_bytes: u64,
    /// Sum of the lengths of the device's dev extents.
    pub bytes_used: u64,
    /// Optimal I/O alignment for the device (mkfs writes the sectorsize).
    pub io_align: u32,
    /// Optimal I/O width for the device (mkfs writes the sectorsize).
    pub io_width: u32,
    /// Minimal I/O size for the device: the sectorsize.
    pub sector_size: u32,
    /// Type and info about the device (unused: 0).
    pub dev_type: u64,
    /// Expected generation for the device (unused: 0).
    pub generation: u64,
    /// Starting byte of the partition on the device, for future stripe alignment (unused: 0).
    pub start_offset: u64,
    /// Grouping information for allocation decisions (unused: 0).
    pub dev_group: u32,
    /// Seek speed, 0-100 where 100 is fastest (unused: 0).
    pub seek_speed: u8,
    /// Bandwidth, 0-100 where 100 is fastest (unused: 0).
    pub bandwidth: u8,
    /// The device's UUID.
    pub uuid: [u8; 16],
    /// The filesystem's fsid (its metadata_uuid with METADATA_UUID).
    pub fsid: [u8; 16],
}

impl DevItem {
    /// Size of the item body.
    pub const SIZE: usize = 98;

    /// Parses an item body.
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

    /// Appends the 98-byte item body.
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

    /// The 98-byte item body.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::SIZE);
        self.write_into(&mut out);
        out
    }
}

/// A DEV_EXTENT body (`btrfs_dev_extent`), key `(devid, DEV_EXTENT, physical start)` in the
/// device tree: one stripe of a chunk, seen from the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevExtent {
    /// Always 3 (the chunk tree).
    pub chunk_tree: u64,
    /// Always 256 ([`FIRST_CHUNK_TREE`](crate::key::objectid::FIRST_CHUNK_TREE)).
    pub chunk_objectid: u64,
    /// Logical start of the chunk this stripe belongs to.
    pub chunk_offset: u64,
    /// Length of the stripe on the device.
    pub length: u64,
    /// UUID of the chunk tree.
    pub chunk_tree_uuid: [u8; 16],
}

impl DevExtent {
    /// Size of the item body.
    pub const SIZE: usize = 48;

    /// Parses an item body.
    pub fn parse(b: &[u8]) -> Result<DevExtent> {
        Ok(DevExtent {
            chunk_tree: u64_at(b, 0)?,
            chunk_objectid: u64_at(b, 8)?,
            chunk_offset: u64_at(b, 16)?,
            length: u64_at(b, 24)?,
            chunk_tree_uuid: array(b, 32)?,
        })
    }

    /// The 48-byte item body.
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

/// A BLOCK_GROUP_ITEM body (`btrfs_block_group_item`), key `(logical start, BLOCK_GROUP_ITEM,
/// length)`: the block group of one chunk (same start, length and flags) and how much of it
/// is allocated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockGroupItem {
    /// Bytes allocated in the block group (its extents' lengths).
    pub used: u64,
    /// Always 256 ([`FIRST_CHUNK_TREE`](crate::key::objectid::FIRST_CHUNK_TREE)).
    pub chunk_objectid: u64,
    /// Type and profile bits, as in the chunk ([`block_group`]).
    pub flags: u64,
}

impl BlockGroupItem {
    /// Size of the item body.
    pub const SIZE: usize = 24;

    /// Parses an item body.
    pub fn parse(b: &[u8]) -> Result<BlockGroupItem> {
        Ok(BlockGroupItem {
            used: u64_at(b, 0)?,
            chunk_objectid: u64_at(b, 8)?,
            flags: u64_at(b, 16)?,
        })
    }

    /// The 24-byte item body.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::SIZE);
        put_u64(&mut out, self.used);
        put_u64(&mut out, self.chunk_objectid);
        put_u64(&mut out, self.flags);
        out
    }
}

/// A FREE_SPACE_INFO body (`btrfs_free_space_info`), key `(block group start,
/// FREE_SPACE_INFO, length)` in the free space tree: how the block group's free space is
/// described.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FreeSpaceInfo {
    /// Number of free extents in the block group.
    pub extent_count: u32,
    /// [`FREE_SPACE_USING_BITMAPS`] or 0.
    pub flags: u32,
}

/// FREE_SPACE_INFO flag: the block group's free space is described by bitmaps.
pub const FREE_SPACE_USING_BITMAPS: u32 = 1 << 0;

impl FreeSpaceInfo {
    /// Size of the item body.
    pub const SIZE: usize = 8;

    /// The 8-byte item body.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::SIZE);
        put_u32(&mut out, self.extent_count);
        put_u32(&mut out, self.flags);
        out
    }

    /// Parses an item body.
    pub fn parse(b: &[u8]) -> Result<FreeSpaceInfo> {
        Ok(FreeSpaceInfo {
            extent_count: u32_at(b, 0)?,
            flags: u32_at(b, 4)?,
        })
    }
}
