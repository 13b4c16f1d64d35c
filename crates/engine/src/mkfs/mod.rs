//! `mkfs`: writes a new, empty btrfs on one device or several, like `mkfs.btrfs` with its
//! current defaults (DUP metadata and single data on one device, RAID1 metadata and single
//! data on several; no-holes, free space tree, skinny metadata) and any of its profiles.
//!
//! The initial chunks are placed and sized as mkfs.btrfs 6.2 places and sizes them
//! (`layout`). Every tree is planned in memory (`plan`), then written once: tree blocks to
//! every copy on every device (RAID5/6 rows with their parity), flush, then each device's
//! superblock copies with its own DEV_ITEM, flush. Generation 1 throughout.

mod layout;
mod pack;
mod plan;
pub mod rootdir;
mod signature;
mod trees;

use crate::error::{Error, Result};
use layout::{ChunkPlan, StripePlan, STRIPE_LEN};
use oleo_format::items::block_group;
use oleo_format::key::objectid;
use oleo_format::superblock::{
    compat_ro, incompat, mirror_offset, BackupRoot, Superblock, MAGIC, SUPER_FLAG_WRITTEN,
    SUPER_INFO_SIZE,
};
use oleo_format::CsumType;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Block group profile (`mkfs.btrfs -d` / `-m`): how the blocks of a chunk are spread over
/// the devices, and how many copies there are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Profile {
    /// One copy of each block.
    Single,
    /// Two copies of each block on the same device (mkfs.btrfs's default for metadata on
    /// one device).
    Dup,
    /// Striped over all devices in 64 KiB units, one copy.
    Raid0,
    /// Two copies on two different devices (mkfs.btrfs's default for metadata on several).
    Raid1,
    /// Three copies on three different devices.
    Raid1c3,
    /// Four copies on four different devices.
    Raid1c4,
    /// Striped over mirrored pairs of devices: two copies.
    Raid10,
    /// Striped with one parity stripe per row: one device may fail.
    Raid5,
    /// Striped with two parity stripes per row: two devices may fail.
    Raid6,
}

impl Profile {
    /// Every profile, in the order of the kernel's raid index (`df` order).
    pub const ALL: [Profile; 9] = [
        Profile::Single,
        Profile::Raid0,
        Profile::Raid1,
        Profile::Dup,
        Profile::Raid10,
        Profile::Raid5,
        Profile::Raid6,
        Profile::Raid1c3,
        Profile::Raid1c4,
    ];

    /// The name `btrfs filesystem df` and mkfs.btrfs print: "single", "DUP", "RAID0",
    /// "RAID1", "RAID1C3", "RAID1C4", "RAID10", "RAID5", "RAID6".
    pub fn name(self) -> &'static str {
        match self {
            Profile::Single => "single",
            Profile::Dup => "DUP",
            Profile::Raid0 => "RAID0",
            Profile::Raid1 => "RAID1",
            Profile::Raid1c3 => "RAID1C3",
            Profile::Raid1c4 => "RAID1C4",
            Profile::Raid10 => "RAID10",
            Profile::Raid5 => "RAID5",
            Profile::Raid6 => "RAID6",
        }
    }

    /// Parses mkfs.btrfs's spellings, case-insensitively: single, dup, raid0, raid1,
    /// raid1c3, raid1c4, raid10, raid5, raid6.
    pub fn parse(s: &str) -> Option<Profile> {
        Profile::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s.trim()))
    }

    /// The block group profile bit (`BTRFS_BLOCK_GROUP_*`; 0 for single).
    pub fn bits(self) -> u64 {
        match self {
            Profile::Single => 0,
            Profile::Dup => block_group::DUP,
            Profile::Raid0 => block_group::RAID0,
            Profile::Raid1 => block_group::RAID1,
            Profile::Raid1c3 => block_group::RAID1C3,
            Profile::Raid1c4 => block_group::RAID1C4,
            Profile::Raid10 => block_group::RAID10,
            Profile::Raid5 => block_group::RAID5,
            Profile::Raid6 => block_group::RAID6,
        }
    }

    /// Devices the profile needs at least (the kernel's `devs_min`): 1 for single, DUP
    /// and RAID0, 2 for RAID1, RAID10 and RAID5, 3 for RAID1C3 and RAID6, 4 for RAID1C4.
    pub fn min_devices(self) -> usize {
        layout::raid_attr(self).devs_min as usize
    }

    /// Devices that may be lost without losing data (0 for single, DUP and RAID0).
    pub fn tolerated_failures(self) -> usize {
        layout::raid_attr(self).tolerated_failures as usize
    }
}

impl std::fmt::Display for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Profile {
    type Err = Error;

    fn from_str(s: &str) -> Result<Profile> {
        Profile::parse(s).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "unknown profile `{s}` (single, dup, raid0, raid1, raid1c3, raid1c4, raid10, \
                 raid5, raid6)"
            ))
        })
    }
}

/// Optional on-disk features, named as `mkfs.btrfs -O` names them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MkfsFeatures {
    /// `no-holes`: holes in files need no EXTENT_DATA items (incompat NO_HOLES).
    pub no_holes: bool,
    /// `free-space-tree`: free space recorded in the free space tree (tree 10), as
    /// space_cache=v2 (compat_ro FREE_SPACE_TREE).
    pub free_space_tree: bool,
    /// `skinny-metadata`: tree blocks get METADATA_ITEMs in the extent tree instead of
    /// full EXTENT_ITEMs (incompat SKINNY_METADATA). oleo writes only such filesystems.
    pub skinny_metadata: bool,
    /// `extref`: INODE_EXTREF items, so one inode can have more hard links in a
    /// directory than fit in one INODE_REF (incompat EXTENDED_IREF).
    pub extended_iref: bool,
    /// `block-group-tree`: BLOCK_GROUP_ITEMs in their own tree (tree 11) instead of the
    /// extent tree (compat_ro BLOCK_GROUP_TREE); needs free-space-tree and no-holes.
    pub block_group_tree: bool,
    /// Mixed data+metadata block groups: not supported, refused.
    pub mixed_groups: bool,
}

impl Default for MkfsFeatures {
    fn default() -> Self {
        MkfsFeatures {
            no_holes: true,
            free_space_tree: true,
            skinny_metadata: true,
            extended_iref: true,
            block_group_tree: false,
            mixed_groups: false,
        }
    }
}

impl MkfsFeatures {
    /// Applies a comma-separated list like `-O` takes: `name` turns on, `^name` turns off.
    pub fn apply_list(&mut self, list: &str) -> Result<()> {
        for raw in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (on, name) = match raw.strip_prefix('^') {
                Some(n) => (false, n),
                None => (true, raw),
            };
            let flag = match name.to_ascii_lowercase().replace('_', "-").as_str() {
                "no-holes" => &mut self.no_holes,
                "free-space-tree" | "fst" => &mut self.free_space_tree,
                "skinny-metadata" => &mut self.skinny_metadata,
                "extref" => &mut self.extended_iref,
                "block-group-tree" | "bgt" => &mut self.block_group_tree,
                "mixed-bg" => &mut self.mixed_groups,
                other => {
                    return Err(Error::Unsupported(format!(
                        "feature `{other}` (oleo mkfs knows no-holes, free-space-tree, \
                         skinny-metadata, extref, block-group-tree)"
                    )))
                }
            };
            *flag = on;
        }
        Ok(())
    }

    /// Names of the features that are on, as mkfs.btrfs lists them.
    pub(crate) fn names(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        for (on, name) in [
            (self.mixed_groups, "mixed-bg"),
            (self.extended_iref, "extref"),
            (self.skinny_metadata, "skinny-metadata"),
            (self.no_holes, "no-holes"),
            (self.free_space_tree, "free-space-tree"),
            (self.block_group_tree, "block-group-tree"),
        ] {
            if on {
                v.push(name);
            }
        }
        v
    }
}

/// What [`mkfs()`] and [`mkfs_devices()`] make, as `mkfs.btrfs`'s options say it.
/// `Default` is mkfs.btrfs's defaults for one device: crc32c, 16 KiB nodes, 4 KiB sectors,
/// DUP metadata, single data, the default features, the size of the target;
/// [`MkfsOptions::for_devices`] gives its defaults for several devices.
#[derive(Clone, Debug)]
pub struct MkfsOptions {
    /// Size in bytes of each device (`-b`). Files are created or extended to it; without
    /// it, each existing file's or block device's size is used. Each device needs what
    /// mkfs.btrfs asks for (109 MiB with the defaults; `InvalidArgument` below that).
    pub size: Option<u64>,
    /// Checksum algorithm for tree blocks and data (`--csum`): crc32c, xxhash64, sha256
    /// or blake2b.
    pub csum: CsumType,
    /// Tree block size (`--nodesize`): a power of two from the sectorsize to 64 KiB.
    pub nodesize: u32,
    /// Sector size (`--sectorsize`): the unit of data extents and checksums. Only 4096.
    pub sectorsize: u32,
    /// Optional features (`-O`).
    pub features: MkfsFeatures,
    /// Profile of the metadata and system block groups (`-m`).
    pub metadata_profile: Profile,
    /// Profile of the data block groups (`-d`).
    pub data_profile: Profile,
    /// Filesystem label (`-L`): at most 255 bytes, no NUL.
    pub label: Option<String>,
    /// Filesystem uuid (`-U`); a random one when None.
    pub fsid: Option<[u8; 16]>,
    /// Owner (uid, gid) of the new filesystem's root directory; mkfs.btrfs gives it to the
    /// user running mkfs, and so does `oleo mkfs`.
    pub root_owner: (u32, u32),
    /// Overwrite targets that hold a filesystem or another signature (mkfs -f). A target
    /// that is mounted or open elsewhere is refused even then.
    pub force: bool,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions {
            size: None,
            csum: CsumType::Crc32c,
            nodesize: 16384,
            sectorsize: 4096,
            features: MkfsFeatures::default(),
            metadata_profile: Profile::Dup,
            data_profile: Profile::Single,
            label: None,
            fsid: None,
            root_owner: (0, 0),
            force: false,
        }
    }
}

impl MkfsOptions {
    /// mkfs.btrfs's defaults for a filesystem of `devices` devices: those of `Default`,
    /// except RAID1 metadata when there are several (data stays single, as in mkfs.btrfs
    /// since 5.15).
    pub fn for_devices(devices: usize) -> MkfsOptions {
        let mut o = MkfsOptions::default();
        if devices > 1 {
            o.metadata_profile = Profile::Raid1;
        }
        o
    }
}

/// One stripe of a chunk: where a copy or a slice of it lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StripeReport {
    /// The device (1 = the first path given).
    pub devid: u64,
    /// Physical start of the stripe on that device.
    pub offset: u64,
}

/// One chunk as created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkReport {
    /// Block group type and profile bits.
    pub flags: u64,
    /// Logical address where the chunk starts.
    pub logical: u64,
    /// Its length in bytes (logical).
    pub length: u64,
    /// Bytes each stripe takes on its device (the DEV_EXTENT length).
    pub stripe_size: u64,
    /// Every stripe, in the chunk item's order.
    pub stripes: Vec<StripeReport>,
}

impl ChunkReport {
    /// Type and profile, e.g. "METADATA|DUP".
    pub fn describe(&self) -> String {
        block_group::describe(self.flags)
    }
}

/// One device of the new filesystem.
#[derive(Clone, Debug)]
pub struct DeviceReport {
    /// Its device id: 1 for the first path given, and so on.
    pub devid: u64,
    /// The path it was given as.
    pub path: PathBuf,
    /// The device's uuid (its DEV_ITEM and superblock).
    pub uuid: [u8; 16],
    /// The size the filesystem uses of it (its DEV_ITEM's total_bytes).
    pub total_bytes: u64,
    /// Bytes of its dev extents (its DEV_ITEM's bytes_used).
    pub bytes_used: u64,
    /// Superblock copies written to it (physical offsets).
    pub superblocks: Vec<u64>,
}

/// What was written: what mkfs.btrfs prints when it is done.
#[derive(Clone, Debug)]
pub struct MkfsReport {
    /// The filesystem's uuid.
    pub fsid: [u8; 16],
    /// The first device's uuid (every device's is in `devices`).
    pub dev_uuid: [u8; 16],
    /// The chunk tree's uuid (in every tree block header).
    pub chunk_tree_uuid: [u8; 16],
    /// The label ("" for none).
    pub label: String,
    /// Filesystem size: the sum of the devices' sizes (the superblock's total_bytes).
    pub total_bytes: u64,
    /// Bytes used by the initial trees (the superblock's bytes_used).
    pub bytes_used: u64,
    /// Bytes of the devices the initial chunks take, every copy and every device counted.
    pub device_bytes_used: u64,
    /// Tree block size.
    pub nodesize: u32,
    /// Sector size.
    pub sectorsize: u32,
    /// Checksum algorithm.
    pub csum: CsumType,
    /// The features that are on, named and ordered as mkfs.btrfs lists them (raid56 and
    /// raid1c34 included when the profiles turned them on).
    pub features: Vec<&'static str>,
    /// The superblock's incompat_flags.
    pub incompat_flags: u64,
    /// The superblock's compat_ro_flags.
    pub compat_ro_flags: u64,
    /// Profile of the metadata and system chunks.
    pub metadata_profile: Profile,
    /// Profile of the data chunk.
    pub data_profile: Profile,
    /// The initial chunks, by logical address.
    pub chunks: Vec<ChunkReport>,
    /// Every device, by devid.
    pub devices: Vec<DeviceReport>,
    /// Superblock copies written to the first device (physical offsets).
    pub superblocks: Vec<u64>,
    /// What mkfs.btrfs would warn about (DUP on several devices, RAID5/6, less redundancy
    /// for metadata than for data, ...), one sentence each.
    pub warnings: Vec<String>,
}

/// Parses a UUID in the usual 8-4-4-4-12 hex form (dashes optional).
pub fn parse_uuid(s: &str) -> Result<[u8; 16]> {
    let hex: Vec<u8> = s.bytes().filter(|&c| c != b'-').collect();
    let bad = || Error::InvalidArgument(format!("`{s}` is not a UUID"));
    if hex.len() != 32 {
        return Err(bad());
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let text = std::str::from_utf8(pair).map_err(|_| bad())?;
        out[i] = u8::from_str_radix(text, 16).map_err(|_| bad())?;
    }
    Ok(out)
}

/// A random (version 4) UUID.
fn random_uuid() -> Result<[u8; 16]> {
    let mut u = [0u8; 16];
    getrandom::fill(&mut u).map_err(|e| {
        Error::Io(std::io::Error::other(format!(
            "no randomness for a UUID: {e}"
        )))
    })?;
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    Ok(u)
}

fn check_options(o: &MkfsOptions) -> Result<()> {
    let f = &o.features;
    if f.mixed_groups {
        return Err(Error::Unsupported(
            "mixed block groups (mixed-bg) are not supported by oleo mkfs".into(),
        ));
    }
    if o.sectorsize != 4096 {
        return Err(Error::Unsupported(format!(
            "sectorsize {}: oleo mkfs writes 4096 only",
            o.sectorsize
        )));
    }
    if !o.nodesize.is_power_of_two() || !(o.sectorsize..=65536).contains(&o.nodesize) {
        return Err(Error::InvalidArgument(format!(
            "nodesize {} must be a power of two between {} and 65536",
            o.nodesize, o.sectorsize
        )));
    }
    if f.block_group_tree && (!f.free_space_tree || !f.no_holes) {
        return Err(Error::InvalidArgument(
            "block-group-tree needs free-space-tree and no-holes".into(),
        ));
    }
    if let Some(l) = &o.label {
        if l.len() > 255 || l.contains('\0') {
            return Err(Error::InvalidArgument(
                "the label must be at most 255 bytes, without NUL".into(),
            ));
        }
    }
    Ok(())
}

/// Refuses profiles that need more devices than given (mkfs.btrfs's
/// `test_num_disk_vs_raid`, its wording) and returns what mkfs.btrfs warns about.
fn check_profiles(o: &MkfsOptions, devices: usize) -> Result<Vec<String>> {
    let (m, d) = (o.metadata_profile, o.data_profile);
    for (what, p) in [("metadata", m), ("data", d)] {
        if p.min_devices() > devices {
            return Err(Error::InvalidArgument(format!(
                "unable to create FS with {what} profile {p} (have {devices} devices but {} \
                 devices are required)",
                p.min_devices()
            )));
        }
    }
    let mut warnings = Vec::new();
    let any = |p: Profile| m == p || d == p;
    if any(Profile::Raid5) || any(Profile::Raid6) {
        warnings.push(
            "RAID5/6 support has known problems is strongly discouraged to be used besides \
             testing or evaluation."
                .to_string(),
        );
    }
    if devices > 1 && any(Profile::Dup) {
        warnings.push("DUP is not recommended on filesystem with multiple devices".into());
    }
    if devices == 3 && any(Profile::Raid6) {
        warnings.push("RAID6 is not recommended on filesystem with 3 devices only".into());
    }
    if devices == 2 && any(Profile::Raid5) {
        warnings.push("RAID5 is not recommended on filesystem with 2 devices only".into());
    }
    if m.tolerated_failures() < d.tolerated_failures() {
        warnings.push("metadata has lower redundancy than data!".into());
    }
    Ok(warnings)
}

/// A device or file to format: an open handle, the size the filesystem uses of it and the
/// size it has.
struct Target {
    path: PathBuf,
    file: File,
    fs_bytes: u64,
    device_bytes: u64,
    block_device: bool,
    /// Made by this mkfs: removed again if mkfs fails.
    created: bool,
    _claim: Option<crate::io::claim::Claim>,
}

impl Target {
    fn io(&self, what: &str, e: std::io::Error) -> Error {
        Error::Io(std::io::Error::new(
            e.kind(),
            format!("{}: {what}: {e}", self.path.display()),
        ))
    }

    fn write_at(&self, bytes: &[u8], offset: u64) -> Result<()> {
        self.file
            .write_all_at(bytes, offset)
            .map_err(|e| self.io(&format!("write at {offset}"), e))
    }

    fn sync(&self) -> Result<()> {
        self.file.sync_all().map_err(|e| self.io("flush", e))
    }
}

/// Refuses an existing target that is in use, or (unless forced) holds a signature.
fn check_target(file: &File, path: &Path, force: bool) -> Result<crate::io::claim::Claim> {
    let claim = crate::io::claim::claim(file, path, true)?;
    if !force {
        let read = |offset: u64, len: usize| {
            let mut b = vec![0u8; len];
            file.read_exact_at(&mut b, offset).ok().map(|_| b)
        };
        if let Some(what) = signature::identify(&read) {
            return Err(Error::WouldOverwrite(format!(
                "{} contains {what}: use -f (force) to overwrite it",
                path.display()
            )));
        }
    }
    Ok(claim)
}

fn open_target(path: &Path, size: Option<u64>, force: bool) -> Result<Target> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            return Err(Error::Io(std::io::Error::new(
                e.kind(),
                format!("{}: {e}", path.display()),
            )))
        }
    };
    let ctx = |e: std::io::Error| {
        Error::Io(std::io::Error::new(
            e.kind(),
            format!("{}: {e}", path.display()),
        ))
    };
    let open = || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(ctx)
    };
    match meta {
        Some(m) if m.file_type().is_block_device() => {
            // The claim takes the device exclusively (O_EXCL), refusing one that is mounted
            // or held: a second exclusive open of our own here would refuse ourselves.
            let mut file = open()?;
            let claim = check_target(&file, path, force)?;
            let dev = file.seek(SeekFrom::End(0)).map_err(ctx)?;
            let fs_bytes = size.unwrap_or(dev);
            if fs_bytes > dev {
                return Err(Error::InvalidArgument(format!(
                    "{}: --size {fs_bytes} is larger than the device ({dev} bytes)",
                    path.display()
                )));
            }
            Ok(Target {
                path: path.to_path_buf(),
                file,
                fs_bytes,
                device_bytes: dev,
                block_device: true,
                created: false,
                _claim: Some(claim),
            })
        }
        Some(m) if m.is_file() => {
            let file = open()?;
            let claim = check_target(&file, path, force)?;
            let len = m.len();
            let fs_bytes = match size {
                Some(s) => {
                    if len < s {
                        file.set_len(s).map_err(ctx)?;
                    }
                    s
                }
                None if len == 0 => {
                    return Err(Error::InvalidArgument(format!(
                        "{} is empty: give a size",
                        path.display()
                    )))
                }
                None => len,
            };
            Ok(Target {
                path: path.to_path_buf(),
                file,
                fs_bytes,
                device_bytes: len.max(fs_bytes),
                block_device: false,
                created: false,
                _claim: Some(claim),
            })
        }
        Some(_) => Err(Error::InvalidArgument(format!(
            "{} is neither a regular file nor a block device",
            path.display()
        ))),
        None => {
            let Some(s) = size else {
                return Err(Error::InvalidArgument(format!(
                    "{} does not exist: give a size to create it",
                    path.display()
                )));
            };
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(path)
                .map_err(ctx)?;
            if let Err(e) = file.set_len(s) {
                let _ = std::fs::remove_file(path);
                return Err(ctx(e));
            }
            Ok(Target {
                path: path.to_path_buf(),
                file,
                fs_bytes: s,
                device_bytes: s,
                block_device: false,
                created: true,
                _claim: None,
            })
        }
    }
}

/// What makes two paths the same target: the device number of a block device, the inode
/// of a file, the absolute path of one that does not exist yet.
#[derive(PartialEq, Eq)]
enum Identity {
    Device(u64),
    Inode(u64, u64),
    Missing(PathBuf),
}

fn identity(path: &Path) -> Identity {
    match std::fs::metadata(path) {
        Ok(m) if m.file_type().is_block_device() => Identity::Device(m.rdev()),
        Ok(m) => Identity::Inode(m.dev(), m.ino()),
        Err(_) => {
            let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
            let parent = abs.parent().and_then(|p| p.canonicalize().ok());
            Identity::Missing(match (parent, abs.file_name()) {
                (Some(p), Some(n)) => p.join(n),
                _ => abs,
            })
        }
    }
}

fn now() -> oleo_format::items::Timespec {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    oleo_format::items::Timespec {
        sec: d.as_secs() as i64,
        nsec: d.subsec_nanos(),
    }
}

/// Formats `path` (an image file or a block device) with a new single-device btrfs, as
/// `mkfs.btrfs` does: generation 1, an empty top-level subvolume (tree 5) with its root
/// directory. A file that does not exist is created at `opts.size` (and removed again if
/// mkfs fails); an existing target that holds a filesystem or another signature is refused
/// with `Error::WouldOverwrite` unless `opts.force`, and one that is mounted or open for
/// writing elsewhere with `Error::Busy`. The same as [`mkfs_devices()`] with one path.
pub fn mkfs(path: impl AsRef<Path>, opts: &MkfsOptions) -> Result<MkfsReport> {
    mkfs_devices(&[path], opts)
}

/// Formats several devices (image files or block devices) as one new btrfs, as
/// `mkfs.btrfs DEV...` does: device ids 1..n in the order given, each device with its own
/// uuid and superblocks, the initial chunks in the requested profiles placed and sized as
/// mkfs.btrfs 6.2 places them. Every path gets the checks [`mkfs()`] makes (each error
/// names it); a path given twice, and a profile that needs more devices than given
/// (RAID1 on one device, RAID1C3 on two, ...), are refused before anything is written.
/// Files this call creates are removed again if it fails. Block devices of a set of
/// several are registered with the kernel's btrfs afterwards (`btrfs device scan`), so
/// that any one of them mounts the set.
pub fn mkfs_devices<P: AsRef<Path>>(paths: &[P], opts: &MkfsOptions) -> Result<MkfsReport> {
    check_options(opts)?;
    let paths: Vec<&Path> = paths.iter().map(AsRef::as_ref).collect();
    if paths.is_empty() {
        return Err(Error::InvalidArgument(
            "mkfs needs at least one device".into(),
        ));
    }
    let mut warnings = check_profiles(opts, paths.len())?;
    let ids: Vec<Identity> = paths.iter().map(|p| identity(p)).collect();
    for (i, id) in ids.iter().enumerate() {
        if let Some(j) = ids[..i].iter().position(|other| other == id) {
            return Err(Error::InvalidArgument(format!(
                "{} is given twice (as device {} and as device {}{})",
                paths[i].display(),
                j + 1,
                i + 1,
                if paths[i] == paths[j] {
                    String::new()
                } else {
                    format!(", also named {}", paths[j].display())
                }
            )));
        }
    }
    let mut targets = Vec::new();
    let mut result = Ok(());
    for p in &paths {
        match open_target(p, opts.size, opts.force) {
            Ok(t) => targets.push(t),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    let result = result
        .and_then(|()| check_sizes(&targets, opts))
        .and_then(|()| format_targets(&targets, opts, &mut warnings));
    let created: Vec<PathBuf> = targets
        .iter()
        .filter(|t| t.created)
        .map(|t| t.path.clone())
        .collect();
    let block_devices: Vec<PathBuf> = targets
        .iter()
        .filter(|t| t.block_device)
        .map(|t| t.path.clone())
        .collect();
    // Closes every device and drops the claims before the kernel looks at them.
    drop(targets);
    match result {
        Ok(mut report) => {
            if paths.len() > 1 {
                for dev in block_devices {
                    if let Err(e) = register_with_kernel(&dev) {
                        report.warnings.push(format!(
                            "{}: not registered with the kernel (mount with -o device= for \
                             each member): {e}",
                            dev.display()
                        ));
                    }
                }
            }
            Ok(report)
        }
        Err(e) => {
            // Leave nothing half-made behind that was not there before.
            for p in created {
                let _ = std::fs::remove_file(p);
            }
            Err(e)
        }
    }
}

/// Each device must hold what mkfs.btrfs asks of each (`btrfs_min_dev_size`).
fn check_sizes(targets: &[Target], opts: &MkfsOptions) -> Result<()> {
    let min = layout::min_device_size(opts.metadata_profile, opts.data_profile);
    for t in targets {
        let size = t.fs_bytes / opts.sectorsize as u64 * opts.sectorsize as u64;
        if size < min {
            return Err(Error::InvalidArgument(format!(
                "'{}' is too small to make a usable filesystem: {size} bytes, the minimum \
                 size for each btrfs device is {min} bytes",
                t.path.display()
            )));
        }
    }
    Ok(())
}

/// `BTRFS_IOC_SCAN_DEV` on /dev/btrfs-control: the kernel learns that `dev` belongs to its
/// filesystem (what mkfs.btrfs does for block devices once it is done).
fn register_with_kernel(dev: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    /// `struct btrfs_ioctl_vol_args`: an fd, then the path.
    #[repr(C)]
    struct VolArgs {
        fd: i64,
        name: [u8; 4088],
    }
    const BTRFS_IOC_SCAN_DEV: libc::c_ulong = 0x5000_9404;
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/btrfs-control")?;
    let name = dev.as_os_str().as_bytes();
    if name.len() >= 4088 {
        return Err(std::io::Error::other("path too long"));
    }
    let mut args = VolArgs {
        fd: 0,
        name: [0; 4088],
    };
    args.name[..name.len()].copy_from_slice(name);
    // SAFETY: a valid descriptor and a properly sized, initialized argument struct.
    let r = unsafe {
        libc::ioctl(
            control.as_raw_fd(),
            BTRFS_IOC_SCAN_DEV as _,
            &mut args as *mut VolArgs,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The features that are on, in mkfs.btrfs's order, with the ones the profiles imply.
fn feature_names(f: &MkfsFeatures, incompat_flags: u64) -> Vec<&'static str> {
    let mut names = f.names();
    if incompat_flags & incompat::RAID56 != 0 {
        let at = names
            .iter()
            .position(|&n| n == "extref")
            .map_or(0, |i| i + 1);
        names.insert(at, "raid56");
    }
    if incompat_flags & incompat::RAID1C34 != 0 {
        let at = names
            .iter()
            .position(|&n| n == "free-space-tree" || n == "block-group-tree")
            .unwrap_or(names.len());
        names.insert(at, "raid1c34");
    }
    names
}

fn format_targets(
    targets: &[Target],
    opts: &MkfsOptions,
    warnings: &mut Vec<String>,
) -> Result<MkfsReport> {
    let sector = opts.sectorsize as u64;
    let sizes: Vec<u64> = targets
        .iter()
        .map(|t| t.fs_bytes / sector * sector)
        .collect();
    let total_bytes: u64 = sizes.iter().sum();
    let chunks = layout::plan_chunks(
        &sizes,
        opts.nodesize,
        opts.metadata_profile,
        opts.data_profile,
    )?;
    let f = &opts.features;
    let mut devices = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let devid = i as u64 + 1;
        let bytes_used = chunks
            .iter()
            .flat_map(|c| c.stripes.iter().map(move |s| (s.devid, c.stripe_size)))
            .filter(|&(d, _)| d == devid)
            .map(|(_, len)| len)
            .sum();
        devices.push(trees::DeviceInfo {
            devid,
            uuid: random_uuid()?,
            total_bytes: size,
            bytes_used,
        });
    }
    let params = trees::Params {
        nodesize: opts.nodesize,
        sectorsize: opts.sectorsize,
        generation: 1,
        now: now(),
        fsid: match opts.fsid {
            Some(u) => u,
            None => random_uuid()?,
        },
        devices,
        chunk_tree_uuid: random_uuid()?,
        fs_tree_uuid: random_uuid()?,
        skinny_metadata: f.skinny_metadata,
        root_owner: opts.root_owner,
    };
    let set = plan::TreeSet {
        free_space_tree: f.free_space_tree,
        block_group_tree: f.block_group_tree,
    };
    let planned = plan::plan(&params, opts.csum, &chunks, set)?;

    let mut incompat_flags = incompat::MIXED_BACKREF;
    let profiles = [opts.metadata_profile, opts.data_profile];
    let raid56 = profiles
        .iter()
        .any(|p| matches!(p, Profile::Raid5 | Profile::Raid6));
    let raid1c34 = profiles
        .iter()
        .any(|p| matches!(p, Profile::Raid1c3 | Profile::Raid1c4));
    for (on, bit) in [
        (f.extended_iref, incompat::EXTENDED_IREF),
        (f.skinny_metadata, incompat::SKINNY_METADATA),
        (f.no_holes, incompat::NO_HOLES),
        // The kernel sets it at mount anyway when nodesize exceeds the page size.
        (opts.nodesize > 4096, incompat::BIG_METADATA),
        (raid56, incompat::RAID56),
        (raid1c34, incompat::RAID1C34),
    ] {
        if on {
            incompat_flags |= bit;
        }
    }
    let mut compat_ro_flags = 0;
    if f.free_space_tree {
        compat_ro_flags |= compat_ro::FREE_SPACE_TREE | compat_ro::FREE_SPACE_TREE_VALID;
    }
    if f.block_group_tree {
        compat_ro_flags |= compat_ro::BLOCK_GROUP_TREE;
    }

    let bytes_used: u64 = planned.used.iter().sum();
    let device_bytes_used: u64 = params.devices.iter().map(|d| d.bytes_used).sum();
    let root = |id: u64| planned.roots.get(&id).copied().unwrap_or_default();
    let sys_chunks: Vec<_> = chunks
        .iter()
        .filter(|c| c.flags & block_group::SYSTEM != 0)
        .map(|c| (c.logical, trees::chunk_item(&params, c)))
        .collect();
    let fmt = |e: oleo_format::FormatError| Error::InvalidArgument(format!("superblock: {e}"));
    let label = opts.label.clone().unwrap_or_default();
    let num_devices = params.devices.len() as u64;
    let backup = BackupRoot {
        tree_root: root(objectid::ROOT_TREE).bytenr,
        tree_root_gen: params.generation,
        chunk_root: root(objectid::CHUNK_TREE).bytenr,
        chunk_root_gen: params.generation,
        extent_root: root(objectid::EXTENT_TREE).bytenr,
        extent_root_gen: params.generation,
        fs_root: root(objectid::FS_TREE).bytenr,
        fs_root_gen: params.generation,
        dev_root: root(objectid::DEV_TREE).bytenr,
        dev_root_gen: params.generation,
        csum_root: root(objectid::CSUM_TREE).bytenr,
        csum_root_gen: params.generation,
        total_bytes,
        bytes_used,
        num_devices,
        tree_root_level: root(objectid::ROOT_TREE).level,
        chunk_root_level: root(objectid::CHUNK_TREE).level,
        extent_root_level: root(objectid::EXTENT_TREE).level,
        fs_root_level: root(objectid::FS_TREE).level,
        dev_root_level: root(objectid::DEV_TREE).level,
        csum_root_level: root(objectid::CSUM_TREE).level,
    };
    let sys_chunk_array = Superblock::encode_sys_chunks(&sys_chunks).map_err(fmt)?;
    let sb = Superblock {
        csum: [0; 32],
        fsid: params.fsid,
        bytenr: 0,
        flags: SUPER_FLAG_WRITTEN,
        magic: MAGIC,
        generation: params.generation,
        root: backup.tree_root,
        chunk_root: backup.chunk_root,
        log_root: 0,
        total_bytes,
        bytes_used,
        root_dir_objectid: objectid::ROOT_TREE_DIR,
        num_devices,
        sectorsize: opts.sectorsize,
        nodesize: opts.nodesize,
        leafsize: opts.nodesize,
        stripesize: opts.sectorsize,
        sys_chunk_array_size: sys_chunk_array.len() as u32,
        chunk_root_generation: params.generation,
        compat_flags: 0,
        compat_ro_flags,
        incompat_flags,
        csum_type_raw: opts.csum.raw(),
        root_level: backup.tree_root_level,
        chunk_root_level: backup.chunk_root_level,
        log_root_level: 0,
        dev_item: trees::dev_item(&params, &params.devices[0]),
        label: label.as_bytes().to_vec(),
        // 0: no v1 space cache in use; (u64)-1 makes the kernel ignore any v1 cache.
        cache_generation: if f.free_space_tree { 0 } else { u64::MAX },
        uuid_tree_generation: params.generation,
        metadata_uuid: [0; 16],
        sys_chunk_array,
        backup_roots: vec![
            backup,
            BackupRoot::default(),
            BackupRoot::default(),
            BackupRoot::default(),
        ],
    };

    let superblocks = write_all(targets, &chunks, &planned.blocks, &sb, &params)?;
    let devices: Vec<DeviceReport> = params
        .devices
        .iter()
        .zip(targets)
        .zip(superblocks)
        .map(|((d, t), supers)| DeviceReport {
            devid: d.devid,
            path: t.path.clone(),
            uuid: d.uuid,
            total_bytes: d.total_bytes,
            bytes_used: d.bytes_used,
            superblocks: supers,
        })
        .collect();
    Ok(MkfsReport {
        fsid: params.fsid,
        dev_uuid: params.devices[0].uuid,
        chunk_tree_uuid: params.chunk_tree_uuid,
        label,
        total_bytes,
        bytes_used,
        device_bytes_used,
        nodesize: opts.nodesize,
        sectorsize: opts.sectorsize,
        csum: opts.csum,
        features: feature_names(f, incompat_flags),
        incompat_flags,
        compat_ro_flags,
        metadata_profile: opts.metadata_profile,
        data_profile: opts.data_profile,
        chunks: chunks
            .iter()
            .map(|c| ChunkReport {
                flags: c.flags,
                logical: c.logical,
                length: c.length,
                stripe_size: c.stripe_size,
                stripes: c
                    .stripes
                    .iter()
                    .map(|s| StripeReport {
                        devid: s.devid,
                        offset: s.offset,
                    })
                    .collect(),
            })
            .collect(),
        superblocks: devices[0].superblocks.clone(),
        devices,
        warnings: std::mem::take(warnings),
    })
}

/// Writes the tree blocks to every copy on every device (RAID5/6: whole rows with their
/// parity), flushes, then each device's superblock copies, flushes. Returns the offsets
/// of the superblocks written, per device.
fn write_all(
    targets: &[Target],
    chunks: &[ChunkPlan],
    blocks: &[(u64, Vec<u8>)],
    template: &Superblock,
    params: &trees::Params,
) -> Result<Vec<Vec<u64>>> {
    let target = |devid: u64| -> Result<&Target> {
        targets
            .get((devid as usize).wrapping_sub(1))
            .ok_or_else(|| Error::InvalidArgument(format!("no device {devid}")))
    };
    // Clear the boot area and any old primary superblock first; stale signatures of other
    // filesystems there would confuse blkid.
    for t in targets {
        t.write_at(&vec![0u8; layout::RESERVED_START as usize], 0)?;
    }
    // RAID5/6 rows touched, by (chunk index, row): the row's data, zeros where no block is.
    let mut rows: BTreeMap<(usize, u64), Vec<u8>> = BTreeMap::new();
    for (logical, bytes) in blocks {
        let (ci, chunk) = chunks
            .iter()
            .enumerate()
            .find(|(_, c)| c.contains(*logical))
            .ok_or_else(|| {
                Error::InvalidArgument(format!("block {logical} is outside every chunk"))
            })?;
        if layout::raid_attr(chunk.profile()).nparity > 0 {
            let row_len = chunk.data_stripes() * STRIPE_LEN;
            let off = logical - chunk.logical;
            let (row, at) = ((off / row_len), (off % row_len) as usize);
            if at + bytes.len() > row_len as usize {
                return Err(Error::InvalidArgument(format!(
                    "block {logical} crosses a RAID5/6 row"
                )));
            }
            rows.entry((ci, row))
                .or_insert_with(|| vec![0u8; row_len as usize])[at..at + bytes.len()]
                .copy_from_slice(bytes);
            continue;
        }
        for StripePlan { devid, offset } in chunk.copies(*logical, bytes.len() as u64)? {
            target(devid)?.write_at(bytes, offset)?;
        }
    }
    for ((ci, row), data) in &rows {
        let chunk = &chunks[*ci];
        let units: Vec<&[u8]> = data.chunks(STRIPE_LEN as usize).collect();
        let d = units.len() as u64;
        for (k, unit) in units.iter().enumerate() {
            let s = chunk.parity_slot(*row, k as u64);
            target(s.devid)?.write_at(unit, s.offset)?;
        }
        let mut p = vec![0u8; STRIPE_LEN as usize];
        let mut q = vec![0u8; STRIPE_LEN as usize];
        let parity: Vec<&[u8]> = if layout::raid_attr(chunk.profile()).nparity == 2 {
            oleo_format::raid56::gen_pq(&units, &mut p, &mut q);
            vec![&p, &q]
        } else {
            oleo_format::raid56::gen_p(&units, &mut p);
            vec![&p]
        };
        for (i, bytes) in parity.into_iter().enumerate() {
            let s = chunk.parity_slot(*row, d + i as u64);
            target(s.devid)?.write_at(bytes, s.offset)?;
        }
    }
    for t in targets {
        t.sync()?;
    }
    let mut written = Vec::new();
    for (t, dev) in targets.iter().zip(&params.devices) {
        let mut sb = template.clone();
        sb.dev_item = trees::dev_item(params, dev);
        let mut mine = Vec::new();
        for m in 0..layout::SUPER_MIRRORS {
            let off = mirror_offset(m);
            // The kernel reads and writes copy i only if it ends strictly before the end of
            // the device's part of the filesystem.
            if off + (SUPER_INFO_SIZE as u64) < dev.total_bytes {
                sb.bytenr = off;
                let bytes = sb
                    .to_bytes()
                    .map_err(|e| Error::InvalidArgument(format!("superblock: {e}")))?;
                t.write_at(&bytes, off)?;
                mine.push(off);
            } else if off + SUPER_INFO_SIZE as u64 <= t.device_bytes {
                // A copy of an older filesystem past our end would still be found by scans.
                t.write_at(&[0u8; SUPER_INFO_SIZE], off)?;
            }
        }
        written.push(mine);
    }
    for t in targets {
        t.sync()?;
    }
    Ok(written)
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::{transaction::fs::FsCore, OpenOptions as FsOpenOptions};

    fn temp_image(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("oleo-mkfs-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        let _ = std::fs::remove_file(&p);
        p
    }

    fn roundtrip(name: &str, opts: MkfsOptions) {
        let img = temp_image(name);
        let report = mkfs(&img, &opts).unwrap();
        let fs = FsCore::open(&img, FsOpenOptions::default()).unwrap();
        let sb = fs.superblock();
        assert_eq!(sb.fsid, report.fsid);
        assert_eq!(sb.generation, 1);
        assert_eq!(sb.nodesize, opts.nodesize);
        assert_eq!(sb.csum_type(), opts.csum);
        assert_eq!(sb.bytes_used, report.bytes_used);
        assert_eq!(
            sb.label,
            opts.label.clone().unwrap_or_default().into_bytes()
        );
        let mut entries = Vec::new();
        fs.readdir(fs.root(), 0, &mut |e| {
            entries.push(e);
            true
        })
        .unwrap();
        assert!(entries.is_empty(), "{entries:?}");
        assert_eq!(fs.getattr(fs.root()).unwrap().nlink, 1);
        std::fs::remove_file(&img).unwrap();
    }

    #[test]
    fn fresh_filesystems_open() {
        roundtrip(
            "default.img",
            MkfsOptions {
                size: Some(256 << 20),
                ..Default::default()
            },
        );
        let mut f = MkfsFeatures::default();
        f.apply_list("^skinny-metadata,block-group-tree").unwrap();
        roundtrip(
            "small-nodes.img",
            MkfsOptions {
                size: Some(128 << 20),
                nodesize: 4096,
                csum: CsumType::Blake2b,
                features: f,
                metadata_profile: Profile::Single,
                label: Some("unit".into()),
                ..Default::default()
            },
        );
    }

    /// The superblock at 64 KiB of `path`.
    fn super_of(path: &Path) -> Superblock {
        let mut b = vec![0u8; SUPER_INFO_SIZE];
        File::open(path)
            .unwrap()
            .read_exact_at(&mut b, mirror_offset(0))
            .unwrap();
        Superblock::parse(&b).unwrap()
    }

    #[test]
    fn several_devices_get_their_own_superblocks() {
        let imgs: Vec<_> = (0..3)
            .map(|i| temp_image(&format!("multi-{i}.img")))
            .collect();
        let mut o = MkfsOptions::for_devices(3);
        assert_eq!(o.metadata_profile, Profile::Raid1);
        o.metadata_profile = Profile::Raid1c3;
        o.data_profile = Profile::Raid5;
        o.size = Some(300 << 20);
        let r = mkfs_devices(&imgs, &o).unwrap();
        assert_eq!(r.devices.len(), 3);
        assert_eq!(r.total_bytes, 900 << 20);
        assert_ne!(r.incompat_flags & incompat::RAID56, 0);
        assert_ne!(r.incompat_flags & incompat::RAID1C34, 0);
        assert!(r.features.contains(&"raid56") && r.features.contains(&"raid1c34"));
        assert!(r.warnings.iter().any(|w| w.contains("RAID5/6")));
        let mut uuids = Vec::new();
        for (i, img) in imgs.iter().enumerate() {
            let sb = super_of(img);
            assert_eq!(sb.fsid, r.fsid);
            assert_eq!(sb.num_devices, 3);
            assert_eq!(sb.total_bytes, 900 << 20);
            assert_eq!(sb.dev_item.devid, i as u64 + 1);
            assert_eq!(sb.dev_item.total_bytes, 300 << 20);
            assert_eq!(sb.dev_item.bytes_used, r.devices[i].bytes_used);
            assert_eq!(sb.dev_item.uuid, r.devices[i].uuid);
            uuids.push(sb.dev_item.uuid);
        }
        uuids.sort_unstable();
        uuids.dedup();
        assert_eq!(uuids.len(), 3, "every device has its own uuid");
        // Each DEV_EXTENT length is the chunk's stripe size; bytes_used adds them up.
        for d in &r.devices {
            let sum: u64 = r
                .chunks
                .iter()
                .flat_map(|c| c.stripes.iter().map(move |s| (s.devid, c.stripe_size)))
                .filter(|&(devid, _)| devid == d.devid)
                .map(|(_, l)| l)
                .sum();
            assert_eq!(sum, d.bytes_used);
        }
        for img in &imgs {
            std::fs::remove_file(img).unwrap();
        }
    }

    #[test]
    fn several_devices_refused() {
        let a = temp_image("refused-a.img");
        let b = temp_image("refused-b.img");
        let o = MkfsOptions {
            size: Some(256 << 20),
            metadata_profile: Profile::Raid1c3,
            ..MkfsOptions::for_devices(2)
        };
        let e = mkfs_devices(&[&a, &b], &o).unwrap_err().to_string();
        assert!(
            e.contains("metadata profile RAID1C3 (have 2 devices but 3 devices are required)"),
            "{e}"
        );
        assert!(
            !a.exists() && !b.exists(),
            "nothing is created when refused"
        );
        let o = MkfsOptions {
            size: Some(256 << 20),
            data_profile: Profile::Raid10,
            ..MkfsOptions::default()
        };
        let e = mkfs(&a, &o).unwrap_err().to_string();
        assert!(
            e.contains("data profile RAID10 (have 1 devices but 2"),
            "{e}"
        );
        let o = MkfsOptions {
            size: Some(256 << 20),
            ..MkfsOptions::for_devices(2)
        };
        let e = mkfs_devices(&[&a, &a], &o).unwrap_err().to_string();
        assert!(
            e.contains("given twice") && e.contains("refused-a.img"),
            "{e}"
        );
        // A device too small is named.
        std::fs::File::create(&a)
            .unwrap()
            .set_len(300 << 20)
            .unwrap();
        std::fs::File::create(&b)
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        let o = MkfsOptions::for_devices(2);
        let e = mkfs_devices(&[&a, &b], &o).unwrap_err().to_string();
        assert!(
            e.contains("refused-b.img") && e.contains("too small"),
            "{e}"
        );
        // A refused second device: the first, created here, is removed again.
        let c = temp_image("refused-c.img");
        mkfs(
            &b,
            &MkfsOptions {
                size: Some(256 << 20),
                ..MkfsOptions::default()
            },
        )
        .unwrap();
        let o = MkfsOptions {
            size: Some(256 << 20),
            ..MkfsOptions::for_devices(2)
        };
        let e = mkfs_devices(&[&c, &b], &o).unwrap_err();
        assert!(
            matches!(&e, Error::WouldOverwrite(m) if m.contains("refused-b.img")),
            "{e}"
        );
        assert!(!c.exists(), "a file mkfs created stays behind");
        std::fs::remove_file(&a).unwrap();
        std::fs::remove_file(&b).unwrap();
        for (s, p) in [
            ("RAID1c3", Profile::Raid1c3),
            ("single", Profile::Single),
            ("Dup", Profile::Dup),
            ("raid10", Profile::Raid10),
        ] {
            assert_eq!(s.parse::<Profile>().unwrap(), p);
        }
        assert_eq!(Profile::Raid1c4.to_string(), "RAID1C4");
        assert!("raid7".parse::<Profile>().is_err());
    }

    #[test]
    fn refusals() {
        let img = temp_image("refused.img");
        let mut o = MkfsOptions {
            size: Some(256 << 20),
            ..Default::default()
        };
        o.features.mixed_groups = true;
        assert!(matches!(mkfs(&img, &o), Err(Error::Unsupported(_))));
        let o = MkfsOptions {
            size: Some(8 << 20),
            ..Default::default()
        };
        assert!(mkfs(&img, &o).is_err(), "8 MiB is too small");
        let mut f = MkfsFeatures::default();
        assert!(f.apply_list("raid56").is_err());
        assert!(f.apply_list("^free-space-tree,block-group-tree").is_ok());
        let o = MkfsOptions {
            size: Some(256 << 20),
            features: f,
            ..Default::default()
        };
        assert!(mkfs(&img, &o).is_err(), "block-group-tree without FST");
        assert_eq!(
            parse_uuid("01234567-89ab-cdef-0123-456789ABCDEF").unwrap()[15],
            0xef
        );
        assert!(parse_uuid("0123").is_err());
        let _ = std::fs::remove_file(&img);
    }
}
