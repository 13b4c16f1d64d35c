//! Subvolume commands on a mounted oleo filesystem. btrfs's own ioctls cannot reach a FUSE
//! server (they carry file descriptors and variable-size buffers, and FUSE passes only
//! fixed-size ones), so `oleo subvolume` and `oleo property` use these instead: fixed-size
//! ioctls on a file or directory of the mount, type 'o'. Numbers and layouts are oleo's
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
}
