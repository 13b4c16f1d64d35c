//! The same filesystem mounted twice. Kernel btrfs, asked to mount a device that is already
//! mounted, finds the superblock it has for it and gives the new mount point a new vfsmount
//! of that superblock (a different `subvol=` gives another root dentry of it): one
//! filesystem, two mounts. oleo does the same with FUSE: a second mount of an image that a
//! live oleo mount serves becomes a bind mount (mount(2) MS_BIND) of that mount, or of the
//! asked subvolume's directory in it, with the per-mount flags it asks for set by
//! MS_BIND|MS_REMOUNT. Both are then one FUSE connection served by one oleo, which ends
//! when the last of them is unmounted (the kernel tears a FUSE connection down when its
//! superblock dies, which is when its last mount goes).
//!
//! What one FUSE connection cannot have twice is refused, naming the option and the
//! mount point already there: the server's atime rules, `sync` and `dirsync` (it cannot tell
//! through which mount a request came), and the filesystem's options (`compress=`,
//! `commit=`, ...). The first mount's options come from its server
//! (`subvol_ioctl::GET_SERVER_OPTIONS`), its per-mount flags from mountinfo. A user cannot
//! bind (fusermount3 does not), so a user's second mount is refused, saying where the
//! image is mounted.

use crate::common::on_mount;
use crate::daemon::vfs_flags::VfsFlags;
use oleo_fuse::subvol_ioctl as cmd;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// What the new mount asks for.
pub struct Asked<'a> {
    /// Its filesystem-wide options, as `mount::shared_options` gives them.
    pub options: Vec<(&'static str, String)>,
    /// The keys of `options` that were given explicitly.
    pub given: &'a [&'static str],
    /// The VFS flags asked for, and their names as given.
    pub vfs: &'a VfsFlags,
    pub vfs_names: &'a [String],
    /// Some(false): `ro`; otherwise read-write is asked (explicitly or by default).
    pub writable: Option<bool>,
    pub subvol: Option<&'a [u8]>,
    pub subvolid: Option<u64>,
}

/// The shared options as the server keeps them: `key=value` lines.
pub fn encode(options: &[(&'static str, String)]) -> String {
    options
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn decode(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// An oleo mount of the image, from mountinfo.
struct Existing {
    point: PathBuf,
    /// The connection (the mount's device number).
    conn: String,
    /// mountinfo's per-mount and per-superblock options.
    mount_opts: String,
    super_opts: String,
}

impl Existing {
    fn has(opts: &str, o: &str) -> bool {
        opts.split(',').any(|x| x == o)
    }
    fn sb_readonly(&self) -> bool {
        Existing::has(&self.super_opts, "ro")
    }
    fn readonly(&self) -> bool {
        Existing::has(&self.mount_opts, "ro") || self.sb_readonly()
    }
}

/// Whether the mountinfo source `source` is the file or device `image`: the same inode
/// (or the same block device), not just the same path string.
fn same_file(source: &str, image: &std::fs::Metadata) -> bool {
    let Ok(m) = std::fs::metadata(source) else {
        return false;
    };
    if image.file_type().is_block_device() && m.file_type().is_block_device() {
        return m.rdev() == image.rdev();
    }
    m.dev() == image.dev() && m.ino() == image.ino()
}

/// Whether the mount at `point` answers: its server is alive.
fn alive(point: &Path) -> bool {
    let Ok(c) = CString::new(point.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a NUL-terminated path and a zeroed statfs the call fills.
    let statfs_ok = unsafe {
        let mut st = std::mem::zeroed::<libc::statfs>();
        libc::statfs(c.as_ptr(), &mut st) == 0
    };
    statfs_ok && std::fs::metadata(point).is_ok_and(|m| m.is_dir())
}

/// The live oleo mounts of `image` here, in mountinfo's order, all of one connection.
fn served(image: &Path) -> Vec<Existing> {
    let Ok(want) = std::fs::metadata(image) else {
        return Vec::new();
    };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut found: Vec<Existing> = info
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let f: Vec<&str> = left.split(' ').collect();
            let mut r = right.split(' ');
            let (fstype, source, super_opts) = (r.next()?, r.next()?, r.next()?);
            if fstype != "fuse.oleo" {
                return None;
            }
            let source = crate::daemon::fuse_mount::unescape(source);
            if !same_file(&source, &want) {
                return None;
            }
            Some(Existing {
                point: PathBuf::from(crate::daemon::fuse_mount::unescape(f.get(4)?)),
                conn: f.get(2)?.to_string(),
                mount_opts: f.get(5)?.to_string(),
                super_opts: super_opts.to_string(),
            })
        })
        .filter(|e| alive(&e.point))
        .collect();
    if let Some(conn) = found.first().map(|e| e.conn.clone()) {
        found.retain(|e| e.conn == conn);
    }
    found
}

/// The first mount's server options; None from an oleo that does not answer them.
fn server_options(point: &Path) -> Result<cmd::ServerOptions, String> {
    let f = std::fs::File::open(point).map_err(|e| format!("{}: {e}", point.display()))?;
    let mut b = vec![0u8; cmd::SERVER_OPTIONS_SIZE];
    on_mount::raw_ioctl(&f, cmd::GET_SERVER_OPTIONS, &mut b).map_err(|e| {
        format!(
            "cannot ask the oleo serving {} for its options ({e}; an older oleo?)",
            point.display()
        )
    })?;
    Ok(cmd::ServerOptions::parse(&b))
}

/// A subvolume path in the form the listing gives: no leading, trailing or doubled
/// slashes, no `.`.
fn normal(path: &[u8]) -> Result<Vec<u8>, String> {
    let parts: Vec<&[u8]> = path
        .split(|&c| c == b'/')
        .filter(|p| !p.is_empty() && *p != b".")
        .collect();
    if parts.contains(&&b".."[..]) {
        return Err(format!(
            "subvol={}: a path with `..` cannot be resolved on a mount oleo shares",
            String::from_utf8_lossy(path)
        ));
    }
    Ok(parts.join(&b'/'))
}

/// The asked subvolume's id and path (from the top level; empty for the top level itself),
/// resolved as the kernel does: subvolid=, subvol= (both: they must name the same one),
/// else the default subvolume.
fn asked_subvolume(point: &Path, asked: &Asked) -> Result<(u64, Vec<u8>), String> {
    let all = on_mount::list(point)?;
    let path_of = |id: u64| -> Result<Vec<u8>, String> {
        if id == oleo::format::key::objectid::FS_TREE {
            return Ok(Vec::new());
        }
        match all.iter().find(|s| s.id == id) {
            Some(s) if !s.path.is_empty() => Ok(s.path.clone()),
            Some(_) => Err(format!(
                "subvolume {id} is not reachable from the top level"
            )),
            None => Err(format!("subvolid={id}: no such subvolume")),
        }
    };
    let by_path = match asked.subvol {
        None => None,
        Some(p) => {
            let p = normal(p)?;
            if p.is_empty() {
                Some(oleo::format::key::objectid::FS_TREE)
            } else {
                Some(
                    all.iter()
                        .find(|s| s.path == p)
                        .map(|s| s.id)
                        .ok_or_else(|| {
                            format!(
                                "subvol=/{}: not a subvolume of the filesystem mounted at {}",
                                String::from_utf8_lossy(&p),
                                point.display()
                            )
                        })?,
                )
            }
        }
    };
    let id = match (asked.subvolid, by_path) {
        (Some(a), Some(b)) if a != b => {
            return Err(format!(
                "subvol= names subvolume {b} but subvolid={a}: they must name the same one"
            ))
        }
        (Some(a), _) => a,
        (None, Some(b)) => b,
        (None, None) => on_mount::get_default(point)?,
    };
    Ok((id, path_of(id)?))
}

/// `path` as a relative path under `root` (both from the top level); None if it is not
/// there.
fn beneath(path: &[u8], root: &[u8]) -> Option<Vec<u8>> {
    if root.is_empty() {
        return Some(path.to_vec());
    }
    if path == root {
        return Some(Vec::new());
    }
    let rest = path.strip_prefix(root)?;
    rest.strip_prefix(b"/").map(|r| r.to_vec())
}

fn shown(path: &[u8]) -> String {
    format!("/{}", String::from_utf8_lossy(path))
}

/// The atime, sync and dirsync flags are the server's, for every mount of it: which of
/// them the names given ask, and whether the asked value differs from `first`'s.
fn flag_differs(
    name: &str,
    asked: oleo_fuse::MountFlags,
    first: oleo_fuse::MountFlags,
) -> Option<String> {
    let atime = |f: oleo_fuse::MountFlags| match f.atime {
        oleo_fuse::Atime::Relative => "relatime",
        oleo_fuse::Atime::Strict => "strictatime",
        oleo_fuse::Atime::Never => "noatime",
    };
    let (differs, theirs) = match name {
        "relatime" | "norelatime" | "strictatime" | "nostrictatime" | "noatime" | "atime" => {
            (asked.atime != first.atime, atime(first).to_string())
        }
        "nodiratime" | "diratime" => (
            asked.nodiratime != first.nodiratime,
            if first.nodiratime {
                "nodiratime"
            } else {
                "diratime"
            }
            .to_string(),
        ),
        "lazytime" | "nolazytime" => (
            asked.lazytime != first.lazytime,
            if first.lazytime {
                "lazytime"
            } else {
                "nolazytime"
            }
            .to_string(),
        ),
        "sync" | "async" => (
            asked.sync != first.sync,
            if first.sync { "sync" } else { "async" }.to_string(),
        ),
        "dirsync" => (asked.dirsync != first.dirsync, "no dirsync".to_string()),
        _ => return None,
    };
    differs.then_some(theirs)
}

/// If `image` is already served by a live oleo mount: makes `mountpoint` (canonical) a
/// bind mount of it and returns true, or refuses saying why. False: not mounted, go on.
pub fn mount_again(
    image: &Path,
    mountpoint: &Path,
    asked: &Asked,
    verbose: bool,
) -> Result<bool, String> {
    let all = served(image);
    let Some(first) = all.first() else {
        return Ok(false);
    };
    let img = image.display();
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(format!(
            "{img} is already mounted at {} by oleo; a second mount of it would be a bind \
             mount of that one, which only root can make (fusermount3 does not bind): use {}, \
             or mount it there as root",
            first.point.display(),
            first.point.display()
        ));
    }
    let theirs = server_options(&first.point);
    // What cannot differ between two mounts of one FUSE connection.
    let needs_server = !asked.given.is_empty()
        || asked
            .vfs_names
            .iter()
            .any(|n| flag_differs(n, Default::default(), Default::default()).is_some());
    let (first_flags, first_writable) = match &theirs {
        Ok(t) => {
            let shared = decode(&String::from_utf8_lossy(&t.options));
            for key in asked.given {
                let mine = asked.options.iter().find(|(k, _)| k == key).map(|(_, v)| v);
                let there = shared.iter().find(|(k, _)| k == key).map(|(_, v)| v);
                if mine != there {
                    return Err(format!(
                        "{img} is already mounted at {} with {key}={}, and a second mount \
                         of it is served by that same oleo: {key}={} cannot differ between \
                         them (leave {key} out, or unmount {} first)",
                        first.point.display(),
                        there.map_or("?", |v| v.as_str()),
                        mine.map_or("?", |v| v.as_str()),
                        first.point.display()
                    ));
                }
            }
            let flags = oleo_fuse::MountFlags::from_ms(t.flags);
            let mine = asked.vfs.server();
            for n in asked.vfs_names {
                if let Some(there) = flag_differs(n, mine, flags) {
                    return Err(format!(
                        "{img} is already mounted at {} with {there}; oleo keeps atime rules, \
                         sync and dirsync for all mounts of one filesystem (its server cannot \
                         tell through which mount a request came), so {n} cannot differ \
                         between them (leave {n} out, or unmount {} first)",
                        first.point.display(),
                        first.point.display()
                    ));
                }
            }
            (Some(flags), t.writable)
        }
        Err(e) if needs_server => return Err(e.clone()),
        // Nothing to compare: mountinfo tells the rest.
        Err(_) => (None, !first.sb_readonly()),
    };
    let readonly = asked.writable == Some(false);
    if !readonly && !first_writable {
        return Err(format!(
            "{img} is already mounted read-only at {} by an oleo that does not write: a \
             read-write mount of it is refused (mount with -o ro, or unmount {} and mount \
             it read-write)",
            first.point.display(),
            first.point.display()
        ));
    }
    if !readonly && first.sb_readonly() {
        return Err(format!(
            "{img} is already mounted read-only at {}: a read-write mount of it is refused; \
             remount {} rw first (mount -o remount,rw {}), or mount with -o ro",
            first.point.display(),
            first.point.display(),
            first.point.display()
        ));
    }
    // Which mount holds the asked subvolume, and where in it.
    let (want_id, want_path) = asked_subvolume(&first.point, asked)?;
    let subvolumes = on_mount::list(&first.point)?;
    let mut roots = Vec::new();
    for e in &all {
        let Ok(s) = on_mount::subvol_of(&e.point) else {
            continue;
        };
        // A bind of some directory inside: not a mount of a subvolume.
        if s.ino != oleo::format::key::objectid::FIRST_FREE {
            continue;
        }
        let path = if s.id == oleo::format::key::objectid::FS_TREE {
            Vec::new()
        } else {
            match subvolumes.iter().find(|x| x.id == s.id) {
                Some(x) if !x.path.is_empty() => x.path.clone(),
                _ => continue,
            }
        };
        roots.push((e, path));
    }
    let holder = roots
        .iter()
        .filter_map(|(e, root)| beneath(&want_path, root).map(|rel| (*e, root, rel)))
        // A read-write mount of the top level first.
        .min_by_key(|(e, root, _)| (!root.is_empty(), e.readonly() && !readonly))
        .map(|(e, _, rel)| (e, rel));
    let Some((from, rel)) = holder else {
        let (e, root) = roots
            .first()
            .map(|(e, r)| (*e, r.clone()))
            .unwrap_or((first, Vec::new()));
        return Err(format!(
            "{img} is already mounted at {} (subvolume {}), and subvolume {} (id {want_id}) \
             is not inside it: oleo can make a second mount only of what a mounted one \
             holds (unmount {} first, or mount the top level there)",
            e.point.display(),
            shown(&root),
            shown(&want_path),
            e.point.display()
        ));
    };
    let source = if rel.is_empty() {
        from.point.clone()
    } else {
        from.point.join(std::ffi::OsStr::from_bytes(&rel))
    };
    // The directory found must be that subvolume's root, through the mount itself.
    match on_mount::subvol_of(&source) {
        Ok(s) if s.id == want_id && s.ino == oleo::format::key::objectid::FIRST_FREE => {}
        Ok(_) | Err(_) => {
            return Err(format!(
                "subvolume {} (id {want_id}) is not at {}: is something mounted over it, or \
                 was it moved?",
                shown(&want_path),
                source.display()
            ))
        }
    }
    // The per-mount flags asked, with the server's atime rules (mountinfo then shows what
    // the server does).
    let per_mount = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_NOSYMFOLLOW;
    let atime_bits =
        libc::MS_NOATIME | libc::MS_RELATIME | libc::MS_STRICTATIME | libc::MS_NODIRATIME;
    let server_atime = match first_flags {
        Some(f) => to_ms(f.to_ms()) & atime_bits,
        None => VfsFlags::of_mount(&from.point)?.ms & atime_bits,
    };
    let flags =
        (asked.vfs.ms & per_mount) | server_atime | if readonly { libc::MS_RDONLY } else { 0 };
    bind(&source, mountpoint, flags)?;
    if verbose {
        let what = if rel.is_empty() {
            String::new()
        } else {
            format!(" (its subvolume {})", shown(&want_path))
        };
        eprintln!(
            "oleo: {img} is already mounted at {}: {} is a bind mount of it{what}",
            from.point.display(),
            mountpoint.display()
        );
        match crate::daemon::vfs_flags::effective(mountpoint) {
            Ok(f) => eprintln!("oleo: mounted on {} with {f}", mountpoint.display()),
            Err(e) => eprintln!("oleo: {e}"),
        }
    }
    Ok(true)
}

/// mount(2)'s flags from the u64 the server keeps (c_ulong is narrower on 32-bit targets).
#[allow(clippy::unnecessary_cast)]
fn to_ms(v: u64) -> libc::c_ulong {
    v as libc::c_ulong
}

/// `source` bound at `target`, then its per-mount flags set; undone if that fails.
fn bind(source: &Path, target: &Path, flags: libc::c_ulong) -> Result<(), String> {
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes()).map_err(|_| "a NUL byte in a path".to_string())
    };
    let (src, tgt, none) = (c(source)?, c(target)?, CString::default());
    // SAFETY: NUL-terminated strings that outlive the calls; no data.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            tgt.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(format!(
            "binding {} at {}: {}",
            source.display(),
            target.display(),
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: as above.
    let r = unsafe {
        libc::mount(
            none.as_ptr(),
            tgt.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND | libc::MS_REMOUNT | flags,
            std::ptr::null(),
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: a NUL-terminated path.
        unsafe { libc::umount2(tgt.as_ptr(), libc::MNT_DETACH) };
        return Err(format!(
            "setting the flags of the bind mount at {}: {e}",
            target.display()
        ));
    }
    Ok(())
}
