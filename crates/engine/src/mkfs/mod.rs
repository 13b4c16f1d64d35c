//! `mkfs`: writes a new, empty single-device btrfs, like `mkfs.btrfs` with its current
//! defaults (DUP metadata, single data, no-holes, free space tree, skinny metadata).
//!
//! Every tree is planned in memory (`plan`), then written once: tree blocks to all copies,
//! flush, then the superblock copies that fit, flush. Generation 1 throughout.

mod layout;
mod pack;
mod plan;
pub mod rootdir;
mod signature;
mod trees;

use crate::error::{Error, Result};
use crate::transaction::fs::random_uuid;
use oleo_format::items::block_group;
use oleo_format::key::objectid;
use oleo_format::superblock::{
    compat_ro, incompat, mirror_offset, BackupRoot, Superblock, MAGIC, SUPER_FLAG_WRITTEN,
    SUPER_INFO_SIZE,
};
use oleo_format::CsumType;
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::Path;

/// Block group profile on a single device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    /// One copy of each block.
    Single,
    /// Two copies of each block on the one device (mkfs.btrfs's default for metadata).
    Dup,
}

impl Profile {
    /// The name `btrfs filesystem df` and mkfs.btrfs print: "single" or "DUP".
    pub fn name(self) -> &'static str {
        match self {
            Profile::Single => "single",
            Profile::Dup => "DUP",
        }
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

/// What [`mkfs()`] makes, as `mkfs.btrfs`'s options say it. `Default` is mkfs.btrfs's
/// defaults: crc32c, 16 KiB nodes, 4 KiB sectors, DUP metadata, single data, the
/// default features, the size of the target.
#[derive(Clone, Debug)]
pub struct MkfsOptions {
    /// Filesystem size in bytes. Files are created or extended to it; without it, the
    /// existing file's or block device's size is used. The initial chunks need a few
    /// dozen MiB (mkfs fails with `InvalidArgument` below that); 256 MiB is comfortable.
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
    /// Overwrite a target that holds a filesystem or another signature (mkfs -f). A target
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

/// One chunk as created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkReport {
    /// Block group type and profile bits.
    pub flags: u64,
    /// Logical address where the chunk starts.
    pub logical: u64,
    /// Its length in bytes (logical).
    pub length: u64,
    /// Physical start of each stripe on the device.
    pub stripes: Vec<u64>,
}

impl ChunkReport {
    /// Type and profile, e.g. "METADATA|DUP".
    pub fn describe(&self) -> String {
        block_group::describe(self.flags)
    }
}

/// What was written: what mkfs.btrfs prints when it is done.
#[derive(Clone, Debug)]
pub struct MkfsReport {
    /// The filesystem's uuid.
    pub fsid: [u8; 16],
    /// The device's uuid (its DEV_ITEM).
    pub dev_uuid: [u8; 16],
    /// The chunk tree's uuid (in every tree block header).
    pub chunk_tree_uuid: [u8; 16],
    /// The label ("" for none).
    pub label: String,
    /// Filesystem size (the superblock's total_bytes).
    pub total_bytes: u64,
    /// Bytes used by the initial trees (the superblock's bytes_used).
    pub bytes_used: u64,
    /// Bytes of the device the initial chunks take, every copy counted.
    pub device_bytes_used: u64,
    /// Tree block size.
    pub nodesize: u32,
    /// Sector size.
    pub sectorsize: u32,
    /// Checksum algorithm.
    pub csum: CsumType,
    /// The features that are on, named as mkfs.btrfs lists them.
    pub features: Vec<&'static str>,
    /// The superblock's incompat_flags.
    pub incompat_flags: u64,
    /// The superblock's compat_ro_flags.
    pub compat_ro_flags: u64,
    /// The initial chunks: system, metadata, data.
    pub chunks: Vec<ChunkReport>,
    /// Superblock copies written (physical offsets).
    pub superblocks: Vec<u64>,
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

/// The device or file to format: an open handle, the filesystem size and the device size.
struct Target {
    file: File,
    fs_bytes: u64,
    device_bytes: u64,
    /// Made by this mkfs: removed again if mkfs fails.
    created: bool,
    _claim: Option<crate::io::claim::Claim>,
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
        Err(e) => return Err(e.into()),
    };
    let ctx = |e: std::io::Error| {
        Error::Io(std::io::Error::new(
            e.kind(),
            format!("{}: {e}", path.display()),
        ))
    };
    match meta {
        Some(m) if m.file_type().is_block_device() => {
            // The claim takes the device exclusively (O_EXCL), refusing one that is mounted
            // or held: a second exclusive open of our own here would refuse ourselves.
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map_err(ctx)?;
            let claim = check_target(&file, path, force)?;
            let dev = file.seek(SeekFrom::End(0)).map_err(ctx)?;
            let fs_bytes = size.unwrap_or(dev);
            if fs_bytes > dev {
                return Err(Error::InvalidArgument(format!(
                    "--size {fs_bytes} is larger than the device ({dev} bytes)"
                )));
            }
            Ok(Target {
                file,
                fs_bytes,
                device_bytes: dev,
                created: false,
                _claim: Some(claim),
            })
        }
        Some(m) if m.is_file() => {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map_err(ctx)?;
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
                file,
                fs_bytes,
                device_bytes: len.max(fs_bytes),
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
                file,
                fs_bytes: s,
                device_bytes: s,
                created: true,
                _claim: None,
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

/// Formats `path` (an image file or a block device) with a new btrfs, as `mkfs.btrfs`
/// does: generation 1, an empty top-level subvolume (tree 5) with its root directory.
/// A file that does not exist is created at `opts.size` (and removed again if mkfs
/// fails); an existing target that holds a filesystem or another signature is refused
/// with `Error::WouldOverwrite` unless `opts.force`, and one that is mounted or open for
/// writing elsewhere with `Error::Busy`.
pub fn mkfs(path: impl AsRef<Path>, opts: &MkfsOptions) -> Result<MkfsReport> {
    check_options(opts)?;
    let path = path.as_ref();
    let target = open_target(path, opts.size, opts.force)?;
    let r = format_target(&target, opts);
    if r.is_err() && target.created {
        // Leave nothing half-made behind that was not there before.
        let _ = std::fs::remove_file(path);
    }
    r
}

fn format_target(target: &Target, opts: &MkfsOptions) -> Result<MkfsReport> {
    let total_bytes = target.fs_bytes / opts.sectorsize as u64 * opts.sectorsize as u64;
    let chunks = layout::plan_chunks(total_bytes, opts.metadata_profile, opts.data_profile)?;
    let f = &opts.features;
    let params = trees::Params {
        nodesize: opts.nodesize,
        sectorsize: opts.sectorsize,
        generation: 1,
        total_bytes,
        now: now(),
        fsid: match opts.fsid {
            Some(u) => u,
            None => random_uuid()?,
        },
        dev_uuid: random_uuid()?,
        chunk_tree_uuid: random_uuid()?,
        fs_tree_uuid: random_uuid()?,
        skinny_metadata: f.skinny_metadata,
        root_owner: opts.root_owner,
    };
    let set = plan::TreeSet {
        free_space_tree: f.free_space_tree,
        block_group_tree: f.block_group_tree,
    };
    let planned = plan::plan(&params, opts.csum, &chunks, set, target.device_bytes)?;

    let mut incompat_flags = incompat::MIXED_BACKREF;
    for (on, bit) in [
        (f.extended_iref, incompat::EXTENDED_IREF),
        (f.skinny_metadata, incompat::SKINNY_METADATA),
        (f.no_holes, incompat::NO_HOLES),
        // The kernel sets it at mount anyway when nodesize exceeds the page size.
        (opts.nodesize > 4096, incompat::BIG_METADATA),
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
    let device_bytes_used: u64 = chunks
        .iter()
        .map(|c| c.stripe_size * c.stripes.len() as u64)
        .sum();
    let root = |id: u64| planned.roots.get(&id).copied().unwrap_or_default();
    let sys_chunks: Vec<_> = chunks
        .iter()
        .filter(|c| c.flags & block_group::SYSTEM != 0)
        .map(|c| (c.logical, trees::chunk_item(&params, c)))
        .collect();
    let fmt = |e: oleo_format::FormatError| Error::InvalidArgument(format!("superblock: {e}"));
    let label = opts.label.clone().unwrap_or_default();
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
        num_devices: 1,
        tree_root_level: root(objectid::ROOT_TREE).level,
        chunk_root_level: root(objectid::CHUNK_TREE).level,
        extent_root_level: root(objectid::EXTENT_TREE).level,
        fs_root_level: root(objectid::FS_TREE).level,
        dev_root_level: root(objectid::DEV_TREE).level,
        csum_root_level: root(objectid::CSUM_TREE).level,
    };
    let sys_chunk_array = Superblock::encode_sys_chunks(&sys_chunks).map_err(fmt)?;
    let mut sb = Superblock {
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
        num_devices: 1,
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
        dev_item: trees::dev_item(&params, device_bytes_used),
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

    let superblocks = write_all(target, &chunks, &planned.blocks, &mut sb, total_bytes)?;
    Ok(MkfsReport {
        fsid: params.fsid,
        dev_uuid: params.dev_uuid,
        chunk_tree_uuid: params.chunk_tree_uuid,
        label,
        total_bytes,
        bytes_used,
        device_bytes_used,
        nodesize: opts.nodesize,
        sectorsize: opts.sectorsize,
        csum: opts.csum,
        features: f.names(),
        incompat_flags,
        compat_ro_flags,
        chunks: chunks
            .iter()
            .map(|c| ChunkReport {
                flags: c.flags,
                logical: c.logical,
                length: c.length,
                stripes: c.stripes.clone(),
            })
            .collect(),
        superblocks,
    })
}

/// Writes the tree blocks to every stripe, flushes, then the superblock copies, flushes.
/// Returns the offsets of the superblocks written.
fn write_all(
    target: &Target,
    chunks: &[layout::ChunkPlan],
    blocks: &[(u64, Vec<u8>)],
    sb: &mut Superblock,
    total_bytes: u64,
) -> Result<Vec<u64>> {
    let file = &target.file;
    // Clear the boot area and any old primary superblock first; stale signatures of other
    // filesystems there would confuse blkid.
    file.write_all_at(&vec![0u8; layout::RESERVED_START as usize], 0)?;
    for (logical, bytes) in blocks {
        let chunk = chunks
            .iter()
            .find(|c| c.contains(*logical))
            .ok_or_else(|| {
                Error::InvalidArgument(format!("block {logical} is outside every chunk"))
            })?;
        for &stripe in &chunk.stripes {
            file.write_all_at(bytes, stripe + (logical - chunk.logical))?;
        }
    }
    file.sync_all()?;
    let mut written = Vec::new();
    for m in 0..layout::SUPER_MIRRORS {
        let off = mirror_offset(m);
        // The kernel reads and writes copy i only if it ends strictly before the device end.
        if off + (SUPER_INFO_SIZE as u64) < total_bytes {
            sb.bytenr = off;
            let bytes = sb
                .to_bytes()
                .map_err(|e| Error::InvalidArgument(format!("superblock: {e}")))?;
            file.write_all_at(&bytes, off)?;
            written.push(off);
        } else if off + SUPER_INFO_SIZE as u64 <= target.device_bytes {
            // A copy of an older filesystem past our end would still be found by scans.
            file.write_all_at(&[0u8; SUPER_INFO_SIZE], off)?;
        }
    }
    file.sync_all()?;
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
