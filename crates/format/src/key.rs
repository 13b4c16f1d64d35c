//! Keys, item types and well-known object ids.

use crate::bytes::{u64_at, u8_at};
use crate::error::Result;
use std::fmt;

/// Size of a disk key (`btrfs_disk_key`): objectid u64, type u8, offset u64.
pub const KEY_SIZE: usize = 17;

/// A btrfs key. Field order gives the on-disk sort order (objectid, type, offset), so the
/// derived `Ord` is the tree order.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Key {
    /// What the item is about: an inode number, a tree id, a logical address, or one of the
    /// [`objectid`] constants.
    pub objectid: u64,
    /// Which kind of item this is (one of the [`item`] constants, btrfs's `type`).
    pub item_type: u8,
    /// Meaning depends on the type: a file offset, a name hash, a length, a parent...
    pub offset: u64,
}

impl Key {
    /// The smallest key, `(0, 0, 0)`.
    pub const MIN: Key = Key {
        objectid: 0,
        item_type: 0,
        offset: 0,
    };
    /// The largest key, all fields at their maximum.
    pub const MAX: Key = Key {
        objectid: u64::MAX,
        item_type: u8::MAX,
        offset: u64::MAX,
    };

    /// The key `(objectid, item_type, offset)`.
    pub const fn new(objectid: u64, item_type: u8, offset: u64) -> Key {
        Key {
            objectid,
            item_type,
            offset,
        }
    }

    /// Reads the 17-byte disk key at `buf[off..]`.
    pub fn parse(buf: &[u8], off: usize) -> Result<Key> {
        Ok(Key {
            objectid: u64_at(buf, off)?,
            item_type: u8_at(buf, off + 8)?,
            offset: u64_at(buf, off + 9)?,
        })
    }

    /// The 17-byte disk key.
    pub fn to_bytes(&self) -> [u8; KEY_SIZE] {
        let mut b = [0u8; KEY_SIZE];
        b[0..8].copy_from_slice(&self.objectid.to_le_bytes());
        b[8] = self.item_type;
        b[9..17].copy_from_slice(&self.offset.to_le_bytes());
        b
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "({} {} {})",
            objectid_name(self.objectid),
            item_type_name(self.item_type),
            self.offset
        )
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Item types (`key.type`). Each doc gives the key as `(objectid, offset)` and what the
/// body holds.
pub mod item {
    /// `(inode, 0)`: an inode's attributes ([`InodeItem`](crate::items::InodeItem)).
    pub const INODE_ITEM: u8 = 1;
    /// `(inode, parent dir)`: the inode's names in that directory
    /// ([`InodeRef`](crate::items::InodeRef)).
    pub const INODE_REF: u8 = 12;
    /// `(inode, hash of parent and name)`: names that no longer fit an INODE_REF
    /// ([`InodeExtref`](crate::items::InodeExtref)).
    pub const INODE_EXTREF: u8 = 13;
    /// `(inode, name hash)`: extended attributes, in the dir entry format.
    pub const XATTR_ITEM: u8 = 24;
    /// `(inode, offset)`: fs-verity descriptor.
    pub const VERITY_DESC_ITEM: u8 = 36;
    /// `(inode, offset)`: fs-verity Merkle tree bytes.
    pub const VERITY_MERKLE_ITEM: u8 = 37;
    /// `(ORPHAN, inode or subvolume id)`: an unlinked inode still open, or a deleted subvolume
    /// being dropped. Empty body.
    pub const ORPHAN_ITEM: u8 = 48;
    /// Log trees only (obsolete): `(dir, first)` -> end, a range of directory entries the log is
    /// authoritative for.
    pub const DIR_LOG_ITEM: u8 = 60;
    /// Log trees only: `(dir, first index)` -> last index, a range of DIR_INDEX entries the log is
    /// authoritative for.
    pub const DIR_LOG_INDEX: u8 = 72;
    /// `(dir, name hash)`: directory entries looked up by name
    /// ([`DirEntryItem`](crate::items::DirEntryItem)).
    pub const DIR_ITEM: u8 = 84;
    /// `(dir, index)`: one directory entry, in readdir order.
    pub const DIR_INDEX: u8 = 96;
    /// `(inode, file offset)`: where a file range's data is
    /// ([`FileExtent`](crate::items::FileExtent)).
    pub const EXTENT_DATA: u8 = 108;
    /// `(EXTENT_CSUM, logical)`: checksums of consecutive data sectors starting there.
    pub const EXTENT_CSUM: u8 = 128;
    /// `(tree id, 0 or snapshot transid)`: where a tree's root block is
    /// ([`RootItem`](crate::items::RootItem)).
    pub const ROOT_ITEM: u8 = 132;
    /// `(child subvolume, parent subvolume)`: the entry naming a subvolume
    /// ([`RootRef`](crate::items::RootRef)).
    pub const ROOT_BACKREF: u8 = 144;
    /// `(parent subvolume, child subvolume)`: the same as ROOT_BACKREF, seen from the parent.
    pub const ROOT_REF: u8 = 156;
    /// `(logical, length)`: an allocated data extent (or non-skinny tree block) and its references
    /// ([`ExtentItem`](crate::items::ExtentItem)).
    pub const EXTENT_ITEM: u8 = 168;
    /// `(logical, level)`: an allocated tree block with SKINNY_METADATA, and its references.
    pub const METADATA_ITEM: u8 = 169;
    /// Inline ref only (simple quotas): the root that owns the extent.
    pub const EXTENT_OWNER_REF: u8 = 172;
    /// `(logical, root)`: a tree references this block (keyed or inline back reference).
    pub const TREE_BLOCK_REF: u8 = 176;
    /// `(logical, hash)`: file extent items of (root, inode, offset) reference this data extent.
    pub const EXTENT_DATA_REF: u8 = 178;
    /// `(logical, parent block)`: a tree block referenced through its parent (FULL_BACKREF).
    pub const SHARED_BLOCK_REF: u8 = 182;
    /// `(logical, parent leaf)`: a data extent referenced through the leaf holding the file items.
    pub const SHARED_DATA_REF: u8 = 184;
    /// `(logical start, length)`: a block group and its used bytes
    /// ([`BlockGroupItem`](crate::items::BlockGroupItem)).
    pub const BLOCK_GROUP_ITEM: u8 = 192;
    /// `(block group start, length)`: how the free space tree describes a block group
    /// ([`FreeSpaceInfo`](crate::items::FreeSpaceInfo)).
    pub const FREE_SPACE_INFO: u8 = 198;
    /// `(start, length)`: one free range of the free space tree. Empty body.
    pub const FREE_SPACE_EXTENT: u8 = 199;
    /// `(start, length)`: a bitmap of free sectors, one bit per sector.
    pub const FREE_SPACE_BITMAP: u8 = 200;
    /// `(devid, physical start)`: a stripe of a chunk on a device
    /// ([`DevExtent`](crate::items::DevExtent)).
    pub const DEV_EXTENT: u8 = 204;
    /// `(DEV_ITEMS, devid)`: a device of the filesystem ([`DevItem`](crate::items::DevItem)).
    pub const DEV_ITEM: u8 = 216;
    /// `(FIRST_CHUNK_TREE, logical start)`: the logical -> physical mapping of a chunk
    /// ([`ChunkItem`](crate::items::ChunkItem)).
    pub const CHUNK_ITEM: u8 = 228;
    /// `(logical, length)`: per-extent stripe map of the raid stripe tree.
    pub const RAID_STRIPE: u8 = 230;
    /// `(0, 0)` in the quota tree: quota state and flags.
    pub const QGROUP_STATUS: u8 = 240;
    /// `(0, qgroupid)`: a qgroup's referenced and exclusive byte counts.
    pub const QGROUP_INFO: u8 = 242;
    /// `(0, qgroupid)`: a qgroup's limits.
    pub const QGROUP_LIMIT: u8 = 244;
    /// `(child, parent)` and `(parent, child)`: qgroup membership. Empty body.
    pub const QGROUP_RELATION: u8 = 246;
    /// Also BALANCE_ITEM: `(BALANCE, 0)` holds a paused or running balance.
    pub const TEMPORARY_ITEM: u8 = 248;
    /// Also DEV_STATS: `(DEV_STATS, devid)` holds a device's error counters.
    pub const PERSISTENT_ITEM: u8 = 249;
    /// `(0, 0)` in the device tree: state of a device replace.
    pub const DEV_REPLACE: u8 = 250;
    /// UUID tree: a subvolume's uuid -> its id ([`UuidItem`](crate::items::UuidItem)).
    pub const UUID_KEY_SUBVOL: u8 = 251;
    /// UUID tree: a received_uuid -> the ids of subvolumes carrying it.
    pub const UUID_KEY_RECEIVED_SUBVOL: u8 = 252;
    /// Debugging only.
    pub const STRING_ITEM: u8 = 253;
}

/// Well-known object ids and tree ids.
pub mod objectid {
    /// The root tree: the tree of tree roots (found through the superblock).
    pub const ROOT_TREE: u64 = 1;
    /// The extent tree: allocated extents and their back references.
    pub const EXTENT_TREE: u64 = 2;
    /// The chunk tree: logical -> physical mapping, and the devices.
    pub const CHUNK_TREE: u64 = 3;
    /// The device tree: physical -> logical (dev extents), device stats.
    pub const DEV_TREE: u64 = 4;
    /// The top-level subvolume (`subvolid=5`).
    pub const FS_TREE: u64 = 5;
    /// The directory inode inside the root tree holding the `default` subvolume entry.
    pub const ROOT_TREE_DIR: u64 = 6;
    /// The checksum tree: data checksums.
    pub const CSUM_TREE: u64 = 7;
    /// The quota tree (qgroups).
    pub const QUOTA_TREE: u64 = 8;
    /// The UUID tree: subvolume uuid -> id.
    pub const UUID_TREE: u64 = 9;
    /// The free space tree.
    pub const FREE_SPACE_TREE: u64 = 10;
    /// The block group tree (compat_ro BLOCK_GROUP_TREE): block group items.
    pub const BLOCK_GROUP_TREE: u64 = 11;
    /// The raid stripe tree.
    pub const RAID_STRIPE_TREE: u64 = 12;
    /// Objectid of the device tree's DEV_STATS (PERSISTENT_ITEM) items.
    pub const DEV_STATS: u64 = 0;
    /// Objectid of the chunk tree's DEV_ITEMs.
    pub const DEV_ITEMS: u64 = 1;
    /// Placeholder inode the kernel shows for a subvolume entry it cannot resolve.
    pub const EMPTY_SUBVOL_DIR: u64 = 2;
    /// First inode number and first subvolume id; 256 is every subvolume's root directory.
    pub const FIRST_FREE: u64 = 256;
    /// Objectid of every CHUNK_ITEM, and `chunk_objectid` of block groups and dev extents.
    pub const FIRST_CHUNK_TREE: u64 = 256;
    /// Highest usable inode number and subvolume id (-256).
    pub const LAST_FREE: u64 = (-256i64) as u64;
    /// Objectid of the balance item (-4).
    pub const BALANCE: u64 = (-4i64) as u64;
    /// Objectid of orphan items (-5).
    pub const ORPHAN: u64 = (-5i64) as u64;
    /// Log trees (-6): owner of every log tree block, objectid of their ROOT_ITEMs.
    pub const TREE_LOG: u64 = (-6i64) as u64;
    /// Temporary link count fixup items during log replay (-7).
    pub const TREE_LOG_FIXUP: u64 = (-7i64) as u64;
    /// Relocation trees of a balance (-8).
    pub const TREE_RELOC: u64 = (-8i64) as u64;
    /// The data relocation tree (-9), which mkfs always creates.
    pub const DATA_RELOC_TREE: u64 = (-9i64) as u64;
    /// Objectid of every EXTENT_CSUM key (-10).
    pub const EXTENT_CSUM: u64 = (-10i64) as u64;
    /// Objectid of v1 free space cache headers in the root tree (-11).
    pub const FREE_SPACE: u64 = (-11i64) as u64;
    /// The obsolete inode number cache (-12).
    pub const FREE_INO: u64 = (-12i64) as u64;
    /// Placeholder the kernel uses internally (-255).
    pub const MULTIPLE: u64 = (-255i64) as u64;

    /// Subvolume trees: the top level (5) and ids 256..=-256.
    pub fn is_fs_tree(id: u64) -> bool {
        id == FS_TREE || (FIRST_FREE..=LAST_FREE).contains(&id)
    }
}

/// The name btrfs-progs prints for item type `t` (`UNKNOWN.<t>` for others).
pub fn item_type_name(t: u8) -> String {
    use item::*;
    let s = match t {
        INODE_ITEM => "INODE_ITEM",
        INODE_REF => "INODE_REF",
        INODE_EXTREF => "INODE_EXTREF",
        XATTR_ITEM => "XATTR_ITEM",
        VERITY_DESC_ITEM => "VERITY_DESC_ITEM",
        VERITY_MERKLE_ITEM => "VERITY_MERKLE_ITEM",
        ORPHAN_ITEM => "ORPHAN_ITEM",
        DIR_LOG_ITEM => "DIR_LOG_ITEM",
        DIR_LOG_INDEX => "DIR_LOG_INDEX",
        DIR_ITEM => "DIR_ITEM",
        DIR_INDEX => "DIR_INDEX",
        EXTENT_DATA => "EXTENT_DATA",
        EXTENT_CSUM => "EXTENT_CSUM",
        ROOT_ITEM => "ROOT_ITEM",
        ROOT_BACKREF => "ROOT_BACKREF",
        ROOT_REF => "ROOT_REF",
        EXTENT_ITEM => "EXTENT_ITEM",
        METADATA_ITEM => "METADATA_ITEM",
        EXTENT_OWNER_REF => "EXTENT_OWNER_REF",
        TREE_BLOCK_REF => "TREE_BLOCK_REF",
        EXTENT_DATA_REF => "EXTENT_DATA_REF",
        SHARED_BLOCK_REF => "SHARED_BLOCK_REF",
        SHARED_DATA_REF => "SHARED_DATA_REF",
        BLOCK_GROUP_ITEM => "BLOCK_GROUP_ITEM",
        FREE_SPACE_INFO => "FREE_SPACE_INFO",
        FREE_SPACE_EXTENT => "FREE_SPACE_EXTENT",
        FREE_SPACE_BITMAP => "FREE_SPACE_BITMAP",
        DEV_EXTENT => "DEV_EXTENT",
        DEV_ITEM => "DEV_ITEM",
        CHUNK_ITEM => "CHUNK_ITEM",
        RAID_STRIPE => "RAID_STRIPE",
        QGROUP_STATUS => "QGROUP_STATUS",
        QGROUP_INFO => "QGROUP_INFO",
        QGROUP_LIMIT => "QGROUP_LIMIT",
        QGROUP_RELATION => "QGROUP_RELATION",
        TEMPORARY_ITEM => "TEMPORARY_ITEM",
        PERSISTENT_ITEM => "PERSISTENT_ITEM",
        DEV_REPLACE => "DEV_REPLACE",
        UUID_KEY_SUBVOL => "UUID_KEY_SUBVOL",
        UUID_KEY_RECEIVED_SUBVOL => "UUID_KEY_RECEIVED_SUBVOL",
        STRING_ITEM => "STRING_ITEM",
        0 => "UNKNOWN.0",
        other => return format!("UNKNOWN.{other}"),
    };
    s.to_string()
}

/// The name btrfs-progs prints for the special (negative) object ids; others as numbers.
pub fn objectid_name(id: u64) -> String {
    use objectid::*;
    let s = match id {
        BALANCE => "BALANCE",
        ORPHAN => "ORPHAN",
        TREE_LOG => "TREE_LOG",
        TREE_LOG_FIXUP => "TREE_LOG_FIXUP",
        TREE_RELOC => "TREE_RELOC",
        DATA_RELOC_TREE => "DATA_RELOC_TREE",
        EXTENT_CSUM => "EXTENT_CSUM",
        FREE_SPACE => "FREE_SPACE",
        FREE_INO => "FREE_INO",
        MULTIPLE => "MULTIPLE",
        _ => return id.to_string(),
    };
    s.to_string()
}

/// The name btrfs-progs prints for tree `id` (others as numbers).
pub fn tree_name(id: u64) -> String {
    use objectid::*;
    let s = match id {
        ROOT_TREE => "ROOT_TREE",
        EXTENT_TREE => "EXTENT_TREE",
        CHUNK_TREE => "CHUNK_TREE",
        DEV_TREE => "DEV_TREE",
        FS_TREE => "FS_TREE",
        CSUM_TREE => "CSUM_TREE",
        QUOTA_TREE => "QUOTA_TREE",
        UUID_TREE => "UUID_TREE",
        FREE_SPACE_TREE => "FREE_SPACE_TREE",
        BLOCK_GROUP_TREE => "BLOCK_GROUP_TREE",
        RAID_STRIPE_TREE => "RAID_STRIPE_TREE",
        TREE_LOG => "TREE_LOG",
        DATA_RELOC_TREE => "DATA_RELOC_TREE",
        _ => return id.to_string(),
    };
    s.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_order_is_numeric_not_bytewise() {
        let a = Key::new(256, 1, 0);
        let b = Key::new(1, 2, 0);
        assert!(b < a, "objectid compares numerically");
        let c = Key::new(256, 1, 1 << 40);
        let d = Key::new(256, 1, 255);
        assert!(d < c);
        assert_eq!(Key::parse(&a.to_bytes(), 0).unwrap(), a);
    }
}
