//! `oleo inspect IMAGE versions PATH`: a file in each snapshot of its subvolume's lineage,
//! and in the older roots the image still holds (the backup roots, and with `--older` the
//! root trees a scan of the metadata chunks finds), each with its sha256. An older root is
//! opened read-only as a filesystem of its own (`Rescue::tree_root`).

use super::{col, inode_items, jopt, js, list, lossy, sub_path, ts};
use oleo::format::key::objectid;
use oleo::{Attr, FileKind, Filesystem, InodeId, OpenOptions, Rescue, SubvolumeInfo};
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::Path;

/// Where a version was found: the current root tree, or an older one.
#[derive(Clone, Copy)]
enum Root {
    Current,
    /// A superblock backup slot's root tree, of this generation.
    Backup(u64),
    /// A root tree the scan found, of this generation.
    Scanned(u64),
}

impl Root {
    fn generation(self) -> Option<u64> {
        match self {
            Root::Current => None,
            Root::Backup(g) | Root::Scanned(g) => Some(g),
        }
    }

    fn source(self) -> &'static str {
        match self {
            Root::Current => "current",
            Root::Backup(_) => "backup",
            Root::Scanned(_) => "scan",
        }
    }
}

/// One subvolume of the lineage, in one root tree, and what it holds of the inode.
struct Version {
    root: Root,
    subvol: u64,
    sub_path: String,
    found: Option<Found>,
}

struct Found {
    path: String,
    attr: Attr,
    transid: Option<u64>,
    hash: Option<String>,
    error: Option<String>,
}

/// What is being looked for: inode `ino` of generation `generation`, at `in_sub` inside
/// its subvolume.
struct Wanted {
    ino: u64,
    generation: u64,
    in_sub: String,
    limit: u64,
}

/// sha256 of a file's bytes (a symlink's target), None for other kinds.
fn content_hash(fs: &Filesystem, a: &Attr, limit: u64) -> Result<Option<String>, String> {
    let mut h = Sha256::new();
    match a.kind {
        FileKind::Symlink => h.update(fs.readlink(a.id).map_err(|e| e.to_string())?),
        FileKind::File => {
            if limit != 0 && a.size > limit {
                return Err(format!(
                    "{} bytes, over --hash-limit {limit}: not hashed",
                    a.size
                ));
            }
            let mut off = 0u64;
            while off < a.size {
                let want = (a.size - off).min(1 << 20) as u32;
                let buf = fs
                    .read(a.id, off, want)
                    .map_err(|e| format!("reading at {off}: {e}"))?;
                if buf.is_empty() {
                    return Err(format!("read ends at {off} of {} bytes", a.size));
                }
                h.update(&buf);
                off += buf.len() as u64;
            }
        }
        _ => return Ok(None),
    }
    Ok(Some(
        h.finalize().iter().map(|b| format!("{b:02x}")).collect(),
    ))
}

/// The subvolumes linked to `start` by snapshot (parent uuid) relations, transitively.
fn lineage(subs: &[SubvolumeInfo], start: u64) -> Vec<&SubvolumeInfo> {
    let mut ids: HashSet<u64> = HashSet::from([start]);
    loop {
        let uuids: HashSet<[u8; 16]> = subs
            .iter()
            .filter(|s| ids.contains(&s.id))
            .flat_map(|s| [s.uuid, s.parent_uuid])
            .filter(|u| *u != [0; 16])
            .collect();
        let before = ids.len();
        for s in subs {
            if uuids.contains(&s.uuid) || uuids.contains(&s.parent_uuid) {
                ids.insert(s.id);
            }
        }
        if ids.len() == before {
            break;
        }
    }
    subs.iter().filter(|s| ids.contains(&s.id)).collect()
}

pub(super) fn versions(
    fs: &Filesystem,
    image: &Path,
    path: &str,
    json: bool,
    limit: u64,
    older: bool,
) -> Result<(), String> {
    let rel = path.trim_matches('/');
    let id = fs
        .resolve_path(fs.root(), rel.as_bytes())
        .map_err(|e| format!("/{rel}: {e}"))?;
    let attr = fs.getattr(id).map_err(|e| format!("/{rel}: {e}"))?;
    let subs = list(fs)?;
    let home = subs
        .iter()
        .find(|s| s.id == id.subvol)
        .ok_or_else(|| format!("/{rel}: its subvolume {} is not listed", id.subvol))?;
    // The path inside its subvolume: what the user gave, less the subvolume's path.
    let in_sub = match sub_path(home) {
        Some(p) if p == "/" => rel.to_string(),
        Some(p) => rel
            .strip_prefix(p.as_str())
            .map(|r| r.trim_start_matches('/').to_string())
            .unwrap_or_else(|| fs.inode_path(id).map(|p| lossy(&p)).unwrap_or_default()),
        None => fs.inode_path(id).map(|p| lossy(&p)).unwrap_or_default(),
    };
    let want = Wanted {
        ino: id.ino,
        generation: attr.generation,
        in_sub,
        limit,
    };
    let lineage: Vec<SubvolumeInfo> = lineage(&subs, home.id).into_iter().cloned().collect();
    let mut out = Vec::new();
    look_in(fs, Root::Current, &lineage, &want, &mut out);
    for (root, bytenr) in older_roots(fs, image, older) {
        let opts = OpenOptions {
            read_only: true,
            subvolid: Some(objectid::FS_TREE),
            log_replay: false,
            rescue: Rescue {
                tree_root: Some(bytenr),
                ignore_bad_roots: true,
                ..Rescue::default()
            },
            ..OpenOptions::default()
        };
        // An older root whose blocks were reused since simply holds nothing.
        let Ok(old) = Filesystem::open(image, opts) else {
            continue;
        };
        look_in(&old, root, &lineage, &want, &mut out);
    }
    print!("{}", versions_text(&out, want.ino, want.generation, json));
    let mut errors = 0;
    for v in &out {
        if let Some(e) = v.found.as_ref().and_then(|f| f.error.as_ref()) {
            errors += 1;
            eprintln!("oleo inspect: {} (subvolume {}): {e}", v.sub_path, v.subvol);
        }
    }
    if errors > 0 {
        return Err(format!("{errors} version(s) could not be hashed"));
    }
    Ok(())
}

/// The root trees older than the current one: the backup slots', and with `scan` those
/// the metadata chunks still hold; newest first, each once.
fn older_roots(fs: &Filesystem, image: &Path, scan: bool) -> Vec<(Root, u64)> {
    let sb = fs.superblock();
    // The current root tree too: a rescue open may show tree 5 from elsewhere (the newest
    // backup slot); rows that repeat what is shown are dropped anyway.
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut backups: Vec<_> = sb
        .backup_roots
        .iter()
        .filter(|b| b.tree_root != 0 && b.tree_root_gen < sb.generation)
        .collect();
    backups.sort_by_key(|b| std::cmp::Reverse(b.tree_root_gen));
    for b in backups {
        if seen.insert(b.tree_root) {
            out.push((Root::Backup(b.tree_root_gen), b.tree_root));
        }
    }
    if scan {
        for c in oleo::rescue::find_roots(image, None).unwrap_or_default() {
            if c.owner == objectid::ROOT_TREE
                && c.generation < sb.generation
                && seen.insert(c.bytenr)
            {
                out.push((Root::Scanned(c.generation), c.bytenr));
            }
        }
    }
    out
}

/// Adds what each subvolume of `lineage` holds of the inode in `fs`, unless an earlier
/// row already showed the same bytes of the same commit in that subvolume.
fn look_in(
    fs: &Filesystem,
    root: Root,
    lineage: &[SubvolumeInfo],
    want: &Wanted,
    out: &mut Vec<Version>,
) {
    let same = |a: &Attr| a.id.ino == want.ino && a.generation == want.generation;
    let inos = HashSet::from([want.ino]);
    for s in lineage {
        let top = InodeId {
            subvol: s.id,
            ino: objectid::FIRST_FREE,
        };
        // The same relative path first, then the inode number.
        let by_path = fs
            .resolve_path(top, want.in_sub.as_bytes())
            .and_then(|i| fs.getattr(i))
            .ok()
            .filter(|a| a.id.subvol == s.id && same(a))
            .map(|a| (want.in_sub.clone(), a));
        let hit = by_path.or_else(|| {
            let a = fs
                .getattr(InodeId {
                    subvol: s.id,
                    ino: want.ino,
                })
                .ok()
                .filter(same)?;
            let p = fs.inode_path(a.id).map(|p| lossy(&p)).unwrap_or_default();
            Some((p, a))
        });
        // A subvolume's root directory is `.` in it.
        let hit = hit.map(|(p, a)| (if p.is_empty() { ".".into() } else { p }, a));
        let found = hit.map(|(path, attr)| {
            let (hash, error) = match content_hash(fs, &attr, want.limit) {
                Ok(h) => (h, None),
                Err(e) => (None, Some(e)),
            };
            let transid = inode_items(fs, s.id, &inos)
                .get(&want.ino)
                .map(|i| i.transid);
            Found {
                path,
                attr,
                transid,
                hash,
                error,
            }
        });
        if let Root::Current = root {
        } else {
            // Older roots show only what differs from every row before.
            let Some(f) = &found else { continue };
            let dup = out.iter().any(|v| {
                v.subvol == s.id
                    && v.found.as_ref().is_some_and(|g| {
                        g.transid == f.transid && g.hash == f.hash && g.attr.size == f.attr.size
                    })
            });
            if dup {
                continue;
            }
        }
        out.push(Version {
            root,
            subvol: s.id,
            sub_path: sub_path(s).unwrap_or_else(|| "<unreachable>".into()),
            found,
        });
    }
}

fn versions_text(out: &[Version], ino: u64, gen: u64, json: bool) -> String {
    let mut t = String::new();
    if json {
        let _ = writeln!(
            t,
            "{{\"inode\": {ino}, \"inode_generation\": {gen}, \"versions\": ["
        );
        for (i, v) in out.iter().enumerate() {
            let _ = write!(
                t,
                "  {{\"root\": {}, \"root_generation\": {}, \"subvolume\": {}, \"subvolume_path\": {}",
                js(v.root.source()),
                v.root
                    .generation()
                    .map_or_else(|| "null".into(), |g| g.to_string()),
                v.subvol,
                js(&v.sub_path)
            );
            if let Some(f) = &v.found {
                let _ = write!(
                    t,
                    ", \"path\": {}, \"size\": {}, \"mtime\": {}, \"mtime_sec\": {}, \
                     \"mtime_nsec\": {}, \"transid\": {}, \"sha256\": {}, \"error\": {}",
                    js(&f.path),
                    f.attr.size,
                    js(&ts(&f.attr.mtime)),
                    f.attr.mtime.sec,
                    f.attr.mtime.nsec,
                    f.transid.map_or_else(|| "null".into(), |x| x.to_string()),
                    jopt(f.hash.clone()),
                    jopt(f.error.clone())
                );
            } else {
                t.push_str(", \"path\": null");
            }
            let _ = writeln!(t, "}}{}", if i + 1 < out.len() { "," } else { "" });
        }
        t.push_str("]}\n");
        return t;
    }
    let _ = writeln!(
        t,
        "{:<6} {:<10} {:<12} {:<30} {:<64} {:<24} {:<16} PATH",
        "SUBVOL", "TRANSID", "SIZE", "MTIME", "SHA256", "SUBVOLUME", "ROOT"
    );
    for v in out {
        let root = match v.root.generation() {
            Some(g) => format!("{}:{g}", v.root.source()),
            None => v.root.source().to_string(),
        };
        match &v.found {
            Some(f) => {
                let _ = writeln!(
                    t,
                    "{:<6} {:<10} {:<12} {:<30} {:<64} {:<24} {:<16} {}",
                    v.subvol,
                    f.transid.map_or_else(|| "-".into(), |x| x.to_string()),
                    f.attr.size,
                    ts(&f.attr.mtime),
                    f.hash.as_deref().unwrap_or("-"),
                    col(&v.sub_path),
                    root,
                    col(&f.path)
                );
            }
            None => {
                let _ = writeln!(
                    t,
                    "{:<6} {:<10} {:<12} {:<30} {:<64} {:<24} {:<16} -",
                    v.subvol,
                    "-",
                    "-",
                    "-",
                    "-",
                    col(&v.sub_path),
                    root
                );
            }
        }
    }
    t
}
