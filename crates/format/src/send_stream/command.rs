//! Command and attribute numbers (btrfs-progs' `send.h`, protocols 1 to 3) and the typed
//! [`Command`].

/// The stream's first 13 bytes: `btrfs-stream` and its NUL.
pub const STREAM_MAGIC: &[u8; 13] = b"btrfs-stream\0";
/// Magic and little-endian u32 version.
pub const STREAM_HEADER_SIZE: usize = 17;
/// A command's header: payload length u32, command u16, crc32c u32.
pub const CMD_HEADER_SIZE: usize = 10;
/// An attribute's header: type u16, length u16 (only the type for v2+ `DATA`).
pub const TLV_HEADER_SIZE: usize = 4;
/// The newest protocol version this module reads and writes.
pub const MAX_VERSION: u32 = 3;
/// The largest payload a reader accepts. The kernel's commands are far smaller (v1: 64 KiB,
/// v2: 16 KiB + 128 KiB of encoded data); anything beyond this is damage, not data.
pub const MAX_COMMAND_LEN: u32 = 16 << 20;

/// One step of the stream's checksum: crc32c as the kernel's `crc32c(seed, ...)`, without
/// the usual inversions. A command's crc is `crc32c_raw(0, header with crc 0 + payload)`.
pub fn crc32c_raw(crc: u32, data: &[u8]) -> u32 {
    // crc32c_append inverts on the way in and out; undo both.
    !crc32c::crc32c_append(!crc, data)
}

/// Command numbers (`BTRFS_SEND_C_*`).
pub mod cmd {
    /// 0 is never a valid command.
    pub const UNSPEC: u16 = 0;
    /// Start of a full stream: the subvolume to create.
    pub const SUBVOL: u16 = 1;
    /// Start of an incremental stream: the snapshot to create from a parent.
    pub const SNAPSHOT: u16 = 2;
    /// Create a regular file.
    pub const MKFILE: u16 = 3;
    /// Create a directory.
    pub const MKDIR: u16 = 4;
    /// Create a device node.
    pub const MKNOD: u16 = 5;
    /// Create a FIFO.
    pub const MKFIFO: u16 = 6;
    /// Create a socket.
    pub const MKSOCK: u16 = 7;
    /// Create a symlink.
    pub const SYMLINK: u16 = 8;
    /// Rename a path.
    pub const RENAME: u16 = 9;
    /// Create a hard link.
    pub const LINK: u16 = 10;
    /// Remove a name.
    pub const UNLINK: u16 = 11;
    /// Remove a directory.
    pub const RMDIR: u16 = 12;
    /// Set an extended attribute.
    pub const SET_XATTR: u16 = 13;
    /// Remove an extended attribute.
    pub const REMOVE_XATTR: u16 = 14;
    /// Write file data.
    pub const WRITE: u16 = 15;
    /// Clone a range from another file.
    pub const CLONE: u16 = 16;
    /// Set a file's size.
    pub const TRUNCATE: u16 = 17;
    /// Set a mode.
    pub const CHMOD: u16 = 18;
    /// Set owner and group.
    pub const CHOWN: u16 = 19;
    /// Set times.
    pub const UTIMES: u16 = 20;
    /// End of the stream.
    pub const END: u16 = 21;
    /// A changed range, without its data (`send --no-data`).
    pub const UPDATE_EXTENT: u16 = 22;
    /// The last command of protocol 1.
    pub const MAX_V1: u16 = 22;
    /// Preallocate, punch or zero a range (v2).
    pub const FALLOCATE: u16 = 23;
    /// Set inode flags (v2).
    pub const FILEATTR: u16 = 24;
    /// Write data as the source stores it, compressed (v2).
    pub const ENCODED_WRITE: u16 = 25;
    /// The last command of protocol 2.
    pub const MAX_V2: u16 = 25;
    /// Enable fs-verity on a file (v3).
    pub const ENABLE_VERITY: u16 = 26;
    /// The last command of protocol 3.
    pub const MAX_V3: u16 = 26;
}

/// Attribute numbers (`BTRFS_SEND_A_*`).
pub mod attr {
    /// 0 is never a valid attribute.
    pub const UNSPEC: u16 = 0;
    /// uuid: a subvolume's.
    pub const UUID: u16 = 1;
    /// u64: a subvolume's ctransid.
    pub const CTRANSID: u16 = 2;
    /// u64: inode number on the sending side.
    pub const INO: u16 = 3;
    /// u64: a size or length.
    pub const SIZE: u16 = 4;
    /// u64: a mode.
    pub const MODE: u16 = 5;
    /// u64: owner.
    pub const UID: u16 = 6;
    /// u64: group.
    pub const GID: u16 = 7;
    /// u64: device number (new_encode_dev).
    pub const RDEV: u16 = 8;
    /// timespec.
    pub const CTIME: u16 = 9;
    /// timespec.
    pub const MTIME: u16 = 10;
    /// timespec.
    pub const ATIME: u16 = 11;
    /// timespec: creation time.
    pub const OTIME: u16 = 12;
    /// string.
    pub const XATTR_NAME: u16 = 13;
    /// data.
    pub const XATTR_DATA: u16 = 14;
    /// string: the path the command acts on.
    pub const PATH: u16 = 15;
    /// string: a rename's destination.
    pub const PATH_TO: u16 = 16;
    /// string: a link's existing path, or a symlink's target.
    pub const PATH_LINK: u16 = 17;
    /// u64.
    pub const FILE_OFFSET: u16 = 18;
    /// data: in v2+ it has no length field and takes the rest of the command.
    pub const DATA: u16 = 19;
    /// uuid: the clone source's subvolume.
    pub const CLONE_UUID: u16 = 20;
    /// u64: the clone source's subvolume ctransid.
    pub const CLONE_CTRANSID: u16 = 21;
    /// string: the clone source's path.
    pub const CLONE_PATH: u16 = 22;
    /// u64.
    pub const CLONE_OFFSET: u16 = 23;
    /// u64.
    pub const CLONE_LEN: u16 = 24;
    /// The last attribute of protocol 1.
    pub const MAX_V1: u16 = 24;
    /// u32 (v2).
    pub const FALLOCATE_MODE: u16 = 25;
    /// u64: btrfs inode flags (v2).
    pub const FILEATTR: u16 = 26;
    /// u64 (v2).
    pub const UNENCODED_FILE_LEN: u16 = 27;
    /// u64 (v2).
    pub const UNENCODED_LEN: u16 = 28;
    /// u64 (v2).
    pub const UNENCODED_OFFSET: u16 = 29;
    /// u32, 0 (none) when absent (v2).
    pub const COMPRESSION: u16 = 30;
    /// u32, 0 (none) when absent (v2).
    pub const ENCRYPTION: u16 = 31;
    /// The last attribute of protocol 2.
    pub const MAX_V2: u16 = 31;
    /// u8 (v3).
    pub const VERITY_ALGORITHM: u16 = 32;
    /// u32 (v3).
    pub const VERITY_BLOCK_SIZE: u16 = 33;
    /// data (v3).
    pub const VERITY_SALT_DATA: u16 = 34;
    /// data (v3).
    pub const VERITY_SIG_DATA: u16 = 35;
    /// The last attribute of protocol 3.
    pub const MAX_V3: u16 = 35;
}

const CMD_NAMES: [&str; 27] = [
    "UNSPEC",
    "SUBVOL",
    "SNAPSHOT",
    "MKFILE",
    "MKDIR",
    "MKNOD",
    "MKFIFO",
    "MKSOCK",
    "SYMLINK",
    "RENAME",
    "LINK",
    "UNLINK",
    "RMDIR",
    "SET_XATTR",
    "REMOVE_XATTR",
    "WRITE",
    "CLONE",
    "TRUNCATE",
    "CHMOD",
    "CHOWN",
    "UTIMES",
    "END",
    "UPDATE_EXTENT",
    "FALLOCATE",
    "FILEATTR",
    "ENCODED_WRITE",
    "ENABLE_VERITY",
];

const ATTR_NAMES: [&str; 36] = [
    "UNSPEC",
    "UUID",
    "CTRANSID",
    "INO",
    "SIZE",
    "MODE",
    "UID",
    "GID",
    "RDEV",
    "CTIME",
    "MTIME",
    "ATIME",
    "OTIME",
    "XATTR_NAME",
    "XATTR_DATA",
    "PATH",
    "PATH_TO",
    "PATH_LINK",
    "FILE_OFFSET",
    "DATA",
    "CLONE_UUID",
    "CLONE_CTRANSID",
    "CLONE_PATH",
    "CLONE_OFFSET",
    "CLONE_LEN",
    "FALLOCATE_MODE",
    "FILEATTR",
    "UNENCODED_FILE_LEN",
    "UNENCODED_LEN",
    "UNENCODED_OFFSET",
    "COMPRESSION",
    "ENCRYPTION",
    "VERITY_ALGORITHM",
    "VERITY_BLOCK_SIZE",
    "VERITY_SALT_DATA",
    "VERITY_SIG_DATA",
];

/// The `BTRFS_SEND_C_` suffix of a command number (`WRITE`), `None` past the last.
pub fn command_name(cmd: u16) -> Option<&'static str> {
    CMD_NAMES.get(usize::from(cmd)).copied()
}

/// The `BTRFS_SEND_A_` suffix of an attribute number (`PATH`), `None` past the last.
pub fn attribute_name(attr: u16) -> Option<&'static str> {
    ATTR_NAMES.get(usize::from(attr)).copied()
}

/// The last command number of protocol `version` (1 to 3).
pub fn max_command(version: u32) -> u16 {
    match version {
        0 | 1 => cmd::MAX_V1,
        2 => cmd::MAX_V2,
        _ => cmd::MAX_V3,
    }
}

/// The last attribute number of protocol `version` (1 to 3).
pub fn max_attribute(version: u32) -> u16 {
    match version {
        0 | 1 => attr::MAX_V1,
        2 => attr::MAX_V2,
        _ => attr::MAX_V3,
    }
}

/// A `btrfs_timespec`: seconds and nanoseconds since the epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Timespec {
    /// Seconds (the kernel's signed time64 stored as u64).
    pub sec: u64,
    /// Nanoseconds.
    pub nsec: u32,
}

/// Size of an encoded [`Timespec`].
pub const TIMESPEC_SIZE: usize = 12;

impl Timespec {
    /// The 12 bytes on the wire.
    pub fn to_bytes(self) -> [u8; TIMESPEC_SIZE] {
        let mut b = [0u8; TIMESPEC_SIZE];
        b[..8].copy_from_slice(&self.sec.to_le_bytes());
        b[8..].copy_from_slice(&self.nsec.to_le_bytes());
        b
    }
}

/// One command of a send stream, with its attributes typed. Paths are raw bytes, relative
/// to the subvolume being received (an empty path is its root).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Create subvolume `path` (a full stream).
    Subvol {
        /// The subvolume's name.
        path: Vec<u8>,
        /// Its uuid on the sending side (its received uuid if it has one).
        uuid: [u8; 16],
        /// Its ctransid.
        ctransid: u64,
    },
    /// Create `path` as a snapshot of the subvolume `clone_uuid` (an incremental stream).
    Snapshot {
        /// The snapshot's name.
        path: Vec<u8>,
        /// Its uuid.
        uuid: [u8; 16],
        /// Its ctransid.
        ctransid: u64,
        /// The parent's uuid.
        clone_uuid: [u8; 16],
        /// The parent's ctransid.
        clone_ctransid: u64,
    },
    /// Create an empty regular file.
    Mkfile {
        /// Where.
        path: Vec<u8>,
        /// Inode number on the sending side.
        ino: u64,
    },
    /// Create a directory.
    Mkdir {
        /// Where.
        path: Vec<u8>,
        /// Inode number on the sending side.
        ino: u64,
    },
    /// Create a device node.
    Mknod {
        /// Where.
        path: Vec<u8>,
        /// Inode number on the sending side.
        ino: u64,
        /// Full mode, type bits included.
        mode: u64,
        /// Device number, new_encode_dev.
        rdev: u64,
    },
    /// Create a FIFO.
    Mkfifo {
        /// Where.
        path: Vec<u8>,
        /// Inode number on the sending side.
        ino: u64,
        /// Full mode: the kernel sends it, receivers ignore it.
        mode: Option<u64>,
        /// Device number (0): the kernel sends it, receivers ignore it.
        rdev: Option<u64>,
    },
    /// Create a socket.
    Mksock {
        /// Where.
        path: Vec<u8>,
        /// Inode number on the sending side.
        ino: u64,
        /// Full mode: the kernel sends it, receivers ignore it.
        mode: Option<u64>,
        /// Device number (0): the kernel sends it, receivers ignore it.
        rdev: Option<u64>,
    },
    /// Create a symlink.
    Symlink {
        /// Where.
        path: Vec<u8>,
        /// Inode number on the sending side.
        ino: u64,
        /// What it points to: any bytes but NUL, not a path inside the stream.
        target: Vec<u8>,
    },
    /// Rename `from` to `to`.
    Rename {
        /// Old path.
        from: Vec<u8>,
        /// New path.
        to: Vec<u8>,
    },
    /// Create `path` as a hard link to the existing `link`.
    Link {
        /// The new name.
        path: Vec<u8>,
        /// The existing path.
        link: Vec<u8>,
    },
    /// Remove a non-directory.
    Unlink {
        /// What.
        path: Vec<u8>,
    },
    /// Remove an empty directory.
    Rmdir {
        /// What.
        path: Vec<u8>,
    },
    /// Set an extended attribute.
    SetXattr {
        /// On what.
        path: Vec<u8>,
        /// The name, `user.foo`.
        name: Vec<u8>,
        /// The value.
        data: Vec<u8>,
    },
    /// Remove an extended attribute.
    RemoveXattr {
        /// On what.
        path: Vec<u8>,
        /// The name.
        name: Vec<u8>,
    },
    /// Write `data` at `offset`.
    Write {
        /// The file.
        path: Vec<u8>,
        /// Byte offset in the file.
        offset: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// Clone `len` bytes of `clone_path` at `clone_offset` (in subvolume `clone_uuid`) to
    /// `path` at `offset`.
    Clone {
        /// The destination file.
        path: Vec<u8>,
        /// Destination offset.
        offset: u64,
        /// Length.
        len: u64,
        /// The source's subvolume uuid.
        clone_uuid: [u8; 16],
        /// The source's subvolume ctransid.
        clone_ctransid: u64,
        /// The source file, relative to its subvolume.
        clone_path: Vec<u8>,
        /// Source offset.
        clone_offset: u64,
    },
    /// Set a file's size.
    Truncate {
        /// The file.
        path: Vec<u8>,
        /// New size.
        size: u64,
    },
    /// Set permission bits.
    Chmod {
        /// What.
        path: Vec<u8>,
        /// The mode (permission bits).
        mode: u64,
    },
    /// Set owner and group.
    Chown {
        /// What.
        path: Vec<u8>,
        /// Owner.
        uid: u64,
        /// Group.
        gid: u64,
    },
    /// Set times.
    Utimes {
        /// What.
        path: Vec<u8>,
        /// Access time.
        atime: Timespec,
        /// Modification time.
        mtime: Timespec,
        /// Change time (informative: no call sets it).
        ctime: Timespec,
        /// Creation time, sent by v2+ kernels.
        otime: Option<Timespec>,
    },
    /// End of the stream.
    End,
    /// `len` bytes at `offset` changed; their data is not in the stream.
    UpdateExtent {
        /// The file.
        path: Vec<u8>,
        /// Offset.
        offset: u64,
        /// Length (attribute `SIZE`).
        len: u64,
    },
    /// fallocate(2) on a range (v2).
    Fallocate {
        /// The file.
        path: Vec<u8>,
        /// fallocate's mode bits.
        mode: u32,
        /// Offset.
        offset: u64,
        /// Length (attribute `SIZE`).
        len: u64,
    },
    /// Set btrfs inode flags (v2).
    Fileattr {
        /// What.
        path: Vec<u8>,
        /// `BTRFS_INODE_*` bits.
        attr: u64,
    },
    /// Write encoded (compressed) data as the source stores it (v2).
    EncodedWrite {
        /// The file.
        path: Vec<u8>,
        /// File offset of the written range.
        offset: u64,
        /// Length of the range in the file.
        unencoded_file_len: u64,
        /// Length of the whole decoded extent.
        unencoded_len: u64,
        /// Where the range starts in the decoded extent.
        unencoded_offset: u64,
        /// `BTRFS_ENCODED_IO_COMPRESSION_*`; absent means 0, none (the kernel omits it
        /// for inline extents).
        compression: Option<u32>,
        /// `BTRFS_ENCODED_IO_ENCRYPTION_*`; absent means 0, none.
        encryption: Option<u32>,
        /// The encoded bytes.
        data: Vec<u8>,
    },
    /// Enable fs-verity (v3).
    EnableVerity {
        /// The file.
        path: Vec<u8>,
        /// `FS_VERITY_HASH_ALG_*`.
        algorithm: u8,
        /// Merkle tree block size.
        block_size: u32,
        /// Salt.
        salt: Vec<u8>,
        /// Signature.
        sig: Vec<u8>,
    },
}

impl Command {
    /// The command number (one of [`cmd`]).
    pub fn number(&self) -> u16 {
        match self {
            Command::Subvol { .. } => cmd::SUBVOL,
            Command::Snapshot { .. } => cmd::SNAPSHOT,
            Command::Mkfile { .. } => cmd::MKFILE,
            Command::Mkdir { .. } => cmd::MKDIR,
            Command::Mknod { .. } => cmd::MKNOD,
            Command::Mkfifo { .. } => cmd::MKFIFO,
            Command::Mksock { .. } => cmd::MKSOCK,
            Command::Symlink { .. } => cmd::SYMLINK,
            Command::Rename { .. } => cmd::RENAME,
            Command::Link { .. } => cmd::LINK,
            Command::Unlink { .. } => cmd::UNLINK,
            Command::Rmdir { .. } => cmd::RMDIR,
            Command::SetXattr { .. } => cmd::SET_XATTR,
            Command::RemoveXattr { .. } => cmd::REMOVE_XATTR,
            Command::Write { .. } => cmd::WRITE,
            Command::Clone { .. } => cmd::CLONE,
            Command::Truncate { .. } => cmd::TRUNCATE,
            Command::Chmod { .. } => cmd::CHMOD,
            Command::Chown { .. } => cmd::CHOWN,
            Command::Utimes { .. } => cmd::UTIMES,
            Command::End => cmd::END,
            Command::UpdateExtent { .. } => cmd::UPDATE_EXTENT,
            Command::Fallocate { .. } => cmd::FALLOCATE,
            Command::Fileattr { .. } => cmd::FILEATTR,
            Command::EncodedWrite { .. } => cmd::ENCODED_WRITE,
            Command::EnableVerity { .. } => cmd::ENABLE_VERITY,
        }
    }

    /// The command's `BTRFS_SEND_C_` name.
    pub fn name(&self) -> &'static str {
        CMD_NAMES[usize::from(self.number())]
    }

    /// The oldest protocol version that has this command.
    pub fn min_version(&self) -> u32 {
        match self.number() {
            n if n <= cmd::MAX_V1 => 1,
            n if n <= cmd::MAX_V2 => 2,
            _ => 3,
        }
    }
}
