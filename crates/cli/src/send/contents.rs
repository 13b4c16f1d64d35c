//! An incremental stream's inode contents: everything of a new inode, and what changed of
//! one the receiver has (xattrs, the data ranges that are not the same extent bytes,
//! owner, mode). UTIMES are the caller's, sent last.

use super::{show, Sender, Xattrs, CAPABILITY, DEFAULT_ACL};
use oleo::format::send_stream::Command;
use oleo::{Attr, ExtentInfo, FileKind, InodeId};
use std::collections::BTreeMap;
use std::io::Write;

/// fallocate's FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE.
const PUNCH_HOLE: u32 = 0x01 | 0x02;

impl<W: Write> Sender<'_, W> {
    /// A new inode's xattrs, data, owner and mode; security.capability again after the
    /// writes and chown that clear it.
    pub(super) fn new_contents(&mut self, a: &Attr, path: &[u8]) -> Result<(), String> {
        self.xattrs(a.id, path, Xattrs::First)?;
        if a.kind == FileKind::File {
            self.data(a.id, path, a.size)?;
        }
        self.chown(path, a)?;
        self.chmod(path, a)?;
        self.xattrs(a.id, path, Xattrs::Last)
    }

    /// What changed of an inode the receiver has, at `path`; true if anything did (its
    /// times are then sent). `no_default_acl`: the receiver's copy has lost its default
    /// ACL (see incremental.rs).
    pub(super) fn changed_contents(
        &mut self,
        old: &Attr,
        new: &Attr,
        path: &[u8],
        no_default_acl: bool,
    ) -> Result<bool, String> {
        let mut changed = (old.mode, old.uid, old.gid, old.size, old.nlink, old.rdev)
            != (new.mode, new.uid, new.gid, new.size, new.nlink, new.rdev)
            || (old.atime, old.mtime, old.ctime, old.crtime)
                != (new.atime, new.mtime, new.ctime, new.crtime);
        let mut ox = self.xattr_map(old.id, path)?;
        if no_default_acl {
            ox.remove(DEFAULT_ACL);
        }
        let nx = self.xattr_map(new.id, path)?;
        // Removals first: security.capability is still there before writes and chown.
        for name in ox.keys().filter(|n| !nx.contains_key(*n)) {
            self.cmd(&Command::RemoveXattr {
                path: path.to_vec(),
                name: name.clone(),
            })?;
            changed = true;
        }
        for (name, data) in &nx {
            if name != CAPABILITY && ox.get(name) != Some(data) {
                self.cmd(&Command::SetXattr {
                    path: path.to_vec(),
                    name: name.clone(),
                    data: data.clone(),
                })?;
                changed = true;
            }
        }
        let wrote = new.kind == FileKind::File && self.changed_data(old, new, path)?;
        let chown = (old.uid, old.gid) != (new.uid, new.gid);
        if chown {
            self.chown(path, new)?;
        }
        // chown clears set-id bits; writes may.
        if old.mode != new.mode || chown || (wrote && new.mode & 0o6000 != 0) {
            self.chmod(path, new)?;
        }
        if let Some(cap) = nx.get(CAPABILITY) {
            if wrote || chown || ox.get(CAPABILITY) != Some(cap) {
                self.cmd(&Command::SetXattr {
                    path: path.to_vec(),
                    name: CAPABILITY.to_vec(),
                    data: cap.clone(),
                })?;
            }
        }
        Ok(changed || wrote)
    }

    fn xattr_map(&self, id: InodeId, path: &[u8]) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, String> {
        let err = |e: oleo::Error| format!("{}: xattrs: {e}", show(path));
        let mut out = BTreeMap::new();
        for name in self.fs.listxattr(id).map_err(err)? {
            match self.fs.getxattr(id, &name) {
                Ok(d) => {
                    out.insert(name, d);
                }
                Err(oleo::Error::NoXattr) => {}
                Err(e) => return Err(err(e)),
            }
        }
        Ok(out)
    }

    /// The file's data where it is not the same extent bytes as the receiver's copy: a
    /// TRUNCATE to the new size first, then WRITEs (or FALLOCATE) of the changed ranges
    /// and holes punched (zeros in protocol 1) where data was. True if anything was sent.
    fn changed_data(&mut self, old: &Attr, new: &Attr, path: &[u8]) -> Result<bool, String> {
        let err = |e: oleo::Error| format!("{}: {e}", show(path));
        let (os, ns) = (old.size, new.size);
        let ox = self.fs.file_extents(old.id).map_err(err)?;
        let nx = self.fs.file_extents(new.id).map_err(err)?;
        // Ranges where neither version changes extent: each is the same throughout.
        let mut cuts = vec![0, ns, os.min(ns)];
        for x in &nx {
            cuts.push(x.file_offset.min(ns));
            cuts.push(x.file_offset.saturating_add(x.len).min(ns));
        }
        for x in &ox {
            cuts.push(x.file_offset.min(os).min(ns));
            cuts.push(x.file_offset.saturating_add(x.len).min(os).min(ns));
        }
        cuts.sort_unstable();
        cuts.dedup();
        let mut sent = false;
        if os != ns {
            self.cmd(&Command::Truncate {
                path: path.to_vec(),
                size: ns,
            })?;
            sent = true;
        }
        let mut run: Option<(u64, u64)> = None;
        for w in cuts.windows(2) {
            let (a, b) = (w[0], w[1]);
            let n = covering(&nx, a);
            // Past the old size the receiver's copy reads zeros (the TRUNCATE made them).
            let o = if a < os { covering(&ox, a) } else { None };
            if self.same(n, o, old.id, new.id, a, b)? {
                continue;
            }
            sent = true;
            match n {
                // A hole where the receiver has data.
                None => self.zero(path, a, b)?,
                Some(x) => {
                    // FALLOCATE keeps the bytes already there: punch them out first.
                    if x.prealloc && o.is_some() && self.w.version() >= 2 {
                        self.zero(path, a, b)?;
                    }
                    run = match run {
                        Some((s, e)) if e == a => Some((s, b)),
                        Some((s, e)) => {
                            self.data_range(new.id, path, s, e, ns)?;
                            Some((a, b))
                        }
                        None => Some((a, b)),
                    };
                }
            }
        }
        if let Some((s, e)) = run {
            self.data_range(new.id, path, s, e, ns)?;
        }
        Ok(sent)
    }

    /// Whether `[a, b)` reads the same in both versions, given the extents covering it.
    fn same(
        &self,
        n: Option<&ExtentInfo>,
        o: Option<&ExtentInfo>,
        old: InodeId,
        new: InodeId,
        a: u64,
        b: u64,
    ) -> Result<bool, String> {
        let (x, y) = match (n, o) {
            (None, None) => return Ok(true),
            (Some(x), Some(y)) => (x, y),
            _ => return Ok(false),
        };
        if x.inline || y.inline {
            if !(x.inline && y.inline) {
                return Ok(false);
            }
            // Inline data has no address: compare the bytes (at most a page; a damaged
            // item claiming more is just sent).
            if b - a > 64 << 10 {
                return Ok(false);
            }
            let len = (b - a) as u32;
            let r = |id| self.fs.read(id, a, len).map_err(|e| e.to_string());
            return Ok(r(old)? == r(new)?);
        }
        // The same disk extent mapped at the same place in the file.
        let base = |e: &ExtentInfo| i128::from(e.file_offset) - i128::from(e.extent_offset);
        Ok(x.disk_bytenr == y.disk_bytenr
            && x.disk_num_bytes == y.disk_num_bytes
            && x.ram_bytes == y.ram_bytes
            && x.compression == y.compression
            && x.prealloc == y.prealloc
            && base(x) == base(y))
    }

    /// Makes `[a, b)` read zeros: a punched hole in protocol 2, WRITEs of zeros in 1.
    fn zero(&mut self, path: &[u8], a: u64, b: u64) -> Result<(), String> {
        self.zeros(path, a, b, PUNCH_HOLE)
    }
}

/// The extent holding byte `at`, if any (holes and hole items are None).
fn covering(xs: &[ExtentInfo], at: u64) -> Option<&ExtentInfo> {
    let i = xs.partition_point(|x| x.file_offset.saturating_add(x.len) <= at);
    xs.get(i)
        .filter(|x| x.file_offset <= at && (x.inline || x.disk_bytenr != 0))
}
