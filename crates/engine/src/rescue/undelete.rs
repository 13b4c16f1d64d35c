//! Undelete: inodes whose items are gone from their subvolume's current tree but whose old
//! leaves are still on disk. Copy-on-write leaves the leaf a file's last unlink changed where
//! it was until its space is used again; the file's data extents stay until the allocator
//! hands their space out again. Nothing here writes to the image.

mod extents;

use super::data::{self, Csums};
use super::find_root::each_block;
use super::open::{self, Image};
use super::restore::load_tree;
use super::walk::Items;
use super::Report;
use crate::error::Result;
use extents::{check_data, claim_extents};
use oleo_format::items::{
    DirEntryIter, ExtentItem, FileExtent, FileExtentBody, InodeExtref, InodeItem, InodeRef,
};
use oleo_format::key::{item, objectid};
use oleo_format::{Key, TreeBlock};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::path::Path;

/// Deeper than this is a loop or damage.
const MAX_DEPTH: usize = 1024;
/// More candidates than this are not kept (a hostile image could claim millions).
const MAX_FOUND: usize = 1 << 20;

/// What can be said of a deleted file's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataState {
    /// Every byte is inline in a checksummed leaf or matches its old data checksum.
    Verified,
    /// No byte is known to be reused, but some have no old checksum to check them by.
    Unverified,
    /// Some of its space holds other data now (allocated again, or failing its old
    /// checksum): those ranges are not claimed as the file's and are left out.
    Reused,
    /// Extent items are lost (the inode holds more bytes than its found items): those
    /// ranges read as holes. Nothing found is known to be reused.
    Incomplete,
    /// Nothing to read (a directory, a special file, an empty file).
    NoData,
}

impl DataState {
    /// `verified`, `unverified`, `reused`, `incomplete` or `no-data`.
    pub fn name(self) -> &'static str {
        match self {
            DataState::Verified => "verified",
            DataState::Unverified => "unverified",
            DataState::Reused => "reused",
            DataState::Incomplete => "incomplete",
            DataState::NoData => "no-data",
        }
    }
}

/// An inode found in old tree leaves and in no current tree: deleted.
#[derive(Clone, Debug)]
pub struct DeletedInode {
    /// The subvolume (tree id) whose leaves held it.
    pub subvol: u64,
    /// Inode number.
    pub ino: u64,
    /// Its INODE_ITEM: the newest copy that still had a link (from before the unlink), else
    /// the newest.
    pub inode: InodeItem,
    /// Transaction that wrote the newest leaf holding its INODE_ITEM.
    pub leaf_generation: u64,
    /// Its last known name and parent directory.
    pub name: Option<(u64, Vec<u8>)>,
    /// Best-known path inside the subvolume (no leading `/`), when every parent is known.
    pub path: Option<Vec<u8>>,
    /// Extended attributes: name and value.
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// What is known of its bytes.
    pub state: DataState,
    /// Bytes inline or checked against an old checksum.
    pub bytes_verified: u64,
    /// Bytes read with no checksum to check them by.
    pub bytes_unverified: u64,
    /// Bytes left out: their space is in use again or fails its old checksum.
    pub bytes_reused: u64,
    /// Allocated bytes (the inode's nbytes) no found extent item accounts for: lost.
    pub bytes_missing: u64,
    /// Extent items overlap (leaves of several versions mixed): some bytes may be stale.
    pub inconsistent: bool,
    /// The subvolume itself is gone from the root tree.
    pub subvolume_gone: bool,
    /// EXTENT_DATA items claimed as the file's: key offset and body.
    extents: Vec<(u64, Vec<u8>)>,
    /// Old data checksums of those extents, as csum tree items.
    csums: Items,
    /// Key offsets of the extents every sector of which has an old checksum.
    checked: HashSet<u64>,
    /// File ranges of extents whose space is allocated again.
    reused: Vec<(u64, u64)>,
}

/// The result of a scan for deleted inodes, with the image kept open to copy them out.
pub struct Undelete {
    img: Image,
    /// Deleted inodes, by subvolume and inode number.
    pub found: Vec<DeletedInode>,
    /// What makes the list less sure (a damaged current tree, an unreadable extent tree).
    pub warnings: Vec<String>,
}

/// A leaf of an fs tree seen by the scan.
struct FsLeaf {
    bytenr: u64,
    owner: u64,
    generation: u64,
    inos: (u64, u64),
}

/// A csum tree leaf seen by the scan: the logical range its items cover.
struct CsumLeaf {
    bytenr: u64,
    generation: u64,
    range: (u64, u64),
}

/// One candidate's newest items: key -> (leaf generation, body).
type Versions = BTreeMap<Key, (u64, Vec<u8>)>;

fn is_fs_tree(id: u64) -> bool {
    id == objectid::FS_TREE || (objectid::FIRST_FREE..=objectid::LAST_FREE).contains(&id)
}

/// The live inodes of a subvolume: ino -> (inode generation, first name).
type Live = HashMap<u64, (u64, Option<(u64, Vec<u8>)>)>;

fn first_ref(key: &Key, body: &[u8]) -> Option<(u64, Vec<u8>)> {
    match key.item_type {
        item::INODE_REF => InodeRef::parse_all(body)
            .ok()?
            .into_iter()
            .next()
            .map(|r| (key.offset, r.name)),
        item::INODE_EXTREF => InodeExtref::parse_all(body)
            .ok()?
            .into_iter()
            .next()
            .map(|r| (r.parent, r.name)),
        _ => None,
    }
}

impl Undelete {
    /// Scans the metadata chunks of the image at `image` (read-only) for deleted inodes.
    pub fn scan(image: &Path, super_copy: Option<usize>) -> Result<Undelete> {
        let mut report = Report::default();
        let img = open::open(image, super_copy, None, &mut report)?;
        let mut warnings = Vec::new();
        let subvols: Vec<u64> = img
            .roots
            .keys()
            .filter(|k| k.item_type == item::ROOT_ITEM && is_fs_tree(k.objectid))
            .map(|k| k.objectid)
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        let (live, unreadable) = live_inodes(&img, &subvols, &mut warnings);
        let (leaves, csum_leaves, cands) = scan_leaves(&img, &live, &unreadable);
        let mut items = leaf_items(&img, &leaves, &cands);
        let extents = allocated(&img, &mut warnings);
        let mut found = Vec::new();
        for (&(subvol, ino, g), (lg, _, inode)) in &cands {
            let v = items.remove(&(subvol, ino, g)).unwrap_or_default();
            let mut d = DeletedInode {
                subvol,
                ino,
                inode: inode.clone(),
                leaf_generation: *lg,
                name: None,
                path: None,
                xattrs: Vec::new(),
                state: DataState::NoData,
                bytes_verified: 0,
                bytes_unverified: 0,
                bytes_reused: 0,
                bytes_missing: 0,
                inconsistent: false,
                subvolume_gone: !subvols.contains(&subvol),
                extents: Vec::new(),
                csums: Items::new(),
                checked: HashSet::new(),
                reused: Vec::new(),
            };
            for (k, (_, body)) in &v {
                match k.item_type {
                    item::INODE_REF | item::INODE_EXTREF if d.name.is_none() => {
                        d.name = first_ref(k, body);
                    }
                    item::XATTR_ITEM => {
                        for e in DirEntryIter::new(body).flatten() {
                            d.xattrs.push((e.name.to_vec(), e.data.to_vec()));
                        }
                    }
                    _ => {}
                }
            }
            claim_extents(&img, &mut d, &v, extents.as_ref(), &csum_leaves);
            found.push(d);
        }
        let paths: Vec<_> = (0..found.len())
            .map(|i| path_of(&found, &live, i))
            .collect();
        for (d, p) in found.iter_mut().zip(paths) {
            d.path = p;
        }
        for d in found.iter_mut() {
            check_data(&img, d);
        }
        Ok(Undelete {
            img,
            found,
            warnings,
        })
    }

    /// Writes the bytes of deleted file `d` into `out` (made `size` long). Returns the file
    /// ranges left as holes: space reused, or failing its old checksum.
    pub fn copy_out(&self, d: &DeletedInode, out: &File) -> Result<Vec<(u64, u64)>> {
        let size = d.inode.size;
        out.set_len(size)?;
        let ext: Vec<(u64, &[u8])> = d.extents.iter().map(|(o, b)| (*o, &b[..])).collect();
        let csums = self.csums(d);
        let mut holes = data::write_file(&self.img.io, &csums, &ext, size, Some(out))?;
        holes.extend(d.reused_ranges());
        holes.sort_unstable();
        Ok(holes)
    }

    /// A deleted symlink's target, when its inline extent survives.
    pub fn symlink_target(&self, d: &DeletedInode) -> Option<Vec<u8>> {
        let (_, body) = d.extents.iter().find(|(o, _)| *o == 0)?;
        match FileExtent::parse(body).ok()?.body {
            FileExtentBody::Inline { data } => Some(data.to_vec()),
            FileExtentBody::Extent { .. } => None,
        }
    }

    fn csums(&self, d: &DeletedInode) -> Csums {
        Csums::new(
            d.csums.clone(),
            self.img.sb.csum_type(),
            u64::from(self.img.sb.sectorsize),
        )
    }
}

/// The live inodes of each subvolume's current tree, and the subvolumes whose tree could
/// not be read (left out: every inode would look deleted).
fn live_inodes(
    img: &Image,
    subvols: &[u64],
    warnings: &mut Vec<String>,
) -> (HashMap<u64, Live>, HashSet<u64>) {
    let mut unreadable = HashSet::new();
    let mut live: HashMap<u64, Live> = HashMap::new();
    for &id in subvols {
        let keep = |k: &Key| {
            matches!(
                k.item_type,
                item::INODE_ITEM | item::INODE_REF | item::INODE_EXTREF
            )
        };
        let mut r = Report::default();
        let Some(items) = load_tree(img, id, &keep, &mut r) else {
            warnings.push(format!(
                "subvolume {id}: its current tree is unreadable; left out"
            ));
            unreadable.insert(id);
            continue;
        };
        if !r.skipped_blocks.is_empty() {
            warnings.push(format!(
                "subvolume {id}: {} tree block(s) unreadable: a live inode there may be \
                 listed as deleted",
                r.skipped_blocks.len()
            ));
        }
        // A tree without its root directory (256) was not really read.
        if !items.contains_key(&Key::new(objectid::FIRST_FREE, item::INODE_ITEM, 0)) {
            warnings.push(format!(
                "subvolume {id}: its root directory is unreadable; left out"
            ));
            unreadable.insert(id);
            continue;
        }
        let mut l = Live::new();
        for (k, body) in &items {
            if k.item_type == item::INODE_ITEM {
                if let Ok(i) = InodeItem::parse(body) {
                    l.entry(k.objectid).or_insert((0, None)).0 = i.generation;
                }
            } else if let Some(r) = first_ref(k, body) {
                l.entry(k.objectid).or_insert((0, None)).1.get_or_insert(r);
            }
        }
        live.insert(id, l);
    }
    (live, unreadable)
}

/// The newest copy of each inode's INODE_ITEM: (subvolume, ino, inode generation) ->
/// (leaf generation, leaf address, item).
type Cands = BTreeMap<(u64, u64, u64), (u64, u64, InodeItem)>;

/// Pass 1 over every verified block: the fs and csum tree leaves, and the INODE_ITEMs no
/// current tree holds.
fn scan_leaves(
    img: &Image,
    live: &HashMap<u64, Live>,
    unreadable: &HashSet<u64>,
) -> (Vec<FsLeaf>, Vec<CsumLeaf>, Cands) {
    let mut leaves = Vec::new();
    let mut csum_leaves = Vec::new();
    let mut cands = Cands::new();
    let mut linked = Cands::new();
    each_block(&img.io, &img.sb, &mut |bytenr, h, block| {
        if h.level != 0 {
            return;
        }
        let Ok(tb) = TreeBlock::new(block) else {
            return;
        };
        let n = tb.nritems();
        if n == 0 {
            return;
        }
        let (Ok(first), Ok(last)) = (tb.item_key(0), tb.item_key(n.saturating_sub(1))) else {
            return;
        };
        if h.owner == objectid::CSUM_TREE {
            let csize = img.sb.csum_type().size().max(1) as u64;
            let tail = tb.item_data(n - 1).map_or(0, |d| d.len() as u64);
            let end = last
                .offset
                .saturating_add(tail / csize * u64::from(img.sb.sectorsize));
            csum_leaves.push(CsumLeaf {
                bytenr,
                generation: h.generation,
                range: (first.offset, end),
            });
            return;
        }
        if !is_fs_tree(h.owner) || unreadable.contains(&h.owner) {
            return;
        }
        leaves.push(FsLeaf {
            bytenr,
            owner: h.owner,
            generation: h.generation,
            inos: (first.objectid, last.objectid),
        });
        let sub_live = live.get(&h.owner);
        for slot in 0..n {
            let Ok(k) = tb.item_key(slot) else { break };
            if k.item_type != item::INODE_ITEM
                || !(objectid::FIRST_FREE..=objectid::LAST_FREE).contains(&k.objectid)
            {
                continue;
            }
            let Ok(i) = tb.item_data(slot).and_then(InodeItem::parse) else {
                continue;
            };
            if sub_live
                .and_then(|l| l.get(&k.objectid))
                .is_some_and(|(g, _)| *g == i.generation)
            {
                continue;
            }
            let key = (h.owner, k.objectid, i.generation);
            if cands.len() >= MAX_FOUND && !cands.contains_key(&key) {
                continue;
            }
            if i.nlink > 0
                && linked
                    .get(&key)
                    .is_none_or(|(g, b, _)| (h.generation, bytenr) > (*g, *b))
            {
                linked.insert(key, (h.generation, bytenr, i.clone()));
            }
            let newer = cands
                .get(&key)
                .is_none_or(|(g, b, _)| (h.generation, bytenr) > (*g, *b));
            if newer {
                cands.insert(key, (h.generation, bytenr, i));
            }
        }
    });
    // The last copy from before the unlink: the eviction's truncation may have been
    // committed halfway, with size and nbytes shrunk. The newest leaf still bounds the
    // file's lifetime.
    for (key, (_, _, i)) in linked {
        if let Some(c) = cands.get_mut(&key) {
            c.2 = i;
        }
    }
    (leaves, csum_leaves, cands)
}

/// Pass 2: each candidate's other items, newest copy of each key, from leaves written
/// in its lifetime (its creation to the newest leaf holding its INODE_ITEM).
fn leaf_items(
    img: &Image,
    leaves: &[FsLeaf],
    cands: &Cands,
) -> BTreeMap<(u64, u64, u64), Versions> {
    let mut items: BTreeMap<(u64, u64, u64), Versions> = BTreeMap::new();
    let mut by_ino: HashMap<(u64, u64), Vec<(u64, u64)>> = HashMap::new();
    for (&(s, ino, g), (lg, _, _)) in cands {
        by_ino.entry((s, ino)).or_default().push((g, *lg));
    }
    for leaf in leaves {
        // Checked leaves have their keys in order; a range backwards would panic.
        if leaf.inos.0 > leaf.inos.1 {
            continue;
        }
        let wanted = cands
            .range((leaf.owner, leaf.inos.0, 0)..=(leaf.owner, leaf.inos.1, u64::MAX))
            .next()
            .is_some();
        if !wanted {
            continue;
        }
        each_item(img, leaf.bytenr, |k, body| {
            if !matches!(
                k.item_type,
                item::INODE_REF | item::INODE_EXTREF | item::XATTR_ITEM | item::EXTENT_DATA
            ) {
                return;
            }
            let Some(lives) = by_ino.get(&(leaf.owner, k.objectid)) else {
                return;
            };
            // The incarnation whose lifetime holds this leaf's generation.
            for &(g, lg) in lives {
                if leaf.generation < g || leaf.generation > lg {
                    continue;
                }
                let v = items.entry((leaf.owner, k.objectid, g)).or_default();
                if v.get(&k).is_none_or(|(og, _)| leaf.generation > *og) {
                    v.insert(k, (leaf.generation, body.to_vec()));
                }
            }
        });
    }
    items
}

/// Calls `f` with each item of the leaf at `bytenr`, if it reads (verified, any copy).
pub(super) fn each_item(img: &Image, bytenr: u64, mut f: impl FnMut(Key, &[u8])) {
    let Ok(block) = img.io.read_tree_block(bytenr, Some(0), None, None) else {
        return;
    };
    let Ok(tb) = TreeBlock::new(&block) else {
        return;
    };
    for slot in 0..tb.nritems() {
        let (Ok(k), Ok(body)) = (tb.item_key(slot), tb.item_data(slot)) else {
            break;
        };
        f(k, body);
    }
}

/// The data extents the current extent tree allocates: start -> (length, generation).
/// Old extents overlapping one of them are reused.
fn allocated(img: &Image, warnings: &mut Vec<String>) -> Option<BTreeMap<u64, (u64, u64)>> {
    let mut r = Report::default();
    let keep = |k: &Key| k.item_type == item::EXTENT_ITEM;
    let extents: Option<BTreeMap<u64, (u64, u64)>> =
        load_tree(img, objectid::EXTENT_TREE, &keep, &mut r).map(|items| {
            items
                .iter()
                .map(|(k, b)| {
                    let gen = ExtentItem::parse(b, false).map_or(u64::MAX, |e| e.generation);
                    (k.objectid, (k.offset, gen))
                })
                .collect()
        });
    if extents.is_none() {
        warnings.push(
            "the extent tree is unreadable: reused space is told only by old checksums".into(),
        );
    } else if !r.skipped_blocks.is_empty() {
        warnings.push(format!(
            "extent tree: {} block(s) unreadable: reused space there is told only by old \
             checksums",
            r.skipped_blocks.len()
        ));
    }
    extents
}

impl DeletedInode {
    /// File ranges whose extents were left out as reused.
    fn reused_ranges(&self) -> Vec<(u64, u64)> {
        self.reused.clone()
    }
}

/// The path of `found[i]` inside its subvolume, through live or deleted parents.
fn path_of(found: &[DeletedInode], live: &HashMap<u64, Live>, i: usize) -> Option<Vec<u8>> {
    let d = &found[i];
    let (mut parent, name) = d.name.clone()?;
    let mut parts = vec![name];
    let l = live.get(&d.subvol);
    for _ in 0..MAX_DEPTH {
        if parent == objectid::FIRST_FREE {
            parts.reverse();
            return Some(parts.join(&b'/'));
        }
        let next = match l.and_then(|l| l.get(&parent)) {
            Some((_, Some(r))) => r.clone(),
            _ => found
                .iter()
                .filter(|f| f.subvol == d.subvol && f.ino == parent)
                .max_by_key(|f| f.leaf_generation)?
                .name
                .clone()?,
        };
        parts.push(next.1);
        parent = next.0;
    }
    None
}
