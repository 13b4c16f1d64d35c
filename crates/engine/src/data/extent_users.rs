//! Who references a data extent: its backrefs in the extent tree, resolved to the file
//! extent items of chosen subvolumes. Send uses it to find a clone source, as the
//! kernel's find_extent_clone walks the same refs. A snapshot shares its leaves with the
//! subvolume it was taken of, so a ref names an inode and position that any of the chosen
//! trees may hold: each is looked up in each tree.

use crate::ctree::{for_each_in_range, lookup, BlockSource};
use crate::error::{Error, Result};
use crate::transaction::fs::FsCore;
use oleo_format::items::{ExtentItem, FileExtent, FileExtentBody, InlineRef};
use oleo_format::key::{item, objectid, Key};
use oleo_format::TreeBlock;
use std::collections::BTreeSet;
use std::ops::ControlFlow;

/// An extent more shared than this is not searched (the kernel's SEND_MAX_EXTENT_REFS).
pub const MAX_EXTENT_REFS: u64 = 64;

/// One file range that references a data extent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtentUser {
    /// The subvolume holding the file extent item.
    pub root: u64,
    /// The file's inode number.
    pub ino: u64,
    /// Where the range starts in the file.
    pub file_offset: u64,
    /// Where it starts in the extent's (uncompressed) bytes.
    pub extent_offset: u64,
    /// Its length.
    pub len: u64,
}

fn le_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

impl FsCore {
    /// The file ranges of trees `roots` that reference the data extent of `disk_len` bytes
    /// at `bytenr` (holding `ram_bytes` uncompressed); None when it has more than
    /// MAX_EXTENT_REFS references, or no extent item.
    pub(crate) fn extent_users(
        &self,
        bytenr: u64,
        disk_len: u64,
        ram_bytes: u64,
        roots: &[u64],
    ) -> Result<Option<Vec<ExtentUser>>> {
        let Some(places) = self.extent_ref_places(bytenr, disk_len)? else {
            return Ok(None);
        };
        let mut out = Vec::new();
        for &root in roots {
            let Some(tree) = self.subvol_root(root)? else {
                continue;
            };
            for &(ino, ref_off) in &places {
                // Items sit at ref_off plus their offset into the extent; a clone to
                // before that offset makes ref_off wrap below zero.
                let last = ref_off.wrapping_add(ram_bytes.max(1) - 1);
                let (first, last) = if last < ref_off {
                    (0, last)
                } else {
                    (ref_off, last)
                };
                for_each_in_range(
                    self,
                    &tree,
                    Key::new(ino, item::EXTENT_DATA, first),
                    Key::new(ino, item::EXTENT_DATA, last),
                    |key, body| {
                        if let Ok(FileExtent {
                            body:
                                FileExtentBody::Extent {
                                    prealloc: false,
                                    disk_bytenr,
                                    offset,
                                    num_bytes,
                                    ..
                                },
                            ..
                        }) = FileExtent::parse(body)
                        {
                            if disk_bytenr == bytenr && key.offset.wrapping_sub(offset) == ref_off {
                                out.push(ExtentUser {
                                    root,
                                    ino,
                                    file_offset: key.offset,
                                    extent_offset: offset,
                                    len: num_bytes,
                                });
                            }
                        }
                        Ok(ControlFlow::Continue(()))
                    },
                )?;
            }
        }
        Ok(Some(out))
    }

    /// The (inode, position of the extent's byte 0 in the file) its refs name; None when
    /// there are too many refs or no extent item.
    fn extent_ref_places(
        &self,
        bytenr: u64,
        disk_len: u64,
    ) -> Result<Option<BTreeSet<(u64, u64)>>> {
        let tree = match self.running_root(objectid::EXTENT_TREE) {
            Some(r) => r,
            None => match self.tree_root(objectid::EXTENT_TREE)? {
                Some(r) => r,
                None => return Ok(None),
            },
        };
        let key = Key::new(bytenr, item::EXTENT_ITEM, disk_len);
        let Some(body) = lookup(self, &tree, &key)? else {
            return Ok(None);
        };
        let ei = ExtentItem::parse(&body, false)
            .map_err(|e| Error::corrupt(bytenr, format!("extent item: {e}")))?;
        if ei.refs > MAX_EXTENT_REFS {
            return Ok(None);
        }
        let mut places = BTreeSet::new();
        let mut parents = Vec::new();
        for r in &ei.inline_refs {
            match r {
                InlineRef::Data {
                    objectid, offset, ..
                } => {
                    places.insert((*objectid, *offset));
                }
                InlineRef::SharedData { parent, .. } => parents.push(*parent),
                _ => {}
            }
        }
        for_each_in_range(
            self,
            &tree,
            Key::new(bytenr, item::EXTENT_DATA_REF, 0),
            Key::new(bytenr, item::SHARED_DATA_REF, u64::MAX),
            |k, b| {
                match k.item_type {
                    item::EXTENT_DATA_REF => {
                        let (Some(ino), Some(off)) = (le_u64(b, 8), le_u64(b, 16)) else {
                            return Err(Error::corrupt(bytenr, "short EXTENT_DATA_REF"));
                        };
                        places.insert((ino, off));
                    }
                    item::SHARED_DATA_REF => parents.push(k.offset),
                    _ => {}
                }
                Ok(ControlFlow::Continue(()))
            },
        )?;
        for parent in parents {
            self.leaf_places(parent, bytenr, &mut places)?;
        }
        Ok(Some(places))
    }

    /// The file extent items of the leaf at `parent` (a SHARED_DATA_REF's) that point at
    /// `bytenr`.
    fn leaf_places(
        &self,
        parent: u64,
        bytenr: u64,
        places: &mut BTreeSet<(u64, u64)>,
    ) -> Result<()> {
        let block = self.read_tree_block(parent, Some(0), None, None)?;
        let leaf = TreeBlock::new(&block).map_err(|e| Error::corrupt(parent, e.to_string()))?;
        for slot in 0..leaf.nritems() {
            let key = leaf
                .item_key(slot)
                .map_err(|e| Error::corrupt(parent, e.to_string()))?;
            if key.item_type != item::EXTENT_DATA {
                continue;
            }
            let data = leaf
                .item_data(slot)
                .map_err(|e| Error::corrupt(parent, e.to_string()))?;
            if let Ok(FileExtent {
                body:
                    FileExtentBody::Extent {
                        disk_bytenr,
                        offset,
                        ..
                    },
                ..
            }) = FileExtent::parse(data)
            {
                if disk_bytenr == bytenr {
                    places.insert((key.objectid, key.offset.wrapping_sub(offset)));
                }
            }
        }
        Ok(())
    }
}
