//! ROOT_ITEM, ROOT_REF and ROOT_BACKREF.

use crate::bytes::{
    array, put_u16, put_u32, put_u64, put_u8, put_zeros, slice, u16_at, u32_at, u64_at, u8_at,
};
use crate::error::Result;
use crate::invalid;
use crate::items::inode::{InodeItem, Timespec};
use crate::key::Key;

/// ROOT_ITEM flag: the subvolume is read-only.
pub const ROOT_SUBVOL_RDONLY: u64 = 1 << 0;
/// Size of a ROOT_ITEM written by old kernels (it ends before `generation_v2`).
pub const ROOT_ITEM_LEGACY_SIZE: usize = 239;
/// Size of a current ROOT_ITEM (`btrfs_root_item`).
pub const ROOT_ITEM_SIZE: usize = 439;

/// A ROOT_ITEM body (`btrfs_root_item`), key `(tree id, ROOT_ITEM, 0 or snapshot transid)` in
/// the root tree: where a tree's root block is and, for subvolumes, their identity and
/// history.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RootItem {
    /// The embedded legacy inode (unused by the kernel, but written; see the format notes).
    pub inode: InodeItem,
    /// Transaction id in which the root block pointer was last updated.
    pub generation: u64,
    /// Inode number of the root directory: 256 for subvolumes, 0 for other trees.
    pub root_dirid: u64,
    /// Logical address of the tree's root block.
    pub bytenr: u64,
    /// Bytes of tree blocks in this tree (kept approximately by the kernel).
    pub bytes_used: u64,
    /// Transaction id of the last snapshot of this root (of its creation, for a snapshot).
    pub last_snapshot: u64,
    /// [`ROOT_SUBVOL_RDONLY`]; bit 48 (SUBVOL_DEAD) while a deleted subvolume is dropped.
    pub flags: u64,
    /// 1 for a live root; 0 once deleted, until the cleaner has dropped the tree.
    pub refs: u32,
    /// Key where an interrupted deletion of the tree resumes.
    pub drop_progress: Key,
    /// Level at which an interrupted deletion resumes.
    pub drop_level: u8,
    /// Level of the root block.
    pub level: u8,
    /// Copy of `generation`; when it differs, the fields after it were written by an old
    /// kernel and are ignored (read as zero).
    pub generation_v2: u64,
    /// The subvolume's UUID (zero for other trees).
    pub uuid: [u8; 16],
    /// For a snapshot: the UUID of the subvolume it was taken of.
    pub parent_uuid: [u8; 16],
    /// Set by `btrfs receive`: the UUID of the subvolume that was sent.
    pub received_uuid: [u8; 16],
    /// Transaction id of the last change to the subvolume's contents.
    pub ctransid: u64,
    /// Transaction id of the subvolume's creation.
    pub otransid: u64,
    /// For a received subvolume: the sent subvolume's ctransid.
    pub stransid: u64,
    /// For a received subvolume: the transaction id of the receive.
    pub rtransid: u64,
    /// Time of the last change to the subvolume's contents.
    pub ctime: Timespec,
    /// Creation time.
    pub otime: Timespec,
    /// Send time (received subvolumes).
    pub stime: Timespec,
    /// Receive time (received subvolumes).
    pub rtime: Timespec,
}

impl RootItem {
    /// Parses a 239-byte legacy or a 439-byte (or longer) item body.
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

    /// The 439-byte item body.
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
    /// The entry's DIR_INDEX index in that directory.
    pub sequence: u64,
    /// The entry's name (no NUL).
    pub name: Vec<u8>,
}

impl RootRef {
    /// Parses an item body.
    pub fn parse(b: &[u8]) -> Result<RootRef> {
        let len = u16_at(b, 16)? as usize;
        Ok(RootRef {
            dirid: u64_at(b, 0)?,
            sequence: u64_at(b, 8)?,
            name: slice(b, 18, len)?.to_vec(),
        })
    }

    /// The item body; an error for a name longer than u16.
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
