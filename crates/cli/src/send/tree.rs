//! The namespaces an incremental send compares: each snapshot's inodes and entries as
//! read from the image, and the receiver's as the stream changes it.

use super::{child, entry_path, show, PATH_MAX};
use oleo::{Attr, FileKind, Filesystem, InodeId};
use std::collections::{HashMap, HashSet, VecDeque};

/// An inode in either snapshot: the same number and generation is the same inode (a later
/// inode may take a deleted one's number, with a later generation).
pub(super) type Key = (u64, u64);

/// One directory entry: (directory, name, inode).
pub(super) type Entry = (Key, Vec<u8>, Key);

/// One snapshot's namespace.
pub(super) struct Tree {
    /// Its root directory's key: the same in both trees (`(ino, 0)`), as the stream's
    /// SNAPSHOT command makes the one the other.
    pub root: Key,
    pub inodes: HashMap<Key, Attr>,
    /// Every entry, each directory's after the directory's own: an order the receiver can
    /// make them in.
    pub entries: Vec<Entry>,
    /// Every name in the top directory, nested subvolumes' included: orphan names avoid
    /// them all.
    pub top_names: HashSet<Vec<u8>>,
}

impl Tree {
    /// Reads the subvolume `subvol` whose root directory is `root`, breadth first.
    /// Entries of nested subvolumes are left out, as the kernel's send leaves them.
    pub fn load(fs: &Filesystem, subvol: u64, root: InodeId) -> Result<Tree, String> {
        let attr = fs.getattr(root).map_err(|e| format!("/: {e}"))?;
        let rkey = (root.ino, 0);
        let mut t = Tree {
            root: rkey,
            inodes: HashMap::from([(rkey, attr)]),
            entries: Vec::new(),
            top_names: HashSet::new(),
        };
        let mut keys: HashMap<u64, Key> = HashMap::from([(root.ino, rkey)]);
        let mut queue = VecDeque::from([(rkey, root, Vec::new())]);
        while let Some((dkey, dir, path)) = queue.pop_front() {
            let mut list = Vec::new();
            fs.readdir(dir, 0, &mut |e| {
                if e.name != b"." && e.name != b".." {
                    list.push(e);
                }
                true
            })
            .map_err(|e| format!("{}: {e}", show(&path)))?;
            for e in list {
                if dkey == rkey {
                    t.top_names.insert(e.name.clone());
                }
                let Some(p) = entry_path(subvol, &path, &e)? else {
                    continue;
                };
                let key = match keys.get(&e.id.ino) {
                    // Only non-directories have several names: a directory met again is a
                    // loop in a damaged tree.
                    Some(k) if e.kind != FileKind::Dir => *k,
                    Some(_) => {
                        return Err(format!(
                            "{}: directory inode {} has more than one name",
                            show(&p),
                            e.id.ino
                        ))
                    }
                    None => {
                        let a = fs
                            .getattr(e.id)
                            .map_err(|err| format!("{}: {err}", show(&p)))?;
                        if (a.kind == FileKind::Dir) != (e.kind == FileKind::Dir) {
                            return Err(format!(
                                "{}: its directory entry and its inode disagree on whether \
                                 it is a directory",
                                show(&p)
                            ));
                        }
                        let k = (e.id.ino, a.generation);
                        keys.insert(e.id.ino, k);
                        t.inodes.insert(k, a);
                        if e.kind == FileKind::Dir {
                            queue.push_back((k, e.id, p));
                        }
                        k
                    }
                };
                t.entries.push((dkey, e.name, key));
            }
        }
        Ok(t)
    }

    pub fn is_dir(&self, k: &Key) -> bool {
        self.inodes.get(k).is_some_and(|a| a.kind == FileKind::Dir)
    }
}

/// The receiver's namespace: where each inode is while the stream is applied, so every
/// path sent is right after the renames before it.
pub(super) struct Model {
    root: Key,
    /// Each inode's names, the first the one its path is made with.
    names: HashMap<Key, Vec<(Key, Vec<u8>)>>,
    /// Every (directory, name) in use.
    taken: HashSet<(Key, Vec<u8>)>,
}

impl Model {
    /// The receiver's namespace before the stream: the parent snapshot's.
    pub fn of(t: &Tree) -> Model {
        let mut m = Model {
            root: t.root,
            names: HashMap::new(),
            taken: HashSet::new(),
        };
        for (d, n, k) in &t.entries {
            m.names.entry(*k).or_default().push((*d, n.clone()));
            m.taken.insert((*d, n.clone()));
        }
        m
    }

    pub fn names(&self, k: &Key) -> &[(Key, Vec<u8>)] {
        self.names.get(k).map_or(&[], |v| v.as_slice())
    }

    /// Where `k` is now, from the subvolume's root ("" for the root itself).
    pub fn path(&self, k: &Key) -> Result<Vec<u8>, String> {
        let mut parts: Vec<&[u8]> = Vec::new();
        let mut len = 0;
        let mut cur = *k;
        while cur != self.root {
            let Some((d, n)) = self.names(&cur).first() else {
                return Err(format!("internal error: inode {} has no name", cur.0));
            };
            len += n.len() + 1;
            if len > PATH_MAX {
                return Err(format!(
                    "inode {}: a path longer than a receiver can make",
                    k.0
                ));
            }
            parts.push(n);
            cur = *d;
        }
        let mut p = Vec::with_capacity(len);
        for n in parts.iter().rev() {
            p = child(&p, n);
        }
        Ok(p)
    }

    pub fn add(&mut self, k: Key, dir: Key, name: &[u8]) -> Result<(), String> {
        if !self.taken.insert((dir, name.to_vec())) {
            return Err(format!(
                "internal error: name {} in directory inode {} is taken",
                show(name),
                dir.0
            ));
        }
        self.names.entry(k).or_default().push((dir, name.to_vec()));
        Ok(())
    }

    pub fn remove(&mut self, k: Key, dir: Key, name: &[u8]) {
        self.taken.remove(&(dir, name.to_vec()));
        if let Some(v) = self.names.get_mut(&k) {
            v.retain(|(d, n)| !(*d == dir && n == name));
        }
    }
}
