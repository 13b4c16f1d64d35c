//! `oleo inspect IMAGE subvolumes | versions PATH | file PATH | deleted | undelete`:
//! forensic reading of an
//! image or device, opened read-only (nothing is written, no log is replayed, no orphan
//! is removed). Paths are from the top-level subvolume. Times are UTC; `--json` prints
//! one JSON document for scripts.

use oleo::format::items::{Compression, InodeItem};
use oleo::format::key::{item, objectid};
use oleo::format::TreeBlock;
use oleo::{FileKind, Filesystem, OpenOptions, SubvolumeInfo, Timespec};
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::PathBuf;

mod deleted;
mod versions;

#[derive(clap::Args)]
pub struct InspectArgs {
    /// Image file or block device (opened read-only).
    image: PathBuf,
    #[command(subcommand)]
    verb: Verb,
}

#[derive(clap::Subcommand)]
enum Verb {
    /// Every subvolume and snapshot, one line each.
    Subvolumes {
        #[arg(long)]
        json: bool,
    },
    /// The file at PATH in each snapshot of its subvolume's lineage and in the older roots
    /// (backup roots; with --older also those a scan finds), with a sha256 of each.
    Versions {
        /// Path from the top-level subvolume, e.g. `vol/dir/f`.
        path: String,
        #[arg(long)]
        json: bool,
        /// Hash no file larger than this many bytes (0: no limit).
        #[arg(long, default_value_t = 64 << 30)]
        hash_limit: u64,
        /// Also look in the root trees of older generations that a scan of the metadata
        /// chunks finds (btrfs-find-root).
        #[arg(long)]
        older: bool,
    },
    /// An inode's attributes, xattrs and extents.
    File {
        /// Path from the top-level subvolume.
        path: String,
        #[arg(long)]
        json: bool,
    },
    /// Inodes found in old tree blocks still on disk and in no current tree: deleted.
    Deleted {
        #[arg(long)]
        json: bool,
    },
    /// Copies a deleted inode's bytes out (never over an existing file).
    Undelete {
        /// Subvolume (tree id) the inode was in; default 5, with --all every one.
        #[arg(long)]
        root: Option<u64>,
        /// Copies every deleted file and symlink to DEST_DIR/<subvol>/<ino>.<gen>/<name>.
        #[arg(long, value_name = "DEST_DIR", conflicts_with_all = ["ino", "dest"])]
        all: Option<PathBuf>,
        /// Inode number, as `deleted` lists it.
        #[arg(required_unless_present = "all")]
        ino: Option<u64>,
        /// Where to write it; must not exist.
        #[arg(value_name = "DEST_FILE", required_unless_present = "all")]
        dest: Option<PathBuf>,
    },
}

pub fn run(a: &InspectArgs) -> Result<(), String> {
    // The rescue open: these work on images the normal open refuses.
    match &a.verb {
        Verb::Deleted { json } => return deleted::list(&a.image, *json),
        Verb::Undelete {
            root,
            all,
            ino,
            dest,
        } => return deleted::undelete(&a.image, *root, *ino, dest.as_deref(), all.as_deref()),
        _ => {}
    }
    let opts = OpenOptions {
        read_only: true,
        subvolid: Some(objectid::FS_TREE),
        ..OpenOptions::default()
    };
    let fs = match Filesystem::open(&a.image, opts.clone()) {
        Ok(fs) => fs,
        // What will not open plainly may with every rescue option (still read-only).
        Err(e) => {
            let mut rescue = oleo::Rescue::default();
            rescue.add("all:usebackuproot").expect("known options");
            let again = OpenOptions {
                rescue,
                log_replay: false,
                ..opts
            };
            let fs = Filesystem::open(&a.image, again)
                .map_err(|_| format!("{}: {e}", a.image.display()))?;
            eprintln!(
                "oleo inspect: {}: {e}; opened with rescue=all,usebackuproot instead",
                a.image.display()
            );
            fs
        }
    };
    match &a.verb {
        Verb::Subvolumes { json } => subvolumes(&fs, *json),
        Verb::Versions {
            path,
            json,
            hash_limit,
            older,
        } => versions::versions(&fs, &a.image, path, *json, *hash_limit, *older),
        Verb::File { path, json } => file(&fs, path, *json),
        Verb::Deleted { .. } | Verb::Undelete { .. } => unreachable!("handled above"),
    }
}

fn list(fs: &Filesystem) -> Result<Vec<SubvolumeInfo>, String> {
    let mut v = fs
        .list_subvolumes()
        .map_err(|e| format!("listing subvolumes: {e}"))?;
    v.sort_by_key(|s| s.id);
    Ok(v)
}

/// A subvolume's path from the top level: `/` for the top level, None if unreachable.
fn sub_path(s: &SubvolumeInfo) -> Option<String> {
    if s.id == objectid::FS_TREE {
        return Some("/".into());
    }
    s.path
        .as_ref()
        .map(|p| String::from_utf8_lossy(p).into_owned())
}

fn uuid(u: &[u8; 16]) -> Option<String> {
    (*u != [0; 16]).then(|| oleo::format::bytes::uuid_string(u))
}

/// `2024-01-31T12:00:00Z`, None for 0 (never).
fn utc(sec: i64) -> Option<String> {
    if sec == 0 {
        return None;
    }
    let days = sec.div_euclid(86_400);
    let rem = sec.rem_euclid(86_400);
    // Days since the epoch to a civil date (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    Some(format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    ))
}

fn ts(t: &Timespec) -> String {
    match utc(t.sec) {
        Some(s) if t.nsec == 0 => s,
        Some(s) => format!("{}.{:09}Z", s.trim_end_matches('Z'), t.nsec),
        None => "-".into(),
    }
}

fn dash(o: Option<String>) -> String {
    o.unwrap_or_else(|| "-".into())
}

/// A JSON string literal.
fn js(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn jopt(o: Option<String>) -> String {
    o.map_or_else(|| "null".into(), |s| js(&s))
}

/// A path for a text column: spaces and control characters escaped, so fields split.
fn col(s: &str) -> String {
    s.chars()
        .flat_map(|c| match c {
            ' ' => "\\x20".chars().collect::<Vec<_>>(),
            '\\' => "\\\\".chars().collect(),
            c if c.is_control() => format!("\\x{:02x}", c as u32).chars().collect(),
            c => vec![c],
        })
        .collect()
}

fn subvolumes(fs: &Filesystem, json: bool) -> Result<(), String> {
    let subs = list(fs)?;
    let mut out = String::new();
    if json {
        out.push_str("[\n");
        for (i, s) in subs.iter().enumerate() {
            let _ = writeln!(
                out,
                "  {{\"id\": {}, \"parent\": {}, \"path\": {}, \"generation\": {}, \
                 \"ctransid\": {}, \"otransid\": {}, \"uuid\": {}, \"parent_uuid\": {}, \
                 \"received_uuid\": {}, \"readonly\": {}, \"otime\": {}, \"otime_sec\": {}}}{}",
                s.id,
                s.parent.map_or(0, |p| p.0),
                jopt(sub_path(s)),
                s.generation,
                s.ctransid,
                s.otransid,
                jopt(uuid(&s.uuid)),
                jopt(uuid(&s.parent_uuid)),
                jopt(uuid(&s.received_uuid)),
                s.readonly,
                jopt(utc(s.otime.0)),
                s.otime.0,
                if i + 1 < subs.len() { "," } else { "" }
            );
        }
        out.push_str("]\n");
    } else {
        let _ = writeln!(
            out,
            "{:<6} {:<6} {:<8} {:<8} {:<8} {:<5} {:<20} {:<36} {:<36} {:<36} PATH",
            "ID",
            "PARENT",
            "GEN",
            "CTRANSID",
            "OTRANSID",
            "FLAGS",
            "OTIME",
            "UUID",
            "PARENT_UUID",
            "RECEIVED_UUID"
        );
        for s in &subs {
            let _ = writeln!(
                out,
                "{:<6} {:<6} {:<8} {:<8} {:<8} {:<5} {:<20} {:<36} {:<36} {:<36} {}",
                s.id,
                s.parent.map_or(0, |p| p.0),
                s.generation,
                s.ctransid,
                s.otransid,
                if s.readonly { "ro" } else { "rw" },
                dash(utc(s.otime.0)),
                dash(uuid(&s.uuid)),
                dash(uuid(&s.parent_uuid)),
                dash(uuid(&s.received_uuid)),
                sub_path(s).map_or_else(|| "<unreachable>".into(), |p| col(&p))
            );
        }
    }
    print!("{out}");
    Ok(())
}

/// The INODE_ITEMs of inodes `inos` in subvolume `subvol` (for their transid), read by
/// walking its tree; damaged blocks are skipped.
fn inode_items(fs: &Filesystem, subvol: u64, inos: &HashSet<u64>) -> HashMap<u64, InodeItem> {
    let mut found = HashMap::new();
    let Ok(Some(root)) = fs.tree_root(subvol) else {
        return found;
    };
    let _ = fs.walk_tree(
        &root,
        &mut |b: TreeBlock| {
            if !b.is_leaf() {
                return;
            }
            for slot in 0..b.nritems() {
                let Ok(k) = b.item_key(slot) else { continue };
                if k.item_type != item::INODE_ITEM || !inos.contains(&k.objectid) {
                    continue;
                }
                if let Ok(i) = b.item_data(slot).and_then(InodeItem::parse) {
                    found.insert(k.objectid, i);
                }
            }
        },
        &mut |_| {},
    );
    found
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn kind_name(k: FileKind) -> &'static str {
    match k {
        FileKind::File => "file",
        FileKind::Dir => "dir",
        FileKind::Symlink => "symlink",
        FileKind::CharDev => "chardev",
        FileKind::BlockDev => "blockdev",
        FileKind::Fifo => "fifo",
        FileKind::Socket => "socket",
    }
}

fn compression_name(c: Compression) -> &'static str {
    match c {
        Compression::None => "none",
        Compression::Zlib => "zlib",
        Compression::Lzo => "lzo",
        Compression::Zstd => "zstd",
    }
}

fn file(fs: &Filesystem, path: &str, json: bool) -> Result<(), String> {
    let rel = path.trim_matches('/');
    let err = |e: oleo::Error| format!("/{rel}: {e}");
    let id = fs.resolve_path(fs.root(), rel.as_bytes()).map_err(err)?;
    let a = fs.getattr(id).map_err(err)?;
    let transid = inode_items(fs, id.subvol, &HashSet::from([id.ino]))
        .get(&id.ino)
        .map(|i| i.transid);
    let mut xattrs = Vec::new();
    for name in fs.listxattr(id).map_err(err)? {
        let size = fs
            .getxattr(id, &name)
            .map(|v| v.len())
            .map_err(|e| format!("/{rel}: xattr {}: {e}", lossy(&name)))?;
        xattrs.push((lossy(&name), size));
    }
    let extents = if matches!(a.kind, FileKind::File | FileKind::Symlink) {
        fs.file_extents(id).map_err(err)?
    } else {
        Vec::new()
    };
    let flags = |e: &oleo::ExtentInfo| {
        let mut f = Vec::new();
        if e.inline {
            f.push("inline");
        }
        if e.prealloc {
            f.push("prealloc");
        }
        if e.compression != Compression::None {
            f.push("encoded");
        }
        f
    };
    let transid_s = transid.map_or_else(|| "-".into(), |x| x.to_string());
    let mut t = String::new();
    if json {
        let _ = write!(
            t,
            "{{\"subvolume\": {}, \"inode\": {}, \"kind\": {}, \"mode\": {}, \"nlink\": {}, \
             \"uid\": {}, \"gid\": {}, \"size\": {}, \"nbytes\": {}, \"rdev\": {}, \
             \"atime\": {}, \"mtime\": {}, \"ctime\": {}, \"otime\": {}, \"generation\": {}, \
             \"transid\": {}, \"flags\": {},\n \"xattrs\": [",
            id.subvol,
            id.ino,
            js(kind_name(a.kind)),
            a.mode,
            a.nlink,
            a.uid,
            a.gid,
            a.size,
            a.blocks * 512,
            a.rdev,
            js(&ts(&a.atime)),
            js(&ts(&a.mtime)),
            js(&ts(&a.ctime)),
            js(&ts(&a.crtime)),
            a.generation,
            transid.map_or_else(|| "null".into(), |x| x.to_string()),
            a.flags
        );
        let xs: Vec<String> = xattrs
            .iter()
            .map(|(n, s)| format!("{{\"name\": {}, \"size\": {s}}}", js(n)))
            .collect();
        t += &xs.join(", ");
        t += "],\n \"extents\": [";
        let es: Vec<String> = extents
            .iter()
            .map(|e| {
                let fl: Vec<String> = flags(e).iter().map(|f| js(f)).collect();
                format!(
                    "\n  {{\"offset\": {}, \"length\": {}, \"logical\": {}, \"disk_bytenr\": {}, \
                     \"disk_bytes\": {}, \"extent_offset\": {}, \"ram_bytes\": {}, \
                     \"compression\": {}, \"generation\": {}, \"flags\": [{}]}}",
                    e.file_offset,
                    e.len,
                    e.logical.map_or_else(|| "null".into(), |l| l.to_string()),
                    e.disk_bytenr,
                    e.disk_num_bytes,
                    e.extent_offset,
                    e.ram_bytes,
                    js(compression_name(e.compression)),
                    e.generation,
                    fl.join(", ")
                )
            })
            .collect();
        t += &es.join(",");
        t += "]}\n";
    } else {
        let _ = writeln!(t, "subvolume  {}", id.subvol);
        let _ = writeln!(t, "inode      {}", id.ino);
        let _ = writeln!(t, "kind       {}", kind_name(a.kind));
        let _ = writeln!(t, "mode       {:o}", a.mode);
        let _ = writeln!(t, "nlink      {}", a.nlink);
        let _ = writeln!(t, "uid        {}", a.uid);
        let _ = writeln!(t, "gid        {}", a.gid);
        let _ = writeln!(t, "size       {}", a.size);
        let _ = writeln!(t, "nbytes     {}", a.blocks * 512);
        let _ = writeln!(t, "rdev       {}", a.rdev);
        let _ = writeln!(t, "atime      {}", ts(&a.atime));
        let _ = writeln!(t, "mtime      {}", ts(&a.mtime));
        let _ = writeln!(t, "ctime      {}", ts(&a.ctime));
        let _ = writeln!(t, "otime      {}", ts(&a.crtime));
        let _ = writeln!(t, "generation {}", a.generation);
        let _ = writeln!(t, "transid    {transid_s}");
        let _ = writeln!(t, "flags      0x{:x}", a.flags);
        let _ = writeln!(t, "xattrs     {}", xattrs.len());
        for (n, s) in &xattrs {
            let _ = writeln!(t, "  {s:<8} {}", col(n));
        }
        let _ = writeln!(t, "extents    {}", extents.len());
        if !extents.is_empty() {
            let _ = writeln!(
                t,
                "  {:<14} {:<12} {:<14} {:<12} {:<11} {:<10} FLAGS",
                "OFFSET", "LENGTH", "LOGICAL", "DISK_BYTES", "COMPRESSION", "GEN"
            );
        }
        for e in &extents {
            let fl = flags(e);
            let _ = writeln!(
                t,
                "  {:<14} {:<12} {:<14} {:<12} {:<11} {:<10} {}",
                e.file_offset,
                e.len,
                e.logical.map_or_else(|| "-".into(), |l| l.to_string()),
                e.disk_num_bytes,
                compression_name(e.compression),
                e.generation,
                if fl.is_empty() {
                    "-".into()
                } else {
                    fl.join(",")
                }
            );
        }
    }
    print!("{t}");
    Ok(())
}
