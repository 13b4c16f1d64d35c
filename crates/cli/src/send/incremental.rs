//! An incremental stream: the commands that turn the parent snapshot, which the receiver
//! has, into this one.
//!
//! Inodes are the same when number and generation match. Paths are computed from a model
//! of the receiver's namespace, which every command updates. The order:
//! 1. every directory whose entry is gone (deleted, moved, renamed) is renamed to an
//!    orphan name in the top directory; non-directories lose their gone names (one
//!    renamed to an orphan name when the inode lives on without any of its old names);
//! 2. new entries in the new tree's order, parents first: new inodes are made under an
//!    orphan name in the top directory (where no default ACL of theirs applies) and
//!    renamed into place, moved ones renamed from their orphan name, further names linked;
//! 3. deleted directories, now empty orphans, are removed;
//! 4. each new or changed inode's xattrs, data, owner and mode (contents.rs);
//! 5. UTIMES last, for every inode changed or whose entries changed.

use super::tree::{Entry, Key, Model, Tree};
use super::{Sender, Snap, DEFAULT_ACL};
use oleo::format::send_stream::Command;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::Write;

/// The state of the namespace steps.
struct Names<'t> {
    old: &'t Tree,
    new: &'t Tree,
    m: Model,
    /// Orphan names given out.
    used: HashSet<Vec<u8>>,
    /// Inodes now under an orphan name.
    orphans: HashSet<Key>,
    /// Inodes whose names or entries the stream changed: their times are sent again.
    touched: BTreeSet<Key>,
}

impl<W: Write> Sender<'_, W> {
    pub(super) fn incremental(&mut self, parent: &Snap, snap: &Snap) -> Result<(), String> {
        let old = Tree::load(self.fs, parent.subvol, parent.root)
            .map_err(|e| format!("parent snapshot: {e}"))?;
        let new = Tree::load(self.fs, snap.subvol, snap.root)?;
        let mut n = Names {
            old: &old,
            new: &new,
            m: Model::of(&old),
            used: HashSet::new(),
            orphans: HashSet::new(),
            touched: BTreeSet::new(),
        };
        let old_set: HashSet<&Entry> = old.entries.iter().collect();
        let new_set: HashSet<&Entry> = new.entries.iter().collect();
        let created: Vec<Key> = order(&new)
            .into_iter()
            .filter(|k| !old.inodes.contains_key(k))
            .collect();

        // 1. Make room: directories first, so the files' paths below go through their
        // orphan names.
        for e @ (d, name, k) in &old.entries {
            if old.is_dir(k) && !new_set.contains(e) {
                let to = n.orphan(*k);
                self.rename(&mut n, *k, (*d, name), (old.root, &to))?;
                n.orphans.insert(*k);
            }
        }
        let mut gone: BTreeMap<Key, Vec<(Key, &[u8])>> = BTreeMap::new();
        for e @ (d, name, k) in &old.entries {
            if !old.is_dir(k) && !new_set.contains(e) {
                gone.entry(*k).or_default().push((*d, name));
            }
        }
        for (k, names) in gone {
            let keeps_one = n.m.names(&k).len() > names.len();
            for (i, (d, name)) in names.into_iter().enumerate() {
                if i == 0 && !keeps_one && new.inodes.contains_key(&k) {
                    let to = n.orphan(k);
                    self.rename(&mut n, k, (d, name), (old.root, &to))?;
                    n.orphans.insert(k);
                } else {
                    let path = super::child(&n.m.path(&d)?, name);
                    self.cmd(&Command::Unlink { path })?;
                    n.m.remove(k, d, name);
                    n.touched.extend([d, k]);
                }
            }
        }

        // 2. The new entries, parents first. The receiver's top directory loses its
        // default ACL while inodes are made in it (contents.rs sets it again).
        let top_acl = !created.is_empty() && self.has_xattr(&old, old.root, DEFAULT_ACL)?;
        if top_acl {
            self.cmd(&Command::RemoveXattr {
                path: Vec::new(),
                name: DEFAULT_ACL.to_vec(),
            })?;
        }
        let mut made: HashSet<Key> = HashSet::new();
        for e @ (d, name, k) in &new.entries {
            if old_set.contains(e) {
                continue;
            }
            if !old.inodes.contains_key(k) && made.insert(*k) {
                let a = &new.inodes[k];
                let orphan = n.orphan(*k);
                let cmd = self.create(a.id, a, orphan.clone())?;
                self.cmd(&cmd)?;
                n.m.add(*k, old.root, &orphan)?;
                n.orphans.insert(*k);
                n.touched.extend([old.root, *k]);
            }
            if n.orphans.remove(k) {
                let from = n.m.names(k)[0].clone();
                self.rename(&mut n, *k, (from.0, &from.1), (*d, name))?;
            } else if new.is_dir(k) {
                return Err(format!(
                    "internal error: directory inode {} has a second new name",
                    k.0
                ));
            } else {
                let link = n.m.path(k)?;
                let path = super::child(&n.m.path(d)?, name);
                self.cmd(&Command::Link { path, link })?;
                n.m.add(*k, *d, name)?;
                n.touched.extend([*d, *k]);
            }
        }

        // 3. The deleted directories: each was made an orphan in the top directory, and
        // everything in them has gone or moved.
        let mut deleted: Vec<&Key> = old
            .inodes
            .keys()
            .filter(|k| old.is_dir(k) && !new.inodes.contains_key(k))
            .collect();
        deleted.sort();
        for k in deleted {
            let path = n.m.path(k)?;
            self.cmd(&Command::Rmdir { path })?;
            let (d, name) = n.m.names(k)[0].clone();
            n.m.remove(*k, d, &name);
            n.touched.insert(d);
        }

        // 4. Contents.
        let created: HashSet<Key> = created.into_iter().collect();
        let mut times = n.touched.clone();
        for k in order(&new) {
            let path = n.m.path(&k)?;
            let a = &new.inodes[&k];
            if created.contains(&k) {
                self.new_contents(a, &path)?;
                times.insert(k);
            } else {
                let skip_acl = top_acl && k == old.root;
                if self.changed_contents(&old.inodes[&k], a, &path, skip_acl)? {
                    times.insert(k);
                }
            }
        }

        // 5. Times, after everything that changes them on the receiver.
        for k in times.iter().filter(|k| new.inodes.contains_key(k)) {
            let path = n.m.path(k)?;
            self.utimes(&path, &new.inodes[k])?;
        }
        Ok(())
    }

    fn rename(
        &mut self,
        n: &mut Names,
        k: Key,
        from: (Key, &[u8]),
        to: (Key, &[u8]),
    ) -> Result<(), String> {
        let from_path = super::child(&n.m.path(&from.0)?, from.1);
        let to_path = super::child(&n.m.path(&to.0)?, to.1);
        self.cmd(&Command::Rename {
            from: from_path,
            to: to_path,
        })?;
        n.m.remove(k, from.0, from.1);
        n.m.add(k, to.0, to.1)?;
        n.touched.extend([from.0, to.0, k]);
        Ok(())
    }

    fn has_xattr(&self, t: &Tree, k: Key, name: &[u8]) -> Result<bool, String> {
        let id = t.inodes[&k].id;
        match self.fs.getxattr(id, name) {
            Ok(_) => Ok(true),
            Err(oleo::Error::NoXattr) => Ok(false),
            Err(e) => Err(format!("parent snapshot's top directory: xattrs: {e}")),
        }
    }
}

impl Names<'_> {
    /// A name for `k` in the top directory that neither tree uses there.
    fn orphan(&mut self, k: Key) -> Vec<u8> {
        let mut i = 0u64;
        loop {
            let name = format!("o{}-{}-{i}", k.0, k.1).into_bytes();
            if !self.old.top_names.contains(&name)
                && !self.new.top_names.contains(&name)
                && self.used.insert(name.clone())
            {
                return name;
            }
            i += 1;
        }
    }
}

/// Every inode of `t`, the root first, then in the order of their first entries.
fn order(t: &Tree) -> Vec<Key> {
    let mut seen = HashSet::from([t.root]);
    let mut out = vec![t.root];
    for (_, _, k) in &t.entries {
        if seen.insert(*k) {
            out.push(*k);
        }
    }
    out
}
