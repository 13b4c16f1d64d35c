//! Shared by the log replay tests: images with pending logs the kernel wrote, views of
//! what a filesystem holds (through the kernel and through oleo), and the replay checks.

use oleo::{Filesystem, OpenOptions};
use oleo_testkit::{
    assert_btrfs_check, build_image_with_log, superblock_generation, superblock_log_root,
    ImageSpec, KernelMount, PopulateSpec, TempDir,
};
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions as StdOpen};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::Rng;

/// `n` bytes that depend on `seed` alone.
pub fn pattern(seed: u64, n: usize) -> Vec<u8> {
    Rng(seed).bytes(n)
}

pub fn sh(cmd: &mut Command) -> io::Result<()> {
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

pub fn fsync(p: &Path) -> io::Result<()> {
    File::open(p)?.sync_all()
}

pub fn write_at(p: &Path, off: u64, data: &[u8]) -> io::Result<()> {
    StdOpen::new().write(true).open(p)?.write_all_at(data, off)
}

/// Every path under `top` (directories recursively) with what it is: kind, size, mode,
/// links, file content and user xattrs.
pub type TreeView = BTreeMap<String, (u32, u64, u32, Vec<u8>, BTreeMap<String, Vec<u8>>)>;

pub fn kernel_tree(top: &Path) -> TreeView {
    use std::os::unix::fs::MetadataExt;
    let mut out = TreeView::new();
    let mut todo = vec![String::new()];
    while let Some(rel) = todo.pop() {
        for e in fs::read_dir(top.join(&rel)).expect("read_dir") {
            let e = e.expect("entry");
            let path = format!("{rel}{}", e.file_name().to_string_lossy());
            let meta = fs::symlink_metadata(e.path()).expect("stat");
            let data = if meta.is_file() {
                fs::read(e.path()).expect("read")
            } else {
                Vec::new()
            };
            let size = if meta.is_dir() { 0 } else { meta.len() };
            let nlink = if meta.is_dir() {
                1
            } else {
                meta.nlink() as u32
            };
            out.insert(
                path.clone(),
                (meta.mode(), size, nlink, data, BTreeMap::new()),
            );
            if meta.is_dir() {
                todo.push(format!("{path}/"));
            }
        }
    }
    out
}

pub fn oleo_tree(fs: &Filesystem) -> TreeView {
    let mut out = TreeView::new();
    let mut todo = vec![(String::new(), fs.root())];
    while let Some((rel, dir)) = todo.pop() {
        let mut entries = Vec::new();
        fs.readdir(dir, 0, &mut |e| {
            if e.name != b"." && e.name != b".." {
                entries.push(e);
            }
            true
        })
        .expect("readdir");
        for e in entries {
            let path = format!("{rel}{}", String::from_utf8_lossy(&e.name));
            let a = fs.getattr(e.id).expect("getattr");
            let is_dir = a.mode & 0o170000 == 0o040000;
            let is_file = a.mode & 0o170000 == 0o100000;
            let data = if is_file {
                fs.read(e.id, 0, a.size as u32).expect("read")
            } else {
                Vec::new()
            };
            let size = if is_dir { 0 } else { a.size };
            out.insert(path.clone(), (a.mode, size, a.nlink, data, BTreeMap::new()));
            if is_dir {
                todo.push((format!("{path}/"), e.id));
            }
        }
    }
    out
}

pub fn diff_trees(what: &str, want: &TreeView, got: &TreeView) {
    let mut bad = Vec::new();
    for (p, w) in want {
        match got.get(p) {
            None => bad.push(format!("{p}: missing in oleo")),
            Some(g) if g != w => bad.push(format!(
                "{p}: mode {:o} / {:o}, size {} / {}, nlink {} / {}, data equal {}, xattrs {:?} / {:?}",
                w.0,
                g.0,
                w.1,
                g.1,
                w.2,
                g.2,
                w.3 == g.3,
                w.4.keys().collect::<Vec<_>>(),
                g.4.keys().collect::<Vec<_>>()
            )),
            _ => {}
        }
    }
    for p in got.keys().filter(|p| !want.contains_key(*p)) {
        bad.push(format!("{p}: only in oleo"));
    }
    assert!(
        bad.is_empty(),
        "{what} (kernel / oleo):\n{}",
        bad.join("\n")
    );
}

/// Where the copies of logical address `logical` are on the image, from the chunk tree as
/// `btrfs inspect-internal dump-tree` prints it.
pub fn physical_copies(image: &Path, logical: u64) -> Vec<u64> {
    let out = Command::new("btrfs")
        .args(["inspect-internal", "dump-tree", "-t", "chunk"])
        .arg(image)
        .output()
        .expect("dump-tree");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut copies = Vec::new();
    let mut chunk: Option<(u64, u64)> = None;
    let num = |w: Option<&str>| w.and_then(|w| w.trim_end_matches(')').parse::<u64>().ok());
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if let Some(i) = words.iter().position(|w| *w == "CHUNK_ITEM") {
            chunk = num(words.get(i + 1).copied()).map(|start| (start, 0));
        } else if words.first() == Some(&"length") {
            if let (Some((start, _)), Some(len)) = (chunk, num(words.get(1).copied())) {
                chunk = Some((start, len));
            }
        } else if words.first() == Some(&"stripe") {
            let offset = words.iter().position(|w| *w == "offset");
            if let (Some((start, len)), Some(off)) =
                (chunk, offset.and_then(|i| num(words.get(i + 1).copied())))
            {
                if (start..start + len).contains(&logical) {
                    copies.push(off + (logical - start));
                }
            }
        }
    }
    copies
}

/// Random writes, truncates, holes, xattrs, renames, links, unlinks, creations and
/// fsyncs of files and directories after a commit: whatever the kernel logs of them.
pub fn random_changes(top: &Path, seed: u64, ops: usize) -> io::Result<()> {
    let mut rng = Rng(seed);
    let dirs = ["a", "b", "a/c"];
    let mut files: Vec<String> = Vec::new();
    for d in dirs {
        for i in 0..3 {
            let f = format!("{d}/f{i}");
            if top.join(&f).exists() {
                files.push(f);
            }
        }
    }
    let mut serial = 0;
    for _ in 0..ops {
        serial += 1;
        let f = rng.pick(&files).clone();
        let p = top.join(&f);
        match rng.below(12) {
            0 | 1 => {
                let off = rng.below(256 << 10);
                let len = 1 + rng.below(64 << 10) as usize;
                write_at(&p, off, &pattern(seed ^ serial, len))?;
            }
            2 => {
                let mut w = StdOpen::new().append(true).open(&p)?;
                w.write_all(&pattern(seed ^ serial, 1 + rng.below(20000) as usize))?;
            }
            3 => StdOpen::new()
                .write(true)
                .open(&p)?
                .set_len(rng.below(300 << 10))?,
            4 => sh(Command::new("fallocate")
                .args(["-p", "-o", &(rng.below(64) * 4096).to_string(), "-l"])
                .arg((4096 * (1 + rng.below(16))).to_string())
                .arg(&p))?,
            5 => sh(Command::new("setfattr")
                .args(["-n", &format!("user.x{}", rng.below(4)), "-v"])
                .arg(format!("v{serial}"))
                .arg(&p))?,
            6 => {
                let _ = Command::new("setfattr")
                    .args(["-x", &format!("user.x{}", rng.below(4))])
                    .arg(&p)
                    .output()?;
            }
            7 => {
                // Within its directory, or into another one (the kernel may commit).
                let dir = if rng.below(3) == 0 {
                    rng.pick(&dirs).to_string()
                } else {
                    f.rsplit_once('/')
                        .map(|(d, _)| d.to_string())
                        .unwrap_or_default()
                };
                let to = format!("{dir}/r{serial}");
                fs::rename(&p, top.join(&to))?;
                files.retain(|x| *x != f);
                files.push(to);
            }
            8 => {
                let to = format!("{}/l{serial}", rng.pick(&dirs));
                fs::hard_link(&p, top.join(&to))?;
                files.push(to);
            }
            9 if files.len() > 3 => {
                fs::remove_file(&p)?;
                files.retain(|x| *x != f);
            }
            _ => {
                let to = format!("{}/n{serial}", rng.pick(&dirs));
                fs::write(
                    top.join(&to),
                    pattern(seed ^ serial, rng.below(9000) as usize),
                )?;
                files.push(to);
            }
        }
        match rng.below(4) {
            0 => fsync(&top.join(rng.pick(&files)))?,
            1 => fsync(&top.join(rng.pick(&dirs)))?,
            _ => {}
        }
    }
    // End on a fast fsync, so that the image has a log.
    let last = top.join(rng.pick(&files));
    write_at(&last, 0, &pattern(seed, 4096))?;
    fsync(&last)
}

pub fn xattr_views(top: &Path) -> BTreeMap<String, BTreeMap<String, Vec<u8>>> {
    let out = Command::new("getfattr")
        .args([
            "-R",
            "-d",
            "-m",
            "^user\\.",
            "-e",
            "hex",
            "--absolute-names",
        ])
        .arg(top)
        .output()
        .expect("getfattr");
    let mut all = BTreeMap::new();
    let mut cur = String::new();
    let prefix = format!("{}/", top.display());
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(p) = line.strip_prefix("# file: ") {
            cur = p.strip_prefix(&prefix).unwrap_or(p).to_string();
        } else if let Some((name, hex)) = line.split_once("=0x") {
            let v = (0..hex.len() / 2)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
                .collect();
            all.entry(cur.clone())
                .or_insert_with(BTreeMap::new)
                .insert(name.to_string(), v);
        }
    }
    all
}

pub fn with_kernel_xattrs(mut t: TreeView, top: &Path) -> TreeView {
    for (path, x) in xattr_views(top) {
        if let Some(e) = t.get_mut(&path) {
            e.4 = x;
        }
    }
    t
}

pub fn with_oleo_xattrs(mut t: TreeView, fs: &Filesystem) -> TreeView {
    for (path, e) in t.iter_mut() {
        let id = fs
            .resolve_path(fs.root(), path.as_bytes())
            .expect("resolve");
        for name in fs.listxattr(id).expect("listxattr") {
            if name.starts_with(b"user.") {
                let v = fs.getxattr(id, &name).expect("getxattr");
                e.4.insert(String::from_utf8_lossy(&name).into_owned(), v);
            }
        }
    }
    t
}

/// Reads the block at `logical` (first copy).
pub fn read_block(image: &Path, logical: u64, nodesize: usize) -> Vec<u8> {
    let at = physical_copies(image, logical)[0];
    let mut b = vec![0u8; nodesize];
    File::open(image)
        .expect("open")
        .read_exact_at(&mut b, at)
        .expect("read block");
    b
}

/// Builds image `name` with the kernel: `setup` runs and is committed, then `changes`
/// (ending in an fsync) leave a pending log. `whole`: no commit may happen meanwhile, so
/// the log holds every change.
pub fn build_logged(
    tmp: &TempDir,
    name: &str,
    seed: u64,
    whole: bool,
    setup: impl FnOnce(&Path) -> io::Result<()>,
    changes: impl FnOnce(&Path) -> io::Result<()>,
) -> PathBuf {
    let image = tmp.join(format!("{name}.img"));
    let live = tmp.join(format!("{name}.img.live"));
    let spec = ImageSpec::new(name, seed)
        .size_mb(256)
        .populate(PopulateSpec::none());
    let mut committed = 0;
    build_image_with_log(&spec, &image, |mount| {
        setup(mount.path())?;
        oleo_testkit::mount::syncfs(mount.path())?;
        committed = superblock_generation(&live)?;
        changes(mount.path())
    })
    .unwrap_or_else(|e| panic!("{name} (seed {seed}): building: {e}"));
    assert_ne!(
        superblock_log_root(&image).unwrap(),
        0,
        "{name}: no pending log"
    );
    if whole {
        assert_eq!(
            superblock_generation(&image).unwrap(),
            committed,
            "{name}: the kernel committed during the fsyncs: the log does not hold every case"
        );
    }
    image
}

/// What the kernel shows after replaying a copy of `image`.
pub fn kernel_replay(tmp: &TempDir, image: &Path) -> TreeView {
    let copy = tmp.join("kernel-replays.img");
    fs::copy(image, &copy).expect("copy image");
    let mnt = tmp.subdir("kernel-replays").expect("dir");
    let m = KernelMount::mount(&copy, &mnt, &["rw"]).expect("kernel mount");
    let v = with_kernel_xattrs(kernel_tree(m.path()), m.path());
    m.unmount().expect("unmount");
    let _ = fs::remove_file(&copy);
    v
}

/// oleo's replay of `image` shows `want`: read-only (in memory, the image untouched), then
/// read-write (committed, `btrfs check --check-data-csum` clean); then the kernel reads
/// the same from what oleo committed.
pub fn oleo_replays_as_the_kernel(what: &str, tmp: &TempDir, image: &Path, want: &TreeView) {
    let before = fs::read(image).expect("read image");
    let fs = Filesystem::open(image, OpenOptions::default())
        .unwrap_or_else(|e| panic!("{what}: read-only open: {e}"));
    assert!(!fs.has_pending_log(), "{what}: not replayed read-only");
    let got = with_oleo_xattrs(oleo_tree(&fs), &fs);
    diff_trees(
        &format!("{what}: read-only, replayed in memory"),
        want,
        &got,
    );
    let new = oleo::NewInode {
        mode: 0o40755,
        ..Default::default()
    };
    assert!(
        fs.mkdir(fs.root(), b"nope", &new).is_err(),
        "{what}: wrote read-only"
    );
    fs.close().expect("close");
    assert!(
        fs::read(image).expect("read image") == before,
        "{what}: the read-only open wrote to the image"
    );

    let fs = Filesystem::open_rw(image, OpenOptions::default())
        .unwrap_or_else(|e| panic!("{what}: open: {e}"));
    assert!(
        !fs.has_pending_log(),
        "{what}: not replayed: {:?}",
        fs.can_write()
    );
    fs.can_write().expect("writable after the replay");
    let got = with_oleo_xattrs(oleo_tree(&fs), &fs);
    diff_trees(&format!("{what}: after replay"), want, &got);
    fs.close().expect("close");
    assert_eq!(
        superblock_log_root(image).unwrap(),
        0,
        "{what}: log_root after replay"
    );
    assert_btrfs_check(image, &format!("{what}: after oleo's replay"));

    let mnt = tmp.subdir("after-oleo").expect("dir");
    let m = KernelMount::mount(image, &mnt, &["rw"]).expect("kernel mount after oleo");
    let after = with_kernel_xattrs(kernel_tree(m.path()), m.path());
    m.unmount().expect("unmount");
    diff_trees(
        &format!("{what}: the kernel after oleo's replay"),
        want,
        &after,
    );
}
