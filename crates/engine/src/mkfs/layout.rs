//! Where the first chunks go, on one device or several: their sizes and placement, as
//! mkfs.btrfs 6.2 makes them, and a tree block allocator that keeps clear of the superblock
//! mirrors.
//!
//! mkfs.btrfs does not plan its chunks: it builds a minimal filesystem on the first device
//! in temporary SINGLE chunks (a 4 MiB SYSTEM chunk at 1 MiB, then an 8 MiB METADATA and an
//! 8 MiB DATA chunk), adds the other devices, allocates one chunk of each type in the
//! requested profiles with its own allocator (kernel-shared/volumes.c `btrfs_alloc_chunk`,
//! not the kernel's), moves the trees there and finally drops the temporary chunks that
//! are left empty. A SINGLE profile keeps its temporary chunk. [`plan_chunks`] replays
//! those steps on a model of the devices, so the chunk and device trees come out as
//! mkfs.btrfs writes them for the same device sizes and profiles: the same logical
//! addresses, lengths, stripe devices and offsets (the first device keeps the holes the
//! temporary chunks leave behind, and the first new chunk starts at logical 21 MiB).
//!
//! Deliberate differences from mkfs.btrfs's trees: the temporary 4 MiB SYSTEM chunk, which
//! stays with `-m single`, carries sub_stripes 0 in mkfs.btrfs's chunk item and 1 here, as
//! every other non-RAID10 chunk (the kernel takes the value from its own table anyway); the
//! device tree also holds a zeroed DEV_STATS item per device, which mkfs.btrfs leaves for
//! the kernel to add; and tree blocks sit where oleo's planner puts them inside the chunks.

use super::Profile;
use crate::error::{Error, Result};
use oleo_format::items::block_group as bg;
use oleo_format::superblock::mirror_offset;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The stripe length every chunk uses; chunk sizes are kept multiples of it.
pub(crate) const STRIPE_LEN: u64 = 64 * 1024;
/// Nothing is allocated in the first MiB of a device (boot area, primary superblock).
pub(crate) const RESERVED_START: u64 = MIB;
/// Superblock copies the format defines.
pub(crate) const SUPER_MIRRORS: usize = 3;
/// The temporary SYSTEM chunk mkfs.btrfs starts with (`BTRFS_MKFS_SYSTEM_GROUP_SIZE`).
const TEMP_SYSTEM_SIZE: u64 = 4 * MIB;
/// Size of the superblock's sys_chunk_array (for the SYSTEM chunk stripe limit).
const SYS_CHUNK_ARRAY_SIZE: u64 = 2048;

/// A profile's row of the kernel's `btrfs_raid_array` (the fields mkfs needs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RaidAttr {
    /// Stripes per device in one chunk (2 for DUP).
    pub dev_stripes: u64,
    /// Devices the profile needs at least.
    pub devs_min: u64,
    /// Stripes mirroring each other within a RAID10 stripe pair (1 elsewhere); the value
    /// chunk items carry.
    pub sub_stripes: u64,
    /// Copies of each block.
    pub ncopies: u64,
    /// Parity stripes of a row (RAID5: 1, RAID6: 2).
    pub nparity: u64,
    /// Devices that may fail without losing data.
    pub tolerated_failures: u64,
}

/// The raid attribute row of `profile`.
pub(crate) fn raid_attr(profile: Profile) -> RaidAttr {
    let a = |dev_stripes, devs_min, sub_stripes, ncopies, nparity, tolerated_failures| RaidAttr {
        dev_stripes,
        devs_min,
        sub_stripes,
        ncopies,
        nparity,
        tolerated_failures,
    };
    match profile {
        Profile::Single => a(1, 1, 1, 1, 0, 0),
        Profile::Dup => a(2, 1, 1, 2, 0, 0),
        Profile::Raid0 => a(1, 1, 1, 1, 0, 0),
        Profile::Raid1 => a(1, 2, 1, 2, 0, 1),
        Profile::Raid1c3 => a(1, 3, 1, 3, 0, 2),
        Profile::Raid1c4 => a(1, 4, 1, 4, 0, 3),
        Profile::Raid10 => a(1, 2, 2, 2, 0, 1),
        Profile::Raid5 => a(1, 2, 1, 1, 1, 1),
        Profile::Raid6 => a(1, 3, 1, 1, 2, 2),
    }
}

/// The profile of block group `flags` (its profile bits; none is SINGLE).
pub(crate) fn profile_of(flags: u64) -> Profile {
    match flags & bg::PROFILE_MASK {
        bg::DUP => Profile::Dup,
        bg::RAID0 => Profile::Raid0,
        bg::RAID1 => Profile::Raid1,
        bg::RAID1C3 => Profile::Raid1c3,
        bg::RAID1C4 => Profile::Raid1c4,
        bg::RAID10 => Profile::Raid10,
        bg::RAID5 => Profile::Raid5,
        bg::RAID6 => Profile::Raid6,
        _ => Profile::Single,
    }
}

/// One stripe of a planned chunk: the device and the physical start there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StripePlan {
    pub devid: u64,
    pub offset: u64,
}

/// One chunk (and its block group): logical range, type and profile, and its stripes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ChunkPlan {
    /// Block group type and profile bits.
    pub flags: u64,
    pub logical: u64,
    pub length: u64,
    /// Bytes each stripe occupies on its device: the length of each DEV_EXTENT.
    pub stripe_size: u64,
    pub stripes: Vec<StripePlan>,
}

impl ChunkPlan {
    pub fn end(&self) -> u64 {
        self.logical + self.length
    }

    pub fn contains(&self, logical: u64) -> bool {
        (self.logical..self.end()).contains(&logical)
    }

    pub fn profile(&self) -> Profile {
        profile_of(self.flags)
    }

    /// Stripes holding data in one row (`calc_data_stripes`): the chunk length divided by
    /// the stripe size.
    pub fn data_stripes(&self) -> u64 {
        let a = raid_attr(self.profile());
        (self.stripes.len() as u64 - a.nparity) / a.ncopies
    }

    /// Logical ranges the kernel keeps unallocated because a superblock copy lives in them
    /// (`exclude_super_stripes` through `btrfs_rmap_block`): for every stripe that covers
    /// a mirror offset (on any device: they are the same everywhere), the logical 64 KiB
    /// stripe unit mapped there, or the whole row of a RAID5/6 chunk.
    pub fn super_excluded(&self) -> Vec<(u64, u64)> {
        let n = self.stripes.len() as u64;
        let a = raid_attr(self.profile());
        let parity = a.nparity > 0;
        let unit = if parity {
            self.data_stripes() * STRIPE_LEN
        } else {
            STRIPE_LEN
        };
        let mut out = Vec::new();
        for m in 0..SUPER_MIRRORS {
            let sb = mirror_offset(m);
            for (i, s) in self.stripes.iter().enumerate() {
                if !(s.offset..s.offset + self.stripe_size).contains(&sb) {
                    continue;
                }
                let mut nr = (sb - s.offset) / STRIPE_LEN;
                let within = (sb - s.offset) % STRIPE_LEN;
                if matches!(self.profile(), Profile::Raid0 | Profile::Raid10) {
                    nr = (nr * n + i as u64) / a.sub_stripes;
                }
                let start = self.logical + nr * unit + within;
                let len = unit.min(self.end().saturating_sub(start));
                if len > 0 {
                    out.push((start, len));
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Where the bytes `[logical, logical + len)` are written (every copy), for profiles
    /// without parity. The range must not cross a 64 KiB stripe unit of a striped profile
    /// (tree blocks of at most 64 KiB placed at multiples of their size never do).
    pub fn copies(&self, logical: u64, len: u64) -> Result<Vec<StripePlan>> {
        let off = logical - self.logical;
        let nr = off / STRIPE_LEN;
        let within = off % STRIPE_LEN;
        let n = self.stripes.len() as u64;
        let striped = |first: u64, count: u64, row: u64| -> Result<Vec<StripePlan>> {
            if within + len > STRIPE_LEN {
                return Err(Error::InvalidArgument(format!(
                    "block {logical} (+{len}) crosses a stripe boundary of chunk {}",
                    self.logical
                )));
            }
            Ok(self.stripes[first as usize..(first + count) as usize]
                .iter()
                .map(|s| StripePlan {
                    devid: s.devid,
                    offset: s.offset + row * STRIPE_LEN + within,
                })
                .collect())
        };
        match self.profile() {
            Profile::Raid0 => striped(nr % n, 1, nr / n),
            Profile::Raid10 => {
                let pairs = n / 2;
                striped((nr % pairs) * 2, 2, nr / pairs)
            }
            Profile::Raid5 | Profile::Raid6 => Err(Error::InvalidArgument(
                "RAID5/6 chunks are written a row at a time".into(),
            )),
            Profile::Single
            | Profile::Dup
            | Profile::Raid1
            | Profile::Raid1c3
            | Profile::Raid1c4 => Ok(self
                .stripes
                .iter()
                .map(|s| StripePlan {
                    devid: s.devid,
                    offset: s.offset + off,
                })
                .collect()),
        }
    }

    /// RAID5/6: the device slot of data stripe `k` of `row`, and of P (k = data stripes)
    /// and Q (k = data stripes + 1): the slots rotate by one each row.
    pub fn parity_slot(&self, row: u64, k: u64) -> StripePlan {
        let n = self.stripes.len() as u64;
        let s = self.stripes[((row + k) % n) as usize];
        StripePlan {
            devid: s.devid,
            offset: s.offset + row * STRIPE_LEN,
        }
    }
}

/// One device of the model: its size and the dev extents allocated on it.
#[derive(Clone, Debug)]
struct SimDevice {
    devid: u64,
    total_bytes: u64,
    /// (start, length), sorted by start.
    extents: Vec<(u64, u64)>,
}

impl SimDevice {
    /// Free bytes from 1 MiB to the end (`btrfs_device_avail_bytes`): all holes together.
    fn avail(&self) -> u64 {
        let used: u64 = self.extents.iter().map(|e| e.1).sum();
        self.total_bytes.saturating_sub(RESERVED_START + used)
    }

    /// The first hole from 1 MiB on that holds `len` bytes (`find_free_dev_extent`).
    fn first_fit(&self, len: u64) -> Option<u64> {
        let mut start = RESERVED_START;
        for &(s, l) in &self.extents {
            if s > start && s - start >= len {
                return Some(start);
            }
            start = start.max(s + l);
        }
        (self.total_bytes > start && self.total_bytes - start >= len).then_some(start)
    }

    fn insert(&mut self, start: u64, len: u64) {
        let at = self.extents.partition_point(|e| e.0 < start);
        self.extents.insert(at, (start, len));
    }

    fn remove(&mut self, start: u64) {
        self.extents.retain(|e| e.0 != start);
    }
}

/// The state mkfs.btrfs's allocator works on.
struct Sim {
    /// Indexed by devid - 1.
    devices: Vec<SimDevice>,
    /// `fs_devices->devices`: the order devices are tried in (indexes into `devices`). A
    /// device added later goes to the front; a device that takes a stripe moves there too.
    order: Vec<usize>,
    /// The superblock's total_bytes (sum of the devices added so far).
    total_bytes: u64,
    /// `BTRFS_MAX_DEVS` for this nodesize: stripes a chunk item in a leaf can hold.
    max_devs: u64,
    chunks: Vec<ChunkPlan>,
}

/// Sizing of one allocation (`struct alloc_chunk_ctl`).
struct Ctl {
    num_stripes: u64,
    min_stripes: u64,
    stripe_size: u64,
    min_stripe_size: u64,
    max_chunk_size: u64,
}

impl Sim {
    /// The chunk's logical size for `stripe_size` and `num_stripes` (`chunk_bytes_by_type`).
    fn chunk_bytes(profile: Profile, stripe_size: u64, num_stripes: u64) -> u64 {
        let a = raid_attr(profile);
        match profile {
            Profile::Dup | Profile::Raid1 | Profile::Raid1c3 | Profile::Raid1c4 => stripe_size,
            Profile::Raid10 => stripe_size * (num_stripes / a.sub_stripes),
            Profile::Raid5 | Profile::Raid6 => stripe_size * (num_stripes - a.nparity),
            Profile::Single | Profile::Raid0 => stripe_size * num_stripes,
        }
    }

    fn ctl(&self, flags: u64) -> Ctl {
        let profile = profile_of(flags);
        let a = raid_attr(profile);
        let mut c = Ctl {
            num_stripes: a.dev_stripes,
            min_stripes: a.devs_min,
            stripe_size: 8 * MIB,
            min_stripe_size: MIB,
            max_chunk_size: 32 * MIB,
        };
        let mut max_stripes = 0;
        // Chunks without a profile bit keep the generic sizes above.
        if flags & bg::PROFILE_MASK != 0 {
            if flags & bg::SYSTEM != 0 {
                c.max_chunk_size = 16 * MIB;
                max_stripes = (SYS_CHUNK_ARRAY_SIZE - 2 * 17 - 2 * 80) / 32 + 1;
            } else if flags & bg::DATA != 0 {
                c.stripe_size = GIB;
                c.max_chunk_size = 10 * GIB;
                c.min_stripe_size = 64 * MIB;
                max_stripes = self.max_devs;
            } else {
                // total_rw_bytes: every device added so far, as total_bytes.
                c.max_chunk_size = if self.total_bytes > 50 * GIB {
                    GIB
                } else {
                    256 * MIB
                };
                c.stripe_size = c.max_chunk_size;
                c.min_stripe_size = 32 * MIB;
                max_stripes = self.max_devs;
            }
        }
        // Never more than 10% of the filesystem in one chunk.
        c.max_chunk_size = c.max_chunk_size.min(self.total_bytes / 10);
        let total_devs = self.devices_added() as u64;
        match profile {
            Profile::Dup => c.min_stripes = 2,
            Profile::Raid1 | Profile::Raid1c3 | Profile::Raid1c4 => {
                c.num_stripes = c.min_stripes.min(total_devs)
            }
            Profile::Raid0 | Profile::Raid10 | Profile::Raid5 | Profile::Raid6 => {
                c.num_stripes = max_stripes.min(total_devs);
                if profile == Profile::Raid10 {
                    c.num_stripes &= !1;
                }
            }
            Profile::Single => {}
        }
        c
    }

    fn devices_added(&self) -> usize {
        self.order.len()
    }

    fn decide_stripe_size(profile: Profile, c: &mut Ctl) {
        if Self::chunk_bytes(profile, c.stripe_size, c.num_stripes) > c.max_chunk_size {
            // mkfs.btrfs divides by the number of stripes whatever the profile, so a RAID1
            // chunk at the 10% limit is half of it.
            c.stripe_size = c.max_chunk_size / c.num_stripes / STRIPE_LEN * STRIPE_LEN;
        }
        c.stripe_size = c.stripe_size.max(c.min_stripe_size) / STRIPE_LEN * STRIPE_LEN;
    }

    /// One chunk of type and profile `flags`, as `btrfs_alloc_chunk` makes it.
    fn alloc_chunk(&mut self, flags: u64) -> Result<()> {
        let profile = profile_of(flags);
        let dup = profile == Profile::Dup;
        let mut c = self.ctl(flags);
        let no_space = || {
            Error::InvalidArgument(format!(
                "the devices are too small: not enough free space to allocate the {} chunk",
                bg::describe(flags)
            ))
        };
        if c.num_stripes < c.min_stripes {
            return Err(no_space());
        }
        let mut looped = false;
        let taken = loop {
            Self::decide_stripe_size(profile, &mut c);
            let min_free = c.stripe_size * if dup { 2 } else { 1 };
            // Devices are taken in list order; each one taken goes to the front of the
            // private list, so the last one taken gets stripe 0.
            let mut taken: Vec<usize> = Vec::new();
            let mut max_avail = 0;
            let mut index = 0;
            let mut pos = 0;
            while index < c.num_stripes && pos < self.order.len() {
                let dev = self.order[pos];
                let avail = self.devices[dev].avail();
                if avail >= min_free {
                    self.order.remove(pos);
                    taken.insert(0, dev);
                    index += if dup { 2 } else { 1 };
                } else {
                    max_avail = max_avail.max(avail);
                    pos += 1;
                }
            }
            if index >= c.num_stripes {
                break taken;
            }
            // Back to the front of the list, in the private list's order.
            for (i, dev) in taken.into_iter().enumerate() {
                self.order.insert(i, dev);
            }
            if index >= c.min_stripes {
                c.num_stripes = index;
                if profile == Profile::Raid10 {
                    c.num_stripes -= c.num_stripes % 2;
                }
                looped = true;
                continue;
            }
            if !looped && max_avail > 0 {
                looped = true;
                c.stripe_size = if dup { max_avail / 2 } else { max_avail };
                continue;
            }
            return Err(no_space());
        };
        self.create_chunk(flags, &c, taken)
    }

    /// `create_chunk`: the stripes, in the private list's order, each at the first hole of
    /// its device that fits; both DUP stripes on the same device.
    fn create_chunk(&mut self, flags: u64, c: &Ctl, mut taken: Vec<usize>) -> Result<()> {
        let profile = profile_of(flags);
        let dup = profile == Profile::Dup;
        let logical = self.chunks.iter().map(ChunkPlan::end).max().unwrap_or(0);
        let mut stripes = Vec::new();
        for index in 0..c.num_stripes {
            let dev = *taken.first().ok_or_else(|| {
                Error::InvalidArgument("chunk allocation ran out of devices".into())
            })?;
            if !dup || index == c.num_stripes - 1 {
                taken.remove(0);
                self.order.insert(0, dev);
            }
            let d = &mut self.devices[dev];
            let offset = d.first_fit(c.stripe_size).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "device {} is too small: no hole of {} bytes for the {} chunk",
                    d.devid,
                    c.stripe_size,
                    bg::describe(flags)
                ))
            })?;
            d.insert(offset, c.stripe_size);
            stripes.push(StripePlan {
                devid: d.devid,
                offset,
            });
        }
        self.chunks.push(ChunkPlan {
            flags,
            logical,
            length: Self::chunk_bytes(profile, c.stripe_size, c.num_stripes),
            stripe_size: c.stripe_size,
            stripes,
        });
        Ok(())
    }

    fn remove_chunk(&mut self, at: usize) {
        let c = self.chunks.remove(at);
        for s in &c.stripes {
            self.devices[(s.devid - 1) as usize].remove(s.offset);
        }
    }
}

/// The initial chunks for devices of `device_sizes` bytes (devid i + 1 for index i), as
/// mkfs.btrfs 6.2 leaves them: SYSTEM and METADATA in the metadata profile, DATA in the
/// data profile. Sorted by logical address.
pub(crate) fn plan_chunks(
    device_sizes: &[u64],
    nodesize: u32,
    metadata: Profile,
    data: Profile,
) -> Result<Vec<ChunkPlan>> {
    let first = *device_sizes
        .first()
        .ok_or_else(|| Error::InvalidArgument("no device given".into()))?;
    let leaf_data = nodesize as u64 - 101;
    let mut sim = Sim {
        devices: device_sizes
            .iter()
            .enumerate()
            .map(|(i, &total_bytes)| SimDevice {
                devid: i as u64 + 1,
                total_bytes,
                extents: Vec::new(),
            })
            .collect(),
        order: vec![0],
        total_bytes: first,
        max_devs: (leaf_data - 25 - 80) / 32 + 1,
        chunks: Vec::new(),
    };
    let too_small = || {
        Error::InvalidArgument(format!(
            "the first device is too small: {first} bytes, the temporary chunks alone need {}",
            RESERVED_START + TEMP_SYSTEM_SIZE + 16 * MIB
        ))
    };
    if first < RESERVED_START + TEMP_SYSTEM_SIZE {
        return Err(too_small());
    }
    // make_btrfs: the temporary SYSTEM chunk, mapped 1:1 at 1 MiB on the first device.
    sim.devices[0].insert(RESERVED_START, TEMP_SYSTEM_SIZE);
    sim.chunks.push(ChunkPlan {
        flags: bg::SYSTEM,
        logical: RESERVED_START,
        length: TEMP_SYSTEM_SIZE,
        stripe_size: TEMP_SYSTEM_SIZE,
        stripes: vec![StripePlan {
            devid: 1,
            offset: RESERVED_START,
        }],
    });
    // The temporary METADATA and DATA chunks, on the first device alone.
    sim.alloc_chunk(bg::METADATA)?;
    sim.alloc_chunk(bg::DATA)?;
    // The other devices, each one to the front of the allocation order.
    for (i, &size) in device_sizes.iter().enumerate().skip(1) {
        sim.order.insert(0, i);
        sim.total_bytes += size;
    }
    // The chunks in the requested profiles; SINGLE keeps the temporary one.
    if metadata != Profile::Single {
        sim.alloc_chunk(bg::SYSTEM | metadata.bits())?;
        sim.alloc_chunk(bg::METADATA | metadata.bits())?;
    }
    if data != Profile::Single {
        sim.alloc_chunk(bg::DATA | data.bits())?;
    }
    // The temporary chunks are left empty once the trees moved: gone.
    let temporary = [
        (bg::SYSTEM, metadata),
        (bg::METADATA, metadata),
        (bg::DATA, data),
    ];
    for (kind, profile) in temporary {
        if profile != Profile::Single {
            if let Some(at) = sim.chunks.iter().position(|c| c.flags == kind) {
                sim.remove_chunk(at);
            }
        }
    }
    let mut chunks = sim.chunks;
    chunks.sort_by_key(|c| c.logical);
    Ok(chunks)
}

/// Bytes each device needs at least (`btrfs_min_dev_size`): the reserved MiB, the
/// temporary chunks, and chunks of the smallest sizes in the requested profiles.
pub(crate) fn min_device_size(metadata: Profile, data: Profile) -> u64 {
    let mut meta = if metadata == Profile::Single {
        16 * MIB
    } else {
        40 * MIB
    };
    if metadata == Profile::Dup {
        meta *= 2;
    }
    let mut dat = if data == Profile::Single {
        8 * MIB
    } else {
        64 * MIB
    };
    if data == Profile::Dup {
        dat *= 2;
    }
    RESERVED_START + TEMP_SYSTEM_SIZE + 16 * MIB + meta + dat
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
    pub fn new(chunk: &ChunkPlan, nodesize: u32) -> BlockAllocator {
        BlockAllocator {
            next: chunk.logical,
            end: chunk.end(),
            nodesize: nodesize as u64,
            excluded: chunk.super_excluded(),
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

    /// (flags, logical, length, [(devid, offset)]) of each chunk.
    type Layout = Vec<(u64, u64, u64, Vec<(u64, u64)>)>;

    fn layout(sizes: &[u64], m: Profile, d: Profile) -> Layout {
        plan_chunks(sizes, 16384, m, d)
            .unwrap()
            .into_iter()
            .map(|c| {
                (
                    c.flags,
                    c.logical,
                    c.length,
                    c.stripes.iter().map(|s| (s.devid, s.offset)).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn one_device_as_mkfs_btrfs() {
        // mkfs.btrfs 6.2, 1 GiB, defaults (dump-tree -t chunk).
        assert_eq!(
            layout(&[GIB], Profile::Dup, Profile::Single),
            vec![
                (bg::DATA, 13631488, 8388608, vec![(1, 13631488)]),
                (
                    bg::SYSTEM | bg::DUP,
                    22020096,
                    8388608,
                    vec![(1, 22020096), (1, 30408704)]
                ),
                (
                    bg::METADATA | bg::DUP,
                    30408704,
                    53673984,
                    vec![(1, 38797312), (1, 92471296)]
                ),
            ]
        );
        // -m single -d single keeps every temporary chunk.
        assert_eq!(
            layout(&[GIB], Profile::Single, Profile::Single),
            vec![
                (bg::SYSTEM, MIB, 4 * MIB, vec![(1, MIB)]),
                (bg::METADATA, 5 * MIB, 8 * MIB, vec![(1, 5 * MIB)]),
                (bg::DATA, 13 * MIB, 8 * MIB, vec![(1, 13 * MIB)]),
            ]
        );
    }

    #[test]
    fn chunk_sizes_match_mkfs_btrfs() {
        let size = |total: u64, m: Profile, d: Profile, kind: u64| {
            let chunks = plan_chunks(&[total], 16384, m, d).unwrap();
            let c = chunks.iter().find(|c| c.flags & kind != 0).unwrap();
            c.stripe_size
        };
        let meta = |total| size(total, Profile::Dup, Profile::Single, bg::METADATA);
        assert_eq!(meta(128 * MIB), 32 * MIB);
        assert_eq!(meta(256 * MIB), 32 * MIB);
        assert_eq!(meta(GIB), 53673984);
        assert_eq!(meta(10 * GIB), 256 * MIB);
        assert_eq!(meta(100 * GIB), GIB);
        let dup = (Profile::Dup, Profile::Single);
        assert_eq!(size(256 * MIB, dup.0, dup.1, bg::SYSTEM), 8 * MIB);
        assert_eq!(size(10 * GIB, dup.0, dup.1, bg::DATA), 8 * MIB);
        assert_eq!(size(GIB, Profile::Dup, Profile::Dup, bg::DATA), 64 * MIB);
        // Below 109 MiB the chunks no longer fit; mkfs.btrfs refuses before it gets there.
        assert_eq!(min_device_size(Profile::Dup, Profile::Single), 109 * MIB);
        assert_eq!(min_device_size(Profile::Dup, Profile::Raid0), 173015040);
    }

    #[test]
    fn several_devices_as_mkfs_btrfs() {
        // mkfs.btrfs 6.2 -m raid1 -d raid1, 2 x 1 GiB.
        assert_eq!(
            layout(&[GIB, GIB], Profile::Raid1, Profile::Raid1),
            vec![
                (
                    bg::SYSTEM | bg::RAID1,
                    22020096,
                    8388608,
                    vec![(1, 22020096), (2, 1048576)]
                ),
                (
                    bg::METADATA | bg::RAID1,
                    30408704,
                    107347968,
                    vec![(1, 30408704), (2, 9437184)]
                ),
                (
                    bg::DATA | bg::RAID1,
                    137756672,
                    107347968,
                    vec![(1, 137756672), (2, 116785152)]
                ),
            ]
        );
        // RAID1 on three devices: the two added last take every stripe.
        let l = layout(&[GIB, GIB, GIB], Profile::Raid1, Profile::Raid1);
        assert_eq!(l[0].3, vec![(2, MIB), (3, MIB)]);
        assert_eq!(l[1].2, 256 * MIB);
        assert_eq!(l[2].2, 161021952);
        // DUP metadata on two devices goes to the last one; single data stays on the first.
        let l = layout(&[GIB, GIB], Profile::Dup, Profile::Single);
        assert_eq!(l[0], (bg::DATA, 13631488, 8388608, vec![(1, 13631488)]));
        assert_eq!(l[1].3, vec![(2, MIB), (2, 9437184)]);
        assert_eq!(l[2].3, vec![(2, 17825792), (2, 125173760)]);
    }

    #[test]
    fn superblock_exclusion_follows_the_profile() {
        let chunk = |flags, stripes: Vec<(u64, u64)>, stripe_size, length| ChunkPlan {
            flags,
            logical: 100 * MIB,
            length,
            stripe_size,
            stripes: stripes
                .into_iter()
                .map(|(devid, offset)| StripePlan { devid, offset })
                .collect(),
        };
        // Mirror at 64 MiB, 2 MiB into the stripe on device 2 (stripe index 1).
        let raid0 = chunk(
            bg::METADATA | bg::RAID0,
            vec![(1, 30 * MIB), (2, 62 * MIB)],
            8 * MIB,
            16 * MIB,
        );
        let unit = 2 * MIB / STRIPE_LEN; // device row 32
        assert_eq!(
            raid0.super_excluded(),
            vec![(100 * MIB + (unit * 2 + 1) * STRIPE_LEN, STRIPE_LEN)]
        );
        let raid5 = chunk(
            bg::DATA | bg::RAID5,
            vec![(1, 30 * MIB), (2, 62 * MIB), (3, 30 * MIB)],
            8 * MIB,
            16 * MIB,
        );
        assert_eq!(
            raid5.super_excluded(),
            vec![(100 * MIB + unit * 2 * STRIPE_LEN, 2 * STRIPE_LEN)]
        );
        let mut a = BlockAllocator::new(&raid0, 16384);
        for _ in 0..(unit * 2 + 1) * 4 {
            let b = a.alloc().unwrap();
            assert!(b + 16384 <= 100 * MIB + (unit * 2 + 1) * STRIPE_LEN);
        }
        assert_eq!(a.alloc().unwrap(), 100 * MIB + (unit * 2 + 2) * STRIPE_LEN);
        // Copies: RAID10 pairs.
        let raid10 = chunk(
            bg::METADATA | bg::RAID10,
            vec![(1, MIB), (2, MIB), (3, MIB), (4, MIB)],
            8 * MIB,
            16 * MIB,
        );
        let at = |i: u64| {
            raid10
                .copies(100 * MIB + i * STRIPE_LEN + 4096, 4096)
                .unwrap()
        };
        assert_eq!(
            at(3),
            vec![
                StripePlan {
                    devid: 3,
                    offset: MIB + STRIPE_LEN + 4096
                },
                StripePlan {
                    devid: 4,
                    offset: MIB + STRIPE_LEN + 4096
                }
            ]
        );
        assert!(raid10.copies(100 * MIB + 60 * 1024, 16384).is_err());
    }

    #[test]
    fn allocator_skips_the_superblock_mirror() {
        let chunk = ChunkPlan {
            flags: bg::METADATA,
            logical: 100 * MIB,
            length: 32 * MIB,
            stripe_size: 32 * MIB,
            stripes: vec![StripePlan {
                devid: 1,
                offset: 64 * MIB,
            }],
        };
        let mut a = BlockAllocator::new(&chunk, 16384);
        // The mirror at physical 64 MiB is the chunk's first stripe unit.
        assert_eq!(a.alloc().unwrap(), 100 * MIB + STRIPE_LEN);
        assert!(plan_chunks(&[4 * MIB], 16384, Profile::Dup, Profile::Single).is_err());
    }
}
