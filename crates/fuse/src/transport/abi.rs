//! The FUSE wire format (the kernel's include/uapi/linux/fuse.h), as far as oleo speaks it.
//! Every message is one of these fixed structs, sometimes followed by names or data.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// The protocol version we speak: 7.39 has everything below (TMPFILE is 7.37,
/// DIRECT_IO_ALLOW_MMAP 7.39). The kernel speaks the lower of its version and ours.
pub const KERNEL_VERSION: u32 = 7;
pub const KERNEL_MINOR_VERSION: u32 = 39;
/// Oldest kernel protocol we accept: 7.31 (Linux 5.8) has every struct below at its
/// current size, so no compat sizes are needed.
pub const MIN_KERNEL_MINOR_VERSION: u32 = 31;

pub const ROOT_ID: u64 = 1;

pub mod opcode {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
    pub const SYNCFS: u32 = 50;
    pub const TMPFILE: u32 = 51;
    pub const STATX: u32 = 52;
}

/// INIT flags (`flags` holds bits 0..32, `flags2` bits 32..64 when INIT_EXT is set).
pub mod init {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const ATOMIC_O_TRUNC: u64 = 1 << 3;
    pub const BIG_WRITES: u64 = 1 << 5;
    /// The kernel leaves the umask to the server (a default ACL replaces it).
    pub const DONT_MASK: u64 = 1 << 6;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    /// O_DIRECT requests of an asynchronous caller (io_uring, libaio) travel in parallel.
    pub const ASYNC_DIO: u64 = 1 << 15;
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const POSIX_ACL: u64 = 1 << 20;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    /// The kernel opens directories without asking when OPENDIR answers ENOSYS.
    pub const NO_OPENDIR_SUPPORT: u64 = 1 << 24;
    pub const INIT_EXT: u64 = 1 << 30;
    /// The server drops setuid/setgid on write, truncate and chown; the kernel then
    /// stops asking for security.capability before every write (SB_NOSEC).
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    /// SETXATTR carries `setxattr_flags` (ACL_KILL_SGID).
    pub const SETXATTR_EXT: u64 = 1 << 29;
    pub const DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
    /// Requests and replies travel through io_uring commands (Linux 6.14+).
    pub const OVER_IO_URING: u64 = 1 << 41;
}

/// FOPEN_* flags of an open or create reply.
pub mod fopen {
    pub const DIRECT_IO: u32 = 1 << 0;
    pub const KEEP_CACHE: u32 = 1 << 1;
    pub const CACHE_DIR: u32 = 1 << 3;
    /// Direct writes to one file that do not extend it may run in parallel.
    pub const PARALLEL_DIRECT_WRITES: u32 = 1 << 6;
}

/// `fuse_setattr_in.valid` bits.
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const LOCKOWNER: u32 = 1 << 9;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
    pub const CTIME: u32 = 1 << 10;
    /// HANDLE_KILLPRIV_V2: drop setuid/setgid (a truncate or chown).
    pub const KILL_SUIDGID: u32 = 1 << 11;
}

/// HANDLE_KILLPRIV_V2: a WRITE (write_flags) or an OPEN with O_TRUNC (open_flags) by a
/// caller without CAP_FSETID must drop setuid/setgid.
pub const WRITE_KILL_SUIDGID: u32 = 1 << 2;
/// A WRITE that writes back the kernel's page cache (not a caller's write(2) itself).
pub const WRITE_CACHE: u32 = 1 << 0;
pub const OPEN_KILL_SUIDGID: u32 = 1 << 0;

pub const GETATTR_FH: u32 = 1 << 0;
/// SETXATTR_EXT: setting this ACL must drop S_ISGID (caller outside the file's group,
/// without CAP_FSETID).
pub const SETXATTR_ACL_KILL_SGID: u32 = 1 << 0;
/// `fuse_statx.mask` bits (STATX_* of statx(2)) we fill.
pub const STATX_BASIC_STATS: u32 = 0x7ff;
pub const STATX_BTIME: u32 = 0x800;
pub const FSYNC_FDATASYNC: u32 = 1 << 0;
pub const NOTIFY_INVAL_INODE: i32 = 2;
pub const NOTIFY_INVAL_ENTRY: i32 = 3;
/// FUSE_DEV_IOC_CLONE: _IOR(229, 0, uint32_t).
pub const DEV_IOC_CLONE: libc::c_ulong = (2 << 30) | (4 << 16) | (229 << 8);

macro_rules! wire {
    ($($(#[$m:meta])* pub struct $name:ident { $(pub $f:ident: $t:ty,)* })*) => {$(
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
        pub struct $name { $(pub $f: $t,)* }
    )*};
}

wire! {
    pub struct InHeader {
        pub len: u32,
        pub opcode: u32,
        pub unique: u64,
        pub nodeid: u64,
        pub uid: u32,
        pub gid: u32,
        pub pid: u32,
        pub total_extlen: u16,
        pub padding: u16,
    }

    pub struct OutHeader {
        pub len: u32,
        pub error: i32,
        pub unique: u64,
    }

    pub struct InitIn {
        pub major: u32,
        pub minor: u32,
        pub max_readahead: u32,
        pub flags: u32,
    }

    pub struct InitOut {
        pub major: u32,
        pub minor: u32,
        pub max_readahead: u32,
        pub flags: u32,
        pub max_background: u16,
        pub congestion_threshold: u16,
        pub max_write: u32,
        pub time_gran: u32,
        pub max_pages: u16,
        pub map_alignment: u16,
        pub flags2: u32,
        pub max_stack_depth: u32,
        pub unused: [u32; 6],
    }

    pub struct Attr {
        pub ino: u64,
        pub size: u64,
        pub blocks: u64,
        pub atime: u64,
        pub mtime: u64,
        pub ctime: u64,
        pub atimensec: u32,
        pub mtimensec: u32,
        pub ctimensec: u32,
        pub mode: u32,
        pub nlink: u32,
        pub uid: u32,
        pub gid: u32,
        pub rdev: u32,
        pub blksize: u32,
        pub flags: u32,
    }

    pub struct EntryOut {
        pub nodeid: u64,
        pub generation: u64,
        pub entry_valid: u64,
        pub attr_valid: u64,
        pub entry_valid_nsec: u32,
        pub attr_valid_nsec: u32,
        pub attr: Attr,
    }

    pub struct AttrOut {
        pub attr_valid: u64,
        pub attr_valid_nsec: u32,
        pub dummy: u32,
        pub attr: Attr,
    }

    pub struct OpenOut {
        pub fh: u64,
        pub open_flags: u32,
        pub backing_id: i32,
    }

    pub struct ForgetIn {
        pub nlookup: u64,
    }

    pub struct ForgetOne {
        pub nodeid: u64,
        pub nlookup: u64,
    }

    pub struct BatchForgetIn {
        pub count: u32,
        pub dummy: u32,
    }

    pub struct GetattrIn {
        pub getattr_flags: u32,
        pub dummy: u32,
        pub fh: u64,
    }

    pub struct SetattrIn {
        pub valid: u32,
        pub padding: u32,
        pub fh: u64,
        pub size: u64,
        pub lock_owner: u64,
        pub atime: u64,
        pub mtime: u64,
        pub ctime: u64,
        pub atimensec: u32,
        pub mtimensec: u32,
        pub ctimensec: u32,
        pub mode: u32,
        pub unused4: u32,
        pub uid: u32,
        pub gid: u32,
        pub unused5: u32,
    }

    pub struct MknodIn {
        pub mode: u32,
        pub rdev: u32,
        pub umask: u32,
        pub padding: u32,
    }

    pub struct MkdirIn {
        pub mode: u32,
        pub umask: u32,
    }

    pub struct RenameIn {
        pub newdir: u64,
    }

    pub struct Rename2In {
        pub newdir: u64,
        pub flags: u32,
        pub padding: u32,
    }

    pub struct LinkIn {
        pub oldnodeid: u64,
    }

    pub struct OpenIn {
        pub flags: u32,
        pub open_flags: u32,
    }

    /// CREATE and TMPFILE.
    pub struct CreateIn {
        pub flags: u32,
        pub mode: u32,
        pub umask: u32,
        pub open_flags: u32,
    }

    pub struct ReleaseIn {
        pub fh: u64,
        pub flags: u32,
        pub release_flags: u32,
        pub lock_owner: u64,
    }

    pub struct ReadIn {
        pub fh: u64,
        pub offset: u64,
        pub size: u32,
        pub read_flags: u32,
        pub lock_owner: u64,
        pub flags: u32,
        pub padding: u32,
    }

    pub struct WriteIn {
        pub fh: u64,
        pub offset: u64,
        pub size: u32,
        pub write_flags: u32,
        pub lock_owner: u64,
        pub flags: u32,
        pub padding: u32,
    }

    pub struct WriteOut {
        pub size: u32,
        pub padding: u32,
    }

    pub struct StatfsOut {
        pub blocks: u64,
        pub bfree: u64,
        pub bavail: u64,
        pub files: u64,
        pub ffree: u64,
        pub bsize: u32,
        pub namelen: u32,
        pub frsize: u32,
        pub padding: u32,
        pub spare: [u32; 6],
    }

    pub struct FsyncIn {
        pub fh: u64,
        pub fsync_flags: u32,
        pub padding: u32,
    }

    /// Without SETXATTR_EXT the kernel sends only `size` and `flags` (see `request`).
    pub struct SetxattrIn {
        pub size: u32,
        pub flags: u32,
        pub setxattr_flags: u32,
        pub padding: u32,
    }

    pub struct StatxIn {
        pub getattr_flags: u32,
        pub reserved: u32,
        pub fh: u64,
        pub sx_flags: u32,
        pub sx_mask: u32,
    }

    pub struct SxTime {
        pub tv_sec: i64,
        pub tv_nsec: u32,
        pub reserved: i32,
    }

    pub struct Statx {
        pub mask: u32,
        pub blksize: u32,
        pub attributes: u64,
        pub nlink: u32,
        pub uid: u32,
        pub gid: u32,
        pub mode: u16,
        pub spare0: u16,
        pub ino: u64,
        pub size: u64,
        pub blocks: u64,
        pub attributes_mask: u64,
        pub atime: SxTime,
        pub btime: SxTime,
        pub ctime: SxTime,
        pub mtime: SxTime,
        pub rdev_major: u32,
        pub rdev_minor: u32,
        pub dev_major: u32,
        pub dev_minor: u32,
        pub spare2: [u64; 14],
    }

    pub struct StatxOut {
        pub attr_valid: u64,
        pub attr_valid_nsec: u32,
        pub flags: u32,
        pub spare: [u64; 2],
        pub stat: Statx,
    }

    pub struct GetxattrIn {
        pub size: u32,
        pub padding: u32,
    }

    pub struct GetxattrOut {
        pub size: u32,
        pub padding: u32,
    }

    pub struct FallocateIn {
        pub fh: u64,
        pub offset: u64,
        pub length: u64,
        pub mode: u32,
        pub padding: u32,
    }

    pub struct LseekIn {
        pub fh: u64,
        pub offset: u64,
        pub whence: u32,
        pub padding: u32,
    }

    pub struct LseekOut {
        pub offset: u64,
    }

    /// Without FUSE_IOCTL_UNRESTRICTED (only CUSE gets it) `in_size`/`out_size` come from
    /// the command's _IOC encoding, and `in_size` bytes of argument follow.
    pub struct IoctlIn {
        pub fh: u64,
        pub flags: u32,
        pub cmd: u32,
        pub arg: u64,
        pub in_size: u32,
        pub out_size: u32,
    }

    pub struct IoctlOut {
        pub result: i32,
        pub flags: u32,
        pub in_iovs: u32,
        pub out_iovs: u32,
    }

    pub struct CopyFileRangeIn {
        pub fh_in: u64,
        pub off_in: u64,
        pub nodeid_out: u64,
        pub fh_out: u64,
        pub off_out: u64,
        pub len: u64,
        pub flags: u64,
    }

    pub struct DirentHead {
        pub ino: u64,
        pub off: u64,
        pub namelen: u32,
        pub typ: u32,
    }

    pub struct NotifyInvalInodeOut {
        pub ino: u64,
        pub off: i64,
        pub len: i64,
    }

    /// Followed by the name and a NUL.
    pub struct NotifyInvalEntryOut {
        pub parent: u64,
        pub namelen: u32,
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
pub mod uring {
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
