//! `oleo send`: `btrfs send` of a read-only snapshot of an image or device nothing has
//! mounted: a full stream, or with `-p` an incremental one that turns the parent snapshot
//! the receiver has into this one (incremental.rs). Several snapshots go one whole stream
//! after the other, or with `-e` in one stream with one END. Extents the receiver has (in
//! the parent, a clone source `-c`, or sent earlier in the stream) go as CLONEs, compressed
//! ones as they are with `--compressed-data` (data.rs).
//!
//! A full stream creates each inode at its final path, parents first (a depth-first walk of
//! the snapshot), and sends, per inode as the kernel does: its xattrs, its data (WRITEs of
//! at most the kernel's read size, holes skipped, a TRUNCATE when the file ends in a hole),
//! then CHOWN, CHMOD (not for symlinks) and UTIMES; a directory's come after its entries,
//! whose creation changed its times. Hard links after the first name are LINKs.
//! Preallocated ranges are sent as zeros in protocol 1 and as FALLOCATE in protocol 2.
//! Extents the receiver already has (shared inside the snapshot, or with a clone source
//! `-c`) are CLONEs; `--compressed-data` sends compressed extents as they are (`data`).

mod contents;
mod data;
mod full;
mod incremental;
mod tree;

use crate::subvolume::{open, shown, subvolume_at};
use oleo::format::send_stream::{Command, StreamWriter, Timespec};
use oleo::{Attr, FileKind, Filesystem, InodeId};
use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

/// The kernel's BTRFS_SEND_READ_SIZE: the most data one WRITE carries in protocol 1 (its
/// 64 KiB command buffer less room for the other attributes).
const READ_SIZE_V1: usize = 48 * 1024;
/// In protocol 2 the kernel's buffer is 16 KiB plus BTRFS_MAX_COMPRESSED (128 KiB), and a
/// WRITE carries the buffer less those 16 KiB.
const READ_SIZE_V2: usize = 128 * 1024;
/// The longest path (with its NUL) a receiver's system calls take.
const PATH_MAX: usize = 4096;
/// How much file data one library read asks for.
const BIG_READ: u64 = 4 << 20;
/// The xattr that writes and chown clear on the receiver: sent again after them, as the
/// kernel does.
const CAPABILITY: &[u8] = b"security.capability";
/// A directory's default ACL: sent after its entries, which it would otherwise pass on to
/// (the kernel makes each inode in the subvolume's root first, where only the root's
/// default ACL is inherited; oleo makes them in place).
const DEFAULT_ACL: &[u8] = b"system.posix_acl_default";

/// Which xattrs of an inode to send.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Xattrs {
    /// All but the ones sent last.
    First,
    /// Those sent after the entries, writes and chown: security.capability, and a
    /// directory's default ACL.
    Last,
}

#[derive(clap::Args)]
pub struct SendArgs {
    /// Image file or block device (not mounted) that holds the snapshot. Without it
    /// SNAPSHOT_PATH is a path on an oleo mount.
    #[arg(long, value_name = "IMAGE")]
    image: Option<PathBuf>,
    /// Write the stream to FILE instead of standard output.
    #[arg(short = 'f', value_name = "FILE")]
    file: Option<PathBuf>,
    /// Send protocol version: 1 (every receiver) or 2.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=2))]
    proto: u32,
    /// Incremental send from PARENT, a read-only snapshot the receiver has (a path inside
    /// IMAGE from its top level).
    #[arg(short = 'p', value_name = "PARENT")]
    parent: Option<String>,
    /// Read-only snapshots the receiver has: extents shared with them are sent as clones.
    #[arg(short = 'c', value_name = "CLONE_SRC")]
    clone_src: Vec<String>,
    /// Several snapshots in one stream with one END (without it, a whole stream each).
    #[arg(short = 'e')]
    one_end: bool,
    /// Send compressed extents as they are on disk (needs --proto 2).
    #[arg(long)]
    compressed_data: bool,
    /// Print nothing but errors (accepted for btrfs's -q; oleo prints nothing else).
    #[arg(short = 'q', long)]
    quiet: bool,
    /// The read-only snapshots to send: paths on an oleo mount, or inside IMAGE from its
    /// top level with --image; one stream after the other, each with -p PARENT when given.
    #[arg(value_name = "SNAPSHOT_PATH", required = true, num_args = 1..)]
    snapshots: Vec<String>,
}

pub fn run(a: &SendArgs) -> Result<(), String> {
    let _ = a.quiet;
    if a.file.is_none() && std::io::stdout().is_terminal() {
        return Err("not dumping send stream into a terminal, redirect it into a file".into());
    }
    let Some(image) = &a.image else {
        let parent = a.parent.as_ref().map(PathBuf::from);
        let clones: Vec<PathBuf> = a.clone_src.iter().map(PathBuf::from).collect();
        let [snapshot] = a.snapshots.as_slice() else {
            return Err(
                "several snapshots in one send on a mount: not implemented yet; \
                        send them one by one, or with --image"
                    .into(),
            );
        };
        let (snap, file) = (PathBuf::from(snapshot), a.file.as_deref());
        return crate::daemon::streams::send(
            &snap,
            parent.as_deref(),
            &clones,
            a.proto,
            a.compressed_data,
            file,
            a.quiet,
        );
    };
    let fs = open(std::slice::from_ref(image), true)?;
    let opts = StreamOptions {
        snapshots: a.snapshots.clone(),
        parent: a.parent.clone(),
        clone_sources: a.clone_src.clone(),
        proto: a.proto,
        compressed: a.compressed_data,
    };
    check(&fs, &opts)?;
    // The stream file is made only once the snapshot is known to be sendable; a send
    // that fails takes it away again, as nobody should receive half a stream.
    let out: Box<dyn Write> = match &a.file {
        Some(f) => Box::new(
            std::fs::File::create(f).map_err(|e| format!("cannot create {}: {e}", f.display()))?,
        ),
        None => Box::new(std::io::stdout().lock()),
    };
    let mut out = crate::common::progress::Meter::new(a.quiet).writer(out);
    let sent = if a.one_end {
        stream_ending(&fs, &opts, true, &mut out)
    } else {
        stream(&fs, &opts, &mut out)
    };
    if let (Err(_), Some(f)) = (&sent, &a.file) {
        let _ = std::fs::remove_file(f);
    }
    sent
}

/// What one `btrfs send` sends: the options that shape the stream. Paths are from the
/// filesystem's top level.
pub struct StreamOptions {
    /// The read-only snapshots: a whole stream of each, one after the other (what
    /// `btrfs send` writes without -e; `btrfs receive` takes them in turn).
    pub snapshots: Vec<String>,
    /// `-p`: the snapshot the receiver has, for an incremental stream.
    pub parent: Option<String>,
    /// `-c`: snapshots the receiver has, whose extents the stream may clone.
    pub clone_sources: Vec<String>,
    /// The protocol version, 1 or 2.
    pub proto: u32,
    /// `--compressed-data` (protocol 2): compressed extents as ENCODED_WRITEs.
    pub compressed: bool,
}

/// Refuses what cannot be sent before anything is written: snapshots and parents that are
/// missing, not subvolumes or writable, and options not implemented. (The parent is looked
/// up in `fs`, so it is always in the same filesystem.)
pub fn check(fs: &Filesystem, o: &StreamOptions) -> Result<(), String> {
    if let Some(p) = &o.parent {
        snapshot(fs, p).map_err(|e| format!("parent (-p {}): {e}", shown(p)))?;
    }
    data::check_clone_sources(fs, &o.clone_sources)?;
    for s in &o.snapshots {
        snapshot(fs, s)?;
    }
    Ok(())
}

/// A read-only snapshot as a stream names it.
struct Snap {
    /// Its tree id.
    subvol: u64,
    /// Its root directory.
    root: InodeId,
    /// Its name, uuid (the received one if it has one, as the kernel sends) and ctransid.
    name: Vec<u8>,
    uuid: [u8; 16],
    ctransid: u64,
}

/// The subvolume at `path`; an error if it is not a read-only subvolume.
fn snapshot(fs: &Filesystem, path: &str) -> Result<Snap, String> {
    let subvol = subvolume_at(fs, path)?;
    let info = fs
        .list_subvolumes()
        .map_err(|e| e.to_string())?
        .into_iter()
        .find(|s| s.id == subvol)
        .ok_or_else(|| format!("subvolume {subvol} is not listed"))?;
    if !info.readonly {
        return Err(format!("subvolume {} is not read-only", shown(path)));
    }
    let root = fs
        .resolve_path(fs.root(), path.trim_matches('/').as_bytes())
        .map_err(|e| format!("{}: {e}", shown(path)))?;
    let uuid = if info.received_uuid != [0; 16] {
        info.received_uuid
    } else {
        info.uuid
    };
    Ok(Snap {
        subvol,
        root,
        name: info.name,
        uuid,
        ctransid: info.ctransid,
    })
}

/// Writes the stream `o` describes to `out` (`check` first).
pub fn stream(fs: &Filesystem, o: &StreamOptions, out: &mut dyn Write) -> Result<(), String> {
    stream_ending(fs, o, false, out)
}

/// `stream`; with `one_end` (`btrfs send -e`) several snapshots go in one stream: one
/// header, each snapshot's commands, one END.
pub fn stream_ending(
    fs: &Filesystem,
    o: &StreamOptions,
    one_end: bool,
    out: &mut dyn Write,
) -> Result<(), String> {
    check(fs, o)?;
    if o.compressed && o.proto < 2 {
        return Err("--compressed-data needs --proto 2".into());
    }
    if o.snapshots.is_empty() {
        return Err("no snapshot to send".into());
    }
    let parent = o.parent.as_deref().map(|p| snapshot(fs, p)).transpose()?;
    let snaps = o
        .snapshots
        .iter()
        .map(|s| snapshot(fs, s))
        .collect::<Result<Vec<_>, _>>()?;
    let mut sharing = data::Sharing::new(fs, o, parent.as_ref())?;
    if one_end {
        return send(fs, &snaps, parent.as_ref(), o.proto, &mut sharing, out);
    }
    for s in &snaps {
        send(
            fs,
            std::slice::from_ref(s),
            parent.as_ref(),
            o.proto,
            &mut sharing,
            out,
        )?;
    }
    Ok(())
}

/// Writes one stream of `snaps` to `out`: each whole, or from `parent` when there is one.
fn send(
    fs: &Filesystem,
    snaps: &[Snap],
    parent: Option<&Snap>,
    proto: u32,
    sharing: &mut data::Sharing,
    out: &mut dyn Write,
) -> Result<(), String> {
    let out = std::io::BufWriter::with_capacity(1 << 20, out);
    let w = StreamWriter::new(out, proto).map_err(|e| format!("writing the stream: {e}"))?;
    let mut s = Sender {
        fs,
        w,
        subvol: 0,
        links: HashMap::new(),
        sharing,
        read_size: if proto == 1 {
            READ_SIZE_V1
        } else {
            READ_SIZE_V2
        },
    };
    for snap in snaps {
        s.subvol = snap.subvol;
        s.links.clear();
        s.sharing.start(snap);
        match parent {
            None => {
                s.cmd(&Command::Subvol {
                    path: snap.name.clone(),
                    uuid: snap.uuid,
                    ctransid: snap.ctransid,
                })?;
                s.directory(snap.root, Vec::new())?;
            }
            Some(p) => {
                s.cmd(&Command::Snapshot {
                    path: snap.name.clone(),
                    uuid: snap.uuid,
                    ctransid: snap.ctransid,
                    clone_uuid: p.uuid,
                    clone_ctransid: p.ctransid,
                })?;
                s.incremental(p, snap)?;
            }
        }
    }
    s.cmd(&Command::End)?;
    let out =
        s.w.into_inner()
            .into_inner()
            .map_err(|e| format!("writing the stream: {}", e.error()))?;
    out.flush().map_err(|e| format!("writing the stream: {e}"))
}

/// The state of one send: the stream and the inodes already sent under another name.
struct Sender<'a, W: Write> {
    fs: &'a Filesystem,
    w: StreamWriter<W>,
    /// The snapshot's tree id: entries of nested subvolumes are left out, as the kernel
    /// leaves them.
    subvol: u64,
    /// Inodes with several names: the path each was first sent at.
    links: HashMap<u64, Vec<u8>>,
    /// The most data per WRITE.
    read_size: usize,
    /// What may be cloned or sent compressed instead of written (see `data`).
    sharing: &'a mut data::Sharing,
}

fn show(path: &[u8]) -> String {
    format!("/{}", String::from_utf8_lossy(path))
}

/// The path of entry `e` of the directory at `dir`, in snapshot `subvol`; None for an
/// entry that is no inode of this tree (a nested subvolume, or the empty directory a
/// snapshot holds for one: the kernel sends nothing for it). A path a receiver could not
/// make with one system call is an error (which also bounds the walk's depth).
fn entry_path(subvol: u64, dir: &[u8], e: &oleo::DirEntry) -> Result<Option<Vec<u8>>, String> {
    if e.id.subvol != subvol || e.id.ino == oleo::format::key::objectid::EMPTY_SUBVOL_DIR {
        return Ok(None);
    }
    let p = child(dir, &e.name);
    if p.len() >= PATH_MAX {
        return Err(format!(
            "{}...: a path of {} bytes, longer than a receiver can make",
            show(&p[..64]),
            p.len()
        ));
    }
    Ok(Some(p))
}

fn child(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(dir.len() + 1 + name.len());
    if !dir.is_empty() {
        p.extend_from_slice(dir);
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

fn time(t: oleo::Timespec) -> Timespec {
    Timespec {
        sec: t.sec as u64,
        nsec: t.nsec,
    }
}

/// A userspace dev_t as the kernel's new_encode_dev writes it into the stream.
fn encode_dev(rdev: u64) -> u64 {
    let major = libc::major(rdev as libc::dev_t) as u64;
    let minor = libc::minor(rdev as libc::dev_t) as u64;
    (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)
}

impl<W: Write> Sender<'_, W> {
    fn cmd(&mut self, c: &Command) -> Result<(), String> {
        self.w
            .write_command(c)
            .map_err(|e| format!("writing the stream: {e}"))
    }

    fn attr(&self, id: InodeId, path: &[u8]) -> Result<Attr, String> {
        self.fs
            .getattr(id)
            .map_err(|e| format!("{}: {e}", show(path)))
    }

    /// SET_XATTR for each xattr of `which` part. security.capability goes in both: the
    /// writes and chown that come between clear it on the receiver.
    fn xattrs(&mut self, id: InodeId, path: &[u8], which: Xattrs) -> Result<(), String> {
        let err = |e: oleo::Error| format!("{}: xattrs: {e}", show(path));
        let names = self.fs.listxattr(id).map_err(err)?;
        for name in names {
            let last = name == CAPABILITY || name == DEFAULT_ACL;
            let first = name != DEFAULT_ACL;
            if !(match which {
                Xattrs::First => first,
                Xattrs::Last => last,
            }) {
                continue;
            }
            let data = match self.fs.getxattr(id, &name) {
                Ok(d) => d,
                Err(oleo::Error::NoXattr) => continue,
                Err(e) => return Err(err(e)),
            };
            self.cmd(&Command::SetXattr {
                path: path.to_vec(),
                name,
                data,
            })?;
        }
        Ok(())
    }

    /// CHOWN, CHMOD (not for symlinks), the last xattrs, UTIMES.
    fn finish(&mut self, id: InodeId, path: &[u8], attr: &Attr) -> Result<(), String> {
        self.chown(path, attr)?;
        self.chmod(path, attr)?;
        self.xattrs(id, path, Xattrs::Last)?;
        self.utimes(path, attr)
    }

    fn chown(&mut self, path: &[u8], attr: &Attr) -> Result<(), String> {
        self.cmd(&Command::Chown {
            path: path.to_vec(),
            uid: u64::from(attr.uid),
            gid: u64::from(attr.gid),
        })
    }

    /// CHMOD, but not for a symlink (whose mode nothing can set).
    fn chmod(&mut self, path: &[u8], attr: &Attr) -> Result<(), String> {
        if attr.kind == FileKind::Symlink {
            return Ok(());
        }
        self.cmd(&Command::Chmod {
            path: path.to_vec(),
            mode: u64::from(attr.mode & 0o7777),
        })
    }

    fn utimes(&mut self, path: &[u8], attr: &Attr) -> Result<(), String> {
        let otime = (self.w.version() >= 2).then(|| time(attr.crtime));
        self.cmd(&Command::Utimes {
            path: path.to_vec(),
            atime: time(attr.atime),
            mtime: time(attr.mtime),
            ctime: time(attr.ctime),
            otime,
        })
    }
}
