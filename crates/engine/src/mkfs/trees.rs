//! What each tree of a fresh filesystem holds, as sorted item lists. Values that depend on
//! where blocks end up (root pointers, extent records, free space, block group usage) are
//! parameters, so the planner can size the trees first and fill them in afterwards.

use super::layout::ChunkPlan;
use super::pack::{BlockInfo, Items};
use crate::error::{Error, Result};
use oleo_format::items::{
    uuid_key, BlockGroupItem, ChunkItem, DevExtent, DevItem, DirEntryItem, ExtentItem, FileType,
    FreeSpaceInfo, InlineRef, InodeItem, InodeRef, RootItem, Stripe, Timespec, UuidItem,
    EXTENT_FLAG_TREE_BLOCK, INODE_FLAG_ROOT_ITEM_INIT,
};
use oleo_format::key::{item, objectid, Key};
use std::collections::BTreeMap;

/// Facts every tree builder needs.
#[derive(Clone, Debug)]
pub(crate) struct Params {
    pub nodesize: u32,
    pub sectorsize: u32,
    pub generation: u64,
    pub now: Timespec,
    pub fsid: [u8; 16],
    /// Every device, devid order.
    pub devices: Vec<DeviceInfo>,
    pub chunk_tree_uuid: [u8; 16],
    /// The top-level subvolume's UUID (its ROOT_ITEM and the uuid tree).
    pub fs_tree_uuid: [u8; 16],
    pub skinny_metadata: bool,
    /// Owner of the top-level subvolume's root directory.
    pub root_owner: (u32, u32),
}

/// One device of the new filesystem: what its DEV_ITEM says.
#[derive(Clone, Debug)]
pub(crate) struct DeviceInfo {
    pub devid: u64,
    pub uuid: [u8; 16],
    /// Its size in the filesystem.
    pub total_bytes: u64,
    /// Bytes of its dev extents.
    pub bytes_used: u64,
}

/// Where a tree's root ended up and how big it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RootPlace {
    pub bytenr: u64,
    pub level: u8,
    pub blocks: u64,
}

const DIR_MODE: u32 = 0o040755;

fn sorted(map: BTreeMap<Key, Vec<u8>>) -> Items {
    map.into_iter().collect()
}

fn fmt_err(what: &str) -> impl Fn(oleo_format::FormatError) -> Error + '_ {
    move |e| Error::InvalidArgument(format!("{what}: {e}"))
}

pub(crate) fn dev_item(p: &Params, d: &DeviceInfo) -> DevItem {
    DevItem {
        devid: d.devid,
        total_bytes: d.total_bytes,
        bytes_used: d.bytes_used,
        io_align: p.sectorsize,
        io_width: p.sectorsize,
        sector_size: p.sectorsize,
        uuid: d.uuid,
        fsid: p.fsid,
        ..Default::default()
    }
}

fn dev_uuid(p: &Params, devid: u64) -> [u8; 16] {
    p.devices
        .iter()
        .find(|d| d.devid == devid)
        .map_or([0; 16], |d| d.uuid)
}

pub(crate) fn chunk_item(p: &Params, c: &ChunkPlan) -> ChunkItem {
    ChunkItem {
        length: c.length,
        owner: objectid::EXTENT_TREE,
        stripe_len: super::layout::STRIPE_LEN,
        chunk_type: c.flags,
        io_align: super::layout::STRIPE_LEN as u32,
        io_width: super::layout::STRIPE_LEN as u32,
        sector_size: p.sectorsize,
        num_stripes: c.stripes.len() as u16,
        sub_stripes: super::layout::raid_attr(c.profile()).sub_stripes as u16,
        stripes: c
            .stripes
            .iter()
            .map(|s| Stripe {
                devid: s.devid,
                offset: s.offset,
                dev_uuid: dev_uuid(p, s.devid),
            })
            .collect(),
    }
}

/// Chunk tree: every device and every chunk.
pub(crate) fn chunk_tree(p: &Params, chunks: &[ChunkPlan]) -> Result<Items> {
    let mut m = BTreeMap::new();
    for d in &p.devices {
        m.insert(
            Key::new(objectid::DEV_ITEMS, item::DEV_ITEM, d.devid),
            dev_item(p, d).to_bytes(),
        );
    }
    for c in chunks {
        m.insert(
            Key::new(objectid::FIRST_CHUNK_TREE, item::CHUNK_ITEM, c.logical),
            chunk_item(p, c).to_bytes().map_err(fmt_err("chunk item"))?,
        );
    }
    Ok(sorted(m))
}

/// Device tree: one dev extent per stripe, and zeroed statistics for each device.
pub(crate) fn dev_tree(p: &Params, chunks: &[ChunkPlan]) -> Items {
    let mut m = BTreeMap::new();
    // DEV_STATS: write, read, flush, corruption, generation errors.
    for d in &p.devices {
        m.insert(
            Key::new(objectid::DEV_STATS, item::PERSISTENT_ITEM, d.devid),
            vec![0u8; 5 * 8],
        );
    }
    for c in chunks {
        for s in &c.stripes {
            let de = DevExtent {
                chunk_tree: objectid::CHUNK_TREE,
                chunk_objectid: objectid::FIRST_CHUNK_TREE,
                chunk_offset: c.logical,
                length: c.stripe_size,
                chunk_tree_uuid: p.chunk_tree_uuid,
            };
            m.insert(Key::new(s.devid, item::DEV_EXTENT, s.offset), de.to_bytes());
        }
    }
    sorted(m)
}

fn dir_inode(p: &Params, (uid, gid): (u32, u32)) -> InodeItem {
    // As mkfs.btrfs writes a new root directory: nbytes = nodesize (check ignores nbytes of
    // directories; the kernel keeps it).
    InodeItem {
        generation: p.generation,
        transid: p.generation,
        size: 0,
        nbytes: p.nodesize as u64,
        nlink: 1,
        uid,
        gid,
        mode: DIR_MODE,
        atime: p.now,
        ctime: p.now,
        mtime: p.now,
        otime: p.now,
        ..Default::default()
    }
}

fn dotdot(index: u64, name: &[u8]) -> Result<Vec<u8>> {
    InodeRef::to_bytes_all(&[InodeRef {
        index,
        name: name.to_vec(),
    }])
    .map_err(fmt_err("inode ref"))
}

/// A subvolume-style tree holding only its root directory 256 owned by `owner` (the fs
/// tree and the data relocation tree).
pub(crate) fn root_dir_tree(p: &Params, owner: (u32, u32)) -> Result<Items> {
    let dir = objectid::FIRST_FREE;
    let mut m = BTreeMap::new();
    m.insert(
        Key::new(dir, item::INODE_ITEM, 0),
        dir_inode(p, owner).to_bytes(),
    );
    m.insert(Key::new(dir, item::INODE_REF, dir), dotdot(0, b"..")?);
    Ok(sorted(m))
}

pub(crate) fn uuid_tree(p: &Params) -> Items {
    vec![(
        uuid_key(&p.fs_tree_uuid, item::UUID_KEY_SUBVOL),
        UuidItem {
            subvol_ids: vec![objectid::FS_TREE],
        }
        .to_bytes(),
    )]
}

fn root_item(p: &Params, id: u64, place: RootPlace) -> RootItem {
    let fs_like = id == objectid::FS_TREE || id == objectid::DATA_RELOC_TREE;
    // The embedded inode is legacy, but mkfs.btrfs fills it like this and so do we.
    let inode = InodeItem {
        generation: 1,
        size: 3,
        nlink: 1,
        nbytes: p.nodesize as u64,
        mode: DIR_MODE,
        flags: if id == objectid::FS_TREE {
            INODE_FLAG_ROOT_ITEM_INIT
        } else {
            0
        },
        ..Default::default()
    };
    let mut r = RootItem {
        inode,
        generation: p.generation,
        generation_v2: p.generation,
        root_dirid: if fs_like { objectid::FIRST_FREE } else { 0 },
        bytenr: place.bytenr,
        level: place.level,
        bytes_used: place.blocks * p.nodesize as u64,
        refs: 1,
        ..Default::default()
    };
    if id == objectid::FS_TREE {
        r.uuid = p.fs_tree_uuid;
        r.ctime = p.now;
        r.otime = p.now;
    }
    r
}

/// Root tree: a ROOT_ITEM per tree in `roots`, and the root directory 6 whose `default`
/// entry names tree 5.
pub(crate) fn root_tree(p: &Params, roots: &[(u64, RootPlace)]) -> Result<Items> {
    let mut m = BTreeMap::new();
    for &(id, place) in roots {
        m.insert(
            Key::new(id, item::ROOT_ITEM, 0),
            root_item(p, id, place).to_bytes(),
        );
    }
    let dir = objectid::ROOT_TREE_DIR;
    m.insert(
        Key::new(dir, item::INODE_ITEM, 0),
        dir_inode(p, (0, 0)).to_bytes(),
    );
    m.insert(Key::new(dir, item::INODE_REF, dir), dotdot(0, b"..")?);
    let name = b"default";
    let entry = DirEntryItem {
        location: Key::new(objectid::FS_TREE, item::ROOT_ITEM, u64::MAX),
        transid: p.generation,
        file_type: FileType::Dir.raw(),
        name,
        data: &[],
    };
    m.insert(
        Key::new(dir, item::DIR_ITEM, oleo_format::csum::name_hash(name)),
        entry.to_bytes().map_err(fmt_err("dir item"))?,
    );
    m.insert(
        Key::new(objectid::FS_TREE, item::INODE_REF, dir),
        dotdot(0, name)?,
    );
    Ok(sorted(m))
}

/// BLOCK_GROUP_ITEMs, `used` = bytes of tree blocks inside each chunk.
pub(crate) fn block_group_items(
    chunks: &[ChunkPlan],
    blocks: &[BlockInfo],
    nodesize: u32,
) -> Items {
    chunks
        .iter()
        .map(|c| {
            let used =
                blocks.iter().filter(|b| c.contains(b.bytenr)).count() as u64 * nodesize as u64;
            let bg = BlockGroupItem {
                used,
                chunk_objectid: objectid::FIRST_CHUNK_TREE,
                flags: c.flags,
            };
            (
                Key::new(c.logical, item::BLOCK_GROUP_ITEM, c.length),
                bg.to_bytes(),
            )
        })
        .collect()
}

/// Extent tree: one extent record per tree block (skinny METADATA_ITEM or EXTENT_ITEM with
/// the block's first key), each with one inline TREE_BLOCK_REF to its owner; plus
/// `extra` (the block group items when they live here).
pub(crate) fn extent_tree(p: &Params, blocks: &[BlockInfo], extra: &Items) -> Items {
    let mut m: BTreeMap<Key, Vec<u8>> = extra.iter().cloned().collect();
    for b in blocks {
        let (key, info) = if p.skinny_metadata {
            (
                Key::new(b.bytenr, item::METADATA_ITEM, b.level as u64),
                None,
            )
        } else {
            (
                Key::new(b.bytenr, item::EXTENT_ITEM, p.nodesize as u64),
                Some((b.first_key, b.level)),
            )
        };
        let e = ExtentItem {
            refs: 1,
            generation: p.generation,
            flags: EXTENT_FLAG_TREE_BLOCK,
            tree_block_info: info,
            inline_refs: vec![InlineRef::TreeBlock { root: b.owner }],
        };
        m.insert(key, e.to_bytes());
    }
    sorted(m)
}

/// Free space tree: per block group, its info item and the maximal free ranges between
/// tree blocks. Superblock mirror ranges are *not* carved out: the kernel lists them as
/// free here and excludes them in memory (what mkfs.btrfs and the kernel write).
pub(crate) fn free_space_tree(chunks: &[ChunkPlan], blocks: &[BlockInfo], nodesize: u32) -> Items {
    let mut out = Vec::new();
    for c in chunks {
        let mut used: Vec<u64> = blocks
            .iter()
            .map(|b| b.bytenr)
            .filter(|&a| c.contains(a))
            .collect();
        used.sort_unstable();
        let mut free = Vec::new();
        let mut cursor = c.logical;
        for a in used {
            if a > cursor {
                free.push((cursor, a - cursor));
            }
            cursor = cursor.max(a + nodesize as u64);
        }
        if cursor < c.end() {
            free.push((cursor, c.end() - cursor));
        }
        let info = FreeSpaceInfo {
            extent_count: free.len() as u32,
            flags: 0,
        };
        out.push((
            Key::new(c.logical, item::FREE_SPACE_INFO, c.length),
            info.to_bytes(),
        ));
        for (start, len) in free {
            out.push((Key::new(start, item::FREE_SPACE_EXTENT, len), Vec::new()));
        }
    }
    out.sort_by_key(|(k, _)| *k);
    out
}
