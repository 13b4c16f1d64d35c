//! The superblock: where everything starts.

use crate::bytes::{
    array, put_u16, put_u32, put_u64, put_u8, put_zeros, slice, u16_at, u32_at, u64_at, u8_at,
};
use crate::csum::CsumType;
use crate::error::{FormatError, Result};
use crate::invalid;
use crate::items::{ChunkItem, DevItem};
use crate::key::{item, Key, KEY_SIZE};

/// Size of one superblock copy (`BTRFS_SUPER_INFO_SIZE`).
pub const SUPER_INFO_SIZE: usize = 4096;
/// Physical offset of the primary superblock (mirror 0): 64 KiB.
pub const SUPER_PRIMARY_OFFSET: u64 = 0x10000;
/// The superblock magic, ASCII `_BHRfS_M` read as a little-endian u64.
pub const MAGIC: u64 = 0x4D5F_5366_5248_425F; // "_BHRfS_M"
/// Capacity of `sys_chunk_array` in bytes.
pub const SYS_CHUNK_ARRAY_MAX: usize = 2048;
/// Number of backup root records in a superblock.
pub const NUM_BACKUP_ROOTS: usize = 4;
/// The label field: up to 255 bytes plus a terminating NUL.
pub const LABEL_SIZE: usize = 256;
/// Superblock flag set by mkfs and the kernel on every copy they write.
pub const SUPER_FLAG_WRITTEN: u64 = 1 << 0;
/// Offsets of the areas written by `to_bytes`.
const SYS_CHUNK_ARRAY_OFFSET: usize = 811;
const BACKUP_ROOTS_OFFSET: usize = 2859;

/// Physical offset of superblock copy `mirror` (0, 1, 2).
pub fn mirror_offset(mirror: usize) -> u64 {
    if mirror == 0 {
        SUPER_PRIMARY_OFFSET
    } else {
        (16 * 1024u64) << (12 * mirror as u64)
    }
}

/// `incompat_flags` bits: an implementation that does not know a set bit must neither
/// read nor write the filesystem.
pub mod incompat {
    /// Modern back references (inline refs, SHARED refs, header backref revision 1). Always set.
    pub const MIXED_BACKREF: u64 = 1 << 0;
    /// The `default` entry of the root tree directory points to a subvolume other than 5.
    pub const DEFAULT_SUBVOL: u64 = 1 << 1;
    /// Block groups may be DATA and METADATA at once (needs sectorsize == nodesize).
    pub const MIXED_GROUPS: u64 = 1 << 2;
    /// LZO-compressed extents may exist.
    pub const COMPRESS_LZO: u64 = 1 << 3;
    /// zstd-compressed extents may exist (zlib needs no bit).
    pub const COMPRESS_ZSTD: u64 = 1 << 4;
    /// nodesize larger than the page size (the kernel sets it at mount when so).
    pub const BIG_METADATA: u64 = 1 << 5;
    /// INODE_EXTREF items may exist.
    pub const EXTENDED_IREF: u64 = 1 << 6;
    /// RAID5 / RAID6 chunks may exist.
    pub const RAID56: u64 = 1 << 7;
    /// Tree blocks are tracked by METADATA_ITEM keys.
    pub const SKINNY_METADATA: u64 = 1 << 8;
    /// Holes are implicit: gaps between EXTENT_DATA items need no hole items.
    pub const NO_HOLES: u64 = 1 << 9;
    /// Tree block headers carry `metadata_uuid` instead of `fsid`.
    pub const METADATA_UUID: u64 = 1 << 10;
    /// RAID1C3 / RAID1C4 chunks may exist.
    pub const RAID1C34: u64 = 1 << 11;
    /// Zoned block device mode.
    pub const ZONED: u64 = 1 << 12;
    /// Experimental extent tree v2 (debug kernels only).
    pub const EXTENT_TREE_V2: u64 = 1 << 13;
    /// Logical -> physical per-extent stripe map (tree 12).
    pub const RAID_STRIPE_TREE: u64 = 1 << 14;
    /// Simple quotas: EXTENT_OWNER_REF inline refs exist.
    pub const SIMPLE_QUOTA: u64 = 1 << 16;
    /// Relocation remap tree (tree 13).
    pub const REMAP_TREE: u64 = 1 << 17;

    /// Bits a reader of this crate understands well enough to read the filesystem.
    pub const READ_SUPPORTED: u64 = MIXED_BACKREF
        | DEFAULT_SUBVOL
        | MIXED_GROUPS
        | COMPRESS_LZO
        | COMPRESS_ZSTD
        | BIG_METADATA
        | EXTENDED_IREF
        | RAID56
        | SKINNY_METADATA
        | NO_HOLES
        | METADATA_UUID
        | RAID1C34
        | SIMPLE_QUOTA;

    /// Every bit with its btrfs-progs name, for [`flag_names`](super::flag_names).
    pub const NAMES: &[(u64, &str)] = &[
        (MIXED_BACKREF, "MIXED_BACKREF"),
        (DEFAULT_SUBVOL, "DEFAULT_SUBVOL"),
        (MIXED_GROUPS, "MIXED_GROUPS"),
        (COMPRESS_LZO, "COMPRESS_LZO"),
        (COMPRESS_ZSTD, "COMPRESS_ZSTD"),
        (BIG_METADATA, "BIG_METADATA"),
        (EXTENDED_IREF, "EXTENDED_IREF"),
        (RAID56, "RAID56"),
        (SKINNY_METADATA, "SKINNY_METADATA"),
        (NO_HOLES, "NO_HOLES"),
        (METADATA_UUID, "METADATA_UUID"),
        (RAID1C34, "RAID1C34"),
        (ZONED, "ZONED"),
        (EXTENT_TREE_V2, "EXTENT_TREE_V2"),
        (RAID_STRIPE_TREE, "RAID_STRIPE_TREE"),
        (SIMPLE_QUOTA, "SIMPLE_QUOTA"),
        (REMAP_TREE, "REMAP_TREE"),
    ];
}

/// The superblock's own `flags` bits (not features: states of the filesystem).
pub mod super_flags {
    /// Set on every superblock written (shared with tree block headers).
    pub const WRITTEN: u64 = 1 << 0;
    /// A tree block header flag (relocation); the kernel accepts it in a superblock.
    pub const RELOC: u64 = 1 << 1;
    /// The kernel hit a fatal error: the filesystem needs checking.
    pub const ERROR: u64 = 1 << 2;
    /// A seed device: read-only, new writes go to sprouted devices.
    pub const SEEDING: u64 = 1 << 32;
    /// A btrfs-image metadata dump restored: data blocks are zeros.
    pub const METADUMP: u64 = 1 << 33;
    /// btrfs-image's newer dump format.
    pub const METADUMP_V2: u64 = 1 << 34;
    /// btrfstune changing the fsid was interrupted.
    pub const CHANGING_FSID: u64 = 1 << 35;
    /// btrfstune changing the metadata_uuid was interrupted.
    pub const CHANGING_FSID_V2: u64 = 1 << 36;
    /// btrfstune converting to the block group tree was interrupted.
    pub const CHANGING_BG_TREE: u64 = 1 << 38;
    /// btrfstune changing the data checksum type was interrupted.
    pub const CHANGING_DATA_CSUM: u64 = 1 << 44;
    /// btrfstune changing the metadata checksum type was interrupted.
    pub const CHANGING_META_CSUM: u64 = 1 << 45;

    /// The flags the kernel mounts with (its BTRFS_SUPER_FLAG_SUPP); any other bit makes
    /// it refuse the mount unless `rescue=ignoresuperflags` (read-only).
    pub const KERNEL_MOUNTS: u64 = WRITTEN | RELOC | ERROR | SEEDING | METADUMP | METADUMP_V2;
    /// The flags oleo writes a filesystem with. The kernel's others stop writes: ERROR
    /// (the kernel turns the mount read-only), SEEDING (seed devices are read-only),
    /// METADUMP (an old-format metadata dump whose data is zeros). METADUMP_V2, a dump
    /// restored by today's btrfs-image, the kernel mounts read-write (its data checksums
    /// do not match, and it skips them): so does oleo (btrfs-progs' fsck test images are
    /// such dumps).
    pub const WRITE_SUPPORTED: u64 = WRITTEN | RELOC | METADUMP_V2;

    /// Every bit with its btrfs-progs name, for [`flag_names`](super::flag_names).
    pub const NAMES: &[(u64, &str)] = &[
        (WRITTEN, "WRITTEN"),
        (RELOC, "RELOC"),
        (ERROR, "ERROR"),
        (SEEDING, "SEEDING"),
        (METADUMP, "METADUMP"),
        (METADUMP_V2, "METADUMP_V2"),
        (CHANGING_FSID, "CHANGING_FSID"),
        (CHANGING_FSID_V2, "CHANGING_FSID_V2"),
        (CHANGING_BG_TREE, "CHANGING_BG_TREE"),
        (CHANGING_DATA_CSUM, "CHANGING_DATA_CSUM"),
        (CHANGING_META_CSUM, "CHANGING_META_CSUM"),
    ];
}

/// `compat_ro_flags` bits: an implementation that does not know a set bit may read the
/// filesystem but must not write it.
pub mod compat_ro {
    /// The free space tree (tree 10) exists and writers must maintain it.
    pub const FREE_SPACE_TREE: u64 = 1 << 0;
    /// The free space tree can be trusted; always set with `FREE_SPACE_TREE`.
    pub const FREE_SPACE_TREE_VALID: u64 = 1 << 1;
    /// fs-verity items may exist.
    pub const VERITY: u64 = 1 << 2;
    /// BLOCK_GROUP_ITEMs live in tree 11 instead of the extent tree.
    pub const BLOCK_GROUP_TREE: u64 = 1 << 3;

    /// Every bit with its btrfs-progs name, for [`flag_names`](super::flag_names).
    pub const NAMES: &[(u64, &str)] = &[
        (FREE_SPACE_TREE, "FREE_SPACE_TREE"),
        (FREE_SPACE_TREE_VALID, "FREE_SPACE_TREE_VALID"),
        (VERITY, "VERITY"),
        (BLOCK_GROUP_TREE, "BLOCK_GROUP_TREE"),
    ];
}

/// Names of the set bits of `flags`, unknown bits as hex.
pub fn flag_names(flags: u64, names: &[(u64, &str)]) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = flags;
    for &(bit, name) in names {
        if flags & bit != 0 {
            out.push(name.to_string());
            rest &= !bit;
        }
    }
    if rest != 0 {
        out.push(format!("{rest:#x}"));
    }
    out
}

/// One of the four backup root records (`btrfs_root_backup`): the roots of a recent
/// commit, for recovery (`-o rescue=usebackuproot`). At each commit the kernel fills the
/// next slot round robin, so the newest slot describes the superblock's own state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackupRoot {
    /// Logical address of the root tree root block.
    pub tree_root: u64,
    /// Generation of that block (the commit's transaction id).
    pub tree_root_gen: u64,
    /// Logical address of the chunk tree root block.
    pub chunk_root: u64,
    /// Generation of the chunk tree root block.
    pub chunk_root_gen: u64,
    /// Logical address of the extent tree root block.
    pub extent_root: u64,
    /// Generation of the extent tree root block.
    pub extent_root_gen: u64,
    /// Logical address of the top-level subvolume's (tree 5) root block.
    pub fs_root: u64,
    /// Generation of tree 5's root block.
    pub fs_root_gen: u64,
    /// Logical address of the device tree root block.
    pub dev_root: u64,
    /// Generation of the device tree root block.
    pub dev_root_gen: u64,
    /// Logical address of the checksum tree root block.
    pub csum_root: u64,
    /// Generation of the checksum tree root block.
    pub csum_root_gen: u64,
    /// The superblock's `total_bytes` at that commit.
    pub total_bytes: u64,
    /// The superblock's `bytes_used` at that commit.
    pub bytes_used: u64,
    /// The superblock's `num_devices` at that commit.
    pub num_devices: u64,
    /// Level of the root tree root block.
    pub tree_root_level: u8,
    /// Level of the chunk tree root block.
    pub chunk_root_level: u8,
    /// Level of the extent tree root block.
    pub extent_root_level: u8,
    /// Level of tree 5's root block.
    pub fs_root_level: u8,
    /// Level of the device tree root block.
    pub dev_root_level: u8,
    /// Level of the checksum tree root block.
    pub csum_root_level: u8,
}

impl BackupRoot {
    const SIZE: usize = 168;

    fn parse(b: &[u8]) -> Result<BackupRoot> {
        Ok(BackupRoot {
            tree_root: u64_at(b, 0)?,
            tree_root_gen: u64_at(b, 8)?,
            chunk_root: u64_at(b, 16)?,
            chunk_root_gen: u64_at(b, 24)?,
            extent_root: u64_at(b, 32)?,
            extent_root_gen: u64_at(b, 40)?,
            fs_root: u64_at(b, 48)?,
            fs_root_gen: u64_at(b, 56)?,
            dev_root: u64_at(b, 64)?,
            dev_root_gen: u64_at(b, 72)?,
            csum_root: u64_at(b, 80)?,
            csum_root_gen: u64_at(b, 88)?,
            total_bytes: u64_at(b, 96)?,
            bytes_used: u64_at(b, 104)?,
            num_devices: u64_at(b, 112)?,
            tree_root_level: u8_at(b, 152)?,
            chunk_root_level: u8_at(b, 153)?,
            extent_root_level: u8_at(b, 154)?,
            fs_root_level: u8_at(b, 155)?,
            dev_root_level: u8_at(b, 156)?,
            csum_root_level: u8_at(b, 157)?,
        })
    }

    /// Appends the 168-byte record.
    pub fn write_into(&self, out: &mut Vec<u8>) {
        for v in [
            self.tree_root,
            self.tree_root_gen,
            self.chunk_root,
            self.chunk_root_gen,
            self.extent_root,
            self.extent_root_gen,
            self.fs_root,
            self.fs_root_gen,
            self.dev_root,
            self.dev_root_gen,
            self.csum_root,
            self.csum_root_gen,
            self.total_bytes,
            self.bytes_used,
            self.num_devices,
        ] {
            put_u64(out, v);
        }
        put_zeros(out, 32);
        for v in [
            self.tree_root_level,
            self.chunk_root_level,
            self.extent_root_level,
            self.fs_root_level,
            self.dev_root_level,
            self.csum_root_level,
        ] {
            put_u8(out, v);
        }
        put_zeros(out, 10);
    }
}

/// One superblock copy (`btrfs_super_block`, 4096 bytes): where every tree starts, the
/// filesystem's geometry and features, and the SYSTEM chunks needed to find the chunk tree.
/// All copies are identical but for `bytenr` and the checksum.
#[derive(Clone, Debug)]
pub struct Superblock {
    /// Checksum of bytes `[32, 4096)`, zero-padded (recomputed by [`Superblock::to_bytes`]).
    pub csum: [u8; 32],
    /// Filesystem UUID, as users see it.
    pub fsid: [u8; 16],
    /// Physical offset of this copy (64 KiB, 64 MiB or 256 GiB).
    pub bytenr: u64,
    /// Superblock flags ([`SUPER_FLAG_WRITTEN`], error and seeding bits).
    pub flags: u64,
    /// Always [`MAGIC`].
    pub magic: u64,
    /// Transaction id of the last committed transaction.
    pub generation: u64,
    /// Logical address of the root tree root block.
    pub root: u64,
    /// Logical address of the chunk tree root block.
    pub chunk_root: u64,
    /// Logical address of the log root tree root block; 0 when there is no log to replay.
    pub log_root: u64,
    /// Sum of the sizes of all devices, as btrfs may use them.
    pub total_bytes: u64,
    /// Bytes allocated in all block groups (data and metadata, each extent counted once).
    pub bytes_used: u64,
    /// Always 6 ([`ROOT_TREE_DIR`](crate::key::objectid::ROOT_TREE_DIR)).
    pub root_dir_objectid: u64,
    /// Number of devices in the filesystem.
    pub num_devices: u64,
    /// Data block size: a power of two in 4 KiB..=64 KiB.
    pub sectorsize: u32,
    /// Tree block size: a power of two in sectorsize..=64 KiB.
    pub nodesize: u32,
    /// Legacy; always equal to `nodesize`.
    pub leafsize: u32,
    /// Stripe size hint; mkfs writes the sectorsize.
    pub stripesize: u32,
    /// Valid bytes in `sys_chunk_array` (on output, taken from its length).
    pub sys_chunk_array_size: u32,
    /// Header generation of the chunk tree root block.
    pub chunk_root_generation: u64,
    /// Compatible feature bits (none are defined).
    pub compat_flags: u64,
    /// Read-only compatible feature bits ([`compat_ro`]).
    pub compat_ro_flags: u64,
    /// Incompatible feature bits ([`incompat`]).
    pub incompat_flags: u64,
    /// Checksum algorithm as stored (see [`Superblock::csum_type`]).
    pub csum_type_raw: u16,
    /// Level of the root tree root block.
    pub root_level: u8,
    /// Level of the chunk tree root block.
    pub chunk_root_level: u8,
    /// Level of the log root tree root block.
    pub log_root_level: u8,
    /// Copy of this device's DEV_ITEM from the chunk tree.
    pub dev_item: DevItem,
    /// Filesystem label, without the terminating NUL (at most 255 bytes).
    pub label: Vec<u8>,
    /// Generation of the v1 free space cache; 0 when it is unused.
    pub cache_generation: u64,
    /// Generation at which the UUID tree was last known consistent.
    pub uuid_tree_generation: u64,
    /// The fsid tree blocks carry when incompat `METADATA_UUID` is set; zero otherwise.
    pub metadata_uuid: [u8; 16],
    /// The SYSTEM chunks: packed (disk key, CHUNK_ITEM) pairs (see [`Superblock::sys_chunks`]).
    pub sys_chunk_array: Vec<u8>,
    /// The backup root records ([`NUM_BACKUP_ROOTS`] on disk).
    pub backup_roots: Vec<BackupRoot>,
}

impl Superblock {
    /// Parses and checks a superblock copy: magic, checksum, then field sanity.
    pub fn parse(buf: &[u8]) -> Result<Superblock> {
        let sb = Superblock::parse_unchecked(buf)?;
        sb.check()?;
        Ok(sb)
    }

    /// Parses a superblock copy whose magic and checksum are good, without the field
    /// sanity checks ([`Superblock::problems`] lists what they would refuse): recovery
    /// tools fall back to other copies, and to the rest of the superblock, field by field.
    pub fn parse_unchecked(buf: &[u8]) -> Result<Superblock> {
        let b = slice(buf, 0, SUPER_INFO_SIZE)?;
        if u64_at(b, 64)? != MAGIC {
            return Err(FormatError::BadMagic);
        }
        let csum_type_raw = u16_at(b, 196)?;
        let csum_type = CsumType::from_raw(csum_type_raw)?;
        if !csum_type.verify(&b[32..], &b[..32]) {
            return Err(FormatError::ChecksumMismatch);
        }
        let label_raw = slice(b, 299, 256)?;
        let label_len = label_raw
            .iter()
            .position(|&c| c == 0)
            .unwrap_or(label_raw.len());
        let sys_chunk_array_size = u32_at(b, 160)?;
        let sys_len = (sys_chunk_array_size as usize).min(SYS_CHUNK_ARRAY_MAX);
        let mut backup_roots = Vec::with_capacity(NUM_BACKUP_ROOTS);
        for i in 0..NUM_BACKUP_ROOTS {
            backup_roots.push(BackupRoot::parse(slice(
                b,
                2859 + i * BackupRoot::SIZE,
                BackupRoot::SIZE,
            )?)?);
        }
        let sb = Superblock {
            csum: array(b, 0)?,
            fsid: array(b, 32)?,
            bytenr: u64_at(b, 48)?,
            flags: u64_at(b, 56)?,
            magic: MAGIC,
            generation: u64_at(b, 72)?,
            root: u64_at(b, 80)?,
            chunk_root: u64_at(b, 88)?,
            log_root: u64_at(b, 96)?,
            total_bytes: u64_at(b, 112)?,
            bytes_used: u64_at(b, 120)?,
            root_dir_objectid: u64_at(b, 128)?,
            num_devices: u64_at(b, 136)?,
            sectorsize: u32_at(b, 144)?,
            nodesize: u32_at(b, 148)?,
            leafsize: u32_at(b, 152)?,
            stripesize: u32_at(b, 156)?,
            sys_chunk_array_size,
            chunk_root_generation: u64_at(b, 164)?,
            compat_flags: u64_at(b, 172)?,
            compat_ro_flags: u64_at(b, 180)?,
            incompat_flags: u64_at(b, 188)?,
            csum_type_raw,
            root_level: u8_at(b, 198)?,
            chunk_root_level: u8_at(b, 199)?,
            log_root_level: u8_at(b, 200)?,
            dev_item: DevItem::parse(slice(b, 201, DevItem::SIZE)?)?,
            label: label_raw[..label_len].to_vec(),
            cache_generation: u64_at(b, 555)?,
            uuid_tree_generation: u64_at(b, 563)?,
            metadata_uuid: array(b, 571)?,
            sys_chunk_array: slice(b, 811, sys_len)?.to_vec(),
            backup_roots,
        };
        Ok(sb)
    }

    /// The sanity checks the kernel does on a superblock before using it: the first field
    /// that fails, as an error naming it.
    fn check(&self) -> Result<()> {
        match self.problems().into_iter().next() {
            Some(p) => invalid!("{p}"),
            None => Ok(()),
        }
    }

    /// Every field that fails a sanity check, each named (`field generation is 0`).
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let pow2_in = |v: u32, lo: u32, hi: u32| v.is_power_of_two() && (lo..=hi).contains(&v);
        if !pow2_in(self.sectorsize, 4096, 65536) {
            out.push(format!(
                "field sectorsize is {}, not a power of two in 4K..64K",
                self.sectorsize
            ));
        }
        if !pow2_in(self.nodesize, self.sectorsize, 65536) {
            out.push(format!(
                "field nodesize is {}, not a power of two in sectorsize..64K",
                self.nodesize
            ));
        }
        if self.leafsize != self.nodesize {
            out.push(format!(
                "field leafsize is {}, not nodesize {}",
                self.leafsize, self.nodesize
            ));
        }
        if self.sys_chunk_array_size as usize > SYS_CHUNK_ARRAY_MAX {
            out.push(format!(
                "field sys_chunk_array_size is {}, more than {}",
                self.sys_chunk_array_size, SYS_CHUNK_ARRAY_MAX
            ));
        }
        // An unaligned address is as bad as none (4096 when sectorsize itself is bad).
        let ss = if self.sectorsize.is_power_of_two() {
            self.sectorsize.max(4096) as u64
        } else {
            4096
        };
        for (name, v) in [
            ("root", self.root),
            ("chunk_root", self.chunk_root),
            ("log_root", self.log_root),
        ] {
            if !v.is_multiple_of(ss) || (v == 0 && name != "log_root") {
                out.push(format!("field {name} is {v}, no tree block address"));
            }
        }
        for (name, v) in [
            ("root_level", self.root_level),
            ("chunk_root_level", self.chunk_root_level),
            ("log_root_level", self.log_root_level),
        ] {
            if v >= 8 {
                out.push(format!("field {name} is {v}, more than 7"));
            }
        }
        if self.num_devices == 0 {
            out.push("field num_devices is 0".into());
        }
        // u64::MAX too: readers compute generation + 1 (the log tree's transid, the
        // "not newer than the next transaction" checks), which must not overflow.
        if self.generation == 0 || self.generation == u64::MAX {
            out.push(format!("field generation is {}", self.generation));
        }
        out
    }

    /// Mends the fields that fail a sanity check from the rest of this superblock: its
    /// backup root records, the newest of which the kernel writes with the superblock's own
    /// commit. A field is mended only where a record vouches for it (a backup slot naming
    /// the same root tree block gives the generation; the slot of that generation gives
    /// the roots, their levels and num_devices); nothing is guessed. Returns what was
    /// mended, or the problems left. For reading only: never write such a superblock.
    pub fn mend_from_backups(&mut self) -> std::result::Result<Vec<String>, Vec<String>> {
        let problems = self.problems();
        let bad = |f: &str| {
            let p = format!("field {f} is");
            problems.iter().any(|m| m.starts_with(&p))
        };
        let mut mended = Vec::new();
        let gen_ok = !bad("generation");
        // The slot of the superblock's own commit: by generation, else by root block.
        let slot = self
            .backup_roots
            .iter()
            .filter(|b| b.tree_root != 0 && b.tree_root_gen != 0 && b.tree_root_gen != u64::MAX)
            .filter(|b| {
                if gen_ok {
                    b.tree_root_gen == self.generation
                } else {
                    !bad("root") && b.tree_root == self.root && b.tree_root_level == self.root_level
                }
            })
            .max_by_key(|b| b.tree_root_gen)
            .cloned();
        if let Some(b) = slot {
            if !gen_ok {
                mended.push(format!(
                    "generation {} (was {}), from the backup root naming root tree block {}",
                    b.tree_root_gen, self.generation, b.tree_root
                ));
                self.generation = b.tree_root_gen;
            }
            if bad("root") || bad("root_level") {
                mended.push(format!(
                    "root {} level {} (was {} level {}), from the backup root of generation {}",
                    b.tree_root, b.tree_root_level, self.root, self.root_level, b.tree_root_gen
                ));
                self.root = b.tree_root;
                self.root_level = b.tree_root_level;
            }
            if (bad("chunk_root") || bad("chunk_root_level"))
                && b.chunk_root_gen == self.chunk_root_generation
            {
                mended.push(format!(
                    "chunk_root {} level {} (was {} level {}), from the backup root of generation {}",
                    b.chunk_root, b.chunk_root_level, self.chunk_root, self.chunk_root_level,
                    b.tree_root_gen
                ));
                self.chunk_root = b.chunk_root;
                self.chunk_root_level = b.chunk_root_level;
            }
            if bad("num_devices") && b.num_devices != 0 {
                mended.push(format!(
                    "num_devices {} (was 0), from the backup root of generation {}",
                    b.num_devices, b.tree_root_gen
                ));
                self.num_devices = b.num_devices;
            }
        }
        if bad("log_root") || bad("log_root_level") {
            // A log is only ever extra: without it, the last commit.
            mended.push(format!(
                "log_root 0 (was {} level {}): the log tree is not replayed",
                self.log_root, self.log_root_level
            ));
            self.log_root = 0;
            self.log_root_level = 0;
        }
        let left = self.problems();
        if left.is_empty() {
            Ok(mended)
        } else {
            Err(left)
        }
    }

    /// The 4096-byte on-disk form of this copy, checksummed with `csum_type_raw`. `csum` and
    /// `magic` are ignored (recomputed / the constant); `sys_chunk_array_size` is taken from
    /// `sys_chunk_array`. Writes nothing that `parse` would reject on the way back.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let csum_type = CsumType::from_raw(self.csum_type_raw)?;
        if self.label.len() >= LABEL_SIZE || self.label.contains(&0) {
            invalid!("label must be at most {} bytes without NUL", LABEL_SIZE - 1);
        }
        if self.sys_chunk_array.len() > SYS_CHUNK_ARRAY_MAX {
            invalid!(
                "sys_chunk_array of {} bytes exceeds {}",
                self.sys_chunk_array.len(),
                SYS_CHUNK_ARRAY_MAX
            );
        }
        let mut o = Vec::with_capacity(SUPER_INFO_SIZE);
        put_zeros(&mut o, 32); // csum, filled below
        o.extend_from_slice(&self.fsid);
        put_u64(&mut o, self.bytenr);
        put_u64(&mut o, self.flags);
        put_u64(&mut o, MAGIC);
        put_u64(&mut o, self.generation);
        put_u64(&mut o, self.root);
        put_u64(&mut o, self.chunk_root);
        put_u64(&mut o, self.log_root);
        put_u64(&mut o, 0); // log_root_transid: unused
        put_u64(&mut o, self.total_bytes);
        put_u64(&mut o, self.bytes_used);
        put_u64(&mut o, self.root_dir_objectid);
        put_u64(&mut o, self.num_devices);
        put_u32(&mut o, self.sectorsize);
        put_u32(&mut o, self.nodesize);
        put_u32(&mut o, self.leafsize);
        put_u32(&mut o, self.stripesize);
        put_u32(&mut o, self.sys_chunk_array.len() as u32);
        put_u64(&mut o, self.chunk_root_generation);
        put_u64(&mut o, self.compat_flags);
        put_u64(&mut o, self.compat_ro_flags);
        put_u64(&mut o, self.incompat_flags);
        put_u16(&mut o, self.csum_type_raw);
        put_u8(&mut o, self.root_level);
        put_u8(&mut o, self.chunk_root_level);
        put_u8(&mut o, self.log_root_level);
        self.dev_item.write_into(&mut o);
        o.extend_from_slice(&self.label);
        put_zeros(&mut o, LABEL_SIZE - self.label.len());
        put_u64(&mut o, self.cache_generation);
        put_u64(&mut o, self.uuid_tree_generation);
        o.extend_from_slice(&self.metadata_uuid);
        // nr_global_roots, remap_root, remap_root_generation, remap_root_level, reserved.
        pad_to(&mut o, SYS_CHUNK_ARRAY_OFFSET)?;
        o.extend_from_slice(&self.sys_chunk_array);
        pad_to(&mut o, BACKUP_ROOTS_OFFSET)?;
        for i in 0..NUM_BACKUP_ROOTS {
            match self.backup_roots.get(i) {
                Some(b) => b.write_into(&mut o),
                None => put_zeros(&mut o, BackupRoot::SIZE),
            }
        }
        pad_to(&mut o, SUPER_INFO_SIZE)?;
        if o.len() != SUPER_INFO_SIZE {
            invalid!("superblock serialized to {} bytes", o.len());
        }
        let digest = csum_type.compute(&o[32..]);
        o[..32].copy_from_slice(&digest);
        Ok(o)
    }

    /// Builds a sys_chunk_array from SYSTEM chunks (logical start, chunk).
    pub fn encode_sys_chunks(chunks: &[(u64, ChunkItem)]) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for (logical, chunk) in chunks {
            out.extend_from_slice(
                &Key::new(
                    crate::key::objectid::FIRST_CHUNK_TREE,
                    item::CHUNK_ITEM,
                    *logical,
                )
                .to_bytes(),
            );
            chunk.write_into(&mut out)?;
        }
        if out.len() > SYS_CHUNK_ARRAY_MAX {
            invalid!(
                "SYSTEM chunks need {} bytes, the array holds {}",
                out.len(),
                SYS_CHUNK_ARRAY_MAX
            );
        }
        Ok(out)
    }

    /// The checksum algorithm (`csum_type_raw`, known good after [`Superblock::parse`]).
    pub fn csum_type(&self) -> CsumType {
        // Checked in parse().
        CsumType::from_raw(self.csum_type_raw).unwrap_or(CsumType::Crc32c)
    }

    /// True when incompat feature `bit` ([`incompat`]) is set.
    pub fn has_incompat(&self, bit: u64) -> bool {
        self.incompat_flags & bit != 0
    }

    /// True when compat_ro feature `bit` ([`compat_ro`]) is set.
    pub fn has_compat_ro(&self, bit: u64) -> bool {
        self.compat_ro_flags & bit != 0
    }

    /// What every tree block of this filesystem is checked against.
    pub fn fs_context(&self) -> crate::validate::FsContext {
        crate::validate::FsContext {
            nodesize: self.nodesize,
            sectorsize: self.sectorsize,
            csum_type: self.csum_type(),
            metadata_fsid: self.metadata_fsid(),
            super_generation: self.generation,
        }
    }

    /// The fsid tree block headers carry.
    pub fn metadata_fsid(&self) -> [u8; 16] {
        if self.has_incompat(incompat::METADATA_UUID) {
            self.metadata_uuid
        } else {
            self.fsid
        }
    }

    /// The SYSTEM chunks embedded in the superblock: (logical start, chunk).
    pub fn sys_chunks(&self) -> Result<Vec<(u64, ChunkItem)>> {
        let a = &self.sys_chunk_array;
        let mut out = Vec::new();
        let mut off = 0;
        while off < a.len() {
            let key = Key::parse(a, off)?;
            off += KEY_SIZE;
            if key.item_type != item::CHUNK_ITEM {
                invalid!(
                    "sys_chunk_array holds a key of type {} at byte {}",
                    key.item_type,
                    off - KEY_SIZE
                );
            }
            let num_stripes = u16_at(a, off + 44)? as usize;
            let len = ChunkItem::size_for(num_stripes);
            let chunk = ChunkItem::parse(slice(a, off, len)?)?;
            out.push((key.offset, chunk));
            off += len;
        }
        if out.is_empty() {
            invalid!("sys_chunk_array is empty");
        }
        Ok(out)
    }
}

/// Zero-fills `o` up to `off`; an error if it is already past it (a layout bug).
fn pad_to(o: &mut Vec<u8>, off: usize) -> Result<()> {
    if o.len() > off {
        invalid!(
            "superblock field area overran offset {off} ({} bytes)",
            o.len()
        );
    }
    o.resize(off, 0);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrors() {
        assert_eq!(mirror_offset(0), 65536);
        assert_eq!(mirror_offset(1), 64 << 20);
        assert_eq!(mirror_offset(2), 256 << 30);
    }

    #[test]
    fn garbage_is_rejected_not_panicking() {
        assert!(Superblock::parse(&[0u8; 100]).is_err());
        assert_eq!(
            Superblock::parse(&[0u8; 4096]).unwrap_err(),
            FormatError::BadMagic
        );
        let mut b = vec![0u8; 4096];
        b[64..72].copy_from_slice(&MAGIC.to_le_bytes());
        assert_eq!(
            Superblock::parse(&b).unwrap_err(),
            FormatError::ChecksumMismatch
        );
    }
}
