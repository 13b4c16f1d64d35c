//! Replay of log trees the kernel wrote: images copied right after fsyncs (a crash at that
//! moment), opened writable by oleo, must show what the kernel shows after its own replay
//! of the same image, pass `btrfs check`, and read the same again in the kernel.

mod common;

use oleo::{Filesystem, OpenOptions};
use oleo_testkit::{
    assert_btrfs_check, build_image_with_log, require_root, superblock_generation,
    superblock_log_root, ImageSpec, KernelMount, PopulateSpec, TempDir,
};
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions as StdOpen};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

/// What a file looks like: size, mode, links, content and user xattrs.
#[derive(Debug, PartialEq, Eq)]
struct FileView {
    size: u64,
    mode: u32,
    nlink: u32,
    data: Vec<u8>,
    xattrs: BTreeMap<String, Vec<u8>>,
}

fn pattern(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn sh(cmd: &mut Command) -> io::Result<()> {
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

fn fsync(p: &Path) -> io::Result<()> {
    File::open(p)?.sync_all()
}

fn write_at(p: &Path, off: u64, data: &[u8]) -> io::Result<()> {
    StdOpen::new().write(true).open(p)?.write_all_at(data, off)
}

/// The files each case leaves, relative to the top of the filesystem.
const FILES: &[&str] = &[
    "overwritten",
    "punched",
    "truncated",
    "xattrs",
    "chmodded",
    "prealloc",
    "inline",
    "untouched",
    "sv/in-subvolume",
];

/// Files as they are before the last commit.
fn setup(top: &Path) -> io::Result<()> {
    for (i, f) in FILES.iter().enumerate() {
        if f.starts_with("sv/") {
            continue;
        }
        let len = if *f == "inline" { 100 } else { 64 * 1024 };
        fs::write(top.join(f), pattern(i as u64, len))?;
    }
    sh(Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(top.join("sv")))?;
    fs::write(top.join("sv/in-subvolume"), pattern(99, 20000))?;
    sh(Command::new("setfattr")
        .args(["-n", "user.gone", "-v", "before"])
        .arg(top.join("xattrs")))?;
    sh(Command::new("setfattr")
        .args(["-n", "user.kept", "-v", "kept"])
        .arg(top.join("xattrs")))
}

/// The changes after the last commit, each made durable by an fsync of its file only.
fn changes(top: &Path) -> io::Result<()> {
    let p = |f: &str| top.join(f);
    write_at(&p("overwritten"), 8192, &pattern(1000, 4096))?;
    let mut f = StdOpen::new().append(true).open(p("overwritten"))?;
    f.write_all(&pattern(1001, 10000))?;
    f.sync_all()?;

    sh(Command::new("fallocate")
        .args(["-p", "-o", "16384", "-l", "16384"])
        .arg(p("punched")))?;
    fsync(&p("punched"))?;

    StdOpen::new()
        .write(true)
        .open(p("truncated"))?
        .set_len(10000)?;
    fsync(&p("truncated"))?;

    sh(Command::new("setfattr")
        .args(["-n", "user.new", "-v", "added"])
        .arg(p("xattrs")))?;
    sh(Command::new("setfattr")
        .args(["-x", "user.gone"])
        .arg(p("xattrs")))?;
    fsync(&p("xattrs"))?;

    fs::set_permissions(p("chmodded"), fs::Permissions::from_mode(0o600))?;
    fsync(&p("chmodded"))?;

    sh(Command::new("fallocate")
        .args(["-n", "-o", "65536", "-l", "65536"])
        .arg(p("prealloc")))?;
    write_at(&p("prealloc"), 4096, &pattern(1002, 4096))?;
    fsync(&p("prealloc"))?;

    let mut f = StdOpen::new().append(true).open(p("inline"))?;
    f.write_all(&pattern(1003, 200))?;
    f.sync_all()?;

    write_at(&p("sv/in-subvolume"), 20000, &pattern(1004, 30000))?;
    fsync(&p("sv/in-subvolume"))
}

fn kernel_view(top: &Path) -> BTreeMap<String, FileView> {
    FILES
        .iter()
        .map(|f| {
            let p = top.join(f);
            let meta = fs::metadata(&p).expect("stat");
            let out = Command::new("getfattr")
                .args(["--absolute-names", "-d", "-m", "^user\\.", "-e", "hex"])
                .arg(&p)
                .output()
                .expect("getfattr");
            let mut xattrs = BTreeMap::new();
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if let Some((name, hex)) = line.split_once("=0x") {
                    let v = (0..hex.len() / 2)
                        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
                        .collect();
                    xattrs.insert(name.to_string(), v);
                }
            }
            use std::os::unix::fs::MetadataExt;
            let view = FileView {
                size: meta.len(),
                mode: meta.mode(),
                nlink: meta.nlink() as u32,
                data: fs::read(&p).expect("read"),
                xattrs,
            };
            (f.to_string(), view)
        })
        .collect()
}

fn oleo_view(fs: &Filesystem) -> BTreeMap<String, FileView> {
    FILES
        .iter()
        .map(|f| {
            let id = fs
                .resolve_path(fs.root(), f.as_bytes())
                .unwrap_or_else(|e| panic!("{f}: {e}"));
            let a = fs.getattr(id).expect("getattr");
            let mut data = Vec::new();
            while (data.len() as u64) < a.size {
                let chunk = fs
                    .read(id, data.len() as u64, 1 << 20)
                    .unwrap_or_else(|e| panic!("{f}: read: {e}"));
                if chunk.is_empty() {
                    break;
                }
                data.extend_from_slice(&chunk);
            }
            let mut xattrs = BTreeMap::new();
            for name in fs.listxattr(id).expect("listxattr") {
                if name.starts_with(b"user.") {
                    let v = fs.getxattr(id, &name).expect("getxattr");
                    xattrs.insert(String::from_utf8_lossy(&name).into_owned(), v);
                }
            }
            let view = FileView {
                size: a.size,
                mode: a.mode,
                nlink: a.nlink,
                data,
                xattrs,
            };
            (f.to_string(), view)
        })
        .collect()
}

fn diff(what: &str, want: &BTreeMap<String, FileView>, got: &BTreeMap<String, FileView>) {
    let mut bad = Vec::new();
    for (f, w) in want {
        let g = &got[f];
        if w != g {
            bad.push(format!(
                "{f}: size {} / {}, mode {:o} / {:o}, nlink {} / {}, data equal {}, xattrs {:?} / {:?}",
                w.size,
                g.size,
                w.mode,
                g.mode,
                w.nlink,
                g.nlink,
                w.data == g.data,
                w.xattrs.keys().collect::<Vec<_>>(),
                g.xattrs.keys().collect::<Vec<_>>()
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{what} (kernel / oleo):\n{}",
        bad.join("\n")
    );
}

#[test]
fn fast_fsync_logs_of_the_kernel_replay_as_the_kernel_does() {
    let name = "fast_fsync_logs_of_the_kernel_replay_as_the_kernel_does";
    let _ = env_logger::builder().is_test(true).try_init();
    if !require_root(name) {
        return;
    }
    let tmp = TempDir::new("log-replay").expect("temp dir");
    let image = tmp.join("log.img");
    let spec = ImageSpec::new("log-replay", 0x10a0)
        .size_mb(512)
        .populate(PopulateSpec::none());
    let live = tmp.join("log.img.live");
    let mut committed = 0;
    build_image_with_log(&spec, &image, |mount| {
        setup(mount.path())?;
        oleo_testkit::mount::syncfs(mount.path())?;
        committed = superblock_generation(&live)?;
        changes(mount.path())
    })
    .expect("build image with a pending log");
    assert_ne!(superblock_log_root(&image).unwrap(), 0, "no pending log");
    assert_eq!(
        superblock_generation(&image).unwrap(),
        committed,
        "the kernel committed during the fsyncs: the log does not hold every case"
    );

    // The kernel's replay, on a copy.
    let kernel_copy = tmp.join("kernel.img");
    fs::copy(&image, &kernel_copy).expect("copy");
    let mnt = tmp.subdir("k").expect("dir");
    let want = {
        let m = KernelMount::mount(&kernel_copy, &mnt, &["rw"]).expect("kernel mount");
        let v = kernel_view(m.path());
        m.unmount().expect("unmount");
        v
    };
    assert_eq!(want["overwritten"].size, 64 * 1024 + 10000, "kernel replay");

    // oleo's replay.
    let fs = Filesystem::open_rw(&image, OpenOptions::default()).expect("open with oleo");
    assert!(!fs.has_pending_log(), "oleo did not replay the log");
    fs.can_write().expect("writable after replay");
    diff("after replay", &want, &oleo_view(&fs));
    fs.close().expect("close");
    assert_eq!(
        superblock_log_root(&image).unwrap(),
        0,
        "log_root after replay"
    );
    assert!(superblock_generation(&image).unwrap() > committed);
    assert_btrfs_check(&image, "after oleo's log replay");

    // The kernel reads what oleo replayed.
    let m = KernelMount::mount(&image, &mnt, &["rw"]).expect("kernel mount after oleo");
    diff("kernel after oleo's replay", &want, &kernel_view(m.path()));
    m.unmount().expect("unmount");
    assert_btrfs_check(&image, "kernel after oleo's replay");
}

/// Every path under `top` (directories recursively) with what it is: kind, size, mode,
/// links, file content and user xattrs.
type TreeView = BTreeMap<String, (u32, u64, u32, Vec<u8>, BTreeMap<String, Vec<u8>>)>;

fn kernel_tree(top: &Path) -> TreeView {
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

fn oleo_tree(fs: &Filesystem) -> TreeView {
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

fn diff_trees(what: &str, want: &TreeView, got: &TreeView) {
    let mut bad = Vec::new();
    for (p, w) in want {
        match got.get(p) {
            None => bad.push(format!("{p}: missing in oleo")),
            Some(g) if g != w => bad.push(format!(
                "{p}: mode {:o} / {:o}, size {} / {}, nlink {} / {}, data equal {}",
                w.0,
                g.0,
                w.1,
                g.1,
                w.2,
                g.2,
                w.3 == g.3
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

/// Name changes made durable by fsyncs (the cases of btrfs-format.md 12.3 and the
/// crash-consistency literature), as one log.
fn name_changes(top: &Path) -> io::Result<()> {
    let p = |f: &str| top.join(f);
    // mkdir newdir; write newdir/newfile; fsync newfile
    fs::create_dir(p("newdir"))?;
    let mut f = File::create(p("newdir/newfile"))?;
    f.write_all(&pattern(20, 8192))?;
    f.sync_all()?;
    // rename d/a to d/b; fsync b
    fs::rename(p("d/a"), p("d/b"))?;
    fsync(&p("d/b"))?;
    // unlink a sibling; fsync the directory
    fs::remove_file(p("d/sib1"))?;
    fsync(&p("d"))?;
    // a hard link; fsync the file
    fs::hard_link(p("d/existing"), p("d/existing.link"))?;
    fsync(&p("d/existing"))?;
    // a link of another directory's file; fsync the directory holding the link
    fs::hard_link(p("x"), p("d/xlink"))?;
    fsync(&p("d"))?;
    // a new empty file; fsync the directory
    File::create(p("e/created"))?;
    fsync(&p("e"))?;
    // unlink a file and fsync its directory
    fs::remove_file(p("e/doomed"))?;
    fsync(&p("e"))?;
    // a new file at the top; fsync the top directory (logs the root and its "..")
    fs::write(p("topnew"), pattern(21, 100))?;
    fsync(top)
}

fn name_setup(top: &Path) -> io::Result<()> {
    for d in ["d", "e"] {
        fs::create_dir(top.join(d))?;
    }
    for (i, f) in ["d/a", "d/sib1", "d/sib2", "d/existing", "x", "e/doomed"]
        .iter()
        .enumerate()
    {
        fs::write(top.join(f), pattern(30 + i as u64, 3000 + 1000 * i))?;
    }
    Ok(())
}

#[test]
fn logs_of_name_changes_replay_as_the_kernel_does() {
    let name = "logs_of_name_changes_replay_as_the_kernel_does";
    let _ = env_logger::builder().is_test(true).try_init();
    if !require_root(name) {
        return;
    }
    let tmp = TempDir::new("log-names").expect("temp dir");
    let image = tmp.join("names.img");
    let live = tmp.join("names.img.live");
    let spec = ImageSpec::new("log-names", 0x10a3)
        .size_mb(256)
        .populate(PopulateSpec::none());
    let mut committed = 0;
    build_image_with_log(&spec, &image, |mount| {
        name_setup(mount.path())?;
        oleo_testkit::mount::syncfs(mount.path())?;
        committed = superblock_generation(&live)?;
        name_changes(mount.path())
    })
    .expect("build image with a pending log");
    assert_eq!(
        superblock_generation(&image).unwrap(),
        committed,
        "the kernel committed during the fsyncs: the log does not hold every case"
    );

    let kernel_copy = tmp.join("kernel.img");
    fs::copy(&image, &kernel_copy).expect("copy");
    let mnt = tmp.subdir("k").expect("dir");
    let want = {
        let m = KernelMount::mount(&kernel_copy, &mnt, &["rw"]).expect("kernel mount");
        let v = kernel_tree(m.path());
        m.unmount().expect("unmount");
        v
    };
    assert!(want.contains_key("newdir/newfile") && want.contains_key("d/b"));

    let fs = Filesystem::open_rw(&image, OpenOptions::default()).expect("open with oleo");
    assert!(!fs.has_pending_log(), "oleo did not replay the log");
    diff_trees("after replay", &want, &oleo_tree(&fs));
    fs.close().expect("close");
    assert_btrfs_check(&image, "after oleo's replay of name changes");

    let m = KernelMount::mount(&image, &mnt, &["rw"]).expect("kernel mount after oleo");
    diff_trees("kernel after oleo's replay", &want, &kernel_tree(m.path()));
    m.unmount().expect("unmount");
}

#[test]
fn nologreplay_leaves_the_last_commit_untouched() {
    let name = "nologreplay_leaves_the_last_commit_untouched";
    let _ = env_logger::builder().is_test(true).try_init();
    if !require_root(name) {
        return;
    }
    let tmp = TempDir::new("log-off").expect("temp dir");
    let image = tmp.join("new.img");
    let spec = ImageSpec::new("log-new-file", 0x10a1)
        .size_mb(256)
        .populate(PopulateSpec::none());
    build_image_with_log(&spec, &image, |mount| {
        fs::write(mount.path().join("old"), b"committed")?;
        oleo_testkit::mount::syncfs(mount.path())?;
        let mut f = File::create(mount.path().join("new"))?;
        f.write_all(&pattern(7, 5000))?;
        f.sync_all()
    })
    .expect("build image with a pending log");
    let before = fs::read(&image).expect("read image");

    let off = OpenOptions {
        log_replay: false,
        ..OpenOptions::default()
    };
    let fs = Filesystem::open_rw(&image, off).expect("open with nologreplay");
    assert!(fs.has_pending_log());
    let why = fs
        .can_write()
        .expect_err("writable with a pending log")
        .to_string();
    assert!(why.contains("nologreplay"), "reason: {why}");
    assert!(fs.resolve_path(fs.root(), b"old").is_ok());
    assert!(
        fs.resolve_path(fs.root(), b"new").is_err(),
        "showed uncommitted state"
    );
    fs.close().expect("close");
    assert!(
        fs::read(&image).expect("read image") == before,
        "oleo wrote to the image"
    );

    // Replayed, the new file is there with its fsynced content.
    let fs = Filesystem::open_rw(&image, OpenOptions::default()).expect("open with oleo");
    let id = fs
        .resolve_path(fs.root(), b"new")
        .expect("new after replay");
    assert_eq!(fs.read(id, 0, 8192).expect("read"), pattern(7, 5000));
    fs.close().expect("close");
    assert_btrfs_check(&image, "after replaying a new file");
}

#[test]
fn a_damaged_log_refuses_the_writable_open_and_names_nologreplay() {
    let name = "a_damaged_log_refuses_the_writable_open_and_names_nologreplay";
    let _ = env_logger::builder().is_test(true).try_init();
    if !require_root(name) {
        return;
    }
    let tmp = TempDir::new("log-damaged").expect("temp dir");
    let image = tmp.join("damaged.img");
    let spec = ImageSpec::new("log-damaged", 0x10a2)
        .size_mb(256)
        .populate(PopulateSpec::none());
    build_image_with_log(&spec, &image, |mount| {
        fs::write(mount.path().join("f"), pattern(3, 8192))?;
        oleo_testkit::mount::syncfs(mount.path())?;
        write_at(&mount.path().join("f"), 0, &pattern(4, 4096))?;
        fsync(&mount.path().join("f"))
    })
    .expect("build image with a pending log");
    // Damage every copy of the log root tree's block.
    let log_root = superblock_log_root(&image).unwrap();
    let f = StdOpen::new().write(true).open(&image).expect("open image");
    let copies = physical_copies(&image, log_root);
    assert!(!copies.is_empty(), "log root {log_root} is in no chunk");
    for physical in copies {
        f.write_all_at(&[0xff; 64], physical + 200).expect("damage");
    }
    drop(f);

    let err = match Filesystem::open_rw(&image, OpenOptions::default()) {
        Ok(_) => panic!("a damaged log was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("nologreplay"), "error: {err}");
    // Read-only, the last commit is there.
    let fs = Filesystem::open(&image, OpenOptions::default()).expect("read-only open");
    let id = fs.resolve_path(fs.root(), b"f").expect("f");
    assert_eq!(fs.read(id, 0, 8192).expect("read"), pattern(3, 8192));
}

/// Where the copies of logical address `logical` are on the image, from the chunk tree as
/// `btrfs inspect-internal dump-tree` prints it.
fn physical_copies(image: &Path, logical: u64) -> Vec<u64> {
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

/// A seeded stream of choices.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }

    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
}

/// Random writes, truncates, holes, xattrs, renames, links, unlinks, creations and
/// fsyncs of files and directories after a commit: whatever the kernel logs of them.
fn random_changes(top: &Path, seed: u64, ops: usize) -> io::Result<()> {
    let mut rng = Rng(seed | 1);
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

fn xattr_views(top: &Path) -> BTreeMap<String, BTreeMap<String, Vec<u8>>> {
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

fn with_kernel_xattrs(mut t: TreeView, top: &Path) -> TreeView {
    for (path, x) in xattr_views(top) {
        if let Some(e) = t.get_mut(&path) {
            e.4 = x;
        }
    }
    t
}

fn with_oleo_xattrs(mut t: TreeView, fs: &Filesystem) -> TreeView {
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

#[test]
fn random_fsync_workloads_of_the_kernel_replay_as_the_kernel_does() {
    let name = "random_fsync_workloads_of_the_kernel_replay_as_the_kernel_does";
    let _ = env_logger::builder().is_test(true).try_init();
    if !require_root(name) {
        return;
    }
    let base = oleo_testkit::seed(0x10b0);
    let rounds = std::env::var("OLEO_LOG_REPLAY_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6u64);
    for round in 0..rounds {
        let seed = base.wrapping_add(round);
        let what =
            format!("seed {seed} (replay with OLEO_TEST_SEED={seed} OLEO_LOG_REPLAY_ROUNDS=1)");
        let tmp = TempDir::new("log-random").expect("temp dir");
        let image = tmp.join("random.img");
        let spec = ImageSpec::new("log-random", seed)
            .size_mb(256)
            .populate(PopulateSpec::none());
        build_image_with_log(&spec, &image, |mount| {
            let top = mount.path();
            for d in ["a", "b", "a/c"] {
                fs::create_dir(top.join(d))?;
            }
            let mut rng = Rng(seed ^ 0x55);
            for d in ["a", "b", "a/c"] {
                for i in 0..3 {
                    let len = rng.below(200 << 10) as usize;
                    fs::write(top.join(format!("{d}/f{i}")), pattern(seed ^ i, len))?;
                }
            }
            oleo_testkit::mount::syncfs(top)?;
            random_changes(top, seed, 40)
        })
        .unwrap_or_else(|e| panic!("{what}: build: {e}"));

        if let Ok(dir) = std::env::var("OLEO_KEEP_IMAGES") {
            fs::copy(&image, Path::new(&dir).join(format!("log-{seed}.img"))).expect("keep");
        }
        let kernel_copy = tmp.join("kernel.img");
        fs::copy(&image, &kernel_copy).expect("copy");
        let mnt = tmp.subdir("k").expect("dir");
        let want = {
            let m = KernelMount::mount(&kernel_copy, &mnt, &["rw"]).expect("kernel mount");
            let v = with_kernel_xattrs(kernel_tree(m.path()), m.path());
            m.unmount().expect("unmount");
            v
        };
        // Read-only: replayed in memory, the image untouched.
        let before = fs::read(&image).expect("read image");
        let fs = Filesystem::open(&image, OpenOptions::default())
            .unwrap_or_else(|e| panic!("{what}: read-only open: {e}"));
        assert!(!fs.has_pending_log(), "{what}: not replayed read-only");
        let got = with_oleo_xattrs(oleo_tree(&fs), &fs);
        diff_trees(
            &format!("{what}: read-only, replayed in memory"),
            &want,
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
            fs::read(&image).expect("read image") == before,
            "{what}: the read-only open wrote to the image"
        );

        let fs = Filesystem::open_rw(&image, OpenOptions::default())
            .unwrap_or_else(|e| panic!("{what}: open: {e}"));
        assert!(
            !fs.has_pending_log(),
            "{what}: not replayed: {:?}",
            fs.can_write()
        );
        let got = with_oleo_xattrs(oleo_tree(&fs), &fs);
        diff_trees(&format!("{what}: after replay"), &want, &got);
        for (p, w) in &want {
            assert_eq!(w.4, got[p].4, "{what}: xattrs of {p}");
        }
        fs.close().expect("close");
        assert_btrfs_check(&image, &format!("{what}: after oleo's replay"));
        let m = KernelMount::mount(&image, &mnt, &["rw"]).expect("kernel mount after oleo");
        let after = with_kernel_xattrs(kernel_tree(m.path()), m.path());
        diff_trees(&format!("{what}: kernel after oleo"), &want, &after);
        m.unmount().expect("unmount");
    }
}

/// btrfs-progs' fsck images with log trees (never kernel-mounted: they are test input
/// only): valid logs replay and leave `btrfs check` clean; a damaged one is refused with a
/// reason, never a panic.
#[test]
fn progs_images_with_logs_replay_or_are_refused() {
    let name = "progs_images_with_logs_replay_or_are_refused";
    let _ = env_logger::builder().is_test(true).try_init();
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/test-images/btrfs-progs-fsck");
    let images = [
        ("065-valid-log-tree/already-present.img.xz", true),
        ("065-valid-log-tree/compressed.img.xz", true),
        ("065-valid-log-tree/hole.img.xz", true),
        ("063-log-missing-csum/default.img.xz", false),
    ];
    if !dir.join(images[0].0).exists() {
        assert!(!oleo_testkit::is_ci(), "{name}: the image set is missing");
        eprintln!("SKIP: {name}: no images under {}", dir.display());
        return;
    }
    let tmp = TempDir::new("log-progs").expect("temp dir");
    for (rel, valid) in images {
        let img = tmp.join("img");
        let out = Command::new("xz")
            .args(["-dc"])
            .arg(dir.join(rel))
            .output()
            .expect("xz");
        assert!(out.status.success(), "{rel}: xz failed");
        // btrfs-image dumps (metadata only: data reads as zeros) become raw images.
        let dump = tmp.join("dump");
        fs::write(&dump, &out.stdout).expect("write dump");
        let _ = fs::remove_file(&img);
        sh(Command::new("btrfs-image").arg("-r").arg(&dump).arg(&img))
            .unwrap_or_else(|e| panic!("{rel}: btrfs-image -r: {e}"));
        if superblock_log_root(&img).unwrap() == 0 {
            panic!("{rel}: no log tree in the image");
        }
        match Filesystem::open_rw(&img, OpenOptions::default()) {
            Ok(fs) => {
                let replayed = !fs.has_pending_log();
                eprintln!(
                    "{rel}: opened, log replayed: {replayed}, {:?}",
                    fs.can_write()
                );
                if valid {
                    assert!(
                        replayed,
                        "{rel}: a valid log was not replayed: {:?}",
                        fs.can_write()
                    );
                }
                fs.close().expect("close");
                // A damaged log may be replayed as the kernel replays it (063's missing
                // checksums stay missing); valid ones must leave a clean filesystem.
                if replayed && valid {
                    // Metadata only: the data checksums cannot match the zeros.
                    if let Err(e) = oleo_testkit::btrfs_check(&img, false) {
                        panic!("{rel}: btrfs check after replay:\n{e}");
                    }
                }
            }
            Err(e) => {
                assert!(!valid, "{rel}: a valid log was refused: {e}");
                assert!(e.to_string().contains("nologreplay"), "{rel}: {e}");
            }
        }
    }
}

/// Reads the block at `logical` (first copy).
fn read_block(image: &Path, logical: u64, nodesize: usize) -> Vec<u8> {
    let at = physical_copies(image, logical)[0];
    let mut b = vec![0u8; nodesize];
    File::open(image)
        .expect("open")
        .read_exact_at(&mut b, at)
        .expect("read block");
    b
}

/// Damaged log blocks (random bytes after the header, checksum fixed so the damage reaches
/// the replay, not just the checksum test) never panic or hang a read-write or read-only
/// open; they are replayed or refused.
#[test]
fn damaged_logs_never_panic_or_hang() {
    use oleo::format::items::RootItem;
    use oleo::format::tree_mut::HeaderMut;
    use oleo::format::{CsumType, TreeBlock};
    let name = "damaged_logs_never_panic_or_hang";
    let _ = env_logger::builder().is_test(true).try_init();
    if !require_root(name) {
        return;
    }
    let tmp = TempDir::new("log-fuzz").expect("temp dir");
    let image = tmp.join("fuzz.img");
    let seed = oleo_testkit::seed(0x10c0);
    let spec = ImageSpec::new("log-fuzz", seed)
        .size_mb(256)
        .populate(PopulateSpec::none());
    build_image_with_log(&spec, &image, |mount| {
        let top = mount.path();
        for d in ["a", "b", "a/c"] {
            fs::create_dir(top.join(d))?;
            for i in 0..3 {
                fs::write(top.join(format!("{d}/f{i}")), pattern(seed ^ i, 30000))?;
            }
        }
        oleo_testkit::mount::syncfs(top)?;
        random_changes(top, seed, 40)
    })
    .expect("build image with a pending log");
    let nodesize = 16384;
    let sb = Filesystem::open(&image, OpenOptions::default())
        .expect("open")
        .superblock();
    assert_eq!(sb.nodesize as usize, nodesize);
    // The log root tree's root and the roots of the log trees it names.
    let mut targets = vec![sb.log_root];
    let root = read_block(&image, sb.log_root, nodesize);
    let tb = TreeBlock::new(&root).expect("log root block");
    if tb.is_leaf() {
        for slot in 0..tb.nritems() {
            let ri = RootItem::parse(tb.item_data(slot).expect("item")).expect("root item");
            targets.push(ri.bytenr);
        }
    }
    let work = tmp.join("work.img");
    let rounds: u64 = std::env::var("OLEO_LOG_FUZZ_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let mut rng = common::Rng(seed);
    let mut failures = Vec::new();
    let (mut replayed, mut refused) = (0, 0);
    for round in 0..rounds {
        let target = targets[rng.below(targets.len() as u64) as usize];
        let copies = physical_copies(&image, target);
        let mut block = read_block(&image, target, nodesize);
        // Item headers and bodies of a leaf, pointers of a node: all after the header.
        for _ in 0..1 + rng.below(4) {
            let at = 101 + rng.below((nodesize - 101) as u64) as usize;
            block[at] = rng.below(256) as u8;
        }
        HeaderMut::new(&mut block)
            .expect("header")
            .finalize(CsumType::Crc32c)
            .expect("checksum");
        let label = format!("seed {seed} round {round} (block {target})");
        for writable in [true, false] {
            // Each open starts from the damaged log.
            sh(Command::new("cp")
                .arg("--sparse=always")
                .arg(&image)
                .arg(&work))
            .expect("copy image");
            let f = StdOpen::new().write(true).open(&work).expect("open copy");
            for c in &copies {
                f.write_all_at(&block, *c).expect("damage");
            }
            drop(f);
            let p = work.clone();
            let out = common::bounded(&label, std::time::Duration::from_secs(60), move || {
                let opened = if writable {
                    Filesystem::open_rw(&p, OpenOptions::default())
                } else {
                    Filesystem::open(&p, OpenOptions::default())
                };
                match opened {
                    Ok(fs) => {
                        let r = !fs.has_pending_log();
                        common::walk(&fs, &common::Limits::default());
                        drop(fs);
                        r
                    }
                    Err(_) => false,
                }
            });
            match out {
                common::Outcome::Done(true) => replayed += 1,
                common::Outcome::Done(false) => refused += 1,
                common::Outcome::Panicked(p) => failures.push(format!("{label}: PANIC {p}")),
                common::Outcome::Hung(d) => failures.push(format!("{label}: HANG {d:?}")),
            }
        }
    }
    eprintln!("{rounds} damaged logs: {replayed} opens replayed, {refused} kept the last commit");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
