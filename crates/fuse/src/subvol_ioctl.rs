//! Subvolume commands on a mounted oleo filesystem. btrfs's own ioctls cannot reach a FUSE
//! server (they carry file descriptors and variable-size buffers, and FUSE passes only
//! fixed-size ones), so `oleo subvolume` and `oleo property` use these instead: fixed-size
//! ioctls on a file or directory of the mount, type 'o'. `oleo extents` and `oleo
//! filesystem` read their reports the same way, in pages. Numbers and layouts are oleo's
//! own; this module is their one definition, shared by the server and the CLI.

/// `_IOC(dir, 'o', nr, size)` as the kernel's asm-generic/ioctl.h encodes it.
const fn ioc(dir: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | ((b'o' as u32) << 8) | nr
}
const WRITE: u32 = 1;
const READ: u32 = 2;

/// Longest name, with its NUL.
pub const NAME: usize = 256;
/// Longest subvolume path in a listing, with its NUL.
pub const PATH: usize = 3584;

/// On any file: which subvolume it is in (`SubvolOf`).
pub const SUBVOL_OF: u32 = ioc(READ, 1, SUBVOL_OF_SIZE);
/// Size of SUBVOL_OF's answer (`SubvolOf`).
pub const SUBVOL_OF_SIZE: usize = 24;
/// On a directory: create the empty subvolume `name` in it (`name` NUL-terminated).
pub const CREATE: u32 = ioc(WRITE, 2, NAME);
/// On a directory: snapshot subvolume `source` as `name` in it (`SnapshotArgs`).
pub const SNAPSHOT: u32 = ioc(WRITE, 3, SNAPSHOT_SIZE);
/// Size of SNAPSHOT's argument (`SnapshotArgs`).
pub const SNAPSHOT_SIZE: usize = 16 + NAME;
/// On a subvolume's root directory: set its read-only flag (u64 flags: `RO`, `FORCE`).
pub const SET_FLAGS: u32 = ioc(WRITE, 4, 8);
/// On any file: the first subvolume with an id at least the u64 given (`SubvolInfo`);
/// ENOENT past the last.
pub const NEXT_SUBVOL: u32 = ioc(READ | WRITE, 5, INFO_SIZE);
/// Size of NEXT_SUBVOL's argument and answer (`SubvolInfo`).
pub const INFO_SIZE: usize = 8 * 4 + 16 * 3 + 8 * 3 + 16 * 3 + PATH;
/// On a directory: delete the subvolume whose entry is `name` in it (`name` NUL-terminated).
pub const DELETE: u32 = ioc(WRITE, 6, NAME);
/// On any file: make subvolume (u64 id) the default.
pub const SET_DEFAULT: u32 = ioc(WRITE, 7, 8);
/// On any file: the default subvolume's id (u64).
pub const GET_DEFAULT: u32 = ioc(READ, 8, 8);

/// On the mount's root: the mount's VFS flags changed (`mount -o remount,...`); the u64
/// argument is mount(2)'s MS_* flags now in force. Root only (EPERM otherwise).
pub const SET_MOUNT_FLAGS: u32 = ioc(WRITE, 16, 8);

/// On the mount's root: what the server runs with (`ServerOptions`): the flags it acts on,
/// whether it writes, and the filesystem's options as the CLI gave them. A second mount of
/// the same image (a bind mount of this one) compares its options against these. Root only
/// (EPERM otherwise): the options name paths (log=, device=).
pub const GET_SERVER_OPTIONS: u32 = ioc(READ, 17, SERVER_OPTIONS_SIZE);
/// Size of GET_SERVER_OPTIONS's answer (`ServerOptions`).
pub const SERVER_OPTIONS_SIZE: usize = 4096;

/// On the mount's root: how many requests of each FUSE opcode the kernel has sent this
/// mount (`transport::counts`: a little-endian u64 per opcode, slot 0 for opcodes past the
/// table). The transport answers it, for any server on it (nullfs too). Root only (EPERM
/// otherwise).
pub const FUSE_STATS: u32 = ioc(READ, 18, FUSE_STATS_SIZE);
/// Size of FUSE_STATS's answer.
pub const FUSE_STATS_SIZE: usize = crate::transport::counts::SIZE;

/// On the mount's root: the nanoseconds the server spent on the requests of each opcode so
/// far, in FUSE_STATS's slots (from parse to the reply handed to the transport). The
/// transport answers it; root only, as FUSE_STATS.
pub const FUSE_STATS_TIME: u32 = ioc(READ, 19, FUSE_STATS_SIZE);

/// GET_SERVER_OPTIONS's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerOptions {
    /// The MS_* flags the server acts on now (`MountFlags::to_ms`): atime, sync, dirsync.
    pub flags: u64,
    /// The server writes (the image was opened read-write).
    pub writable: bool,
    /// The filesystem-wide options, `name=value` lines, in the CLI's own canonical form
    /// (opaque to the server).
    pub options: Vec<u8>,
}

impl ServerOptions {
    /// None if the options do not fit.
    pub fn to_bytes(&self) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(SERVER_OPTIONS_SIZE);
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&u64::from(self.writable).to_le_bytes());
        put_c_str(&mut out, &self.options, SERVER_OPTIONS_SIZE - 16)?;
        Some(out)
    }
    /// Reads an answer (missing fields read as 0).
    pub fn parse(b: &[u8]) -> ServerOptions {
        ServerOptions {
            flags: u64_at(b, 0),
            writable: u64_at(b, 8) != 0,
            options: c_str(b.get(16..).unwrap_or_default()).to_vec(),
        }
    }
}

/// Flags of SNAPSHOT and SET_FLAGS, and of `SubvolOf` and `SubvolInfo`.
pub const RO: u64 = 1;
/// SET_FLAGS: make a received subvolume writable (clears its received uuid).
pub const FORCE: u64 = 2;

fn u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// The u64 argument of SET_FLAGS, SET_DEFAULT and NEXT_SUBVOL (0 if short).
pub(crate) fn u64_arg(b: &[u8]) -> u64 {
    u64_at(b, 0)
}

/// A NUL-terminated name or path out of a fixed field.
fn c_str(b: &[u8]) -> &[u8] {
    b.iter().position(|&c| c == 0).map_or(b, |n| &b[..n])
}

/// A name into a fixed field of `len` bytes; None if it does not fit with its NUL.
fn put_c_str(out: &mut Vec<u8>, s: &[u8], len: usize) -> Option<()> {
    if s.len() >= len || s.contains(&0) {
        return None;
    }
    out.extend_from_slice(s);
    out.resize(out.len() + len - s.len(), 0);
    Some(())
}

/// SUBVOL_OF's answer: where a file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubvolOf {
    /// The subvolume's id.
    pub id: u64,
    /// The file's inode number inside the subvolume (256: its root directory).
    pub ino: u64,
    /// [`RO`] if the subvolume is read-only.
    pub flags: u64,
}

impl SubvolOf {
    /// The 24-byte answer.
    pub fn to_bytes(self) -> Vec<u8> {
        [self.id, self.ino, self.flags]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect()
    }
    /// Reads an answer (missing fields read as 0).
    pub fn parse(b: &[u8]) -> SubvolOf {
        SubvolOf {
            id: u64_at(b, 0),
            ino: u64_at(b, 8),
            flags: u64_at(b, 16),
        }
    }
}

/// SNAPSHOT's argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotArgs {
    /// Id of the subvolume to snapshot.
    pub source: u64,
    /// [`RO`] for a read-only snapshot.
    pub flags: u64,
    /// Name of the snapshot in the directory (no NUL).
    pub name: Vec<u8>,
}

impl SnapshotArgs {
    /// The argument; None if the name does not fit.
    pub fn to_bytes(&self) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(SNAPSHOT_SIZE);
        out.extend_from_slice(&self.source.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
        put_c_str(&mut out, &self.name, NAME)?;
        Some(out)
    }
    /// Reads an argument (missing fields read as 0).
    pub fn parse(b: &[u8]) -> SnapshotArgs {
        SnapshotArgs {
            source: u64_at(b, 0),
            flags: u64_at(b, 8),
            name: c_str(b.get(16..).unwrap_or_default()).to_vec(),
        }
    }
}

/// CREATE's argument.
pub fn create_arg(name: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(NAME);
    put_c_str(&mut out, name, NAME)?;
    Some(out)
}

/// The name in CREATE's or DELETE's argument.
pub(crate) fn parse_create_arg(b: &[u8]) -> &[u8] {
    c_str(b)
}

/// NEXT_SUBVOL's answer: one subvolume as `btrfs subvolume list` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubvolInfo {
    /// The subvolume's id.
    pub id: u64,
    /// The subvolume holding its entry (0: none, the top level).
    pub parent: u64,
    /// Transaction id of its root's last update (ROOT_ITEM `generation`).
    pub generation: u64,
    /// [`RO`] if read-only.
    pub flags: u64,
    /// Its UUID.
    pub uuid: [u8; 16],
    /// For a snapshot: the UUID of its source.
    pub parent_uuid: [u8; 16],
    /// For a received subvolume: the UUID of the sent one.
    pub received_uuid: [u8; 16],
    /// Transaction id of its creation.
    pub otransid: u64,
    /// For a received subvolume: the sent one's ctransid.
    pub stransid: u64,
    /// For a received subvolume: transaction id of the receive.
    pub rtransid: u64,
    /// Creation, send and receive times: (seconds, nanoseconds).
    pub otime: (i64, u32),
    /// Send time: (seconds, nanoseconds).
    pub stime: (i64, u32),
    /// Receive time: (seconds, nanoseconds).
    pub rtime: (i64, u32),
    /// From the top level; empty if unreachable.
    pub path: Vec<u8>,
}

impl SubvolInfo {
    /// The engine's description of a subvolume, in this layout's terms.
    pub fn from_engine(s: oleo::SubvolumeInfo) -> SubvolInfo {
        SubvolInfo {
            id: s.id,
            parent: s.parent.map_or(0, |(p, _)| p),
            generation: s.generation,
            flags: if s.readonly { RO } else { 0 },
            uuid: s.uuid,
            parent_uuid: s.parent_uuid,
            received_uuid: s.received_uuid,
            otransid: s.otransid,
            stransid: s.stransid,
            rtransid: s.rtransid,
            otime: s.otime,
            stime: s.stime,
            rtime: s.rtime,
            path: s.path.unwrap_or_default(),
        }
    }

    /// None if the path does not fit.
    pub fn to_bytes(&self) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(INFO_SIZE);
        for v in [self.id, self.parent, self.generation, self.flags] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.uuid);
        out.extend_from_slice(&self.parent_uuid);
        out.extend_from_slice(&self.received_uuid);
        for v in [self.otransid, self.stransid, self.rtransid] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for (sec, nsec) in [self.otime, self.stime, self.rtime] {
            out.extend_from_slice(&sec.to_le_bytes());
            out.extend_from_slice(&u64::from(nsec).to_le_bytes());
        }
        put_c_str(&mut out, &self.path, PATH)?;
        Some(out)
    }
    /// Reads an answer (missing fields read as 0).
    pub fn parse(b: &[u8]) -> SubvolInfo {
        let uuid = |at: usize| -> [u8; 16] {
            b.get(at..at + 16)
                .and_then(|s| s.try_into().ok())
                .unwrap_or_default()
        };
        SubvolInfo {
            id: u64_at(b, 0),
            parent: u64_at(b, 8),
            generation: u64_at(b, 16),
            flags: u64_at(b, 24),
            uuid: uuid(32),
            parent_uuid: uuid(48),
            received_uuid: uuid(64),
            otransid: u64_at(b, 80),
            stransid: u64_at(b, 88),
            rtransid: u64_at(b, 96),
            otime: (u64_at(b, 104) as i64, u64_at(b, 112) as u32),
            stime: (u64_at(b, 120) as i64, u64_at(b, 128) as u32),
            rtime: (u64_at(b, 136) as i64, u64_at(b, 144) as u32),
            path: c_str(b.get(152..).unwrap_or_default()).to_vec(),
        }
    }
}

/// On a regular file: its file extent items that end past the u64 file offset given, at
/// most `EXTENT_ENTRIES` (`ExtentsPage`): `oleo extents` through a mount, since FIEMAP
/// cannot pass through FUSE.
pub const EXTENTS: u32 = ioc(READ | WRITE, 9, EXTENTS_SIZE);
/// Most extents in one `ExtentsPage`.
pub const EXTENT_ENTRIES: usize = 256;
const EXTENT_ENTRY: usize = 32;
const EXTENTS_HEADER: usize = 24;
/// Size of EXTENTS' argument and answer (`ExtentsPage`).
pub const EXTENTS_SIZE: usize = EXTENTS_HEADER + EXTENT_ENTRIES * EXTENT_ENTRY;

/// `Extent` flag: the data is inline in the tree.
pub const EXTENT_INLINE: u32 = 1;
/// `Extent` flag: preallocated, reads as zeros.
pub const EXTENT_PREALLOC: u32 = 2;
/// `Extent` flag: compressed.
pub const EXTENT_ENCODED: u32 = 4;

/// One file extent item (a hole item is left out), as `oleo::ExtentInfo` says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Where the extent item starts in the file.
    pub file_offset: u64,
    /// Bytes of file it covers.
    pub len: u64,
    /// btrfs logical address of the first byte; None for inline data.
    pub logical: Option<u64>,
    /// `EXTENT_INLINE`, `EXTENT_PREALLOC`, `EXTENT_ENCODED`.
    pub flags: u32,
}

/// EXTENTS' answer: the file's size, the sector size, and a page of extents; `more` when
/// extents past the page's last remain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtentsPage {
    /// The file's size.
    pub size: u64,
    /// The filesystem's sector size.
    pub sectorsize: u32,
    /// Extents past this page's last remain: ask again from its end.
    pub more: bool,
    /// At most `EXTENT_ENTRIES` extents, in file order.
    pub extents: Vec<Extent>,
}

impl ExtentsPage {
    /// The `EXTENTS_SIZE`-byte answer (extents past `EXTENT_ENTRIES` are left out).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; EXTENTS_SIZE];
        b[0..8].copy_from_slice(&self.size.to_le_bytes());
        b[8..12].copy_from_slice(&self.sectorsize.to_le_bytes());
        b[12..16].copy_from_slice(&u32::from(self.more).to_le_bytes());
        let n = self.extents.len().min(EXTENT_ENTRIES);
        b[16..20].copy_from_slice(&(n as u32).to_le_bytes());
        for (i, e) in self.extents.iter().take(n).enumerate() {
            let at = EXTENTS_HEADER + i * EXTENT_ENTRY;
            b[at..at + 8].copy_from_slice(&e.file_offset.to_le_bytes());
            b[at + 8..at + 16].copy_from_slice(&e.len.to_le_bytes());
            b[at + 16..at + 24].copy_from_slice(&e.logical.unwrap_or(u64::MAX).to_le_bytes());
            b[at + 24..at + 28].copy_from_slice(&e.flags.to_le_bytes());
        }
        b
    }

    /// Reads an answer (missing fields read as 0).
    pub fn parse(b: &[u8]) -> ExtentsPage {
        let u32_at = |at: usize| {
            b.get(at..at + 4)
                .and_then(|s| s.try_into().ok())
                .map_or(0, u32::from_le_bytes)
        };
        let n = (u32_at(16) as usize).min(EXTENT_ENTRIES);
        let extents = (0..n)
            .map(|i| {
                let at = EXTENTS_HEADER + i * EXTENT_ENTRY;
                let logical = u64_at(b, at + 16);
                Extent {
                    file_offset: u64_at(b, at),
                    len: u64_at(b, at + 8),
                    logical: (logical != u64::MAX).then_some(logical),
                    flags: u32_at(at + 24),
                }
            })
            .collect();
        ExtentsPage {
            size: u64_at(b, 0),
            sectorsize: u32_at(8),
            more: u32_at(12) != 0,
            extents,
        }
    }
}

/// On any file: a page of the encoded [`FsUsage`] of the filesystem, from the u64 byte
/// offset given (`FsUsagePage`): what `oleo filesystem show | df | usage` print of a mount,
/// where btrfs-progs asks the FS_INFO, DEV_INFO, SPACE_INFO and TREE_SEARCH ioctls.
pub const FS_USAGE: u32 = ioc(READ | WRITE, 10, FS_USAGE_SIZE);
/// Size of FS_USAGE's argument and answer (`FsUsagePage`).
pub const FS_USAGE_SIZE: usize = 8192;
const FS_USAGE_HEADER: usize = 24;
/// Most bytes of the encoded report in one `FsUsagePage`.
pub const FS_USAGE_CHUNK: usize = FS_USAGE_SIZE - FS_USAGE_HEADER;

/// One device of the filesystem, for `filesystem show | usage`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsDevice {
    /// Device id.
    pub devid: u64,
    /// Its uuid (DEV_ITEM).
    pub uuid: [u8; 16],
    /// Size the filesystem may use on it (DEV_ITEM total_bytes).
    pub total_bytes: u64,
    /// Bytes its chunks take on it (DEV_ITEM bytes_used).
    pub bytes_used: u64,
    /// Size of the file or block device behind it (0 when missing or unknown).
    pub device_size: u64,
    /// Where it was opened from; None when it is missing.
    pub path: Option<Vec<u8>>,
}

/// One chunk and its block group's use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsChunk {
    /// Logical start.
    pub logical: u64,
    /// Logical length.
    pub length: u64,
    /// Block group type and profile bits.
    pub flags: u64,
    /// Bytes the block group uses.
    pub used: u64,
    /// The devid of each stripe, in stripe order.
    pub stripes: Vec<u64>,
}

/// Everything `oleo filesystem show | df | usage` need, from the engine's view of the
/// filesystem: the superblock's numbers, the devices, the chunks, and the size the kernel
/// would give its global block reserve.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct FsUsage {
    /// Label (no NUL).
    pub label: Vec<u8>,
    /// Filesystem uuid.
    pub fsid: [u8; 16],
    /// Devices the filesystem has (the superblock's num_devices).
    pub num_devices: u64,
    /// The superblock's total_bytes.
    pub total_bytes: u64,
    /// The superblock's bytes_used.
    pub bytes_used: u64,
    /// Sector size.
    pub sectorsize: u32,
    /// Node size.
    pub nodesize: u32,
    /// Size of the kernel's global block reserve right after a mount (see
    /// [`global_reserve`]).
    pub global_reserve: u64,
    /// The devices by devid, missing ones included.
    pub devices: Vec<FsDevice>,
    /// The chunks in logical order.
    pub chunks: Vec<FsChunk>,
}

/// The kernel's BTRFS_UNLINK_METADATA_UNITS: items an unlink touches.
const UNLINK_METADATA_UNITS: u64 = 6;
/// The kernel's BTRFS_MAX_LEVEL.
const MAX_LEVEL: u64 = 8;

/// The size `btrfs_update_global_block_rsv` (fs/btrfs/block-rsv.c) gives the global block
/// reserve when a filesystem is mounted: the bytes_used of the extent, csum and free space
/// trees (and of the block group tree), at least room to insert `1 + those trees + 6`
/// items and the delayed refs of an unlink (twice that with the free space tree), at most
/// 512 MiB. The root tree's own share is 0 at mount (the kernel keeps it in memory only,
/// from zero), which is what is taken here; later commits on a kernel mount move it.
///
/// `tree_bytes` is each such tree's bytes_used (one per tree found).
pub fn global_reserve(nodesize: u32, tree_bytes: &[u64], free_space_tree: bool) -> u64 {
    let insert = |items: u64| u64::from(nodesize) * MAX_LEVEL * 2 * items;
    let min_items = 1 + tree_bytes.len() as u64 + UNLINK_METADATA_UNITS;
    let delayed_refs = insert(UNLINK_METADATA_UNITS) * if free_space_tree { 2 } else { 1 };
    let used: u64 = tree_bytes.iter().fold(0u64, |a, &b| a.wrapping_add(b));
    used.max(insert(min_items) + delayed_refs).min(512 << 20)
}

/// Size of the file or block device at `path` (0 if it cannot be told).
fn device_size(path: &std::path::Path) -> u64 {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileTypeExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return 0;
    };
    if meta.is_file() {
        return meta.len();
    }
    if !meta.file_type().is_block_device() {
        return 0;
    }
    let Ok(f) = std::fs::File::open(path) else {
        return 0;
    };
    let mut size = 0u64;
    // BLKGETSIZE64 = _IOR(0x12, 114, size_t).
    const BLKGETSIZE64: u32 = (READ << 30) | (8 << 16) | (0x12 << 8) | 114;
    // SAFETY: the ioctl writes one u64 through a valid pointer.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), BLKGETSIZE64 as libc::Ioctl, &mut size) };
    if r == 0 {
        size
    } else {
        0
    }
}

impl FsUsage {
    /// What the engine says of `fs` now (block group use as last committed).
    pub fn from_engine(fs: &oleo::Filesystem) -> oleo::Result<FsUsage> {
        use oleo::format::key::{item, objectid};
        use oleo::format::superblock::compat_ro;
        let sb = fs.superblock();
        // The trees the kernel loads as global roots, and the block group tree.
        let fst = sb.has_compat_ro(compat_ro::FREE_SPACE_TREE);
        let bgt = sb.has_compat_ro(compat_ro::BLOCK_GROUP_TREE);
        let counted = |id: u64| {
            id == objectid::EXTENT_TREE
                || id == objectid::CSUM_TREE
                || (fst && id == objectid::FREE_SPACE_TREE)
                || (bgt && id == objectid::BLOCK_GROUP_TREE)
        };
        let mut tree_bytes = Vec::new();
        let mut failure = None;
        let mut walk_error = None;
        if let Some(root) = fs.tree_root(objectid::ROOT_TREE)? {
            fs.walk_tree(
                &root,
                &mut |block| {
                    if !block.is_leaf() {
                        return;
                    }
                    for slot in 0..block.nritems() {
                        let Ok(key) = block.item_key(slot) else {
                            continue;
                        };
                        if key.item_type != item::ROOT_ITEM || !counted(key.objectid) {
                            continue;
                        }
                        let parsed = block
                            .item_data(slot)
                            .ok()
                            .and_then(|d| oleo::format::items::RootItem::parse(d).ok());
                        match parsed {
                            Some(r) => tree_bytes.push(r.bytes_used),
                            None => {
                                failure.get_or_insert(format!("bad root item {key:?}"));
                            }
                        }
                    }
                },
                &mut |e| {
                    walk_error.get_or_insert(e.to_string());
                },
            )?;
        }
        if let Some(why) = failure.or(walk_error) {
            return Err(oleo::Error::corrupt(0, why));
        }
        let devices = fs
            .devices()?
            .into_iter()
            .map(|d| FsDevice {
                devid: d.devid,
                uuid: d.uuid,
                total_bytes: d.total_bytes,
                bytes_used: d.bytes_used,
                device_size: d.path.as_deref().map_or(0, device_size),
                path: d.path.map(|p| {
                    use std::os::unix::ffi::OsStrExt;
                    p.as_os_str().as_bytes().to_vec()
                }),
            })
            .collect();
        let chunks = fs
            .chunk_usage()?
            .into_iter()
            .map(|c| FsChunk {
                logical: c.logical,
                length: c.length,
                flags: c.flags,
                used: c.used,
                stripes: c.stripes.iter().map(|s| s.0).collect(),
            })
            .collect();
        Ok(FsUsage {
            label: sb.label.clone(),
            fsid: sb.fsid,
            num_devices: sb.num_devices,
            total_bytes: sb.total_bytes,
            bytes_used: sb.bytes_used,
            sectorsize: sb.sectorsize,
            nodesize: sb.nodesize,
            global_reserve: global_reserve(sb.nodesize, &tree_bytes, fst),
            devices,
            chunks,
        })
    }

    /// The report as bytes (little-endian, lengths before variable parts).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        let bytes = |b: &mut Vec<u8>, s: &[u8]| {
            b.extend_from_slice(&(s.len() as u32).to_le_bytes());
            b.extend_from_slice(s);
        };
        bytes(&mut b, &self.label);
        b.extend_from_slice(&self.fsid);
        for v in [
            self.num_devices,
            self.total_bytes,
            self.bytes_used,
            self.global_reserve,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&self.sectorsize.to_le_bytes());
        b.extend_from_slice(&self.nodesize.to_le_bytes());
        b.extend_from_slice(&(self.devices.len() as u32).to_le_bytes());
        for d in &self.devices {
            b.extend_from_slice(&d.devid.to_le_bytes());
            b.extend_from_slice(&d.uuid);
            for v in [d.total_bytes, d.bytes_used, d.device_size] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            b.push(u8::from(d.path.is_some()));
            bytes(&mut b, d.path.as_deref().unwrap_or_default());
        }
        b.extend_from_slice(&(self.chunks.len() as u32).to_le_bytes());
        for c in &self.chunks {
            for v in [c.logical, c.length, c.flags, c.used] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            b.extend_from_slice(&(c.stripes.len() as u32).to_le_bytes());
            for s in &c.stripes {
                b.extend_from_slice(&s.to_le_bytes());
            }
        }
        b
    }

    /// Reads what [`FsUsage::encode`] wrote; None if it is cut short.
    pub fn decode(b: &[u8]) -> Option<FsUsage> {
        let mut r = Reader { b, at: 0 };
        let label = r.bytes()?;
        let fsid = r.take(16)?.try_into().ok()?;
        let (num_devices, total_bytes, bytes_used, global_reserve) =
            (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
        let (sectorsize, nodesize) = (r.u32()?, r.u32()?);
        let mut devices = Vec::new();
        for _ in 0..r.u32()? {
            let devid = r.u64()?;
            let uuid = r.take(16)?.try_into().ok()?;
            let (total_bytes, bytes_used, device_size) = (r.u64()?, r.u64()?, r.u64()?);
            let present = r.take(1)?[0] != 0;
            let path = r.bytes()?;
            devices.push(FsDevice {
                devid,
                uuid,
                total_bytes,
                bytes_used,
                device_size,
                path: present.then_some(path),
            });
        }
        let mut chunks = Vec::new();
        for _ in 0..r.u32()? {
            let (logical, length, flags, used) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
            let n = r.u32()? as usize;
            // Each stripe takes 8 bytes: a count past what is left is a bad report.
            if n > b.len() / 8 {
                return None;
            }
            let stripes = (0..n).map(|_| r.u64()).collect::<Option<Vec<u64>>>()?;
            chunks.push(FsChunk {
                logical,
                length,
                flags,
                used,
                stripes,
            });
        }
        Some(FsUsage {
            label,
            fsid,
            num_devices,
            total_bytes,
            bytes_used,
            sectorsize,
            nodesize,
            global_reserve,
            devices,
            chunks,
        })
    }
}

/// Reads fields in order out of an encoded report.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn bytes(&mut self) -> Option<Vec<u8>> {
        let n = self.u32()? as usize;
        Some(self.take(n)?.to_vec())
    }
}

/// FS_USAGE's answer: `data` is the encoded report from the offset asked for; `total` its
/// whole length, `stamp` a digest of the whole (a change between pages means start over).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsUsagePage {
    /// Length of the whole encoded report.
    pub total: u64,
    /// Digest of the whole encoded report.
    pub stamp: u64,
    /// At most `FS_USAGE_CHUNK` bytes of it.
    pub data: Vec<u8>,
}

impl FsUsagePage {
    /// The page of `report` (an encoded [`FsUsage`]) that starts at `from`.
    pub fn of(report: &[u8], from: u64) -> FsUsagePage {
        let start = usize::try_from(from)
            .unwrap_or(usize::MAX)
            .min(report.len());
        let end = report.len().min(start + FS_USAGE_CHUNK);
        FsUsagePage {
            total: report.len() as u64,
            stamp: digest(report),
            data: report[start..end].to_vec(),
        }
    }

    /// The `FS_USAGE_SIZE`-byte answer.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; FS_USAGE_SIZE];
        let n = self.data.len().min(FS_USAGE_CHUNK);
        b[0..8].copy_from_slice(&self.total.to_le_bytes());
        b[8..16].copy_from_slice(&self.stamp.to_le_bytes());
        b[16..20].copy_from_slice(&(n as u32).to_le_bytes());
        b[FS_USAGE_HEADER..FS_USAGE_HEADER + n].copy_from_slice(&self.data[..n]);
        b
    }

    /// Reads an answer (missing fields read as 0).
    pub fn parse(b: &[u8]) -> FsUsagePage {
        let n = b
            .get(16..20)
            .and_then(|s| s.try_into().ok())
            .map_or(0, u32::from_le_bytes) as usize;
        let n = n.min(FS_USAGE_CHUNK);
        FsUsagePage {
            total: u64_at(b, 0),
            stamp: u64_at(b, 8),
            data: b
                .get(FS_USAGE_HEADER..FS_USAGE_HEADER + n)
                .unwrap_or_default()
                .to_vec(),
        }
    }
}

/// FNV-1a over the report: enough to notice that it changed between two pages.
fn digest(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_round_trip_and_sizes_match_the_numbers() {
        let s = SnapshotArgs {
            source: 257,
            flags: RO,
            name: b"snap".to_vec(),
        };
        let b = s.to_bytes().unwrap();
        assert_eq!(b.len(), SNAPSHOT_SIZE);
        assert_eq!(SnapshotArgs::parse(&b), s);
        let i = SubvolInfo {
            id: 260,
            parent: 5,
            generation: 9,
            flags: 0,
            uuid: [7; 16],
            parent_uuid: [0; 16],
            received_uuid: [9; 16],
            otransid: 8,
            stransid: 0,
            rtransid: 3,
            otime: (1_700_000_000, 5),
            stime: (0, 0),
            rtime: (-1, 999),
            path: b"a/b".to_vec(),
        };
        let b = i.to_bytes().unwrap();
        assert_eq!(b.len(), INFO_SIZE);
        assert_eq!(SubvolInfo::parse(&b), i);
        assert_eq!(create_arg(b"x").unwrap().len(), NAME);
        assert!(create_arg(&[b'a'; NAME]).is_none());
        assert_eq!((SNAPSHOT >> 16) & 0x3fff, SNAPSHOT_SIZE as u32);
        assert_eq!((NEXT_SUBVOL >> 30), READ | WRITE);
        let o = ServerOptions {
            flags: 1 << 21,
            writable: true,
            options: b"commit=30\ncompress=no".to_vec(),
        };
        let b = o.to_bytes().unwrap();
        assert_eq!(b.len(), SERVER_OPTIONS_SIZE);
        assert_eq!(ServerOptions::parse(&b), o);
        assert_eq!(
            (GET_SERVER_OPTIONS >> 16) & 0x3fff,
            SERVER_OPTIONS_SIZE as u32
        );
    }

    #[test]
    fn an_extents_page_round_trips() {
        let p = ExtentsPage {
            size: 1 << 20,
            sectorsize: 4096,
            more: true,
            extents: vec![
                Extent {
                    file_offset: 0,
                    len: 3000,
                    logical: None,
                    flags: EXTENT_INLINE,
                },
                Extent {
                    file_offset: 8192,
                    len: 4096,
                    logical: Some(13 << 20),
                    flags: EXTENT_PREALLOC | EXTENT_ENCODED,
                },
            ],
        };
        let b = p.to_bytes();
        assert_eq!(b.len(), EXTENTS_SIZE);
        assert_eq!(ExtentsPage::parse(&b), p);
        assert_eq!((EXTENTS >> 16) & 0x3fff, EXTENTS_SIZE as u32);
    }

    #[test]
    fn a_usage_report_round_trips_in_pages() {
        let u = FsUsage {
            label: b"lbl".to_vec(),
            fsid: [3; 16],
            num_devices: 2,
            total_bytes: 2 << 30,
            bytes_used: 5 << 20,
            sectorsize: 4096,
            nodesize: 16384,
            global_reserve: 5632 << 10,
            devices: vec![
                FsDevice {
                    devid: 1,
                    uuid: [1; 16],
                    total_bytes: 1 << 30,
                    bytes_used: 1 << 28,
                    device_size: 1 << 30,
                    path: Some(b"/dev/loop0".to_vec()),
                },
                FsDevice {
                    devid: 2,
                    uuid: [2; 16],
                    total_bytes: 1 << 30,
                    bytes_used: 1 << 28,
                    device_size: 0,
                    path: None,
                },
            ],
            chunks: (0..500)
                .map(|i| FsChunk {
                    logical: i << 30,
                    length: 1 << 30,
                    flags: 1 | 16,
                    used: i,
                    stripes: vec![1, 2],
                })
                .collect(),
        };
        let enc = u.encode();
        assert!(enc.len() > 2 * FS_USAGE_CHUNK);
        let mut got = Vec::new();
        while got.len() < enc.len() {
            let b = FsUsagePage::of(&enc, got.len() as u64).to_bytes();
            assert_eq!(b.len(), FS_USAGE_SIZE);
            let p = FsUsagePage::parse(&b);
            assert_eq!(p.total, enc.len() as u64);
            got.extend(p.data);
        }
        assert_eq!(FsUsage::decode(&got), Some(u));
        assert_eq!(FsUsage::decode(&got[..got.len() - 1]), None);
        assert_eq!((FS_USAGE >> 16) & 0x3fff, FS_USAGE_SIZE as u32);
    }

    #[test]
    fn the_global_reserve_is_the_kernels() {
        // mkfs defaults (16 KiB nodes, free space tree): 5.50 MiB, as the kernel reports.
        assert_eq!(global_reserve(16384, &[16384; 3], true), 5632 << 10);
        // Without the free space tree, two trees: 3.75 MiB; with a block group tree too,
        // 5.75 MiB (both seen on Linux 6.18).
        assert_eq!(global_reserve(16384, &[16384; 2], false), 3840 << 10);
        assert_eq!(global_reserve(16384, &[16384; 4], true), 5888 << 10);
        // Big trees: their size, at most 512 MiB.
        assert_eq!(
            global_reserve(16384, &[100 << 20, 1 << 20], true),
            101 << 20
        );
        assert_eq!(global_reserve(16384, &[1 << 30], true), 512 << 20);
    }
}

/// On any file: starts a scrub of the mounted filesystem in the server's background. In:
/// u64 flags ([`SCRUB_READONLY`]), u64 bytes per second at most (0: no limit). EBUSY while
/// one runs.
pub const SCRUB_START: u32 = ioc(WRITE, 11, 16);
/// SCRUB_START's flag: report only, repair nothing (`scrub start -r`).
pub const SCRUB_READONLY: u64 = 1;
/// On any file: the state of the mount's last or running scrub ([`ScrubStatus`]).
pub const SCRUB_STATUS: u32 = ioc(READ, 12, SCRUB_STATUS_SIZE);
/// Devices a [`ScrubStatus`] or [`DevStatsReply`] holds at most.
pub const MAX_DEVICES: usize = 16;
/// Counters per device in a [`ScrubStatus`] (btrfs_scrub_progress's, in its order).
pub const SCRUB_COUNTERS: usize = 15;
/// Size of SCRUB_STATUS's answer.
pub const SCRUB_STATUS_SIZE: usize = 8 * 4 + MAX_DEVICES * 8 * (1 + SCRUB_COUNTERS);
/// On any file: the devices' error counters ([`DevStatsReply`]); in: u64 flags, 1 to zero
/// them after reading (`device stats -z`).
pub const DEV_STATS: u32 = ioc(READ | WRITE, 13, DEV_STATS_SIZE);
/// Size of DEV_STATS's argument and answer.
pub const DEV_STATS_SIZE: usize = 8 + MAX_DEVICES * 8 * 6;

/// Where a mount's scrub stands.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrubStatus {
    /// 0: none since the mount; 1: running; 2: finished; 3: failed; 4: finished, errors
    /// uncorrectable.
    pub state: u64,
    /// When it started (seconds since the epoch).
    pub started: u64,
    /// Seconds it ran (so far).
    pub duration: u64,
    /// Per device: devid and the counters (`ScrubProgress` in field order).
    pub devices: Vec<(u64, [u64; SCRUB_COUNTERS])>,
}

impl ScrubStatus {
    /// The fixed-size answer.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(SCRUB_STATUS_SIZE);
        for v in [
            self.state,
            self.started,
            self.duration,
            self.devices.len() as u64,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for (devid, c) in self.devices.iter().take(MAX_DEVICES) {
            b.extend_from_slice(&devid.to_le_bytes());
            for v in c {
                b.extend_from_slice(&v.to_le_bytes());
            }
        }
        b.resize(SCRUB_STATUS_SIZE, 0);
        b
    }

    /// Reads an answer back.
    pub fn parse(b: &[u8]) -> ScrubStatus {
        let n = (u64_at(b, 24) as usize).min(MAX_DEVICES);
        let devices = (0..n)
            .map(|i| {
                let at = 32 + i * 8 * (1 + SCRUB_COUNTERS);
                let mut c = [0u64; SCRUB_COUNTERS];
                for (j, v) in c.iter_mut().enumerate() {
                    *v = u64_at(b, at + 8 + j * 8);
                }
                (u64_at(b, at), c)
            })
            .collect();
        ScrubStatus {
            state: u64_at(b, 0),
            started: u64_at(b, 8),
            duration: u64_at(b, 16),
            devices,
        }
    }
}

/// The devices' error counters: devid, then write, read, flush, corruption, generation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DevStatsReply {
    /// One entry per device, in devid order.
    pub devices: Vec<(u64, [u64; 5])>,
}

impl DevStatsReply {
    /// The fixed-size answer.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(DEV_STATS_SIZE);
        b.extend_from_slice(&(self.devices.len() as u64).to_le_bytes());
        for (devid, c) in self.devices.iter().take(MAX_DEVICES) {
            b.extend_from_slice(&devid.to_le_bytes());
            for v in c {
                b.extend_from_slice(&v.to_le_bytes());
            }
        }
        b.resize(DEV_STATS_SIZE, 0);
        b
    }

    /// Reads an answer back.
    pub fn parse(b: &[u8]) -> DevStatsReply {
        let n = (u64_at(b, 0) as usize).min(MAX_DEVICES);
        DevStatsReply {
            devices: (0..n)
                .map(|i| {
                    let at = 8 + i * 48;
                    let mut c = [0u64; 5];
                    for (j, v) in c.iter_mut().enumerate() {
                        *v = u64_at(b, at + 8 + j * 8);
                    }
                    (u64_at(b, at), c)
                })
                .collect(),
        }
    }
}

/// A scrub's counters in ScrubStatus order.
pub fn scrub_counters(p: &oleo::ScrubProgress) -> [u64; SCRUB_COUNTERS] {
    [
        p.data_extents_scrubbed,
        p.tree_extents_scrubbed,
        p.data_bytes_scrubbed,
        p.tree_bytes_scrubbed,
        p.read_errors,
        p.csum_errors,
        p.verify_errors,
        p.no_csum,
        p.csum_discards,
        p.super_errors,
        p.malloc_errors,
        p.uncorrectable_errors,
        p.corrected_errors,
        p.unverified_errors,
        p.last_physical,
    ]
}

/// Counters in ScrubStatus order back into a `ScrubProgress`.
pub fn scrub_progress(c: &[u64; SCRUB_COUNTERS]) -> oleo::ScrubProgress {
    oleo::ScrubProgress {
        data_extents_scrubbed: c[0],
        tree_extents_scrubbed: c[1],
        data_bytes_scrubbed: c[2],
        tree_bytes_scrubbed: c[3],
        read_errors: c[4],
        csum_errors: c[5],
        verify_errors: c[6],
        no_csum: c[7],
        csum_discards: c[8],
        super_errors: c[9],
        malloc_errors: c[10],
        uncorrectable_errors: c[11],
        corrected_errors: c[12],
        unverified_errors: c[13],
        last_physical: c[14],
    }
}

/// Size of SEND's and RECEIVE's argument and answer (`SendRequest`, `ReceiveRequest`,
/// `StreamReply`).
pub const STREAM_SIZE: usize = 8192;
/// On any file: write the send stream of subvolumes to the caller's FIFO (`SendRequest`);
/// answers with a `StreamReply` once the stream is written. A send stream cannot pass
/// through a fixed-size buffer, so it goes through a FIFO the caller owns and reads.
pub const SEND: u32 = ioc(READ | WRITE, 14, STREAM_SIZE);
/// On a directory: receive the send stream read from the caller's FIFO into it
/// (`ReceiveRequest`); answers with a `StreamReply` once it is applied.
pub const RECEIVE: u32 = ioc(READ | WRITE, 15, STREAM_SIZE);
/// Most subvolumes (snapshots and clone sources together) one `SendRequest` names.
pub const STREAM_SUBVOLS: usize = 64;
/// Longest FIFO path, with its NUL.
pub const FIFO_PATH: usize = 4096;
/// Longest name of a stream's input in a `ReceiveRequest`, with its NUL.
pub const INPUT_NAME: usize = 1024;
/// `SendRequest` flag: compressed extents as ENCODED_WRITEs (protocol 2).
pub const SEND_COMPRESSED: u64 = 1;
/// `ReceiveRequest` flag: stop after the first END (`btrfs receive -e`).
pub const RECEIVE_END: u64 = 1;
/// `ReceiveRequest` flag: no "At subvol" lines.
pub const RECEIVE_QUIET: u64 = 2;

const SEND_IDS: usize = 32;
const SEND_FIFO: usize = SEND_IDS + STREAM_SUBVOLS * 8;
const RECEIVE_FIFO: usize = 8;
const RECEIVE_NAME: usize = RECEIVE_FIFO + FIFO_PATH;
const _: () = assert!(SEND_FIFO + FIFO_PATH <= STREAM_SIZE);
const _: () = assert!(RECEIVE_NAME + INPUT_NAME <= STREAM_SIZE);

fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

/// SEND's argument: what `btrfs send` is asked for, subvolumes by id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SendRequest {
    /// The read-only snapshots to send, in order.
    pub snapshots: Vec<u64>,
    /// `-p`: the parent snapshot (0: a full send).
    pub parent: u64,
    /// `-c`: clone sources.
    pub clone_sources: Vec<u64>,
    /// Protocol version.
    pub proto: u32,
    /// `SEND_COMPRESSED`.
    pub flags: u64,
    /// The FIFO the stream goes to (no NUL).
    pub fifo: Vec<u8>,
}

impl SendRequest {
    /// None if too many subvolumes or the path does not fit.
    pub fn to_bytes(&self) -> Option<Vec<u8>> {
        let ids: Vec<u64> = self
            .snapshots
            .iter()
            .chain(&self.clone_sources)
            .copied()
            .collect();
        if ids.len() > STREAM_SUBVOLS {
            return None;
        }
        let mut b = Vec::with_capacity(STREAM_SIZE);
        b.extend_from_slice(&self.flags.to_le_bytes());
        b.extend_from_slice(&self.proto.to_le_bytes());
        b.extend_from_slice(&(self.snapshots.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.parent.to_le_bytes());
        b.extend_from_slice(&(self.clone_sources.len() as u32).to_le_bytes());
        b.resize(SEND_IDS, 0);
        for id in ids {
            b.extend_from_slice(&id.to_le_bytes());
        }
        b.resize(SEND_FIFO, 0);
        put_c_str(&mut b, &self.fifo, FIFO_PATH)?;
        b.resize(STREAM_SIZE, 0);
        Some(b)
    }

    /// Reads an argument; None if its counts are out of range.
    pub fn parse(b: &[u8]) -> Option<SendRequest> {
        let (snaps, clones) = (u32_at(b, 12) as usize, u32_at(b, 24) as usize);
        if snaps + clones > STREAM_SUBVOLS {
            return None;
        }
        let id = |i: usize| u64_at(b, SEND_IDS + i * 8);
        Some(SendRequest {
            snapshots: (0..snaps).map(id).collect(),
            parent: u64_at(b, 16),
            clone_sources: (snaps..snaps + clones).map(id).collect(),
            proto: u32_at(b, 8),
            flags: u64_at(b, 0),
            fifo: c_str(b.get(SEND_FIFO..SEND_FIFO + FIFO_PATH)?).to_vec(),
        })
    }
}

/// RECEIVE's argument.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReceiveRequest {
    /// `RECEIVE_END`, `RECEIVE_QUIET`.
    pub flags: u64,
    /// The FIFO the stream comes from (no NUL).
    pub fifo: Vec<u8>,
    /// How errors name the input ("FILE: ", or empty for standard input).
    pub name: Vec<u8>,
}

impl ReceiveRequest {
    /// None if the path does not fit (a long name is cut).
    pub fn to_bytes(&self) -> Option<Vec<u8>> {
        let mut b = Vec::with_capacity(STREAM_SIZE);
        b.extend_from_slice(&self.flags.to_le_bytes());
        put_c_str(&mut b, &self.fifo, FIFO_PATH)?;
        let name: Vec<u8> = self.name.iter().copied().filter(|&c| c != 0).collect();
        put_c_str(&mut b, &name[..name.len().min(INPUT_NAME - 1)], INPUT_NAME)?;
        b.resize(STREAM_SIZE, 0);
        Some(b)
    }

    /// Reads an argument (missing fields read as empty).
    pub fn parse(b: &[u8]) -> ReceiveRequest {
        let field = |at: usize, len: usize| c_str(b.get(at..at + len).unwrap_or_default()).to_vec();
        ReceiveRequest {
            flags: u64_at(b, 0),
            fifo: field(RECEIVE_FIFO, FIFO_PATH),
            name: field(RECEIVE_NAME, INPUT_NAME),
        }
    }
}

/// Which of the caller's outputs a line of a `StreamReply` is for.
pub const STDOUT: u8 = 1;
/// See [`STDOUT`].
pub const STDERR: u8 = 2;

/// SEND's and RECEIVE's answer: how it went, the lines the command prints (`btrfs
/// receive`'s "At subvol" lines, warnings) and the error.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamReply {
    /// The stream was sent or received whole.
    pub ok: bool,
    /// (`STDOUT` or `STDERR`, text without its newline), in order.
    pub lines: Vec<(u8, Vec<u8>)>,
    /// Why it failed (empty if `ok`).
    pub error: Vec<u8>,
}

/// Room kept for the error in a `StreamReply`.
const REPLY_ERROR: usize = 2048;
const REPLY_HEADER: usize = 16;

impl StreamReply {
    /// The `STREAM_SIZE`-byte answer. What does not fit is cut: the error to its first
    /// 2 KiB, then lines past the room left, the last line saying how many were left out.
    pub fn to_bytes(&self) -> Vec<u8> {
        let error = &self.error[..self.error.len().min(REPLY_ERROR)];
        let room = STREAM_SIZE - REPLY_HEADER - error.len();
        let mut body = Vec::new();
        let mut n = 0u32;
        for (i, (fd, text)) in self.lines.iter().enumerate() {
            let left = self.lines.len() - i;
            let note = format!("... {left} more lines");
            // Room for this line and, after it, a note about the rest.
            if body.len() + 5 + text.len() + 5 + note.len() > room {
                body.push(STDERR);
                body.extend_from_slice(&(note.len() as u32).to_le_bytes());
                body.extend_from_slice(note.as_bytes());
                n += 1;
                break;
            }
            body.push(*fd);
            body.extend_from_slice(&(text.len() as u32).to_le_bytes());
            body.extend_from_slice(text);
            n += 1;
        }
        let mut b = Vec::with_capacity(STREAM_SIZE);
        b.extend_from_slice(&(if self.ok { 1u64 } else { 2u64 }).to_le_bytes());
        b.extend_from_slice(&n.to_le_bytes());
        b.extend_from_slice(&(error.len() as u32).to_le_bytes());
        b.extend_from_slice(error);
        b.extend_from_slice(&body);
        b.resize(STREAM_SIZE, 0);
        b
    }

    /// Reads an answer; None if the server did not fill it in.
    pub fn parse(b: &[u8]) -> Option<StreamReply> {
        let status = u64_at(b, 0);
        if status != 1 && status != 2 {
            return None;
        }
        let (n, elen) = (u32_at(b, 8) as usize, u32_at(b, 12) as usize);
        let mut at = REPLY_HEADER;
        let error = b.get(at..at + elen)?.to_vec();
        at += elen;
        let mut lines = Vec::new();
        for _ in 0..n {
            let fd = *b.get(at)?;
            let len = u32_at(b, at + 1) as usize;
            lines.push((fd, b.get(at + 5..at + 5 + len)?.to_vec()));
            at += 5 + len;
        }
        Some(StreamReply {
            ok: status == 1,
            lines,
            error,
        })
    }
}

#[cfg(test)]
mod stream_tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip() {
        let s = SendRequest {
            snapshots: vec![257, 300],
            parent: 258,
            clone_sources: vec![259],
            proto: 2,
            flags: SEND_COMPRESSED,
            fifo: b"/tmp/x/fifo".to_vec(),
        };
        assert_eq!(SendRequest::parse(&s.to_bytes().unwrap()), Some(s));
        let r = ReceiveRequest {
            flags: RECEIVE_END,
            fifo: b"/tmp/y/fifo".to_vec(),
            name: b"stream: ".to_vec(),
        };
        assert_eq!(ReceiveRequest::parse(&r.to_bytes().unwrap()), r);
        let a = StreamReply {
            ok: false,
            lines: vec![(STDERR, b"At subvol s".to_vec()), (STDOUT, b"x".to_vec())],
            error: b"bad".to_vec(),
        };
        assert_eq!(StreamReply::parse(&a.to_bytes()), Some(a));
        assert_eq!(StreamReply::parse(&[0; STREAM_SIZE]), None);
    }

    #[test]
    fn long_replies_are_cut_not_broken() {
        let a = StreamReply {
            ok: true,
            lines: vec![(STDERR, vec![b'a'; 1000]); 20],
            error: vec![b'e'; 5000],
        };
        let back = StreamReply::parse(&a.to_bytes()).unwrap();
        assert_eq!(back.error.len(), REPLY_ERROR);
        assert!(back.lines.len() < 20);
        assert!(back.lines.last().unwrap().1.starts_with(b"... "));
        let too_many = SendRequest {
            snapshots: vec![1; STREAM_SUBVOLS + 1],
            ..Default::default()
        };
        assert!(too_many.to_bytes().is_none());
        let mut bad = vec![0u8; STREAM_SIZE];
        bad[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(SendRequest::parse(&bad).is_none());
    }
}
