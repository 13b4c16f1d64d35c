//! INODE_ITEM, INODE_REF and INODE_EXTREF.

use crate::bytes::{
    i64_at, put_i64, put_u16, put_u32, put_u64, put_zeros, slice, u16_at, u32_at, u64_at,
};
use crate::error::Result;
use crate::invalid;
use crate::items::name_len;

/// Size of an INODE_ITEM body (`btrfs_inode_item`).
pub const INODE_ITEM_SIZE: usize = 160;

/// Inode flag: No checksums for the inode's data (set with NODATACOW).
pub const INODE_FLAG_NODATASUM: u64 = 0x1;
/// Inode flag: Data is overwritten in place, not copied on write (`chattr +C`).
pub const INODE_FLAG_NODATACOW: u64 = 0x2;
/// Inode flag: Legacy read-only flag; no current kernel sets it.
pub const INODE_FLAG_READONLY: u64 = 0x4;
/// Inode flag: Never compress the inode's data (`chattr +m`).
pub const INODE_FLAG_NOCOMPRESS: u64 = 0x8;
/// Inode flag: The inode has had preallocated (fallocate) extents.
pub const INODE_FLAG_PREALLOC: u64 = 0x10;
/// Inode flag: Writes are synchronous (`chattr +S`).
pub const INODE_FLAG_SYNC: u64 = 0x20;
/// Inode flag: The inode cannot change (`chattr +i`).
pub const INODE_FLAG_IMMUTABLE: u64 = 0x40;
/// Inode flag: Writes only append (`chattr +a`).
pub const INODE_FLAG_APPEND: u64 = 0x80;
/// Inode flag: Skipped by dump (`chattr +d`).
pub const INODE_FLAG_NODUMP: u64 = 0x100;
/// Inode flag: Reads do not update atime (`chattr +A`).
pub const INODE_FLAG_NOATIME: u64 = 0x200;
/// Inode flag: Directory changes are synchronous (`chattr +D`).
pub const INODE_FLAG_DIRSYNC: u64 = 0x400;
/// Inode flag: Compress the inode's data (`chattr +c`).
pub const INODE_FLAG_COMPRESS: u64 = 0x800;
/// Only in a ROOT_ITEM's embedded inode: the root item has the v2 fields initialised.
pub const INODE_FLAG_ROOT_ITEM_INIT: u64 = 0x8000_0000;
/// All inode flag bits the kernel knows (low 32 bits) plus VERITY in the high half.
pub const INODE_FLAGS_KNOWN: u64 = 0x1
    | 0x2
    | 0x4
    | 0x8
    | 0x10
    | 0x20
    | 0x40
    | 0x80
    | 0x100
    | 0x200
    | 0x400
    | 0x800
    | 0x8000_0000
    | (1 << 32);

/// An on-disk timestamp (`btrfs_timespec`, 12 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timespec {
    /// Seconds since the Unix epoch.
    pub sec: i64,
    /// Nanoseconds within the second.
    pub nsec: u32,
}

impl Timespec {
    /// Reads the 12-byte timestamp at `b[off..]`.
    pub fn parse(b: &[u8], off: usize) -> Result<Timespec> {
        Ok(Timespec {
            sec: i64_at(b, off)?,
            nsec: u32_at(b, off + 8)?,
        })
    }

    /// Appends the 12-byte timestamp.
    pub fn write_into(&self, out: &mut Vec<u8>) {
        put_i64(out, self.sec);
        put_u32(out, self.nsec);
    }
}

/// An INODE_ITEM body (`btrfs_inode_item`), key `(inode, INODE_ITEM, 0)`: an inode's
/// attributes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InodeItem {
    /// Transaction id in which the inode was created (the NFS generation).
    pub generation: u64,
    /// Transaction id of the last change to the inode item.
    pub transid: u64,
    /// i_size: a file's length, a symlink's target length, a directory's sum of twice its
    /// entries' name lengths.
    pub size: u64,
    /// Bytes of data the file maps: `num_bytes` of its non-hole extent items plus an inline
    /// item's `ram_bytes` (holes count 0).
    pub nbytes: u64,
    /// Allocation hint; written as 0.
    pub block_group: u64,
    /// Number of names (always 1 for a directory).
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// POSIX mode with the S_IFMT type bits.
    pub mode: u32,
    /// Device number of a character or block device (Linux encoding), 0 otherwise.
    pub rdev: u64,
    /// `INODE_FLAG_*` in the low 32 bits; read-only compat flags (bit 32: VERITY) above.
    pub flags: u64,
    /// NFS change counter (i_version), bumped on every change.
    pub sequence: u64,
    /// Last access.
    pub atime: Timespec,
    /// Last change of the inode.
    pub ctime: Timespec,
    /// Last change of the data.
    pub mtime: Timespec,
    /// Creation (birth) time.
    pub otime: Timespec,
}

impl InodeItem {
    /// Size of the body ([`INODE_ITEM_SIZE`]).
    pub const SIZE: usize = INODE_ITEM_SIZE;

    /// Parses the first 160 bytes of `b` (a ROOT_ITEM embeds one at its start).
    pub fn parse(b: &[u8]) -> Result<InodeItem> {
        if b.len() < Self::SIZE {
            invalid!("inode item is {} bytes, expected {}", b.len(), Self::SIZE);
        }
        Ok(InodeItem {
            generation: u64_at(b, 0)?,
            transid: u64_at(b, 8)?,
            size: u64_at(b, 16)?,
            nbytes: u64_at(b, 24)?,
            block_group: u64_at(b, 32)?,
            nlink: u32_at(b, 40)?,
            uid: u32_at(b, 44)?,
            gid: u32_at(b, 48)?,
            mode: u32_at(b, 52)?,
            rdev: u64_at(b, 56)?,
            flags: u64_at(b, 64)?,
            sequence: u64_at(b, 72)?,
            atime: Timespec::parse(b, 112)?,
            ctime: Timespec::parse(b, 124)?,
            mtime: Timespec::parse(b, 136)?,
            otime: Timespec::parse(b, 148)?,
        })
    }

    /// Appends the 160-byte on-disk form.
    pub fn write_into(&self, out: &mut Vec<u8>) {
        put_u64(out, self.generation);
        put_u64(out, self.transid);
        put_u64(out, self.size);
        put_u64(out, self.nbytes);
        put_u64(out, self.block_group);
        put_u32(out, self.nlink);
        put_u32(out, self.uid);
        put_u32(out, self.gid);
        put_u32(out, self.mode);
        put_u64(out, self.rdev);
        put_u64(out, self.flags);
        put_u64(out, self.sequence);
        put_zeros(out, 32);
        for t in [&self.atime, &self.ctime, &self.mtime, &self.otime] {
            t.write_into(out);
        }
    }

    /// The 160-byte item body.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::SIZE);
        self.write_into(&mut out);
        out
    }
}

/// One name of an inode in its parent directory (an INODE_REF entry, `btrfs_inode_ref`);
/// the item key is `(inode, INODE_REF, parent directory)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InodeRef {
    /// The name's DIR_INDEX key offset in the parent directory.
    pub index: u64,
    /// The name (no NUL).
    pub name: Vec<u8>,
}

impl InodeRef {
    /// All entries packed in one INODE_REF body.
    pub fn parse_all(b: &[u8]) -> Result<Vec<InodeRef>> {
        let mut out = Vec::new();
        let mut off = 0;
        while off < b.len() {
            let index = u64_at(b, off)?;
            let len = u16_at(b, off + 8)? as usize;
            let name = slice(b, off + 10, len)?.to_vec();
            out.push(InodeRef { index, name });
            off += 10 + len;
        }
        Ok(out)
    }

    /// Appends one entry. Names longer than u16 cannot be represented: an error.
    pub fn write_into(&self, out: &mut Vec<u8>) -> Result<()> {
        let len = name_len(&self.name)?;
        put_u64(out, self.index);
        put_u16(out, len);
        out.extend_from_slice(&self.name);
        Ok(())
    }

    /// The body of an INODE_REF item holding `refs` (the inverse of `parse_all`).
    pub fn to_bytes_all(refs: &[InodeRef]) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for r in refs {
            r.write_into(&mut out)?;
        }
        Ok(out)
    }
}

/// An INODE_EXTREF entry (`btrfs_inode_extref`): like INODE_REF but carrying its parent, for
/// names that do not fit the INODE_REF item. The key is `(inode, INODE_EXTREF,
/// extref_hash(parent, name))`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InodeExtref {
    /// Inode number of the directory holding the name.
    pub parent: u64,
    /// The name's DIR_INDEX key offset in that directory.
    pub index: u64,
    /// The name (no NUL).
    pub name: Vec<u8>,
}

impl InodeExtref {
    /// All entries packed in one INODE_EXTREF body.
    pub fn parse_all(b: &[u8]) -> Result<Vec<InodeExtref>> {
        let mut out = Vec::new();
        let mut off = 0;
        while off < b.len() {
            let parent = u64_at(b, off)?;
            let index = u64_at(b, off + 8)?;
            let len = u16_at(b, off + 16)? as usize;
            let name = slice(b, off + 18, len)?.to_vec();
            out.push(InodeExtref {
                parent,
                index,
                name,
            });
            off += 18 + len;
        }
        Ok(out)
    }

    /// Appends one entry. Names longer than u16 cannot be represented: an error.
    pub fn write_into(&self, out: &mut Vec<u8>) -> Result<()> {
        let len = name_len(&self.name)?;
        put_u64(out, self.parent);
        put_u64(out, self.index);
        put_u16(out, len);
        out.extend_from_slice(&self.name);
        Ok(())
    }

    /// The body of an INODE_EXTREF item holding `refs`.
    pub fn to_bytes_all(refs: &[InodeExtref]) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for r in refs {
            r.write_into(&mut out)?;
        }
        Ok(out)
    }
}
