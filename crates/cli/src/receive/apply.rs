//! `oleo receive --image IMAGE DIR`: the kernel's receive (btrfs-progs' cmds/receive.c) on
//! an unmounted image. SUBVOL makes a subvolume in DIR, SNAPSHOT a writable snapshot of the
//! parent the stream names; every later command works inside it; END records where it came
//! from (received_uuid, stransid) and makes it read-only. A failure leaves the subvolume
//! writable without received_uuid, as btrfs does, with what was done committed.

use super::data;
use oleo::format::bytes::uuid_string;
use oleo::{
    FallocMode, FileKind, Filesystem, InodeId, NewInode, RenameFlags, SetAttr, Timespec, XattrSet,
};
use oleo_format::key::objectid;
use oleo_format::send_stream::{
    Command, StreamError, StreamErrorKind, StreamReader, Timespec as StreamTime,
};
use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::path::Path;

/// What a receive tells as it goes: lines to print, subvolumes made.
pub use oleo_fuse::Note;

const S_IFMT: u32 = 0o170000;

pub struct Options {
    /// `-e`: stop after the first END.
    pub honor_end: bool,
    pub quiet: bool,
}

pub fn run(
    image: &Path,
    dir: &str,
    input: &mut dyn Read,
    name: &str,
    opts: &Options,
    note: &mut dyn FnMut(Note),
) -> Result<(), String> {
    let fs = crate::subvolume::open(&[image.to_path_buf()], false)?;
    let dest = crate::subvolume::resolve(&fs, dir)?;
    let kind = fs.getattr(dest).map_err(|e| format!("{dir}: {e}"))?.kind;
    if kind != FileKind::Dir {
        return Err(format!("{dir}: not a directory"));
    }
    let received = receive_into(&fs, dest, input, name, opts, note);
    // What was done is committed either way: a half-received subvolume stays, writable and
    // without received_uuid, as btrfs leaves it.
    let closed = fs
        .close()
        .map_err(|e| format!("{}: final commit: {e}", image.display()));
    match (received, closed) {
        (Err(a), Err(b)) => Err(format!("{a}\n{b}")),
        (r, c) => r.and(c),
    }
}

/// Receives every stream of `input` (the first only with `honor_end`) into directory
/// `dest` of `fs`, on an image or in a mount's server. `name` starts error messages
/// about the input; `note` gets the lines to print and each subvolume made.
pub fn receive_into(
    fs: &Filesystem,
    dest: InodeId,
    input: &mut dyn Read,
    name: &str,
    opts: &Options,
    note: &mut dyn FnMut(Note),
) -> Result<(), String> {
    let kind = fs
        .getattr(dest)
        .map_err(|e| format!("the destination: {e}"))?
        .kind;
    if kind != FileKind::Dir {
        return Err("the destination is not a directory".into());
    }
    let mut r = Receiver {
        fs,
        dest,
        cur: None,
        quiet: opts.quiet,
        found: HashMap::new(),
        note,
        // SAFETY: getuid and getgid cannot fail.
        owner: unsafe { (libc::getuid(), libc::getgid()) },
    };
    r.receive_all(input, name, opts.honor_end)
}

/// The subvolume being received.
struct Current {
    id: u64,
    root: InodeId,
    /// The stream's uuid and ctransid: its received_uuid and stransid at END.
    uuid: [u8; 16],
    ctransid: u64,
}

struct Receiver<'a> {
    fs: &'a Filesystem,
    /// Lines to print and subvolumes made.
    note: &'a mut dyn FnMut(Note),
    dest: InodeId,
    cur: Option<Current>,
    quiet: bool,
    /// Subvolumes found by (uuid, transid) for the current one: a stream names its clone
    /// source at every CLONE.
    found: HashMap<([u8; 16], u64), u64>,
    /// Who new inodes belong to until the stream's CHOWN: this process's uid and gid.
    owner: (u32, u32),
}

/// Where an error happened, for its message.
struct At<'a> {
    name: &'a str,
    stream: usize,
    base: u64,
}

impl At<'_> {
    fn prefix(&self) -> String {
        if self.stream == 0 {
            self.name.to_string()
        } else {
            format!(
                "{}stream {} (from byte {} of the input), ",
                self.name,
                self.stream + 1,
                self.base
            )
        }
    }

    fn stream_err(&self, e: StreamError) -> String {
        format!("{}{e}", self.prefix())
    }
}

impl Receiver<'_> {
    /// Every stream of the input (only the first with `honor_end`), as btrfs-progs'
    /// do_receive: an input that ends where a stream would start ends the receive.
    fn receive_all(
        &mut self,
        input: &mut dyn Read,
        name: &str,
        honor_end: bool,
    ) -> Result<(), String> {
        let mut input = BufReader::with_capacity(256 << 10, input);
        let mut at = At {
            name,
            stream: 0,
            base: 0,
        };
        loop {
            let mut s = match StreamReader::new(&mut input) {
                Ok(s) => s,
                Err(e) if matches!(e.kind, StreamErrorKind::Empty) && at.stream > 0 => break,
                Err(e) if matches!(e.kind, StreamErrorKind::Empty) => {
                    return Err(format!("{name}empty stream is not considered valid"))
                }
                Err(e) => return Err(at.stream_err(e)),
            };
            loop {
                let offset = s.position();
                match s.next_command().map_err(|e| at.stream_err(e))? {
                    None | Some(Command::End) => break,
                    Some(c) => self.apply(&c).map_err(|e| {
                        format!(
                            "{}send stream, byte {offset}, command {} ({}): {e}",
                            at.prefix(),
                            c.number(),
                            c.name()
                        )
                    })?,
                }
            }
            self.finish()
                .map_err(|e| format!("{}at the END command: {e}", at.prefix()))?;
            at.base += s.position();
            at.stream += 1;
            if honor_end {
                break;
            }
        }
        Ok(())
    }

    /// END: where the subvolume came from, then read-only (btrfs-progs' finish_subvol).
    fn finish(&mut self) -> Result<(), String> {
        // What the next subvolume finds may have changed with this one.
        self.found.clear();
        let Some(cur) = self.cur.take() else {
            return Ok(());
        };
        // btrfs-progs leaves stime zero; the kernel stamps rtransid and rtime.
        self.fs
            .set_received_subvol(cur.id, &cur.uuid, cur.ctransid, Timespec::default())
            .map_err(|e| format!("setting the received uuid of subvolume {}: {e}", cur.id))?;
        self.fs
            .set_subvolume_readonly(cur.id, true, false)
            .map_err(|e| format!("making subvolume {} read-only: {e}", cur.id))
    }

    fn apply(&mut self, c: &Command) -> Result<(), String> {
        match c {
            Command::Subvol {
                path,
                uuid,
                ctransid,
            } => self.start(path, *uuid, *ctransid, None),
            Command::Snapshot {
                path,
                uuid,
                ctransid,
                clone_uuid,
                clone_ctransid,
            } => self.start(path, *uuid, *ctransid, Some((clone_uuid, *clone_ctransid))),
            // Sent with --no-data: nothing to write (as btrfs receive).
            Command::UpdateExtent { .. } => Ok(()),
            // btrfs-progs ignores it too: BTRFS_INODE_* flags are not FS_IOC_SETFLAGS flags.
            Command::Fileattr { .. } => Ok(()),
            Command::End => Ok(()),
            c => {
                let root = match &self.cur {
                    Some(cur) => cur.root,
                    None => return Err("comes before any SUBVOL or SNAPSHOT command".into()),
                };
                self.inside(root, c)
            }
        }
    }

    /// SUBVOL, or SNAPSHOT of `parent`: the new, writable subvolume in DIR.
    fn start(
        &mut self,
        name: &[u8],
        uuid: [u8; 16],
        ctransid: u64,
        parent: Option<(&[u8; 16], u64)>,
    ) -> Result<(), String> {
        // A stream with several subvolumes finishes each before the next, as btrfs-progs.
        self.finish()?;
        let shown = name.escape_ascii().to_string();
        if name.contains(&b'/') {
            return Err(format!("'{shown}': a subvolume name cannot hold '/'"));
        }
        match self.fs.lookup(self.dest, name) {
            Ok(_) => return Err(format!("'{shown}' already exists in the destination")),
            Err(oleo::Error::NotFound) => {}
            Err(e) => return Err(format!("'{shown}': {e}")),
        }
        let id = match parent {
            None => {
                if !self.quiet {
                    (self.note)(Note::Stderr(format!("At subvol {shown}")));
                }
                let (uid, gid) = self.owner;
                self.fs
                    .create_subvolume(self.dest, name, uid, gid)
                    .map_err(|e| format!("creating subvolume '{shown}': {e}"))?
            }
            Some((puuid, ptransid)) => {
                if !self.quiet {
                    (self.note)(Note::Stdout(format!("At snapshot {shown}")));
                }
                let source = self.find(puuid, ptransid, "parent subvolume")?;
                self.fs
                    .snapshot(source, self.dest, name, false)
                    .map_err(|e| format!("snapshot of subvolume {source} as '{shown}': {e}"))?
            }
        };
        (self.note)(Note::Made {
            id,
            name: name.to_vec(),
        });
        self.cur = Some(Current {
            id,
            root: InodeId {
                subvol: id,
                ino: objectid::FIRST_FREE,
            },
            uuid,
            ctransid,
        });
        Ok(())
    }

    /// A command that works inside the subvolume being received, whose root is `root`.
    fn inside(&mut self, root: InodeId, c: &Command) -> Result<(), String> {
        let fs = self.fs;
        let (uid, gid) = self.owner;
        let made = |mode: u32| NewInode::with_mode(mode).owner(uid, gid);
        let create = |path: &[u8], new: NewInode| {
            let (dir, name) = parent(fs, root, path)?;
            done(path, fs.mknod(dir, name, &new))
        };
        match c {
            // Modes as btrfs-progs creates them; CHOWN and CHMOD follow.
            Command::Mkfile { path, .. } => create(path, made(0o100600)),
            Command::Mkdir { path, .. } => {
                let (dir, name) = parent(fs, root, path)?;
                done(path, fs.mkdir(dir, name, &made(0o040700)))
            }
            Command::Mknod {
                path, mode, rdev, ..
            } => create(path, made(*mode as u32 & S_IFMT).rdev(*rdev)),
            Command::Mkfifo { path, .. } => create(path, made(0o010600)),
            Command::Mksock { path, .. } => create(path, made(0o140600)),
            Command::Symlink { path, target, .. } => {
                let (dir, name) = parent(fs, root, path)?;
                done(path, fs.symlink(dir, name, target, uid, gid))
            }
            Command::Rename { from, to } => {
                let (fdir, fname) = parent(fs, root, from)?;
                let (tdir, tname) = parent(fs, root, to)?;
                let r = fs.rename(fdir, fname, tdir, tname, RenameFlags::default());
                r.map_err(|e| format!("'{}' to '{}': {e}", from.escape_ascii(), to.escape_ascii()))
            }
            Command::Link { path, link } => {
                let existing = resolve(fs, root, link)?;
                let (dir, name) = parent(fs, root, path)?;
                done(path, fs.link(existing, dir, name))
            }
            Command::Unlink { path } => {
                let (dir, name) = parent(fs, root, path)?;
                done(path, fs.unlink(dir, name))
            }
            Command::Rmdir { path } => {
                let (dir, name) = parent(fs, root, path)?;
                done(path, fs.rmdir(dir, name))
            }
            Command::SetXattr { path, name, data } => {
                let id = resolve(fs, root, path)?;
                done(path, fs.setxattr(id, name, data, XattrSet::Either))
            }
            Command::RemoveXattr { path, name } => {
                let id = resolve(fs, root, path)?;
                done(path, fs.removexattr(id, name))
            }
            Command::Write { path, offset, data } => {
                let id = resolve(fs, root, path)?;
                done(path, fs.write(id, *offset, data))
            }
            Command::Clone {
                path,
                offset,
                len,
                clone_uuid,
                clone_ctransid,
                clone_path,
                clone_offset,
            } => {
                let dst = resolve(fs, root, path)?;
                let src_root = self.clone_source(clone_uuid, *clone_ctransid)?;
                let src = resolve(fs, src_root, clone_path)?;
                let r = data::clone(fs, src, *clone_offset, dst, *offset, *len);
                r.map_err(|e| {
                    let from = clone_path.escape_ascii();
                    format!("'{}' from '{from}': {e}", path.escape_ascii())
                })
            }
            Command::EncodedWrite { path, .. } => {
                let id = resolve(fs, root, path)?;
                done(path, data::encoded_write(fs, id, c))
            }
            Command::Truncate { path, size } => setattr(fs, root, path, |s| s.size = Some(*size)),
            Command::Chmod { path, mode } => {
                setattr(fs, root, path, |s| s.mode = Some(*mode as u32 & 0o7777))
            }
            Command::Chown { path, uid, gid } => {
                let id32 = |v: u64| {
                    u32::try_from(v).map_err(|_| with_path(path, format!("owner {v} is too big")))
                };
                let (u, g) = (id32(*uid)?, id32(*gid)?);
                setattr(fs, root, path, |s| {
                    s.uid = Some(u);
                    s.gid = Some(g);
                })
            }
            // As utimensat: atime and mtime; ctime becomes now.
            Command::Utimes {
                path, atime, mtime, ..
            } => setattr(fs, root, path, |s| {
                s.atime = Some(time(atime));
                s.mtime = Some(time(mtime));
            }),
            Command::Fallocate {
                path,
                mode,
                offset,
                len,
            } => {
                let id = resolve(fs, root, path)?;
                let mode = falloc_mode(*mode).map_err(|e| with_path(path, e))?;
                done(path, fs.fallocate(id, *offset, *len, mode))
            }
            Command::EnableVerity { path, .. } => {
                Err(with_path(path, "fs-verity is not supported"))
            }
            other => Err(format!("unexpected {} command", other.name())),
        }
    }

    /// The root of the subvolume a CLONE reads from: the one being received when the
    /// stream names it, else one received as (or with) that uuid.
    fn clone_source(&mut self, uuid: &[u8; 16], ctransid: u64) -> Result<InodeId, String> {
        let id = match &self.cur {
            Some(cur) if cur.uuid == *uuid => cur.id,
            _ => self.find(uuid, ctransid, "clone source subvolume")?,
        };
        Ok(InodeId {
            subvol: id,
            ino: objectid::FIRST_FREE,
        })
    }

    fn find(&mut self, uuid: &[u8; 16], transid: u64, what: &str) -> Result<u64, String> {
        if let Some(&id) = self.found.get(&(*uuid, transid)) {
            return Ok(id);
        }
        let id = find_subvolume(self.fs, uuid, transid, what, &mut *self.note)?;
        self.found.insert((*uuid, transid), id);
        Ok(id)
    }
}

/// The subvolume received as `uuid`, else the one whose own uuid it is (btrfs-progs'
/// search order), preferring the one at `transid`. btrfs-progs does not compare transids,
/// so one at another transid is taken too, with a warning.
fn find_subvolume(
    fs: &Filesystem,
    uuid: &[u8; 16],
    transid: u64,
    what: &str,
    note: &mut dyn FnMut(Note),
) -> Result<u64, String> {
    let mut other = None;
    for received in [true, false] {
        let found = fs
            .subvolumes_by_uuid(uuid, received)
            .map_err(|e| format!("looking for {what} {}: {e}", uuid_string(uuid)))?;
        if let Some(&(id, _)) = found.iter().find(|(_, t)| *t == transid) {
            return Ok(id);
        }
        other = other.or(found.first().copied());
    }
    match other {
        Some((id, t)) => {
            note(Note::Stderr(format!(
                "warning: {what} {} is subvolume {id} at transid {t}, the stream names \
                 transid {transid}; using it, as btrfs receive does",
                uuid_string(uuid)
            )));
            Ok(id)
        }
        None => Err(format!(
            "cannot find {what} {} (transid {transid}): no subvolume here was received as \
             it or has it as its uuid",
            uuid_string(uuid)
        )),
    }
}

fn with_path(path: &[u8], e: impl std::fmt::Display) -> String {
    format!("'{}': {e}", path.escape_ascii())
}

/// An engine call's result, its error naming `path`.
fn done<T>(path: &[u8], r: oleo::Result<T>) -> Result<(), String> {
    r.map(drop).map_err(|e| with_path(path, e))
}

/// Follows `path` inside the subvolume of `root`, never into another subvolume (nor
/// through a symlink: lookups do not follow them).
fn resolve(fs: &Filesystem, root: InodeId, path: &[u8]) -> Result<InodeId, String> {
    let mut cur = root;
    for comp in path.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
        cur = fs.lookup(cur, comp).map_err(|e| with_path(path, e))?;
        if cur.subvol != root.subvol {
            return Err(with_path(path, "leads into another subvolume"));
        }
    }
    Ok(cur)
}

/// The directory holding `path` and its last name.
fn parent<'p>(
    fs: &Filesystem,
    root: InodeId,
    path: &'p [u8],
) -> Result<(InodeId, &'p [u8]), String> {
    let (dir, name) = match path.iter().rposition(|&b| b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&path[..0], path),
    };
    if name.is_empty() {
        return Err(with_path(path, "no name"));
    }
    Ok((resolve(fs, root, dir)?, name))
}

fn setattr(
    fs: &Filesystem,
    root: InodeId,
    path: &[u8],
    f: impl FnOnce(&mut SetAttr),
) -> Result<(), String> {
    let id = resolve(fs, root, path)?;
    let mut s = SetAttr::default();
    f(&mut s);
    done(path, fs.setattr(id, &s))
}

fn time(t: &StreamTime) -> Timespec {
    Timespec {
        sec: t.sec as i64,
        nsec: t.nsec,
    }
}

/// fallocate(2)'s mode bits as the engine takes them.
fn falloc_mode(mode: u32) -> oleo::Result<FallocMode> {
    const KEEP_SIZE: u32 = 0x01;
    const PUNCH_HOLE: u32 = 0x02;
    const ZERO_RANGE: u32 = 0x10;
    Ok(match mode {
        0 => FallocMode::Allocate { keep_size: false },
        KEEP_SIZE => FallocMode::Allocate { keep_size: true },
        m if m == PUNCH_HOLE | KEEP_SIZE => FallocMode::PunchHole,
        ZERO_RANGE => FallocMode::ZeroRange { keep_size: false },
        m if m == ZERO_RANGE | KEEP_SIZE => FallocMode::ZeroRange { keep_size: true },
        m => {
            return Err(oleo::Error::InvalidArgument(format!(
                "fallocate mode {m:#x} is not supported"
            )))
        }
    })
}
