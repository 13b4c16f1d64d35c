//! The FUSE wire format (the kernel's include/uapi/linux/fuse.h), as far as oleo speaks it.
//! Every message is one of these fixed structs, sometimes followed by names or data.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// The protocol version we speak: 7.39 has everything below (TMPFILE is 7.37,
/// DIRECT_IO_ALLOW_MMAP 7.39). The kernel speaks the lower of its version and ours.
/// (The major version, `FUSE_KERNEL_VERSION`.)
pub const KERNEL_VERSION: u32 = 7;
/// The minor version we speak (`FUSE_KERNEL_MINOR_VERSION`).
pub const KERNEL_MINOR_VERSION: u32 = 39;
/// Oldest kernel protocol we accept: 7.31 (Linux 5.8) has every struct below at its
/// current size, so no compat sizes are needed.
pub const MIN_KERNEL_MINOR_VERSION: u32 = 31;

/// Node id of the mount's root directory (`FUSE_ROOT_ID`).
pub const ROOT_ID: u64 = 1;

/// Request opcodes (`enum fuse_opcode`, `FUSE_*`) of the opcodes oleo serves.
pub mod opcode {
    /// `FUSE_LOOKUP`: Look up a name in a directory.
    pub const LOOKUP: u32 = 1;
    /// `FUSE_FORGET`: Drop lookup references to a node (no reply).
    pub const FORGET: u32 = 2;
    /// `FUSE_GETATTR`: Get attributes.
    pub const GETATTR: u32 = 3;
    /// `FUSE_SETATTR`: Set attributes.
    pub const SETATTR: u32 = 4;
    /// `FUSE_READLINK`: Read a symlink's target.
    pub const READLINK: u32 = 5;
    /// `FUSE_SYMLINK`: Create a symlink.
    pub const SYMLINK: u32 = 6;
    /// `FUSE_MKNOD`: Create a device, fifo, socket or file.
    pub const MKNOD: u32 = 8;
    /// `FUSE_MKDIR`: Create a directory.
    pub const MKDIR: u32 = 9;
    /// `FUSE_UNLINK`: Remove a name.
    pub const UNLINK: u32 = 10;
    /// `FUSE_RMDIR`: Remove a directory.
    pub const RMDIR: u32 = 11;
    /// `FUSE_RENAME`: Rename.
    pub const RENAME: u32 = 12;
    /// `FUSE_LINK`: Create a hard link.
    pub const LINK: u32 = 13;
    /// `FUSE_OPEN`: Open a file.
    pub const OPEN: u32 = 14;
    /// `FUSE_READ`: Read from an open file.
    pub const READ: u32 = 15;
    /// `FUSE_WRITE`: Write to an open file.
    pub const WRITE: u32 = 16;
    /// `FUSE_STATFS`: Filesystem statistics.
    pub const STATFS: u32 = 17;
    /// `FUSE_RELEASE`: Close an open file.
    pub const RELEASE: u32 = 18;
    /// `FUSE_FSYNC`: Sync a file.
    pub const FSYNC: u32 = 20;
    /// `FUSE_SETXATTR`: Set an extended attribute.
    pub const SETXATTR: u32 = 21;
    /// `FUSE_GETXATTR`: Get an extended attribute.
    pub const GETXATTR: u32 = 22;
    /// `FUSE_LISTXATTR`: List extended attributes.
    pub const LISTXATTR: u32 = 23;
    /// `FUSE_REMOVEXATTR`: Remove an extended attribute.
    pub const REMOVEXATTR: u32 = 24;
    /// `FUSE_FLUSH`: A close(2) of a descriptor.
    pub const FLUSH: u32 = 25;
    /// `FUSE_INIT`: The handshake, first on every connection.
    pub const INIT: u32 = 26;
    /// `FUSE_OPENDIR`: Open a directory.
    pub const OPENDIR: u32 = 27;
    /// `FUSE_READDIR`: List a directory.
    pub const READDIR: u32 = 28;
    /// `FUSE_RELEASEDIR`: Close a directory.
    pub const RELEASEDIR: u32 = 29;
    /// `FUSE_FSYNCDIR`: Sync a directory.
    pub const FSYNCDIR: u32 = 30;
    /// `FUSE_ACCESS`: Check access(2) permissions.
    pub const ACCESS: u32 = 34;
    /// `FUSE_CREATE`: Create and open a file.
    pub const CREATE: u32 = 35;
    /// `FUSE_INTERRUPT`: Interrupt a pending request (no reply).
    pub const INTERRUPT: u32 = 36;
    /// `FUSE_DESTROY`: The connection is going away.
    pub const DESTROY: u32 = 38;
    /// `FUSE_IOCTL`: An ioctl on an open file.
    pub const IOCTL: u32 = 39;
    /// `FUSE_BATCH_FORGET`: FORGET for many nodes (no reply).
    pub const BATCH_FORGET: u32 = 42;
    /// `FUSE_FALLOCATE`: Allocate or punch file space.
    pub const FALLOCATE: u32 = 43;
    /// `FUSE_READDIRPLUS`: List a directory with attributes.
    pub const READDIRPLUS: u32 = 44;
    /// `FUSE_RENAME2`: Rename with flags.
    pub const RENAME2: u32 = 45;
    /// `FUSE_LSEEK`: SEEK_DATA / SEEK_HOLE.
    pub const LSEEK: u32 = 46;
    /// `FUSE_COPY_FILE_RANGE`: Copy a range between files.
    pub const COPY_FILE_RANGE: u32 = 47;
    /// `FUSE_SYNCFS`: Sync the whole filesystem.
    pub const SYNCFS: u32 = 50;
    /// `FUSE_TMPFILE`: Create an unnamed file (O_TMPFILE).
    pub const TMPFILE: u32 = 51;
    /// `FUSE_STATX`: statx(2) attributes.
    pub const STATX: u32 = 52;
}

/// INIT flags (`FUSE_*` capability bits of `fuse_init_in` / `fuse_init_out`: `flags` holds
/// bits 0..32, `flags2` bits 32..64 when INIT_EXT is set).
pub mod init {
    /// `FUSE_ASYNC_READ`: Reads may be sent in parallel.
    pub const ASYNC_READ: u64 = 1 << 0;
    /// `FUSE_ATOMIC_O_TRUNC`: OPEN handles O_TRUNC itself.
    pub const ATOMIC_O_TRUNC: u64 = 1 << 3;
    /// `FUSE_EXPORT_SUPPORT`: LOOKUP answers "." and ".." (file handles, NFS export).
    pub const EXPORT_SUPPORT: u64 = 1 << 4;
    /// `FUSE_BIG_WRITES`: Writes larger than a page.
    pub const BIG_WRITES: u64 = 1 << 5;
    /// The kernel leaves the umask to the server (a default ACL replaces it).
    pub const DONT_MASK: u64 = 1 << 6;
    /// `FUSE_DO_READDIRPLUS`: Use READDIRPLUS.
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    /// O_DIRECT requests of an asynchronous caller (io_uring, libaio) travel in parallel.
    pub const ASYNC_DIO: u64 = 1 << 15;
    /// `FUSE_WRITEBACK_CACHE`: The kernel caches writes (writeback cache).
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    /// `FUSE_PARALLEL_DIROPS`: Lookups and listings of one directory may run in parallel.
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    /// `FUSE_POSIX_ACL`: The kernel enforces POSIX ACLs.
    pub const POSIX_ACL: u64 = 1 << 20;
    /// `FUSE_MAX_PAGES`: `max_pages` of the INIT reply is valid.
    pub const MAX_PAGES: u64 = 1 << 22;
    /// `FUSE_CACHE_SYMLINKS`: The kernel caches symlink targets.
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    /// The kernel opens directories without asking when OPENDIR answers ENOSYS.
    pub const NO_OPENDIR_SUPPORT: u64 = 1 << 24;
    /// `FUSE_INIT_EXT`: INIT carries `flags2` (bits 32..64).
    pub const INIT_EXT: u64 = 1 << 30;
    /// The server drops setuid/setgid on write, truncate and chown; the kernel then
    /// stops asking for security.capability before every write (SB_NOSEC).
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    /// SETXATTR carries `setxattr_flags` (ACL_KILL_SGID).
    pub const SETXATTR_EXT: u64 = 1 << 29;
    /// `FUSE_DIRECT_IO_ALLOW_MMAP`: Direct-IO files may be mmapped.
    pub const DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
    /// `FUSE_ALLOW_IDMAP`: The mount may be idmapped (Linux 6.12+; the kernel takes it only
    /// with default_permissions and fails the connection otherwise). In exchange, only the
    /// requests that make an inode (MKNOD, MKDIR, SYMLINK, CREATE, TMPFILE, RENAME2 with
    /// RENAME_WHITEOUT) carry the caller's ids, mapped through the mount's idmap; every
    /// other request carries [`INVALID_UIDGID`](super::INVALID_UIDGID) in both.
    pub const ALLOW_IDMAP: u64 = 1 << 40;
    /// Requests and replies travel through io_uring commands (Linux 6.14+).
    pub const OVER_IO_URING: u64 = 1 << 41;
}

/// `FUSE_INVALID_UIDGID`: the uid and gid of a request's header when the kernel does not
/// tell who asked (every request but those making an inode, once ALLOW_IDMAP is agreed).
pub const INVALID_UIDGID: u32 = u32::MAX;

/// `FOPEN_*` flags of an open or create reply (`fuse_open_out.open_flags`).
pub mod fopen {
    /// Bypass the page cache for this handle.
    pub const DIRECT_IO: u32 = 1 << 0;
    /// Keep cached pages from earlier opens.
    pub const KEEP_CACHE: u32 = 1 << 1;
    /// Cache the directory listing.
    pub const CACHE_DIR: u32 = 1 << 3;
    /// Direct writes to one file that do not extend it may run in parallel.
    pub const PARALLEL_DIRECT_WRITES: u32 = 1 << 6;
}

/// `fuse_setattr_in.valid` bits (`FATTR_*`): which fields of a SETATTR to apply.
pub mod fattr {
    /// `FATTR_MODE`: `mode` is set.
    pub const MODE: u32 = 1 << 0;
    /// `FATTR_UID`: `uid` is set.
    pub const UID: u32 = 1 << 1;
    /// `FATTR_GID`: `gid` is set.
    pub const GID: u32 = 1 << 2;
    /// `FATTR_SIZE`: `size` is set (a truncate).
    pub const SIZE: u32 = 1 << 3;
    /// `FATTR_ATIME`: `atime` is set.
    pub const ATIME: u32 = 1 << 4;
    /// `FATTR_MTIME`: `mtime` is set.
    pub const MTIME: u32 = 1 << 5;
    /// `FATTR_FH`: `fh` is set.
    pub const FH: u32 = 1 << 6;
    /// `FATTR_LOCKOWNER`: `lock_owner` is set.
    pub const LOCKOWNER: u32 = 1 << 9;
    /// `FATTR_ATIME_NOW`: set atime to now.
    pub const ATIME_NOW: u32 = 1 << 7;
    /// `FATTR_MTIME_NOW`: set mtime to now.
    pub const MTIME_NOW: u32 = 1 << 8;
    /// `FATTR_CTIME`: `ctime` is set.
    pub const CTIME: u32 = 1 << 10;
    /// HANDLE_KILLPRIV_V2: drop setuid/setgid (a truncate or chown).
    pub const KILL_SUIDGID: u32 = 1 << 11;
}

/// HANDLE_KILLPRIV_V2: a WRITE (write_flags) or an OPEN with O_TRUNC (open_flags) by a
/// caller without CAP_FSETID must drop setuid/setgid.
pub const WRITE_KILL_SUIDGID: u32 = 1 << 2;
/// A WRITE that writes back the kernel's page cache (not a caller's write(2) itself).
pub const WRITE_CACHE: u32 = 1 << 0;
/// `FUSE_READ_LOCKOWNER` (`fuse_read_in.read_flags`): set by the kernel's direct path
/// (`fuse_direct_io`, which reads into the caller's buffer, never into the page cache) for
/// any caller with a file table; its page-cache reads (`read_folio`, readahead) never set it.
pub const READ_LOCKOWNER: u32 = 1 << 1;
/// `FUSE_OPEN_KILL_SUIDGID` (`fuse_open_in.open_flags`): see [`WRITE_KILL_SUIDGID`].
pub const OPEN_KILL_SUIDGID: u32 = 1 << 0;

/// `FUSE_GETATTR_FH`: `fuse_getattr_in.fh` is valid.
pub const GETATTR_FH: u32 = 1 << 0;
/// SETXATTR_EXT: setting this ACL must drop S_ISGID (caller outside the file's group,
/// without CAP_FSETID).
pub const SETXATTR_ACL_KILL_SGID: u32 = 1 << 0;
/// `fuse_statx.mask` bits (STATX_* of statx(2)) we fill: `STATX_BASIC_STATS`.
pub const STATX_BASIC_STATS: u32 = 0x7ff;
/// `STATX_BTIME`: the birth time.
pub const STATX_BTIME: u32 = 0x800;
/// `FUSE_FSYNC_FDATASYNC`: sync data only (fdatasync).
pub const FSYNC_FDATASYNC: u32 = 1 << 0;
/// `FUSE_NOTIFY_INVAL_INODE`: drop an inode's cached attributes and pages.
pub const NOTIFY_INVAL_INODE: i32 = 2;
/// `FUSE_NOTIFY_INVAL_ENTRY`: drop a cached directory entry.
pub const NOTIFY_INVAL_ENTRY: i32 = 3;
/// `FUSE_DEV_IOC_CLONE` (`_IOR(229, 0, uint32_t)`): attach a new /dev/fuse descriptor to an
/// existing connection.
pub const DEV_IOC_CLONE: libc::c_ulong = (2 << 30) | (4 << 16) | (229 << 8);

macro_rules! wire {
    ($($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident: $t:ty,)* })*) => {$(
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
        pub struct $name { $($(#[$fm])* pub $f: $t,)* }
    )*};
}

wire! {
    /// `struct fuse_in_header`: the start of every request.
    pub struct InHeader {
        /// Length of the whole request.
        pub len: u32,
        /// What is asked ([`opcode`]).
        pub opcode: u32,
        /// Request id; the reply carries it back.
        pub unique: u64,
        /// The node the request is about.
        pub nodeid: u64,
        /// Caller's effective uid.
        pub uid: u32,
        /// Caller's effective gid.
        pub gid: u32,
        /// Caller's thread id.
        pub pid: u32,
        /// Length of the extensions at the end, in 8-byte units.
        pub total_extlen: u16,
        /// Unused.
        pub padding: u16,
    }

    /// `struct fuse_out_header`: the start of every reply and notification.
    pub struct OutHeader {
        /// Length of the whole reply.
        pub len: u32,
        /// 0 or a negative errno; for a notification, its code.
        pub error: i32,
        /// The request's id (0 for a notification).
        pub unique: u64,
    }

    /// `struct fuse_init_in` (the part before `flags2`): the kernel's side of the handshake.
    pub struct InitIn {
        /// Kernel protocol major version.
        pub major: u32,
        /// Kernel protocol minor version.
        pub minor: u32,
        /// Largest readahead the kernel will do.
        pub max_readahead: u32,
        /// Capabilities the kernel offers (bits 0..32 of [`init`]).
        pub flags: u32,
    }

    /// `struct fuse_init_out`: the server's side of the handshake.
    pub struct InitOut {
        /// Our protocol major version.
        pub major: u32,
        /// Our protocol minor version.
        pub minor: u32,
        /// Largest readahead we want.
        pub max_readahead: u32,
        /// Capabilities we take (bits 0..32 of [`init`]).
        pub flags: u32,
        /// Most background requests in flight.
        pub max_background: u16,
        /// Background requests at which the kernel reports congestion.
        pub congestion_threshold: u16,
        /// Largest WRITE payload.
        pub max_write: u32,
        /// Timestamp granularity in nanoseconds.
        pub time_gran: u32,
        /// Largest request in pages (with [`init::MAX_PAGES`]).
        pub max_pages: u16,
        /// DAX mapping alignment (unused).
        pub map_alignment: u16,
        /// Capabilities we take, bits 32..64.
        pub flags2: u32,
        /// Passthrough stacking depth (unused).
        pub max_stack_depth: u32,
        /// Reserved.
        pub unused: [u32; 6],
    }

    /// `struct fuse_attr`: an inode's attributes.
    pub struct Attr {
        /// Inode number (st_ino).
        pub ino: u64,
        /// Size in bytes.
        pub size: u64,
        /// 512-byte blocks allocated.
        pub blocks: u64,
        /// Access time, seconds.
        pub atime: u64,
        /// Modification time, seconds.
        pub mtime: u64,
        /// Change time, seconds.
        pub ctime: u64,
        /// Access time, nanoseconds.
        pub atimensec: u32,
        /// Modification time, nanoseconds.
        pub mtimensec: u32,
        /// Change time, nanoseconds.
        pub ctimensec: u32,
        /// Type and permission bits.
        pub mode: u32,
        /// Link count.
        pub nlink: u32,
        /// Owner.
        pub uid: u32,
        /// Group.
        pub gid: u32,
        /// Device number.
        pub rdev: u32,
        /// Preferred I/O size.
        pub blksize: u32,
        /// `FUSE_ATTR_*` flags.
        pub flags: u32,
    }

    /// `struct fuse_entry_out`: a looked-up or created entry.
    pub struct EntryOut {
        /// Node id the kernel will use for it.
        pub nodeid: u64,
        /// Node id generation (unique with `nodeid` over the mount's life).
        pub generation: u64,
        /// How long the name may be cached, seconds.
        pub entry_valid: u64,
        /// How long the attributes may be cached, seconds.
        pub attr_valid: u64,
        /// Nanoseconds of `entry_valid`.
        pub entry_valid_nsec: u32,
        /// Nanoseconds of `attr_valid`.
        pub attr_valid_nsec: u32,
        /// The attributes.
        pub attr: Attr,
    }

    /// `struct fuse_attr_out`: a GETATTR or SETATTR reply.
    pub struct AttrOut {
        /// How long the attributes may be cached, seconds.
        pub attr_valid: u64,
        /// Nanoseconds of `attr_valid`.
        pub attr_valid_nsec: u32,
        /// Unused.
        pub dummy: u32,
        /// The attributes.
        pub attr: Attr,
    }

    /// `struct fuse_open_out`: an OPEN, OPENDIR or CREATE reply.
    pub struct OpenOut {
        /// Handle the kernel passes back with later requests.
        pub fh: u64,
        /// [`fopen`] flags.
        pub open_flags: u32,
        /// Passthrough backing file (unused: 0).
        pub backing_id: i32,
    }

    /// `struct fuse_forget_in`.
    pub struct ForgetIn {
        /// How many lookup references to drop.
        pub nlookup: u64,
    }

    /// `struct fuse_forget_one`: one node of a BATCH_FORGET.
    pub struct ForgetOne {
        /// The node.
        pub nodeid: u64,
        /// How many lookup references to drop.
        pub nlookup: u64,
    }

    /// `struct fuse_batch_forget_in`: followed by `count` [`ForgetOne`]s.
    pub struct BatchForgetIn {
        /// Number of nodes.
        pub count: u32,
        /// Unused.
        pub dummy: u32,
    }

    /// `struct fuse_getattr_in`.
    pub struct GetattrIn {
        /// [`GETATTR_FH`] when `fh` is valid.
        pub getattr_flags: u32,
        /// Unused.
        pub dummy: u32,
        /// Handle of the open file asked about.
        pub fh: u64,
    }

    /// `struct fuse_setattr_in`: the fields `valid` ([`fattr`]) marks are to be set.
    pub struct SetattrIn {
        /// Which fields to apply ([`fattr`]).
        pub valid: u32,
        /// Unused.
        pub padding: u32,
        /// Handle (with [`fattr::FH`]).
        pub fh: u64,
        /// New size.
        pub size: u64,
        /// Lock owner (with [`fattr::LOCKOWNER`]).
        pub lock_owner: u64,
        /// New access time, seconds.
        pub atime: u64,
        /// New modification time, seconds.
        pub mtime: u64,
        /// New change time, seconds.
        pub ctime: u64,
        /// New access time, nanoseconds.
        pub atimensec: u32,
        /// New modification time, nanoseconds.
        pub mtimensec: u32,
        /// New change time, nanoseconds.
        pub ctimensec: u32,
        /// New mode.
        pub mode: u32,
        /// Unused.
        pub unused4: u32,
        /// New owner.
        pub uid: u32,
        /// New group.
        pub gid: u32,
        /// Unused.
        pub unused5: u32,
    }

    /// `struct fuse_mknod_in`: followed by the name.
    pub struct MknodIn {
        /// Type and permissions.
        pub mode: u32,
        /// Device number.
        pub rdev: u32,
        /// Caller's umask (with DONT_MASK).
        pub umask: u32,
        /// Unused.
        pub padding: u32,
    }

    /// `struct fuse_mkdir_in`: followed by the name.
    pub struct MkdirIn {
        /// Permissions.
        pub mode: u32,
        /// Caller's umask (with DONT_MASK).
        pub umask: u32,
    }

    /// `struct fuse_rename_in`: followed by the old and new names.
    pub struct RenameIn {
        /// Node id of the target directory.
        pub newdir: u64,
    }

    /// `struct fuse_rename2_in`: followed by the old and new names.
    pub struct Rename2In {
        /// Node id of the target directory.
        pub newdir: u64,
        /// RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT.
        pub flags: u32,
        /// Unused.
        pub padding: u32,
    }

    /// `struct fuse_link_in`: followed by the new name.
    pub struct LinkIn {
        /// The node to link.
        pub oldnodeid: u64,
    }

    /// `struct fuse_open_in`.
    pub struct OpenIn {
        /// open(2) flags.
        pub flags: u32,
        /// `FUSE_OPEN_*` flags ([`OPEN_KILL_SUIDGID`]).
        pub open_flags: u32,
    }

    /// `struct fuse_create_in`: CREATE and TMPFILE (followed by the name for CREATE).
    pub struct CreateIn {
        /// open(2) flags.
        pub flags: u32,
        /// Type and permissions.
        pub mode: u32,
        /// Caller's umask (with DONT_MASK).
        pub umask: u32,
        /// `FUSE_OPEN_*` flags ([`OPEN_KILL_SUIDGID`]).
        pub open_flags: u32,
    }

    /// `struct fuse_release_in`.
    pub struct ReleaseIn {
        /// The handle being closed.
        pub fh: u64,
        /// open(2) flags of the handle.
        pub flags: u32,
        /// `FUSE_RELEASE_*` flags.
        pub release_flags: u32,
        /// Lock owner.
        pub lock_owner: u64,
    }

    /// `struct fuse_read_in`: READ, READDIR and READDIRPLUS.
    pub struct ReadIn {
        /// Handle.
        pub fh: u64,
        /// Where to read (a listing's resume offset for READDIR).
        pub offset: u64,
        /// Most bytes to return.
        pub size: u32,
        /// `FUSE_READ_*` flags.
        pub read_flags: u32,
        /// Lock owner.
        pub lock_owner: u64,
        /// open(2) flags of the handle.
        pub flags: u32,
        /// Unused.
        pub padding: u32,
    }

    /// `struct fuse_write_in`: followed by `size` bytes of data.
    pub struct WriteIn {
        /// Handle.
        pub fh: u64,
        /// Where to write.
        pub offset: u64,
        /// Bytes of data.
        pub size: u32,
        /// [`WRITE_CACHE`], [`WRITE_KILL_SUIDGID`].
        pub write_flags: u32,
        /// Lock owner.
        pub lock_owner: u64,
        /// open(2) flags of the handle.
        pub flags: u32,
        /// Unused.
        pub padding: u32,
    }

    /// `struct fuse_write_out`.
    pub struct WriteOut {
        /// Bytes written.
        pub size: u32,
        /// Unused.
        pub padding: u32,
    }

    /// `struct fuse_statfs_out` (its `struct fuse_kstatfs`): statfs(2) numbers.
    pub struct StatfsOut {
        /// Total blocks of `frsize`.
        pub blocks: u64,
        /// Free blocks.
        pub bfree: u64,
        /// Free blocks for unprivileged users.
        pub bavail: u64,
        /// Total inodes.
        pub files: u64,
        /// Free inodes.
        pub ffree: u64,
        /// Block size.
        pub bsize: u32,
        /// Longest name.
        pub namelen: u32,
        /// Fragment size.
        pub frsize: u32,
        /// Unused.
        pub padding: u32,
        /// Reserved.
        pub spare: [u32; 6],
    }

    /// `struct fuse_fsync_in`.
    pub struct FsyncIn {
        /// Handle.
        pub fh: u64,
        /// [`FSYNC_FDATASYNC`].
        pub fsync_flags: u32,
        /// Unused.
        pub padding: u32,
    }

    /// `struct fuse_setxattr_in`, followed by the name and the value. Without SETXATTR_EXT the
    /// kernel sends only `size` and `flags` (see `request`).
    pub struct SetxattrIn {
        /// Length of the value.
        pub size: u32,
        /// setxattr(2) flags (XATTR_CREATE, XATTR_REPLACE).
        pub flags: u32,
        /// `FUSE_SETXATTR_*` flags ([`SETXATTR_ACL_KILL_SGID`]).
        pub setxattr_flags: u32,
        /// Unused.
        pub padding: u32,
    }

    /// `struct fuse_statx_in`.
    pub struct StatxIn {
        /// [`GETATTR_FH`] when `fh` is valid.
        pub getattr_flags: u32,
        /// Unused.
        pub reserved: u32,
        /// Handle.
        pub fh: u64,
        /// statx(2) `flags` (AT_STATX_*).
        pub sx_flags: u32,
        /// statx(2) `mask`: the fields wanted.
        pub sx_mask: u32,
    }

    /// `struct fuse_sx_time`: a statx timestamp.
    pub struct SxTime {
        /// Seconds.
        pub tv_sec: i64,
        /// Nanoseconds.
        pub tv_nsec: u32,
        /// Unused.
        pub reserved: i32,
    }

    /// `struct fuse_statx`: statx(2) attributes.
    pub struct Statx {
        /// Fields filled (STATX_*).
        pub mask: u32,
        /// Preferred I/O size.
        pub blksize: u32,
        /// STATX_ATTR_* flags.
        pub attributes: u64,
        /// Link count.
        pub nlink: u32,
        /// Owner.
        pub uid: u32,
        /// Group.
        pub gid: u32,
        /// Type and permissions.
        pub mode: u16,
        /// Unused.
        pub spare0: u16,
        /// Inode number.
        pub ino: u64,
        /// Size in bytes.
        pub size: u64,
        /// 512-byte blocks allocated.
        pub blocks: u64,
        /// STATX_ATTR_* flags supported.
        pub attributes_mask: u64,
        /// Access time.
        pub atime: SxTime,
        /// Birth time.
        pub btime: SxTime,
        /// Change time.
        pub ctime: SxTime,
        /// Modification time.
        pub mtime: SxTime,
        /// Device number, major.
        pub rdev_major: u32,
        /// Device number, minor.
        pub rdev_minor: u32,
        /// Containing device, major (the kernel fills it).
        pub dev_major: u32,
        /// Containing device, minor (the kernel fills it).
        pub dev_minor: u32,
        /// Reserved.
        pub spare2: [u64; 14],
    }

    /// `struct fuse_statx_out`.
    pub struct StatxOut {
        /// How long the attributes may be cached, seconds.
        pub attr_valid: u64,
        /// Nanoseconds of `attr_valid`.
        pub attr_valid_nsec: u32,
        /// Unused.
        pub flags: u32,
        /// Reserved.
        pub spare: [u64; 2],
        /// The attributes.
        pub stat: Statx,
    }

    /// `struct fuse_getxattr_in`: GETXATTR (followed by the name) and LISTXATTR.
    pub struct GetxattrIn {
        /// Size of the caller's buffer; 0 asks for the size needed.
        pub size: u32,
        /// Unused.
        pub padding: u32,
    }

    /// `struct fuse_getxattr_out`: the size a value or list needs.
    pub struct GetxattrOut {
        /// Bytes needed.
        pub size: u32,
        /// Unused.
        pub padding: u32,
    }

    /// `struct fuse_fallocate_in`.
    pub struct FallocateIn {
        /// Handle.
        pub fh: u64,
        /// Start of the range.
        pub offset: u64,
        /// Length of the range.
        pub length: u64,
        /// fallocate(2) mode (FALLOC_FL_*).
        pub mode: u32,
        /// Unused.
        pub padding: u32,
    }

    /// `struct fuse_lseek_in`.
    pub struct LseekIn {
        /// Handle.
        pub fh: u64,
        /// Where to start looking.
        pub offset: u64,
        /// SEEK_DATA or SEEK_HOLE.
        pub whence: u32,
        /// Unused.
        pub padding: u32,
    }

    /// `struct fuse_lseek_out`.
    pub struct LseekOut {
        /// The offset found.
        pub offset: u64,
    }

    /// `struct fuse_ioctl_in`. Without FUSE_IOCTL_UNRESTRICTED (only CUSE gets it)
    /// `in_size`/`out_size` come from the command's _IOC encoding, and `in_size` bytes of
    /// argument follow.
    pub struct IoctlIn {
        /// Handle.
        pub fh: u64,
        /// `FUSE_IOCTL_*` flags.
        pub flags: u32,
        /// The ioctl command.
        pub cmd: u32,
        /// The caller's argument pointer.
        pub arg: u64,
        /// Bytes of argument that follow.
        pub in_size: u32,
        /// Most bytes the reply may write back.
        pub out_size: u32,
    }

    /// `struct fuse_ioctl_out`: followed by the bytes written back to the argument.
    pub struct IoctlOut {
        /// The ioctl's return value.
        pub result: i32,
        /// `FUSE_IOCTL_*` flags (retry: unused).
        pub flags: u32,
        /// Retry: unused.
        pub in_iovs: u32,
        /// Retry: unused.
        pub out_iovs: u32,
    }

    /// `struct fuse_copy_file_range_in`.
    pub struct CopyFileRangeIn {
        /// Source handle (of the request's node).
        pub fh_in: u64,
        /// Source offset.
        pub off_in: u64,
        /// Destination node.
        pub nodeid_out: u64,
        /// Destination handle.
        pub fh_out: u64,
        /// Destination offset.
        pub off_out: u64,
        /// Bytes to copy.
        pub len: u64,
        /// copy_file_range(2) flags.
        pub flags: u64,
    }

    /// `struct fuse_dirent` without its name: one READDIR entry (padded to 8 bytes).
    pub struct DirentHead {
        /// Inode number.
        pub ino: u64,
        /// Offset that resumes the listing after this entry.
        pub off: u64,
        /// Length of the name that follows.
        pub namelen: u32,
        /// DT_* type (`mode >> 12`).
        pub typ: u32,
    }

    /// `struct fuse_notify_inval_inode_out`.
    pub struct NotifyInvalInodeOut {
        /// Node id.
        pub ino: u64,
        /// Start of the page range to drop (negative: none).
        pub off: i64,
        /// Length of the range (0: to the end).
        pub len: i64,
    }

    /// `struct fuse_notify_inval_entry_out`, followed by the name and a NUL.
    pub struct NotifyInvalEntryOut {
        /// Directory node id.
        pub parent: u64,
        /// Length of the name.
        pub namelen: u32,
        /// `FUSE_EXPIRE_ONLY` or 0.
        pub flags: u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

    /// The sizes the kernel checks replies against.
    #[test]
    fn sizes_match_the_kernel() {
        assert_eq!(size_of::<StatxIn>(), 24);
        assert_eq!(size_of::<Statx>(), 256);
        assert_eq!(size_of::<StatxOut>(), 288);
        assert_eq!(size_of::<SetxattrIn>(), 16);
        assert_eq!(size_of::<InHeader>(), 40);
        assert_eq!(size_of::<OutHeader>(), 16);
        assert_eq!(size_of::<InitOut>(), 64);
        assert_eq!(size_of::<Attr>(), 88);
        assert_eq!(size_of::<EntryOut>(), 128);
        assert_eq!(size_of::<AttrOut>(), 104);
        assert_eq!(size_of::<OpenOut>(), 16);
        assert_eq!(size_of::<SetattrIn>(), 88);
        assert_eq!(size_of::<ReadIn>(), 40);
        assert_eq!(size_of::<WriteIn>(), 40);
        assert_eq!(size_of::<StatfsOut>(), 80);
        assert_eq!(size_of::<CopyFileRangeIn>(), 56);
        assert_eq!(size_of::<IoctlIn>(), 32);
        assert_eq!(size_of::<IoctlOut>(), 16);
        assert_eq!(size_of::<DirentHead>(), 24);
        assert_eq!(DEV_IOC_CLONE, 0x8004_e500);
    }
}

/// FUSE over io_uring (fuse.h, 7.42): each ring entry is a pair of buffers the server
/// registers, a header block and a payload, and io_uring commands on the device.
pub(crate) mod uring {
    use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

    pub const CMD_REGISTER: u32 = 1;
    pub const CMD_COMMIT_AND_FETCH: u32 = 2;
    /// The in/out header slot and the per-opcode header slot of `Headers`.
    pub const IN_OUT_SZ: usize = 128;
    pub const OP_IN_SZ: usize = 128;
    /// Size of the header block: in_out, op_in, then `EntInOut`.
    pub const HEADERS_SZ: usize = IN_OUT_SZ + OP_IN_SZ + size_of::<EntInOut>();

    /// The last part of the header block: which request, and how much payload it carries.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
    pub struct EntInOut {
        pub flags: u64,
        pub commit_id: u64,
        pub payload_sz: u32,
        pub padding: u32,
        pub reserved: u64,
    }

    /// The command block of an SQE128.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
    pub struct CmdReq {
        pub flags: u64,
        pub commit_id: u64,
        pub qid: u16,
        pub padding: [u8; 6],
    }
}
