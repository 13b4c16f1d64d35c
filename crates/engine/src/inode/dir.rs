//! Directories: name lookup through DIR_ITEM (hashed) and listing through DIR_INDEX
//! (stable order, stable resume cookies).

use crate::ctree::{for_each_in_range, lookup, lookup_le};
use crate::error::{Error, Result};
use crate::transaction::fs::{DirEntry, FileKind, FsCore, InodeId};
use oleo_format::csum::name_hash;
use oleo_format::items::{DirEntryItem, DirEntryIter, FileType};
use oleo_format::key::{item, objectid, Key};
use std::collections::HashSet;
use std::ops::ControlFlow;

/// Readdir cookies from here on resume the listing of names whose DIR_INDEX is lost
/// (`rescue=ignorebadroots`): this plus the DIR_ITEM's name hash. Real indexes stay far
/// below it (they count up from 2).
const RESCUE_COOKIES: u64 = 1 << 62;

fn kind_of(t: FileType) -> Option<FileKind> {
    Some(match t {
        FileType::RegFile => FileKind::File,
        FileType::Dir => FileKind::Dir,
        FileType::Symlink => FileKind::Symlink,
        FileType::ChrDev => FileKind::CharDev,
        FileType::BlkDev => FileKind::BlockDev,
        FileType::Fifo => FileKind::Fifo,
        FileType::Sock => FileKind::Socket,
        FileType::Xattr | FileType::Unknown => return None,
    })
}

impl FsCore {
    fn require_dir(&self, dir: InodeId) -> Result<()> {
        if self.getattr(dir)?.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        Ok(())
    }

    /// Where a directory entry leads: an inode of the same subvolume, or another subvolume.
    fn entry_target(&self, dir: InodeId, e: &DirEntryItem) -> Result<InodeId> {
        match e.location.item_type {
            item::INODE_ITEM => Ok(InodeId {
                subvol: dir.subvol,
                ino: e.location.objectid,
            }),
            item::ROOT_ITEM => self.cross_into_subvolume(dir, e.location.objectid, e.name),
            t => Err(Error::corrupt(
                0,
                format!("dir entry points at a key of type {t}"),
            )),
        }
    }

    pub(crate) fn lookup(&self, dir: InodeId, name: &[u8]) -> Result<InodeId> {
        if name == b"." {
            return Ok(dir);
        }
        if dir.ino == objectid::EMPTY_SUBVOL_DIR {
            return Err(Error::NotFound);
        }
        self.require_dir(dir)?;
        if name == b".." {
            return self.parent_of(dir);
        }
        // No such name can exist, but the answer is ENAMETOOLONG, as from kernel btrfs: the
        // VFS leaves the check to the filesystem, and over FUSE that means this lookup.
        if name.len() > 255 {
            return Err(Error::NameTooLong);
        }
        let tree = self.tree_of(dir)?;
        let Some(body) = lookup(
            self,
            &tree,
            &Key::new(dir.ino, item::DIR_ITEM, name_hash(name)),
        )?
        else {
            return Err(Error::NotFound);
        };
        for e in DirEntryIter::new(&body) {
            let e = e.map_err(|e| Error::corrupt(0, format!("dir item in {}: {e}", dir.ino)))?;
            if e.name == name {
                return self.entry_target(dir, &e);
            }
        }
        Err(Error::NotFound)
    }

    /// The parent directory; a subvolume root's parent is the directory holding its entry.
    fn parent_of(&self, dir: InodeId) -> Result<InodeId> {
        let tree = self.tree_of(dir)?;
        if dir.ino == objectid::FIRST_FREE {
            if dir == self.root() {
                return Ok(dir);
            }
            return Ok(self
                .root_backref(dir.subvol)?
                .map(|(subvol, r)| InodeId {
                    subvol,
                    ino: r.dirid,
                })
                .unwrap_or(dir));
        }
        let mut parent = None;
        for_each_in_range(
            self,
            &tree,
            Key::new(dir.ino, item::INODE_REF, 0),
            Key::new(dir.ino, item::INODE_REF, u64::MAX),
            |key, _| {
                parent = Some(key.offset);
                Ok(ControlFlow::Break(()))
            },
        )?;
        parent
            .map(|ino| InodeId {
                subvol: dir.subvol,
                ino,
            })
            .ok_or(Error::NotFound)
    }

    /// Where a listing of `dir` that starts now ends: one past its highest DIR_INDEX. A
    /// rename or create during the listing gives an entry a higher number, so stopping here
    /// lists each entry once, as the kernel's readdir does.
    pub(crate) fn readdir_end(&self, dir: InodeId) -> Result<u64> {
        // A rescue mount is read-only (nothing is renamed during a listing), and lists
        // past the indexes (`readdir_unindexed`).
        if self.io.rescue().ignore_bad_roots {
            return Ok(u64::MAX);
        }
        if let Some(&next) = self.next_index.lock().get(&dir) {
            return Ok(next);
        }
        let tree = self.tree_of(dir)?;
        let last = lookup_le(self, &tree, &Key::new(dir.ino, item::DIR_INDEX, u64::MAX))?;
        Ok(last.map_or(2, |(k, _)| k.offset.saturating_add(1).max(2)))
    }

    /// Lists entries whose DIR_INDEX is >= `from` (0 and 1 are `.` and `..`, which the
    /// caller adds). `f` returns false to stop; each entry's `next_offset` resumes after it.
    /// Entries still queued in the running transaction (`delayed_inode`) are listed in
    /// their place, deletions queued there are left out.
    pub(crate) fn readdir(
        &self,
        dir: InodeId,
        from: u64,
        f: &mut dyn FnMut(DirEntry) -> bool,
    ) -> Result<()> {
        if dir.ino == objectid::EMPTY_SUBVOL_DIR {
            return Ok(());
        }
        self.require_dir(dir)?;
        let tree = self.tree_of(dir)?;
        let rescue = self.io.rescue().ignore_bad_roots;
        if rescue && from >= RESCUE_COOKIES {
            return self.readdir_unindexed(dir, from - RESCUE_COOKIES, f);
        }
        let from = from.max(2);
        let queue = self.running.as_deref().and_then(|t| t.delayed.dir(&dir));
        let mut queued = queue
            .into_iter()
            .flat_map(|q| q.insert.range(from..))
            .peekable();
        let min = Key::new(dir.ino, item::DIR_INDEX, from);
        let max = Key::new(dir.ino, item::DIR_INDEX, u64::MAX);
        let mut more = true;
        for_each_in_range(self, &tree, min, max, |key, body| {
            while let Some((&i, b)) = queued.next_if(|(&i, _)| i < key.offset) {
                if !self.list_entries(dir, i, b, f)? {
                    more = false;
                    return Ok(ControlFlow::Break(()));
                }
            }
            if queue.is_some_and(|q| q.delete.contains(&key.offset)) {
                return Ok(ControlFlow::Continue(()));
            }
            if !self.list_entries(dir, key.offset, body, f)? {
                more = false;
                return Ok(ControlFlow::Break(()));
            }
            Ok(ControlFlow::Continue(()))
        })?;
        if more {
            for (&i, b) in queued {
                if !self.list_entries(dir, i, b, f)? {
                    more = false;
                    break;
                }
            }
        }
        if more && rescue {
            return self.readdir_unindexed(dir, 0, f);
        }
        Ok(())
    }

    /// Under `rescue=ignorebadroots`, after the DIR_INDEX listing: the names whose
    /// DIR_INDEX item is gone (its leaf unreadable) but whose DIR_ITEM survives, from name
    /// hash `from` on. Only for a directory whose readable DIR_INDEX items fall short of
    /// its size (which counts each name twice, once per item).
    fn readdir_unindexed(
        &self,
        dir: InodeId,
        from: u64,
        f: &mut dyn FnMut(DirEntry) -> bool,
    ) -> Result<()> {
        let tree = self.tree_of(dir)?;
        let mut listed: HashSet<(u64, Vec<u8>)> = HashSet::new();
        let mut name_bytes = 0u64;
        let min = Key::new(dir.ino, item::DIR_INDEX, 0);
        let max = Key::new(dir.ino, item::DIR_INDEX, u64::MAX);
        for_each_in_range(self, &tree, min, max, |_, body| {
            for e in DirEntryIter::new(body).map_while(|e| e.ok()) {
                name_bytes += e.name.len() as u64;
                listed.insert((e.location.objectid, e.name.to_vec()));
            }
            Ok(ControlFlow::Continue(()))
        })?;
        let size = self.getattr(dir)?.size;
        if name_bytes.saturating_mul(2) >= size {
            return Ok(());
        }
        self.io.skips().note("ignorebadroots", dir.ino, || {
            format!(
                "directory {} (subvolume {}): its DIR_INDEX items hold {name_bytes} of the {} name bytes its size counts; names found only in DIR_ITEMs are listed after the rest",
                dir.ino,
                dir.subvol,
                size / 2
            )
        });
        let min = Key::new(dir.ino, item::DIR_ITEM, from);
        let max = Key::new(dir.ino, item::DIR_ITEM, u64::from(u32::MAX));
        for_each_in_range(self, &tree, min, max, |key, body| {
            for e in DirEntryIter::new(body).map_while(|e| e.ok()) {
                let Some(kind) = kind_of(e.kind()) else {
                    continue;
                };
                if listed.contains(&(e.location.objectid, e.name.to_vec())) {
                    continue;
                }
                let Ok(id) = self.entry_target(dir, &e) else {
                    continue;
                };
                let entry = DirEntry {
                    name: e.name.to_vec(),
                    id,
                    kind,
                    next_offset: RESCUE_COOKIES + key.offset + 1,
                };
                if !f(entry) {
                    return Ok(ControlFlow::Break(()));
                }
            }
            Ok(ControlFlow::Continue(()))
        })
    }

    /// Hands the entries of one DIR_INDEX item (`index`, `body`) to `f`; false once `f`
    /// asks to stop.
    fn list_entries(
        &self,
        dir: InodeId,
        index: u64,
        body: &[u8],
        f: &mut dyn FnMut(DirEntry) -> bool,
    ) -> Result<bool> {
        for e in DirEntryIter::new(body) {
            let e =
                e.map_err(|e| Error::corrupt(0, format!("dir index {index} of {}: {e}", dir.ino)))?;
            let Some(kind) = kind_of(e.kind()) else {
                continue;
            };
            let id = self.entry_target(dir, &e)?;
            let entry = DirEntry {
                name: e.name.to_vec(),
                id,
                kind,
                next_offset: index.saturating_add(1),
            };
            if !f(entry) {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use crate::error::Error;
    use crate::{transaction::fs::FsCore, OpenOptions};

    #[test]
    fn overlong_names_are_too_long_not_absent() {
        let dir = std::env::temp_dir().join(format!("oleo-dir-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let img = dir.join("lookup.img");
        let opts = crate::mkfs::MkfsOptions {
            size: Some(256 << 20),
            ..Default::default()
        };
        crate::mkfs::mkfs(&img, &opts).unwrap();
        let fs = FsCore::open(&img, OpenOptions::default()).unwrap();
        let root = fs.root();
        assert!(matches!(
            fs.lookup(root, &[b'x'; 255]),
            Err(Error::NotFound)
        ));
        let too_long = fs.lookup(root, &[b'x'; 256]).unwrap_err();
        assert!(matches!(too_long, Error::NameTooLong), "{too_long:?}");
        assert_eq!(too_long.errno(), libc::ENAMETOOLONG);
        drop(fs);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
