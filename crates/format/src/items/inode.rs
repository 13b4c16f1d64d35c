//! INODE_ITEM, INODE_REF and INODE_EXTREF.

use crate::bytes::{
    i64_at, put_i64, put_u16, put_u32, put_u64, put_zeros, slice, u16_at, u32_at, u64_at,
};
use crate::error::Result;
use crate::invalid;
use crate::items::name_len;

pub const INODE_ITEM_SIZE: usize = 160;

pub const INODE_FLAG_NODATASUM: u64 = 0x1;
pub const INODE_FLAG_NODATACOW: u64 = 0x2;
pub const INODE_FLAG_READONLY: u64 = 0x4;
pub const INODE_FLAG_NOCOMPRESS: u64 = 0x8;
pub const INODE_FLAG_PREALLOC: u64 = 0x10;
pub const INODE_FLAG_SYNC: u64 = 0x20;
pub const INODE_FLAG_IMMUTABLE: u64 = 0x40;
pub const INODE_FLAG_APPEND: u64 = 0x80;
pub const INODE_FLAG_NODUMP: u64 = 0x100;
pub const INODE_FLAG_NOATIME: u64 = 0x200;
pub const INODE_FLAG_DIRSYNC: u64 = 0x400;
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

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timespec {
    pub sec: i64,
    pub nsec: u32,
}

impl Timespec {
    pub fn parse(b: &[u8], off: usize) -> Result<Timespec> {
        Ok(Timespec {
            sec: i64_at(b, off)?,
            nsec: u32_at(b, off + 8)?,
        })
    }

    pub fn write_into(&self, out: &mut Vec<u8>) {
        put_i64(out, self.sec);
        put_u32(out, self.nsec);
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InodeItem {
    pub generation: u64,
    pub transid: u64,
    pub size: u64,
    pub nbytes: u64,
    pub block_group: u64,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
    pub rdev: u64,
    pub flags: u64,
    pub sequence: u64,
    pub atime: Timespec,
    pub ctime: Timespec,
    pub mtime: Timespec,
    pub otime: Timespec,
}

impl InodeItem {
    pub const SIZE: usize = INODE_ITEM_SIZE;

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

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::SIZE);
        self.write_into(&mut out);
        out
    }
}

/// One name of an inode in its parent directory (an INODE_REF entry).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InodeRef {
    pub index: u64,
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

/// An INODE_EXTREF entry: like INODE_REF but carrying its parent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InodeExtref {
    pub parent: u64,
    pub index: u64,
    pub name: Vec<u8>,
}

impl InodeExtref {
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
