//! The directory walk: each subvolume's tree read tolerantly, its names followed from the
//! root directory, what they lead to written under the destination.

use super::data::{self, Csums};
use super::open::Image;
use super::walk::{self, Items, Start};
use super::{Report, RestoreOptions, SkippedBlock};
use crate::error::{Error, Result};
use oleo_format::items::{DirEntryIter, FileExtent, FileExtentBody, InodeItem, InodeRef, RootItem};
use oleo_format::key::{item, objectid};
use oleo_format::Key;
use std::collections::{HashMap, HashSet};
use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Deeper than this is a loop or damage (PATH_MAX allows about 2048 levels).
const MAX_DEPTH: usize = 1024;

struct Walk<'a> {
    img: &'a Image,
    csums: Csums,
    opts: RestoreOptions,
    report: &'a mut Report,
    subvols: HashSet<u64>,
    /// DEST: nothing is written outside it.
    dest: PathBuf,
}

/// One subvolume's items and what of it is done.
struct Tree {
    items: Items,
    reached: HashSet<u64>,
    /// Files written, by inode: later names of one become hard links.
    written: HashMap<u64, PathBuf>,
    /// Names by parent directory, from the inodes' back references (INODE_REF): where a
    /// directory's entries are lost, its children still name themselves.
    backrefs: HashMap<u64, Vec<(Vec<u8>, u64)>>,
}

/// Every INODE_REF name, by parent directory.
fn backrefs(items: &Items) -> HashMap<u64, Vec<(Vec<u8>, u64)>> {
    let mut out: HashMap<u64, Vec<(Vec<u8>, u64)>> = HashMap::new();
    for (k, body) in items {
        if k.item_type != item::INODE_REF || k.objectid == k.offset {
            continue;
        }
        for r in InodeRef::parse_all(body).unwrap_or_default() {
            out.entry(k.offset).or_default().push((r.name, k.objectid));
        }
    }
    out
}

pub(crate) fn run(
    img: &Image,
    dest: &Path,
    opts: RestoreOptions,
    report: &mut Report,
) -> Result<()> {
    if !opts.dry_run {
        std::fs::create_dir_all(dest)
            .map_err(|e| Error::InvalidArgument(format!("{}: {e}", dest.display())))?;
    }
    let keep = |k: &Key| k.item_type == item::EXTENT_CSUM;
    let csum_items = load_tree(img, objectid::CSUM_TREE, &keep, report).unwrap_or_default();
    let csums = Csums::new(csum_items, img.sb.csum_type(), img.sb.sectorsize as u64);
    let id = opts.root.unwrap_or(objectid::FS_TREE);
    let mut w = Walk {
        img,
        csums,
        opts,
        report,
        subvols: HashSet::new(),
        dest: dest.to_path_buf(),
    };
    if !w.subvol(id, dest, Path::new("/"), 0) {
        return Err(Error::Unusable(format!("tree {id} cannot be read")));
    }
    Ok(())
}

/// Where tree `id` starts: its ROOT_ITEM, else (tree 5, csums) the backup roots.
fn starts(img: &Image, id: u64) -> Vec<Start> {
    let mut out = Vec::new();
    let min = Key::new(id, item::ROOT_ITEM, 0);
    let max = Key::new(id, item::ROOT_ITEM, u64::MAX);
    if let Some((_, body)) = img.roots.range(min..=max).next_back() {
        if let Ok(r) = RootItem::parse(body) {
            out.push(Start {
                owner: id,
                bytenr: r.bytenr,
                level: Some(r.level),
                generation: Some(r.generation),
            });
        }
    }
    for b in &img.backups {
        let (bytenr, level, generation) = match id {
            objectid::FS_TREE => (b.fs_root, b.fs_root_level, b.fs_root_gen),
            objectid::CSUM_TREE => (b.csum_root, b.csum_root_level, b.csum_root_gen),
            _ => continue,
        };
        if bytenr != 0 && !out.iter().any(|s| s.bytenr == bytenr) {
            out.push(Start {
                owner: id,
                bytenr,
                level: Some(level),
                generation: Some(generation),
            });
        }
    }
    // A root tree from an older commit points to an older tree: the newest root wins.
    out.sort_by_key(|s| std::cmp::Reverse(s.generation));
    // Then what a scan found (`--older`), newest first, after every root the image names.
    for c in img.older.iter().filter(|c| c.owner == id) {
        if !out.iter().any(|s| s.bytenr == c.bytenr) {
            out.push(Start {
                owner: id,
                bytenr: c.bytenr,
                level: Some(c.level),
                generation: Some(c.generation),
            });
        }
    }
    out
}

/// The items of tree `id` from the first start whose root block reads.
pub(crate) fn load_tree(
    img: &Image,
    id: u64,
    keep: &dyn Fn(&Key) -> bool,
    report: &mut Report,
) -> Option<Items> {
    let mut starts = starts(img, id);
    if id == objectid::CSUM_TREE {
        // Older checksums would turn data rewritten since into false holes.
        let newest = starts.first().and_then(|s| s.generation);
        starts.retain(|s| s.generation == newest);
    }
    let mut first_err = None;
    for start in starts {
        match walk::read_block(&img.io, start.bytenr, start.level, start.generation, None) {
            Ok(_) => return Some(walk::collect(&img.io, start, keep, report)),
            Err(e) => {
                eprintln!("tree {id}: root block {} unreadable ({e})", start.bytenr);
                first_err.get_or_insert((start.bytenr, e.to_string()));
            }
        }
    }
    if let Some((bytenr, why)) = first_err {
        report.skipped_blocks.push(SkippedBlock {
            bytenr,
            owner: id,
            why,
        });
    }
    None
}

impl Walk<'_> {
    fn matches(&self, rel: &Path) -> bool {
        self.opts
            .filter
            .as_ref()
            .is_none_or(|f| f(&rel.to_string_lossy()))
    }

    fn announce(&mut self, rel: &Path) {
        if let Some(f) = self.opts.on_path.as_mut() {
            f(rel);
        }
    }

    fn error(&mut self, msg: String) {
        eprintln!("{msg}");
        self.report.errors.push(msg);
    }

    /// Restores subvolume `id` at `out`; false when its tree cannot be read at all.
    fn subvol(&mut self, id: u64, out: &Path, rel: &Path, depth: usize) -> bool {
        if !self.subvols.insert(id) {
            return true;
        }
        let Some(items) = load_tree(self.img, id, &|_| true, self.report) else {
            return false;
        };
        let mut tree = Tree {
            backrefs: backrefs(&items),
            items,
            reached: HashSet::new(),
            written: HashMap::new(),
        };
        let top = objectid::FIRST_FREE;
        tree.reached.insert(top);
        self.dir(&mut tree, top, out, rel, depth);
        if rel != Path::new("/") && out.exists() {
            self.attrs(&tree, top, out, false);
        }
        self.lost_found(&mut tree, out, rel, depth);
        true
    }

    /// Inodes no name led to: restored as lost+found/<ino>, unless a parent that is itself
    /// unreached will bring them along.
    fn lost_found(&mut self, tree: &mut Tree, out: &Path, rel: &Path, depth: usize) {
        let inodes: Vec<u64> = tree
            .items
            .keys()
            .filter(|k| k.item_type == item::INODE_ITEM && k.objectid > objectid::FIRST_FREE)
            .map(|k| k.objectid)
            .collect();
        for ino in inodes {
            if tree.reached.contains(&ino) {
                continue;
            }
            let parents = tree
                .items
                .range(Key::new(ino, item::INODE_REF, 0)..=Key::new(ino, item::INODE_REF, u64::MAX))
                .map(|(k, _)| k.offset);
            let mut waits = false;
            for p in parents {
                waits |= p != ino
                    && !tree.reached.contains(&p)
                    && tree.items.contains_key(&Key::new(p, item::INODE_ITEM, 0));
            }
            if waits {
                continue;
            }
            let name = ino.to_string();
            let lf_out = out.join("lost+found");
            let lf_rel = rel.join("lost+found");
            self.inode(
                tree,
                ino,
                None,
                &lf_out.join(&name),
                &lf_rel.join(&name),
                depth + 1,
            );
        }
    }

    /// A directory's entries: DIR_INDEX first, then DIR_ITEM names the index lost, then
    /// the names its children's back references give that both lost.
    fn entries(tree: &Tree, dir: u64) -> Vec<(Vec<u8>, Key, u8)> {
        let mut out = Vec::new();
        let mut names = HashSet::new();
        for t in [item::DIR_INDEX, item::DIR_ITEM] {
            let range = Key::new(dir, t, 0)..=Key::new(dir, t, u64::MAX);
            for (_, body) in tree.items.range(range) {
                for e in DirEntryIter::new(body).flatten() {
                    if names.insert(e.name.to_vec()) {
                        out.push((e.name.to_vec(), e.location, e.file_type));
                    }
                }
            }
        }
        for (name, child) in tree.backrefs.get(&dir).into_iter().flatten() {
            if names.insert(name.clone()) {
                out.push((name.clone(), Key::new(*child, item::INODE_ITEM, 0), 0));
            }
        }
        out
    }

    fn dir(&mut self, tree: &mut Tree, dir: u64, out: &Path, rel: &Path, depth: usize) {
        if depth > MAX_DEPTH {
            self.error(format!(
                "{}: deeper than {MAX_DEPTH} levels; not followed",
                rel.display()
            ));
            return;
        }
        for (name, loc, ftype) in Self::entries(tree, dir) {
            if name.is_empty() || name.contains(&b'/') || name == b"." || name == b".." {
                self.error(format!(
                    "{}: entry with invalid name {:?} left out",
                    rel.display(),
                    String::from_utf8_lossy(&name)
                ));
                continue;
            }
            let os = OsStr::from_bytes(&name);
            let (c_out, c_rel) = (out.join(os), rel.join(os));
            if loc.item_type == item::ROOT_ITEM {
                if self.opts.root.is_none() && !self.subvol(loc.objectid, &c_out, &c_rel, depth + 1)
                {
                    self.report.names_without_inode.push(c_rel);
                }
                continue;
            }
            self.inode(tree, loc.objectid, Some(ftype), &c_out, &c_rel, depth + 1);
        }
    }

    fn inode(
        &mut self,
        tree: &mut Tree,
        ino: u64,
        ftype: Option<u8>,
        out: &Path,
        rel: &Path,
        depth: usize,
    ) {
        let inode = tree
            .items
            .get(&Key::new(ino, item::INODE_ITEM, 0))
            .and_then(|b| InodeItem::parse(b).ok());
        let Some(kind) = Self::kind(tree, ino, inode.as_ref(), ftype) else {
            if self.matches(rel) {
                self.error(format!("{}: file of unknown type left out", rel.display()));
            }
            tree.reached.insert(ino);
            return;
        };
        let first = tree.reached.insert(ino);
        if kind == libc::S_IFDIR {
            if !first {
                self.error(format!(
                    "{}: directory seen twice (a loop); not followed",
                    rel.display()
                ));
                return;
            }
            if inode.is_none() {
                self.report.names_without_inode.push(rel.to_path_buf());
            }
            if self.matches(rel) {
                self.announce(rel);
                self.report.dirs += 1;
                if !self.opts.dry_run {
                    if let Err(e) = self.make_dir(out) {
                        self.error(format!("{}: {e}", out.display()));
                        return;
                    }
                }
            }
            self.dir(tree, ino, out, rel, depth);
            if !self.opts.dry_run && out.exists() {
                self.attrs(tree, ino, out, false);
            }
            return;
        }
        if !self.matches(rel) {
            return;
        }
        self.announce(rel);
        if self.opts.dry_run {
            if matches!(
                kind,
                libc::S_IFIFO | libc::S_IFCHR | libc::S_IFBLK | libc::S_IFSOCK
            ) {
                self.report.specials += 1;
                return;
            }
            self.count(kind, inode.is_none(), rel, Vec::new());
            return;
        }
        if let Some(parent) = out.parent() {
            if let Err(e) = self.make_dir(parent) {
                self.error(format!("{}: {e}", out.display()));
                return;
            }
        }
        let _ = std::fs::remove_file(out);
        if kind == libc::S_IFREG {
            if let Some(first_path) = tree.written.get(&ino) {
                if std::fs::hard_link(first_path, out).is_ok() {
                    self.report.files_whole += 1;
                    return;
                }
            }
        }
        if let Some(special) = inode
            .as_ref()
            .filter(|_| kind != libc::S_IFREG && kind != libc::S_IFLNK)
        {
            self.special(tree, ino, kind, special, out, rel);
            return;
        }
        let extents: Vec<(u64, &[u8])> = tree
            .items
            .range(Key::new(ino, item::EXTENT_DATA, 0)..=Key::new(ino, item::EXTENT_DATA, u64::MAX))
            .map(|(k, v)| (k.offset, v.as_slice()))
            .collect();
        if kind == libc::S_IFLNK {
            let Some(target) = extents.first().and_then(|e| symlink_target(e.1)) else {
                self.report.names_without_inode.push(rel.to_path_buf());
                return;
            };
            match std::os::unix::fs::symlink(OsStr::from_bytes(&target), out) {
                Ok(()) => {
                    self.attrs(tree, ino, out, true);
                    self.count(kind, inode.is_none(), rel, Vec::new());
                }
                Err(e) => self.error(format!("{}: {e}", out.display())),
            }
            return;
        }
        let size = match &inode {
            Some(i) => i.size,
            None => extents
                .iter()
                .filter_map(|(o, b)| {
                    FileExtent::parse(b)
                        .ok()
                        .map(|f| o.saturating_add(f.file_len()))
                })
                .max()
                .unwrap_or(0),
        };
        // Never through a link a hostile image (two entries of one name) put there.
        let created = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(out);
        if inode.is_none() && extents.is_empty() {
            // The name alone survives: kept as an empty file, and listed as such.
            if let Err(e) = created {
                self.error(format!("{}: {e}", out.display()));
            }
            self.report.names_without_inode.push(rel.to_path_buf());
            return;
        }
        self.csums.take_unverified();
        let result = created.and_then(|f| {
            let holes = data::write_file(&self.img.io, &self.csums, &extents, size, Some(&f))?;
            f.set_len(size)?;
            Ok(holes)
        });
        let unverified = self.csums.take_unverified();
        if unverified > 0 && result.is_ok() {
            eprintln!(
                "{}: {unverified} bytes copied unverified (their checksums cannot be read)",
                rel.display()
            );
            self.report
                .files_unverified
                .push((rel.to_path_buf(), unverified));
        }
        match result {
            Ok(holes) => {
                tree.written.insert(ino, out.to_path_buf());
                self.attrs(tree, ino, out, false);
                self.count(kind, inode.is_none(), rel, holes);
            }
            Err(e) => self.error(format!("{}: {e}", out.display())),
        }
    }

    /// What kind of file `ino` is. The directory entry's type wins over an inode mode that
    /// says otherwise (as `btrfs check` repairs a bad mode from it); with neither, the items
    /// tell: entries make a directory, extents a regular file.
    fn kind(tree: &Tree, ino: u64, inode: Option<&InodeItem>, ftype: Option<u8>) -> Option<u32> {
        let from_entry = ftype.and_then(|t| match t {
            1 => Some(libc::S_IFREG),
            2 => Some(libc::S_IFDIR),
            3 => Some(libc::S_IFCHR),
            4 => Some(libc::S_IFBLK),
            5 => Some(libc::S_IFIFO),
            6 => Some(libc::S_IFSOCK),
            7 => Some(libc::S_IFLNK),
            _ => None,
        });
        let from_inode = inode.map(|i| i.mode & libc::S_IFMT).filter(|f| {
            matches!(
                *f,
                libc::S_IFREG
                    | libc::S_IFDIR
                    | libc::S_IFLNK
                    | libc::S_IFIFO
                    | libc::S_IFCHR
                    | libc::S_IFBLK
                    | libc::S_IFSOCK
            )
        });
        let has = |t: u8| {
            tree.items
                .range(Key::new(ino, t, 0)..=Key::new(ino, t, u64::MAX))
                .next()
                .is_some()
        };
        from_entry.or(from_inode).or_else(|| {
            if has(item::DIR_INDEX) || has(item::DIR_ITEM) {
                Some(libc::S_IFDIR)
            } else if has(item::EXTENT_DATA) || inode.is_some() {
                Some(libc::S_IFREG)
            } else {
                None
            }
        })
    }

    /// A FIFO, socket or device node, made with mknod; a device node needs root, and
    /// without it the name is reported and left out.
    fn special(
        &mut self,
        tree: &Tree,
        ino: u64,
        fmt: u32,
        inode: &InodeItem,
        out: &Path,
        rel: &Path,
    ) {
        let rdev = if matches!(fmt, libc::S_IFCHR | libc::S_IFBLK) {
            crate::inode::inode::disk_rdev_to_user(inode.rdev)
        } else {
            0
        };
        let Ok(c) = CString::new(out.as_os_str().as_bytes()) else {
            return;
        };
        // SAFETY: `c` is a NUL-terminated path.
        let made =
            unsafe { libc::mknod(c.as_ptr(), fmt | (inode.mode & 0o7777), rdev as libc::dev_t) };
        if made != 0 {
            let e = std::io::Error::last_os_error();
            self.error(format!("{}: special file not made: {e}", rel.display()));
            return;
        }
        self.attrs(tree, ino, out, false);
        self.report.specials += 1;
    }

    /// Makes directory `out` and its missing parents inside DEST, each with mkdir: a name
    /// already there that is not a directory (a symlink an earlier entry of the same name
    /// made, in a hostile image) is refused, never followed out of DEST.
    fn make_dir(&self, out: &Path) -> std::io::Result<()> {
        let rel = out
            .strip_prefix(&self.dest)
            .map_err(|_| std::io::Error::other("outside the destination"))?;
        let mut p = self.dest.clone();
        for c in rel.components() {
            p.push(c);
            match std::fs::symlink_metadata(&p) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        format!("{} is there and is no directory", p.display()),
                    ))
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir(&p)?,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn count(&mut self, kind: u32, no_inode: bool, rel: &Path, holes: Vec<(u64, u64)>) {
        if no_inode {
            self.report.names_without_inode.push(rel.to_path_buf());
        }
        if kind == libc::S_IFLNK {
            self.report.symlinks += 1;
        } else if holes.is_empty() {
            self.report.files_whole += 1;
        } else {
            self.report
                .files_with_holes
                .push((rel.to_path_buf(), holes));
        }
    }

    /// Owner, mode, times and xattrs, where the inode item survives. Failures for want of
    /// privilege (owner, trusted.* xattrs) are expected without root and passed over.
    fn attrs(&mut self, tree: &Tree, ino: u64, out: &Path, symlink: bool) {
        let Some(inode) = tree
            .items
            .get(&Key::new(ino, item::INODE_ITEM, 0))
            .and_then(|b| InodeItem::parse(b).ok())
        else {
            return;
        };
        let Ok(c) = CString::new(out.as_os_str().as_bytes()) else {
            return;
        };
        let range = Key::new(ino, item::XATTR_ITEM, 0)..=Key::new(ino, item::XATTR_ITEM, u64::MAX);
        for (_, body) in tree.items.range(range) {
            for x in DirEntryIter::new(body).flatten() {
                let Ok(name) = CString::new(x.name) else {
                    continue;
                };
                // SAFETY: both strings are NUL-terminated and the value slice is live.
                unsafe {
                    libc::lsetxattr(
                        c.as_ptr(),
                        name.as_ptr(),
                        x.data.as_ptr().cast(),
                        x.data.len(),
                        0,
                    );
                }
            }
        }
        // SAFETY: `c` is a NUL-terminated path; the times array has two entries.
        unsafe {
            libc::lchown(c.as_ptr(), inode.uid, inode.gid);
            if !symlink {
                libc::chmod(c.as_ptr(), inode.mode & 0o7777);
            }
            let t = |s: &oleo_format::items::Timespec| libc::timespec {
                tv_sec: s.sec as libc::time_t,
                tv_nsec: s.nsec.min(999_999_999) as libc::c_long,
            };
            let times = [t(&inode.atime), t(&inode.mtime)];
            libc::utimensat(
                libc::AT_FDCWD,
                c.as_ptr(),
                times.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            );
        }
    }
}

fn symlink_target(body: &[u8]) -> Option<Vec<u8>> {
    let fe = FileExtent::parse(body).ok()?;
    let FileExtentBody::Inline { data } = fe.body else {
        return None;
    };
    if fe.compression == oleo_format::items::Compression::None {
        return Some(data.to_vec());
    }
    oleo_format::compression::decompress(fe.compression, data, 4096, 4096).ok()
}
