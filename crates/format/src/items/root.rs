//! ROOT_ITEM, ROOT_REF and ROOT_BACKREF.

use crate::bytes::{
    array, put_u16, put_u32, put_u64, put_u8, put_zeros, slice, u16_at, u32_at, u64_at, u8_at,
};
use crate::error::Result;
use crate::invalid;
use crate::items::inode::{InodeItem, Timespec};
use crate::key::Key;

pub const ROOT_SUBVOL_RDONLY: u64 = 1 << 0;
pub const ROOT_ITEM_LEGACY_SIZE: usize = 239;
pub const ROOT_ITEM_SIZE: usize = 439;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RootItem {
    /// The embedded legacy inode (unused by the kernel, but written; see the format notes).
    pub inode: InodeItem,
    pub generation: u64,
    pub root_dirid: u64,
    pub bytenr: u64,
    pub bytes_used: u64,
    pub last_snapshot: u64,
    pub flags: u64,
    pub refs: u32,
    pub drop_progress: Key,
    pub drop_level: u8,
    pub level: u8,
    pub generation_v2: u64,
    pub uuid: [u8; 16],
    pub parent_uuid: [u8; 16],
    pub received_uuid: [u8; 16],
    pub ctransid: u64,
    pub otransid: u64,
    pub stransid: u64,
    pub rtransid: u64,
    pub ctime: Timespec,
    pub otime: Timespec,
    pub stime: Timespec,
    pub rtime: Timespec,
}

impl RootItem {
    pub fn parse(b: &[u8]) -> Result<RootItem> {
        if b.len() != ROOT_ITEM_LEGACY_SIZE && b.len() < ROOT_ITEM_SIZE {
            invalid!(
                "root item is {} bytes, expected {} or {}",
                b.len(),
                ROOT_ITEM_LEGACY_SIZE,
                ROOT_ITEM_SIZE
            );
        }
        let mut r = RootItem {
            inode: InodeItem::parse(b)?,
            generation: u64_at(b, 160)?,
            root_dirid: u64_at(b, 168)?,
            bytenr: u64_at(b, 176)?,
            bytes_used: u64_at(b, 192)?,
            last_snapshot: u64_at(b, 200)?,
            flags: u64_at(b, 208)?,
            refs: u32_at(b, 216)?,
            drop_progress: Key::parse(b, 220)?,
            drop_level: u8_at(b, 237)?,
            level: u8_at(b, 238)?,
            ..Default::default()
        };
        if b.len() >= ROOT_ITEM_SIZE {
            r.generation_v2 = u64_at(b, 239)?;
            // Fields past the legacy size are only meaningful when generation_v2 matches.
            if r.generation_v2 == r.generation {
                r.uuid = array(b, 247)?;
                r.parent_uuid = array(b, 263)?;
                r.received_uuid = array(b, 279)?;
                r.ctransid = u64_at(b, 295)?;
                r.otransid = u64_at(b, 303)?;
                r.stransid = u64_at(b, 311)?;
                r.rtransid = u64_at(b, 319)?;
                r.ctime = Timespec::parse(b, 327)?;
                r.otime = Timespec::parse(b, 339)?;
                r.stime = Timespec::parse(b, 351)?;
                r.rtime = Timespec::parse(b, 363)?;
            }
        }
        Ok(r)
    }

    /// Appends the full 439-byte form (never the legacy 239-byte one).
    pub fn write_into(&self, out: &mut Vec<u8>) {
        self.inode.write_into(out);
        put_u64(out, self.generation);
        put_u64(out, self.root_dirid);
        put_u64(out, self.bytenr);
        put_u64(out, 0); // byte_limit: unused
        put_u64(out, self.bytes_used);
        put_u64(out, self.last_snapshot);
        put_u64(out, self.flags);
        put_u32(out, self.refs);
        out.extend_from_slice(&self.drop_progress.to_bytes());
        put_u8(out, self.drop_level);
        put_u8(out, self.level);
        put_u64(out, self.generation_v2);
        out.extend_from_slice(&self.uuid);
        out.extend_from_slice(&self.parent_uuid);
        out.extend_from_slice(&self.received_uuid);
        put_u64(out, self.ctransid);
        put_u64(out, self.otransid);
        put_u64(out, self.stransid);
        put_u64(out, self.rtransid);
        for t in [&self.ctime, &self.otime, &self.stime, &self.rtime] {
            t.write_into(out);
        }
        put_zeros(out, 64);
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(ROOT_ITEM_SIZE);
        self.write_into(&mut out);
        out
    }
}

/// ROOT_REF (parent, 156, child) / ROOT_BACKREF (child, 144, parent) body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootRef {
    /// Directory inode in the parent subvolume holding the entry.
    pub dirid: u64,
    pub sequence: u64,
    pub name: Vec<u8>,
}

impl RootRef {
    pub fn parse(b: &[u8]) -> Result<RootRef> {
        let len = u16_at(b, 16)? as usize;
        Ok(RootRef {
            dirid: u64_at(b, 0)?,
            sequence: u64_at(b, 8)?,
            name: slice(b, 18, len)?.to_vec(),
        })
    }

    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let len = crate::items::name_len(&self.name)?;
        let mut out = Vec::with_capacity(18 + self.name.len());
        put_u64(&mut out, self.dirid);
        put_u64(&mut out, self.sequence);
        put_u16(&mut out, len);
        out.extend_from_slice(&self.name);
        Ok(out)
    }
}
