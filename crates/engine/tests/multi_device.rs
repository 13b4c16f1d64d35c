//! Multi-device filesystems (every RAID profile) checked against the kernel and btrfs-progs:
//!
//! - reads: sets the kernel made and filled (mkfs.btrfs over N images, a kernel mount,
//!   `multi_device::fill`) read through the library file by file, the devices given in a
//!   shuffled order, and `devices()` / `chunk_usage()` equal to the chunk tree as progs
//!   dumps it (profiles, stripes, stripe sizes, dev bytes_used, block group use);
//! - writes: oleo writes hundreds of MiB (files, overwrites, deletes, a directory tree,
//!   xattrs) into kernel-made sets until it allocates data and metadata chunks of its own;
//!   `btrfs check --check-data-csum` is clean, the kernel reads what oleo wrote, and each
//!   new chunk is what the kernel's btrfs_create_chunk would make in its place (profile,
//!   devices with the most room, stripe placement and size); the kernel's scrub finds a
//!   csum for every data block oleo wrote;
//! - self-heal: one copy of a data block (RAID1, RAID10, RAID1C3) or of tree blocks
//!   damaged on the raw image: a read-only open reads the right bytes and writes nothing, a
//!   writable one rewrites the bad data copy (progs finds no csum error after); sectors of
//!   one read bad in different copies, a RAID5 strip bad, a RAID6 strip bad with a device
//!   missing: read as the kernel reads them;
//! - degraded: members left out, refused without `degraded` (naming the devid), read with
//!   it (RAID1, RAID10 one and two short, RAID1C3 two, RAID1C4 three, RAID5 one, RAID6
//!   two), written with it (new chunks SINGLE on the device present), then mounted by the
//!   kernel degraded and whole, and scrubbed back;
//! - refusals: a device of another filesystem or none, the same image twice (also under
//!   another name), RAID5/6 read-write, too many devices missing for a writable degraded
//!   open (as the kernel refuses them).
//!
//! Needs root, loop devices, kernel btrfs and btrfs-progs (a skip elsewhere, a failure
//! under CI=true). `MD_TEST_LOG=1` echoes the engine's warnings and errors.

use oleo::{ChunkInfo, DeviceInfo, Filesystem, NewInode, OpenOptions, XattrSet};
use oleo_testkit::multi_device::{
    self as md, BG_DATA, BG_DUP, BG_METADATA, BG_RAID0, BG_RAID1, BG_RAID10, BG_RAID1C3,
    BG_RAID1C4, BG_RAID5, BG_RAID6, BG_SYSTEM, BLOCK,
};
use oleo_testkit::{require_root, Kind, TempDir};
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, Once};
use std::time::Instant;

const MIB: u64 = 1 << 20;
const PROFILE_MASK: u64 =
    BG_RAID0 | BG_RAID1 | BG_DUP | BG_RAID10 | BG_RAID5 | BG_RAID6 | BG_RAID1C3 | BG_RAID1C4;
const TYPE_MASK: u64 = BG_DATA | BG_SYSTEM | BG_METADATA;

// ---- the engine's log, per thread --------------------------------------------------------

/// Keeps the engine's warnings and errors with the thread that logged them, so that a test
/// can see which copies a read of its own tried (tests run in parallel threads).
struct Capture;

static LOGS: Mutex<Vec<(std::thread::ThreadId, String)>> = Mutex::new(Vec::new());

impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, r: &log::Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let line = format!("{}: {}", r.level(), r.args());
        if std::env::var_os("MD_TEST_LOG").is_some() {
            eprintln!("[{:?}] {line}", std::thread::current().id());
        }
        LOGS.lock()
            .unwrap()
            .push((std::thread::current().id(), line));
    }
    fn flush(&self) {}
}

fn capture_logs() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if log::set_logger(&Capture).is_ok() {
            log::set_max_level(log::LevelFilter::Warn);
        }
    });
}

/// What this thread logged from now on: call `mark` first, `since` after.
fn log_mark() -> usize {
    capture_logs();
    LOGS.lock().unwrap().len()
}

fn logged_since(mark: usize) -> Vec<String> {
    let me = std::thread::current().id();
    LOGS.lock().unwrap()[mark..]
        .iter()
        .filter(|(t, _)| *t == me)
        .map(|(_, l)| l.clone())
        .collect()
}

// ---- sets --------------------------------------------------------------------------------

/// A set the kernel made and filled: the images (devid i+1 is `images[i]`), what
/// `md::fill` wrote, and the pattern files' extents (file offset, logical, length).
struct KernelFilled {
    tmp: TempDir,
    images: Vec<PathBuf>,
    manifest: md::Manifest,
    extents: BTreeMap<String, Vec<(u64, u64, u64)>>,
    what: String,
}

impl KernelFilled {
    fn mnt(&self) -> PathBuf {
        self.tmp.subdir("mnt").unwrap()
    }
}

/// mkfs.btrfs `-d data -m meta` over `ndevs` sparse images of `size_mb` MiB, a kernel
/// mount, `md::fill`, unmount. None (after a skip message) without root.
fn kernel_filled(
    label: &str,
    ndevs: usize,
    size_mb: u64,
    data: &str,
    meta: &str,
    seed: u64,
) -> Option<KernelFilled> {
    let what = format!("{data} data, {meta} metadata on {ndevs} devices");
    if !require_root(&format!("multi_device {label} ({what})")) {
        return None;
    }
    capture_logs();
    let tmp = TempDir::new(&format!("md-{label}")).unwrap();
    let images = md::mkfs_set(tmp.path(), label, ndevs, size_mb * MIB, data, meta)
        .unwrap_or_else(|e| panic!("{what}: mkfs.btrfs: {e}"));
    let mnt = tmp.subdir("mnt").unwrap();
    let set = md::KernelSet::mount(&images, &[], &mnt, &["rw", "noatime"])
        .unwrap_or_else(|e| panic!("{what}: kernel mount: {e}"));
    let manifest = md::fill(set.root(), seed).unwrap_or_else(|e| panic!("{what}: fill: {e}"));
    let mut extents = BTreeMap::new();
    for name in md::PATTERN_FILES
        .iter()
        .map(|p| p.1)
        .chain([md::SPARSE_FILE.1])
    {
        let e = md::file_logical_extents(&set.root().join(name)).unwrap();
        extents.insert(name.to_string(), e);
    }
    set.unmount()
        .unwrap_or_else(|e| panic!("{what}: unmount: {e}"));
    Some(KernelFilled {
        tmp,
        images,
        manifest,
        extents,
        what,
    })
}

/// Opens `paths[0]` with the others as `devices`.
fn open_set(paths: &[PathBuf], degraded: bool, rw: bool) -> oleo::Result<Filesystem> {
    let (first, rest) = paths.split_first().expect("a path");
    let opts = OpenOptions {
        devices: rest.to_vec(),
        degraded,
        ..OpenOptions::default()
    };
    if rw {
        Filesystem::open_rw(first, opts)
    } else {
        Filesystem::open(first, opts)
    }
}

fn splitmix(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn random_bytes(s: &mut u64, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        out.extend_from_slice(&splitmix(s).to_le_bytes());
    }
    out.truncate(n);
    out
}

/// `images` in a seeded order whose first is never devid 1's image (the superblock then
/// comes from another member, and `devices` holds devid 1).
fn shuffled(images: &[PathBuf], seed: u64) -> Vec<PathBuf> {
    let mut v = images.to_vec();
    let mut s = seed;
    for i in (1..v.len()).rev() {
        let j = (splitmix(&mut s) % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    if v.len() > 1 && v[0] == images[0] {
        v.rotate_left(1);
    }
    v
}

/// The whole file at `rel` (from the opened subvolume's root), read 1 MiB at a time.
fn read_path(fs: &Filesystem, rel: &Path) -> Result<Vec<u8>, String> {
    let id = fs
        .resolve_path(fs.root(), rel.as_os_str().as_bytes())
        .map_err(|e| format!("resolve: {e}"))?;
    let size = fs.getattr(id).map_err(|e| format!("getattr: {e}"))?.size;
    let mut out = Vec::with_capacity(size as usize);
    while (out.len() as u64) < size {
        let chunk = fs
            .read(id, out.len() as u64, 1 << 20)
            .map_err(|e| format!("read at {}: {e}", out.len()))?;
        if chunk.is_empty() {
            return Err(format!("short read at {} of {size}", out.len()));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// Everything of `m` through the library: every regular file's contents
/// (`Manifest::check_with`), and each path's kind, symlink target and xattrs.
fn check_library(fs: &Filesystem, m: &md::Manifest, what: &str) -> Result<(), String> {
    let mut errors = Vec::new();
    let contents = m.check_with(|p| match read_path(fs, p) {
        Ok(d) => Some(d),
        Err(e) => {
            errors.push(format!("{}: {e}", p.display()));
            None
        }
    });
    let mut diffs: Vec<String> = contents.err().into_iter().collect();
    diffs.extend(errors);
    for (p, want) in &m.files {
        let d = p.display();
        let parent = p.parent().unwrap_or(Path::new(""));
        let dir = match fs.resolve_path(fs.root(), parent.as_os_str().as_bytes()) {
            Ok(d) => d,
            Err(e) => {
                diffs.push(format!("{d}: its directory: {e}"));
                continue;
            }
        };
        let id = match fs.lookup(dir, p.file_name().unwrap().as_bytes()) {
            Ok(id) => id,
            Err(e) => {
                diffs.push(format!("{d}: lookup: {e}"));
                continue;
            }
        };
        let attr = match fs.getattr(id) {
            Ok(a) => a,
            Err(e) => {
                diffs.push(format!("{d}: getattr: {e}"));
                continue;
            }
        };
        let kind = match attr.kind {
            oleo::FileKind::File => Kind::File,
            oleo::FileKind::Dir => Kind::Dir,
            oleo::FileKind::Symlink => Kind::Symlink,
            _ => Kind::Unknown,
        };
        if kind != want.kind {
            diffs.push(format!("{d}: kind {:?}, found {kind:?}", want.kind));
            continue;
        }
        if let Some(t) = &want.target {
            match fs.readlink(id) {
                Ok(got) if got == t.as_os_str().as_bytes() => {}
                Ok(got) => diffs.push(format!(
                    "{d}: symlink target {t:?}, found {:?}",
                    String::from_utf8_lossy(&got)
                )),
                Err(e) => diffs.push(format!("{d}: readlink: {e}")),
            }
        }
        let names = match fs.listxattr(id) {
            Ok(n) => n,
            Err(e) => {
                diffs.push(format!("{d}: listxattr: {e}"));
                continue;
            }
        };
        let mut got = BTreeMap::new();
        for n in names {
            match fs.getxattr(id, &n) {
                Ok(v) => {
                    got.insert(n, v);
                }
                Err(e) => diffs.push(format!("{d}: getxattr: {e}")),
            }
        }
        if got != want.xattrs {
            diffs.push(format!(
                "{d}: xattrs {:?}, found {:?}",
                want.xattrs
                    .keys()
                    .map(|k| String::from_utf8_lossy(k))
                    .collect::<Vec<_>>(),
                got.keys()
                    .map(|k| String::from_utf8_lossy(k))
                    .collect::<Vec<_>>()
            ));
        }
    }
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(format!("{what}: oleo reads differ:\n{}", diffs.join("\n")))
    }
}

fn sha256_file(p: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(p)
        .output()
        .expect("sha256sum");
    assert!(out.status.success(), "sha256sum {}", p.display());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

fn hashes(images: &[PathBuf]) -> Vec<String> {
    images.iter().map(|i| sha256_file(i)).collect()
}

// ---- layout ------------------------------------------------------------------------------

fn profile_bits(name: &str) -> u64 {
    match name {
        "single" => 0,
        "dup" => BG_DUP,
        "raid0" => BG_RAID0,
        "raid1" => BG_RAID1,
        "raid10" => BG_RAID10,
        "raid5" => BG_RAID5,
        "raid6" => BG_RAID6,
        "raid1c3" => BG_RAID1C3,
        "raid1c4" => BG_RAID1C4,
        _ => panic!("unknown profile {name}"),
    }
}

fn profile_name(flags: u64) -> String {
    let c = md::Chunk {
        logical: 0,
        length: 0,
        flags,
        stripes: Vec::new(),
        stripe_len: 0,
        sub_stripes: 1,
    };
    let ty = match flags & TYPE_MASK {
        BG_DATA => "DATA",
        BG_METADATA => "METADATA",
        BG_SYSTEM => "SYSTEM",
        _ => "MIXED",
    };
    format!("{ty}|{}", c.profile())
}

/// Bytes each stripe of a chunk holds (a dev extent's length).
fn stripe_size(flags: u64, length: u64, nstripes: usize) -> u64 {
    let n = nstripes as u64;
    let data_stripes = match flags & PROFILE_MASK {
        BG_RAID0 => n,
        BG_RAID10 => n / 2,
        BG_RAID5 => n - 1,
        BG_RAID6 => n - 2,
        _ => 1,
    };
    length / data_stripes.max(1)
}

/// (logical -> used) of every block group, from `dump-tree -t extent` of the whole set.
fn kernel_block_group_use(images: &[PathBuf]) -> BTreeMap<u64, u64> {
    let out = Command::new("btrfs")
        .args(["inspect-internal", "dump-tree", "-t", "extent", "--noscan"])
        .args(images)
        .output()
        .expect("btrfs inspect-internal dump-tree");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut map = BTreeMap::new();
    let mut cur = None;
    for line in text.lines() {
        if let Some(at) = line.find(" BLOCK_GROUP_ITEM ") {
            let key = &line[..at];
            cur = key
                .rsplit('(')
                .next()
                .and_then(|s| s.trim().parse::<u64>().ok());
        } else if let Some(rest) = line.trim().strip_prefix("block group used ") {
            if let (Some(l), Some(u)) = (
                cur.take(),
                rest.split_whitespace().next().and_then(|s| s.parse().ok()),
            ) {
                map.insert(l, u);
            }
        }
    }
    map
}

/// `devices()` and `chunk_usage()` of an open set equal what progs reads from the images:
/// the same chunks (logical, length, type and profile, stripes in order), stripe sizes,
/// block group use, and per devid the path it was given as, its size and the bytes its
/// stripes cover. `given` are the paths oleo opened, `missing` the images left out.
fn check_layout(fs: &Filesystem, images: &[PathBuf], given: &[PathBuf], what: &str) {
    let kernel = md::chunk_map_all(images).unwrap_or_else(|e| panic!("{what}: chunk map: {e}"));
    let ours = fs.chunk_usage().expect("chunk_usage");
    let k: Vec<_> = kernel
        .iter()
        .map(|c| {
            (
                c.logical,
                c.length,
                profile_name(c.flags),
                c.stripes.clone(),
            )
        })
        .collect();
    let o: Vec<_> = ours
        .iter()
        .map(|c| {
            (
                c.logical,
                c.length,
                profile_name(c.flags),
                c.stripes.clone(),
            )
        })
        .collect();
    assert_eq!(
        o, k,
        "{what}: chunk_usage() (left) differs from dump-tree -t chunk (right)"
    );
    let used = kernel_block_group_use(images);
    for c in &ours {
        assert_eq!(
            c.stripe_size,
            stripe_size(c.flags, c.length, c.stripes.len()),
            "{what}: stripe_size of chunk {} ({})",
            c.logical,
            profile_name(c.flags)
        );
        assert_eq!(
            Some(&c.used),
            used.get(&c.logical),
            "{what}: used of block group {} ({}): oleo vs the extent tree",
            c.logical,
            profile_name(c.flags)
        );
    }
    let devs = fs.devices().expect("devices");
    let mut want = BTreeMap::new();
    for img in images {
        let devid = md::devid_of(img).unwrap();
        let path = given.iter().find(|g| *g == img).cloned();
        let size = std::fs::metadata(img).unwrap().len();
        let bytes: u64 = kernel
            .iter()
            .map(|c| {
                let n = c.stripes.iter().filter(|s| s.0 == devid).count() as u64;
                n * stripe_size(c.flags, c.length, c.stripes.len())
            })
            .sum();
        want.insert(devid, (path, size, bytes));
    }
    let got: BTreeMap<u64, (Option<PathBuf>, u64, u64)> = devs
        .iter()
        .map(|d| (d.devid, (d.path.clone(), d.total_bytes, d.bytes_used)))
        .collect();
    assert_eq!(
        got, want,
        "{what}: devices() (left) vs the images (right): devid -> (path, total_bytes, bytes_used)"
    );
}

/// A manifest entry for a regular file, a directory or a symlink that oleo wrote.
fn entry(kind: Kind, data: Vec<u8>, target: Option<&str>) -> md::Entry {
    md::Entry {
        kind,
        data,
        target: target.map(PathBuf::from),
        xattrs: BTreeMap::new(),
        hard_link_of: None,
    }
}

/// `a` and `b` together (the paths must not overlap), sorted.
fn merged(a: &md::Manifest, b: &[(PathBuf, md::Entry)]) -> md::Manifest {
    let mut files = a.files.clone();
    files.extend(b.iter().cloned());
    files.sort_by(|x, y| x.0.cmp(&y.0));
    md::Manifest { files }
}

// ---- 1. reads of every profile -----------------------------------------------------------

fn reads_every_profile(data: &str, meta: &str, ndevs: usize, seed: u64) {
    let label = format!("read-{data}-{meta}-{ndevs}");
    let Some(k) = kernel_filled(&label, ndevs, 256, data, meta, seed) else {
        return;
    };
    let started = Instant::now();
    for (round, order) in [
        shuffled(&k.images, seed),
        shuffled(&k.images, seed ^ 0xfeed),
    ]
    .into_iter()
    .enumerate()
    {
        let what = format!("{} (devices given as {order:?})", k.what);
        let fs =
            open_set(&order, false, false).unwrap_or_else(|e| panic!("{what}: open failed: {e}"));
        check_library(&fs, &k.manifest, &what).unwrap_or_else(|e| panic!("{e}"));
        if round == 0 {
            check_layout(&fs, &k.images, &order, &what);
            // The chunks have the profiles mkfs was asked for (system follows metadata).
            for c in fs.chunk_usage().unwrap() {
                let want = if c.flags & BG_DATA != 0 {
                    profile_bits(data)
                } else {
                    profile_bits(meta)
                };
                assert_eq!(
                    c.flags & PROFILE_MASK,
                    want,
                    "{what}: chunk {} is {}",
                    c.logical,
                    profile_name(c.flags)
                );
                let devids: BTreeSet<u64> = c.stripes.iter().map(|s| s.0).collect();
                if c.flags & BG_DUP == 0 {
                    assert_eq!(
                        devids.len(),
                        c.stripes.len(),
                        "{what}: chunk {} ({}) has two stripes on one device: {:?}",
                        c.logical,
                        profile_name(c.flags),
                        c.stripes
                    );
                }
            }
        }
    }
    eprintln!(
        "{}: oleo read everything in {:?}",
        k.what,
        started.elapsed()
    );
}

#[test]
fn read_raid0_data_raid1_metadata_x2() {
    reads_every_profile("raid0", "raid1", 2, 101);
}

#[test]
fn read_raid1_x2() {
    reads_every_profile("raid1", "raid1", 2, 102);
}

#[test]
fn read_raid10_x4() {
    reads_every_profile("raid10", "raid10", 4, 103);
}

#[test]
fn read_raid1c3_x3() {
    reads_every_profile("raid1c3", "raid1c3", 3, 104);
}

#[test]
fn read_raid1c4_x4() {
    reads_every_profile("raid1c4", "raid1c4", 4, 105);
}

#[test]
fn read_raid5_x3() {
    reads_every_profile("raid5", "raid5", 3, 106);
}

#[test]
fn read_raid6_x4() {
    reads_every_profile("raid6", "raid6", 4, 107);
}

#[test]
fn read_single_data_dup_metadata_x2() {
    reads_every_profile("single", "dup", 2, 108);
}

#[test]
fn read_raid0_x3() {
    reads_every_profile("raid0", "raid0", 3, 109);
}

// ---- 2. writes ---------------------------------------------------------------------------

/// What oleo wrote, as manifest entries under `oleo/`.
struct Written {
    entries: Vec<(PathBuf, md::Entry)>,
    bytes: u64,
}

/// A 4 KiB pattern block per block: a stripe written to the wrong place names itself.
fn pattern_data(id: u32, from_block: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + BLOCK);
    let mut i = from_block;
    while v.len() < len {
        v.extend(md::pattern_block(id, i));
        i += 1;
    }
    v.truncate(len);
    v
}

/// Writes through the library, under `oleo/`: `nbig` files of `big_mb` MiB (pattern data,
/// 1 MiB per write), a tree of directories, 120 small files per big one (inline and not,
/// some with xattrs), a symlink; then overwrites the middle of every third big file,
/// deletes every fourth, every seventh small file and a whole directory, with commits in
/// between. Returns what must be there.
fn oleo_writes(fs: &Filesystem, nbig: u32, big_mb: u64, seed: u64) -> Written {
    let mut rng = seed;
    let root = fs.root();
    let top = fs
        .mkdir(root, b"oleo", &NewInode::dir(0o755))
        .expect("mkdir oleo")
        .id;
    let mut files: BTreeMap<PathBuf, md::Entry> = BTreeMap::new();
    let mut dirs = vec![PathBuf::from("oleo")];
    let mkdir = |parent, name: &str| fs.mkdir(parent, name.as_bytes(), &NewInode::dir(0o755));
    let big = mkdir(top, "big").unwrap().id;
    dirs.push("oleo/big".into());
    let mut deep = top;
    let mut deep_path = PathBuf::from("oleo");
    for name in ["tree", "a", "b", "c", "d"] {
        deep = mkdir(deep, name).unwrap().id;
        deep_path.push(name);
        dirs.push(deep_path.clone());
    }
    let gone = mkdir(top, "gone").unwrap().id;
    let mut small_dirs = Vec::new();
    for i in 0..6 {
        let name = format!("s{i}");
        small_dirs.push((
            mkdir(top, &name).unwrap().id,
            PathBuf::from("oleo").join(&name),
        ));
        dirs.push(PathBuf::from("oleo").join(&name));
    }
    let mut bytes = 0u64;
    let mut nsmall = 0u32;
    let data_chunks = |fs: &Filesystem| {
        fs.chunk_usage()
            .unwrap()
            .iter()
            .filter(|c| c.flags & BG_DATA != 0)
            .count()
    };
    let had_data = data_chunks(fs);
    let mut nbig = nbig;
    let mut b = 0;
    while b < nbig {
        // Until oleo made a data chunk of its own (the kernel's fill may have left a few
        // empty ones), and one more file after.
        if b + 1 == nbig && data_chunks(fs) == had_data {
            assert!(nbig < 60, "no new data chunk after {nbig} files");
            nbig += 1;
        }
        let name = format!("f{b:02}");
        let id = fs
            .mknod(big, name.as_bytes(), &NewInode::file(0o644))
            .unwrap()
            .id;
        let size = big_mb * MIB + (b as u64) * 4097; // some end mid-block
        let mut off = 0u64;
        while off < size {
            let n = (size - off).min(MIB) as usize;
            let chunk = pattern_data(100 + b, off / BLOCK as u64, n);
            let w = fs
                .write(id, off, &chunk)
                .unwrap_or_else(|e| panic!("write oleo/big/{name} at {off}: {e}"));
            assert_eq!(w, n);
            off += n as u64;
        }
        bytes += size;
        files.insert(
            PathBuf::from("oleo/big").join(&name),
            entry(Kind::File, pattern_data(100 + b, 0, size as usize), None),
        );
        for _ in 0..120 {
            let (dir, dpath) = &small_dirs[(nsmall as usize) % small_dirs.len()];
            let len = (splitmix(&mut rng) % 6000) as usize;
            let data = random_bytes(&mut rng, len);
            let name = format!("n{nsmall:05}");
            let id = fs
                .mknod(*dir, name.as_bytes(), &NewInode::file(0o600))
                .unwrap()
                .id;
            fs.write(id, 0, &data).unwrap();
            let mut e = entry(Kind::File, data, None);
            if nsmall.is_multiple_of(5) {
                let v = random_bytes(&mut rng, 300 + nsmall as usize % 2000);
                fs.setxattr(id, b"user.oleo", &v, XattrSet::Either).unwrap();
                e.xattrs.insert(b"user.oleo".to_vec(), v);
            }
            files.insert(dpath.join(&name), e);
            bytes += len as u64;
            nsmall += 1;
        }
        if b % 3 == 2 {
            fs.sync().expect("sync");
        }
        b += 1;
    }
    // Files in a directory that goes away.
    for i in 0..20 {
        let id = fs
            .mknod(gone, format!("g{i}").as_bytes(), &NewInode::file(0o644))
            .unwrap()
            .id;
        fs.write(id, 0, &random_bytes(&mut rng, 70_000)).unwrap();
    }
    let leaf_data = random_bytes(&mut rng, 10_000);
    let leaf = fs.mknod(deep, b"leaf", &NewInode::file(0o644)).unwrap().id;
    fs.write(leaf, 0, &leaf_data).unwrap();
    files.insert(deep_path.join("leaf"), entry(Kind::File, leaf_data, None));
    fs.symlink(top, b"link", b"big/f00", 0, 0).unwrap();
    files.insert(
        PathBuf::from("oleo/link"),
        entry(Kind::Symlink, Vec::new(), Some("big/f00")),
    );
    fs.sync().expect("sync");

    // Overwrites (copy-on-write: new extents) and deletes.
    for b in (0..nbig).step_by(3) {
        let p = PathBuf::from("oleo/big").join(format!("f{b:02}"));
        let id = fs.resolve_path(root, p.as_os_str().as_bytes()).unwrap();
        let at = (big_mb / 2) * MIB + 512; // not block aligned
        let new = pattern_data(500 + b, 0, (3 * MIB) as usize);
        fs.write(id, at, &new).unwrap();
        let e = files.get_mut(&p).unwrap();
        e.data[at as usize..at as usize + new.len()].copy_from_slice(&new);
        bytes += new.len() as u64;
    }
    for b in (1..nbig).step_by(4) {
        let name = format!("f{b:02}");
        fs.unlink(big, name.as_bytes()).unwrap();
        files.remove(&PathBuf::from("oleo/big").join(name));
    }
    for n in (0..nsmall).step_by(7) {
        let (dir, dpath) = &small_dirs[(n as usize) % small_dirs.len()];
        let name = format!("n{n:05}");
        fs.unlink(*dir, name.as_bytes()).unwrap();
        files.remove(&dpath.join(name));
    }
    for i in 0..20 {
        fs.unlink(gone, format!("g{i}").as_bytes()).unwrap();
    }
    fs.rmdir(top, b"gone").unwrap();
    fs.sync().expect("sync");

    // Metadata until oleo makes a metadata chunk: files with four xattrs of 14000 bytes,
    // each filling most of a leaf (the first metadata chunk mkfs makes is 5% of the set).
    let meta_chunks = |fs: &Filesystem| {
        fs.chunk_usage()
            .unwrap()
            .iter()
            .filter(|c| c.flags & BG_METADATA != 0)
            .count()
    };
    let had = meta_chunks(fs);
    let xdir = mkdir(top, "x").unwrap().id;
    dirs.push("oleo/x".into());
    let mut i = 0u32;
    while meta_chunks(fs) == had {
        assert!(i < 4000, "no new metadata chunk after {i} files of xattrs");
        for _ in 0..25 {
            let name = format!("x{i:05}");
            let id = fs
                .mknod(xdir, name.as_bytes(), &NewInode::file(0o644))
                .unwrap()
                .id;
            let mut e = entry(Kind::File, Vec::new(), None);
            for x in 0..4u32 {
                let key = format!("user.m{x}").into_bytes();
                let v = pattern_data(10_000 + x, i as u64, 14_000);
                fs.setxattr(id, &key, &v, XattrSet::Either)
                    .unwrap_or_else(|e| panic!("setxattr oleo/x/{name}: {e}"));
                e.xattrs.insert(key, v);
            }
            files.insert(PathBuf::from("oleo/x").join(&name), e);
            bytes += 4 * 14_000;
            i += 1;
        }
    }
    // And some more, into the new chunk.
    for j in 0..50u32 {
        let name = format!("y{j:05}");
        let id = fs
            .mknod(xdir, name.as_bytes(), &NewInode::file(0o644))
            .unwrap()
            .id;
        let v = pattern_data(20_000, j as u64, 14_000);
        fs.setxattr(id, b"user.y", &v, XattrSet::Either).unwrap();
        let mut e = entry(Kind::File, Vec::new(), None);
        e.xattrs.insert(b"user.y".to_vec(), v);
        files.insert(PathBuf::from("oleo/x").join(&name), e);
    }
    fs.sync().expect("sync");

    let mut entries: Vec<(PathBuf, md::Entry)> = files.into_iter().collect();
    entries.extend(
        dirs.into_iter()
            .map(|d| (d, entry(Kind::Dir, Vec::new(), None))),
    );
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    Written { entries, bytes }
}

/// What btrfs_create_chunk (volumes.c, gather_device_info) sees of one device before a
/// chunk: the largest hole (capped at `want`, as max_avail), where the hole it would use
/// starts (the first that fits `want`, else the largest), and the unallocated bytes.
#[derive(Debug, Clone, Copy)]
struct DevRoom {
    max_avail: u64,
    hole_start: u64,
    unallocated: u64,
}

fn dev_room(extents: &[(u64, u64)], total: u64, used: u64, want: u64) -> DevRoom {
    let mut ext = extents.to_vec();
    ext.sort_unstable();
    let mut cur = MIB; // BTRFS_DEVICE_RANGE_RESERVED
    let mut best = (cur, 0u64);
    let mut fit = None;
    for (s, e) in ext.into_iter().chain([(total, total)]) {
        if s > cur {
            let hole = s - cur;
            if hole >= want && fit.is_none() {
                fit = Some(cur);
            }
            if hole > best.1 {
                best = (cur, hole);
            }
        }
        cur = cur.max(e);
    }
    let (max_avail, hole_start) = match fit {
        Some(at) => (want, at),
        None => (best.1, best.0),
    };
    DevRoom {
        max_avail,
        hole_start,
        unallocated: total - used,
    }
}

/// The chunks oleo made (those not in `before`) are what the kernel's btrfs_create_chunk
/// would make in their place, replayed chunk by chunk in logical order from the state
/// before: the filesystem's profile for their type; the stripe count and distinct devices
/// the profile asks for (both DUP stripes on one device, back to back); devices picked by
/// the largest hole (capped at the stripe the type allows), then unallocated room (so for
/// RAID1 the two with the most room); each stripe at the start of its device's hole; the
/// stripe sized as decide_stripe_size_regular does. Dev extents never overlap, and
/// `devices()` ends where the replay does. `present`: the devices oleo could write.
fn check_new_chunks(
    before: &[ChunkInfo],
    devs_before: &[DeviceInfo],
    after: &[ChunkInfo],
    devs_after: &[DeviceInfo],
    (data, meta): (&str, &str),
    present: &[u64],
    what: &str,
) -> Vec<ChunkInfo> {
    let old: BTreeSet<u64> = before.iter().map(|c| c.logical).collect();
    let new: Vec<ChunkInfo> = after
        .iter()
        .filter(|c| !old.contains(&c.logical))
        .cloned()
        .collect();
    let describe = |c: &ChunkInfo| {
        format!(
            "chunk {} ({}, {} MiB, stripe {} bytes, stripes {:?})",
            c.logical,
            profile_name(c.flags),
            c.length / MIB,
            c.stripe_size,
            c.stripes
        )
    };
    let mut used: BTreeMap<u64, u64> = devs_before
        .iter()
        .map(|d| (d.devid, d.bytes_used))
        .collect();
    let total: BTreeMap<u64, u64> = devs_before
        .iter()
        .map(|d| (d.devid, d.total_bytes))
        .collect();
    let total_rw: u64 = present.iter().map(|d| total[d]).sum();
    for c in &new {
        let is_data = c.flags & BG_DATA != 0;
        let want = profile_bits(if is_data { data } else { meta });
        assert_eq!(
            c.flags & PROFILE_MASK,
            want,
            "{what}: oleo made {}; the filesystem's profile for it is {}",
            describe(c),
            if is_data { data } else { meta }
        );
        let devids: Vec<u64> = c.stripes.iter().map(|s| s.0).collect();
        let distinct: BTreeSet<u64> = devids.iter().copied().collect();
        let (want_stripes, want_devs) = match want {
            BG_DUP => (2, 1),
            BG_RAID1 => (2, 2),
            BG_RAID1C3 => (3, 3),
            BG_RAID1C4 => (4, 4),
            // As many as have room (all of them here), an even number for RAID10.
            BG_RAID0 => (present.len(), present.len()),
            BG_RAID10 => (present.len() / 2 * 2, present.len() / 2 * 2),
            _ => (1, 1),
        };
        assert_eq!(
            (c.stripes.len(), distinct.len()),
            (want_stripes, want_devs),
            "{what}: {}: (stripes, distinct devices)",
            describe(c)
        );
        for d in &distinct {
            assert!(
                present.contains(d),
                "{what}: {} has a stripe on devid {d}, which is not present",
                describe(c)
            );
        }
        // The kernel's view of each device just before this chunk.
        let dev_stripes = if want == BG_DUP { 2 } else { 1 };
        let type_max = if is_data {
            10 << 30
        } else if c.flags & BG_SYSTEM != 0 {
            32 * MIB
        } else if total_rw > 50 << 30 {
            1 << 30
        } else {
            256 * MIB
        };
        let max_stripe = type_max.min(1 << 30);
        let max_chunk = type_max.min(total_rw / 10);
        let rooms: BTreeMap<u64, DevRoom> = present
            .iter()
            .map(|&d| {
                let ext: Vec<(u64, u64)> = after
                    .iter()
                    .filter(|o| o.logical < c.logical)
                    .flat_map(|o| {
                        o.stripes
                            .iter()
                            .filter(move |s| s.0 == d)
                            .map(move |s| (s.1, s.1 + o.stripe_size))
                    })
                    .collect();
                (
                    d,
                    dev_room(&ext, total[&d], used[&d], max_stripe * dev_stripes),
                )
            })
            .collect();
        let key = |d: u64| (rooms[&d].max_avail, rooms[&d].unallocated);
        for &u in present.iter().filter(|d| !distinct.contains(d)) {
            for &p in &distinct {
                assert!(
                    key(u) <= key(p),
                    "{what}: {} went to devids {distinct:?}, but devid {u} had more room \
                     (largest hole, unallocated) than devid {p}: {:?}",
                    describe(c),
                    rooms
                );
            }
        }
        // Each stripe at its device's hole, DUP's two back to back.
        for (i, &(d, phys)) in c.stripes.iter().enumerate() {
            let k = if want == BG_DUP { i as u64 } else { 0 };
            assert_eq!(
                phys,
                rooms[&d].hole_start + k * c.stripe_size,
                "{what}: {}: stripe {i} on devid {d} is not where the kernel puts it \
                 (the device's first hole that fits, else its largest): {:?}",
                describe(c),
                rooms[&d]
            );
        }
        // decide_stripe_size_regular.
        let n = c.stripes.len() as u64;
        let data_stripes = match want {
            BG_RAID0 => n,
            BG_RAID10 => n / 2,
            _ => 1,
        };
        let smallest = distinct.iter().map(|d| rooms[d].max_avail).min().unwrap();
        let mut stripe = smallest / dev_stripes;
        if stripe * data_stripes > max_chunk {
            stripe = stripe.min((max_chunk / data_stripes).next_multiple_of(16 * MIB));
        }
        stripe = stripe.min(1 << 30) / (64 << 10) * (64 << 10);
        assert_eq!(
            (c.stripe_size, c.length),
            (stripe, stripe * data_stripes),
            "{what}: {}: (stripe size, length) differ from the kernel's sizing \
             (max chunk {max_chunk}, rooms {rooms:?})",
            describe(c)
        );
        for &d in &devids {
            *used.get_mut(&d).unwrap() += c.stripe_size;
        }
    }
    // The replay ends where oleo's DEV_ITEMs say.
    for d in devs_after {
        assert_eq!(
            Some(&d.bytes_used),
            used.get(&d.devid),
            "{what}: devid {} bytes_used after oleo's chunks",
            d.devid
        );
    }
    // Dev extents: inside the device, past the first MiB, never overlapping.
    let mut per_dev: BTreeMap<u64, Vec<(u64, u64, u64)>> = BTreeMap::new();
    for c in after {
        for &(d, p) in &c.stripes {
            per_dev
                .entry(d)
                .or_default()
                .push((p, p + c.stripe_size, c.logical));
        }
    }
    for (d, mut v) in per_dev {
        v.sort_unstable();
        assert!(v[0].0 >= MIB, "{what}: devid {d}: dev extent at {}", v[0].0);
        assert!(
            v.last().unwrap().1 <= total[&d],
            "{what}: devid {d}: dev extent past the device end: {:?}",
            v.last()
        );
        for w in v.windows(2) {
            assert!(
                w[0].1 <= w[1].0,
                "{what}: devid {d}: dev extents of chunks {} and {} overlap: {:?} {:?}",
                w[0].2,
                w[1].2,
                w[0],
                w[1]
            );
        }
    }
    new
}

/// A short list of chunks for messages.
fn chunk_list(chunks: &[ChunkInfo]) -> Vec<String> {
    chunks
        .iter()
        .map(|c| {
            format!(
                "{} {} MiB on {:?}",
                profile_name(c.flags),
                c.length / MIB,
                c.stripes.iter().map(|s| s.0).collect::<Vec<_>>()
            )
        })
        .collect()
}

fn writes(data: &str, meta: &str, ndevs: usize, nbig: u32, seed: u64) {
    let label = format!("write-{data}-{meta}-{ndevs}");
    let Some(k) = kernel_filled(&label, ndevs, 512, data, meta, seed) else {
        return;
    };
    let what = k.what.clone();
    let all: Vec<u64> = (1..=ndevs as u64).collect();
    let (before, devs_before) = {
        let fs = open_set(&k.images, false, false).unwrap();
        (fs.chunk_usage().unwrap(), fs.devices().unwrap())
    };
    eprintln!("{what}: before oleo: {:?}", chunk_list(&before));
    let started = Instant::now();
    let order = shuffled(&k.images, seed);
    let fs = open_set(&order, false, true)
        .unwrap_or_else(|e| panic!("{what}: read-write open failed: {e}"));
    let written = oleo_writes(&fs, nbig, 24, seed);
    fs.close()
        .unwrap_or_else(|e| panic!("{what}: close (final commit) failed: {e}"));
    eprintln!(
        "{what}: oleo wrote {} MiB in {:?}",
        written.bytes / MIB,
        started.elapsed()
    );
    let expect = merged(&k.manifest, &written.entries);

    let fs = open_set(&shuffled(&k.images, seed + 1), false, false).unwrap();
    check_library(&fs, &expect, &format!("{what}, after oleo's writes"))
        .unwrap_or_else(|e| panic!("{e}"));
    let after = fs.chunk_usage().unwrap();
    let devs_after = fs.devices().unwrap();
    let new = check_new_chunks(
        &before,
        &devs_before,
        &after,
        &devs_after,
        (data, meta),
        &all,
        &what,
    );
    check_layout(&fs, &k.images, &shuffled(&k.images, seed + 1), &what);
    drop(fs);
    let kinds = chunk_list(&new);
    assert!(
        new.iter().any(|c| c.flags & BG_DATA != 0),
        "{what}: oleo made no data chunk (new: {kinds:?})"
    );
    assert!(
        new.iter().any(|c| c.flags & BG_METADATA != 0),
        "{what}: oleo made no metadata chunk (new: {kinds:?})"
    );
    eprintln!("{what}: oleo made chunks {kinds:?}");

    let check = md::offline_check(&k.images).unwrap();
    assert!(
        check.clean,
        "{what}: btrfs check --check-data-csum after oleo's writes:\n{}",
        check.output
    );
    let set = md::KernelSet::mount(&k.images, &[], &k.mnt(), &["ro", "noatime"])
        .unwrap_or_else(|e| panic!("{what}: the kernel cannot mount oleo's writes: {e}"));
    expect
        .check_dir(set.root())
        .unwrap_or_else(|e| panic!("{what}: the kernel reads differ from what oleo wrote:\n{e}"));
    set.unmount().unwrap();
    eprintln!("{what}: write test done in {:?}", started.elapsed());
}

#[test]
fn write_raid1_x2() {
    writes("raid1", "raid1", 2, 8, 201);
}

#[test]
fn write_raid10_x4() {
    writes("raid10", "raid10", 4, 8, 202);
}

#[test]
fn write_raid1c3_x3() {
    writes("raid1c3", "raid1c3", 3, 8, 203);
}

#[test]
fn write_raid0_data_raid1_metadata_x3() {
    writes("raid0", "raid1", 3, 8, 204);
}

#[test]
fn write_single_data_dup_metadata_x2() {
    writes("single", "dup", 2, 8, 205);
}

#[test]
fn read_raid1_data_raid1c3_metadata_x4() {
    // RAID1 on four devices: each chunk on two of them.
    reads_every_profile("raid1", "raid1c3", 4, 110);
}

#[test]
fn read_raid5_x2() {
    // The smallest RAID5: one data strip and its parity (a mirror in effect).
    reads_every_profile("raid5", "raid1", 2, 111);
}

#[test]
fn read_raid6_x3() {
    // The smallest RAID6: one data strip, P and Q.
    reads_every_profile("raid6", "raid6", 3, 112);
}

#[test]
fn read_dup_data_raid10_metadata_x4() {
    reads_every_profile("dup", "raid10", 4, 113);
}

// ---- 3. self-heal ------------------------------------------------------------------------

/// The copy oleo tries first for a read starting at `logical` of a mirrored chunk, when it
/// reads copy by copy (`DiskIo::mirror_order` spreads reads over the copies by address).
/// Only a guess that makes damage likely to be met: the tests confirm in the log.
fn first_copy(logical: u64, copies: usize) -> usize {
    ((logical >> 20) % copies as u64) as usize
}

/// The logical address of file offset `off` (inside one of `extents`).
fn logical_at(extents: &[(u64, u64, u64)], off: u64) -> u64 {
    let &(fo, lo, _) = extents
        .iter()
        .find(|(fo, _, len)| (*fo..fo + len).contains(&off))
        .unwrap_or_else(|| panic!("no extent holds file offset {off}: {extents:?}"));
    lo + (off - fo)
}

/// `len` bytes of `rel` at `off`, read in one call (the read starts at `off`).
fn read_at(fs: &Filesystem, rel: &str, off: u64, len: u32) -> Result<Vec<u8>, String> {
    let id = fs
        .resolve_path(fs.root(), rel.as_bytes())
        .map_err(|e| format!("{rel}: {e}"))?;
    fs.read(id, off, len)
        .map_err(|e| format!("{rel}: read at {off}: {e}"))
}

/// Reads `rel` around file offset `off` (and the sector after it) in ways that start at
/// different places and have different lengths (small reads go copy by copy from one
/// chosen by address, large ones draw on every copy at once, then go copy by copy if a
/// sector is bad), each checked against `want`, until the thread's log shows a checksum
/// mismatch at `bad` in copy `copy`: the damaged copy was met (the library's counterpart
/// of `md::read_from_every_mirror`). False if no way met it.
fn read_until_met(
    fs: &Filesystem,
    rel: &str,
    want: &[u8],
    off: u64,
    bad: u64,
    copy: usize,
    what: &str,
) -> bool {
    let mark = log_mark();
    let k = 4096u64;
    // (how far before `off` to start, length): each covers both damaged sectors.
    let variants: &[(u64, u64)] = &[
        (0, 2 * k),
        (k, 3 * k),
        (64 * k / 4, 64 * k / 4 + 2 * k),
        (0, MIB),
        (MIB / 2, MIB),
        (MIB - 2 * k, MIB),
        (MIB + k, 2 * MIB),
        (2 * MIB - 2 * k, 3 * MIB),
        (3 * MIB, 4 * MIB),
        (4 * MIB + 12 * k, 5 * MIB),
    ];
    let needle = format!("mismatch at logical {bad} ");
    let in_copy = format!("in copy {copy}");
    for &(back, len) in variants {
        let from = off.saturating_sub(back);
        let len = len.min(want.len() as u64 - from);
        let got = read_at(fs, rel, from, len as u32)
            .unwrap_or_else(|e| panic!("{what}: {rel} at {from} (+{len}): {e}"));
        assert!(
            got[..] == want[from as usize..(from + len) as usize],
            "{what}: {rel} at {from} (+{len}) reads wrong bytes"
        );
        if logged_since(mark)
            .iter()
            .any(|l| l.contains(&needle) && l.contains(&in_copy))
        {
            return true;
        }
    }
    false
}

/// One copy of two sectors of a pattern file damaged on the raw image: a read-only open
/// reads the right bytes (also reads that meet the damaged copy) and writes nothing; a
/// read-write open whose read meets it rewrites the bad copy from a good one (progs finds
/// no csum error after, the kernel reads everything).
fn bad_data_copy_is_read_around_and_repaired(data: &str, ndevs: usize, ncopies: usize) {
    let label = format!("heal-{data}");
    let Some(k) = kernel_filled(&label, ndevs, 256, data, data, 11) else {
        return;
    };
    let what = &k.what;
    let chunks = md::chunk_map_all(&k.images).unwrap();
    let p3 = "patterns/p3";
    let want_p3 = k.manifest.get(p3).unwrap().data.clone();
    let target = 5 * MIB;
    let lx = logical_at(&k.extents[p3], target);
    let cps = md::copies(&chunks, lx);
    assert_eq!(cps.len(), ncopies, "{what}: copies of {lx}: {cps:?}");
    let slot = first_copy(lx, ncopies);
    let (devid, phys) = cps[slot];
    let img = md::image_of_devid(&k.images, devid).unwrap();
    let good = md::read_image(&img, phys, 2 * BLOCK).unwrap();
    assert_eq!(
        &good[..],
        &want_p3[target as usize..target as usize + 2 * BLOCK],
        "{what}: the copy on devid {devid} does not hold p3 at {target} before the damage"
    );
    md::overwrite(&img, phys, 2 * BLOCK, 0xAA).unwrap();
    let damaged = md::offline_check(&k.images).unwrap();
    assert_eq!(
        damaged.csum_mismatches,
        vec![(slot as u32 + 1, lx), (slot as u32 + 1, lx + BLOCK as u64)],
        "{what}: progs does not see the damage as planned:\n{}",
        damaged.output
    );
    let whatx = format!("{what}, copy {slot} (devid {devid}) of logical {lx} damaged");

    // Read-only: the right bytes, also from reads that met the bad copy; not a byte written.
    let before = hashes(&k.images);
    {
        let fs = open_set(&shuffled(&k.images, 3), false, false).unwrap();
        assert!(
            read_until_met(&fs, p3, &want_p3, target, lx, slot, &whatx),
            "{whatx}: no read met the damaged copy (read-only)"
        );
        check_library(&fs, &k.manifest, &format!("{whatx}, read-only"))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    assert_eq!(
        hashes(&k.images),
        before,
        "{whatx}: a read-only open changed the images"
    );

    // Read-write: the read that meets the bad copy rewrites it from the good one.
    {
        let fs = open_set(&shuffled(&k.images, 4), false, true).unwrap();
        assert!(
            read_until_met(&fs, p3, &want_p3, target, lx, slot, &whatx),
            "{whatx}: no read met the damaged copy (read-write)"
        );
        check_library(&fs, &k.manifest, &format!("{whatx}, read-write"))
            .unwrap_or_else(|e| panic!("{e}"));
        fs.close().unwrap();
    }
    let now = md::read_image(&img, phys, 2 * BLOCK).unwrap();
    assert!(
        now == good,
        "{whatx}: not repaired (physical {phys}) by a read-write open whose read met it \
         (first bytes now {:02x?})",
        &now[..16]
    );
    let check = md::offline_check(&k.images).unwrap();
    assert!(
        check.clean,
        "{whatx}: btrfs check after oleo's repair:\n{}",
        check.output
    );
    let set = md::KernelSet::mount(&k.images, &[], &k.mnt(), &["ro", "noatime"]).unwrap();
    k.manifest.check_dir(set.root()).unwrap();
    set.unmount().unwrap();
}

#[test]
fn raid1_bad_data_copy_is_read_around_and_repaired() {
    bad_data_copy_is_read_around_and_repaired("raid1", 2, 2);
}

#[test]
fn raid10_bad_data_copy_is_read_around_and_repaired() {
    bad_data_copy_is_read_around_and_repaired("raid10", 4, 2);
}

#[test]
fn raid1c3_bad_data_copy_is_read_around_and_repaired() {
    bad_data_copy_is_read_around_and_repaired("raid1c3", 3, 3);
}

/// Two neighbouring sectors of one read, each bad in a different copy: every sector still
/// has a good copy. The kernel checks and repairs sector by sector (btrfs_check_read_bio,
/// repair of each bad sector from the next mirror), so such a read succeeds there; a reader
/// that retries the whole range copy by copy fails with EIO.
#[test]
fn raid1_sectors_bad_in_different_copies_of_one_read() {
    let Some(k) = kernel_filled("heal-mixed", 2, 256, "raid1", "raid1", 12) else {
        return;
    };
    let what = &k.what;
    let chunks = md::chunk_map(&k.images[0]).unwrap();
    let p3 = "patterns/p3";
    let want_p3 = k.manifest.get(p3).unwrap().data.clone();
    let target = 12 * MIB;
    let lz = logical_at(&k.extents[p3], target);
    assert_eq!(
        logical_at(&k.extents[p3], target + BLOCK as u64),
        lz + BLOCK as u64,
        "{what}: p3 is not contiguous at {target}"
    );
    // Sector 0 bad in copy 0, sector 1 bad in copy 1.
    for (i, slot) in [(0u64, 0usize), (1, 1)] {
        let l = lz + i * BLOCK as u64;
        let (devid, phys) = md::copies(&chunks, l)[slot];
        let img = md::image_of_devid(&k.images, devid).unwrap();
        md::overwrite(&img, phys, BLOCK, 0xA0 + i as u8).unwrap();
    }
    let damaged = md::offline_check(&k.images).unwrap();
    assert_eq!(
        damaged.csum_mismatches,
        vec![(1, lz), (2, lz + BLOCK as u64)],
        "{}",
        damaged.output
    );
    let range = target as usize..(target + MIB) as usize;

    // The kernel reads it right whichever copy it starts from (read-only loop devices).
    let set = md::KernelSet::mount(&k.images, &[], &k.mnt(), &["ro", "noatime"]).unwrap();
    for (i, got) in md::read_from_every_mirror(&set.root().join(p3), 2)
        .unwrap()
        .iter()
        .enumerate()
    {
        assert!(
            *got == want_p3,
            "{what}: the kernel (read policy slot {i}) misreads p3: the test's premise fails"
        );
    }
    set.unmount().unwrap();

    let fs = open_set(&k.images, false, false).unwrap();
    let got = read_at(&fs, p3, target, MIB as u32);
    assert!(
        matches!(&got, Ok(d) if d[..] == want_p3[range.clone()]),
        "{what}: oleo cannot read p3 at {target} (1 MiB from logical {lz}) where sector {lz} is \
         bad in copy 0 and sector {} in copy 1, which the kernel reads: {}",
        lz + BLOCK as u64,
        match &got {
            Ok(_) => "wrong bytes".to_string(),
            Err(e) => e.clone(),
        }
    );
    check_library(&fs, &k.manifest, what).unwrap_or_else(|e| panic!("{e}"));
}

/// `(logical, level)` of every tree block of tree `tree`, from `dump-tree -t TREE`.
fn tree_blocks(images: &[PathBuf], tree: &str) -> Vec<(u64, u64)> {
    let out = Command::new("btrfs")
        .args(["inspect-internal", "dump-tree", "-t", tree, "--noscan"])
        .args(images)
        .output()
        .expect("dump-tree");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            match w.as_slice() {
                ["leaf", b, "items", ..] => Some((b.parse().ok()?, 0)),
                ["node", b, "level", lv, ..] => Some((b.parse().ok()?, lv.parse().ok()?)),
                _ => None,
            }
        })
        .collect()
}

#[test]
fn raid1_bad_tree_block_copy_is_read_around() {
    let Some(k) = kernel_filled("heal-meta", 2, 256, "raid1", "raid1", 13) else {
        return;
    };
    let what = &k.what;
    let chunks = md::chunk_map(&k.images[0]).unwrap();
    let blocks = tree_blocks(&k.images, "5");
    let leaves: Vec<u64> = blocks.iter().filter(|b| b.1 == 0).map(|b| b.0).collect();
    let nodes: Vec<u64> = blocks.iter().filter(|b| b.1 > 0).map(|b| b.0).collect();
    assert!(
        leaves.len() >= 3 && !nodes.is_empty(),
        "{what}: the fs tree is too small: {blocks:?}"
    );
    // The root node and leaves spread over the tree, one copy each: the copy oleo
    // likely reads first for half of them, the other copy for the rest (the log shows
    // which were met).
    let mut targets = vec![nodes[0]];
    let step = (leaves.len() / 8).max(1);
    targets.extend(leaves.iter().step_by(step).copied());
    targets.push(*leaves.last().unwrap());
    targets.sort_unstable();
    targets.dedup();
    for (i, &b) in targets.iter().enumerate() {
        let cps = md::copies(&chunks, b);
        assert_eq!(cps.len(), 2, "{what}: tree block {b}: {cps:?}");
        let (devid, phys) = cps[(first_copy(b, 2) + i) % 2];
        let img = md::image_of_devid(&k.images, devid).unwrap();
        md::overwrite(&img, phys, 4096, 0x5A).unwrap();
    }
    let before = hashes(&k.images);
    let mark = log_mark();
    {
        let fs = open_set(&shuffled(&k.images, 5), false, false).unwrap_or_else(|e| {
            panic!("{what}: open with tree blocks {targets:?} bad in one copy: {e}")
        });
        check_library(
            &fs,
            &k.manifest,
            &format!("{what}, tree blocks {targets:?} bad in one copy"),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }
    let logs = logged_since(mark);
    let met: Vec<u64> = targets
        .iter()
        .copied()
        .filter(|b| logs.iter().any(|l| l.contains(&format!("tree block {b}"))))
        .collect();
    assert!(
        !met.is_empty(),
        "{what}: oleo read all files without meeting a damaged copy of {targets:?}: the test \
         damaged the wrong copies; its log: {logs:#?}"
    );
    assert_eq!(
        hashes(&k.images),
        before,
        "{what}: a read-only open changed the images"
    );

    // A writable open still works from the good copies, and what it writes the kernel reads.
    let fs = open_set(&k.images, false, true).unwrap();
    check_library(&fs, &k.manifest, &format!("{what}, read-write"))
        .unwrap_or_else(|e| panic!("{e}"));
    let id = fs
        .mknod(fs.root(), b"after-damage", &NewInode::file(0o644))
        .unwrap()
        .id;
    fs.write(id, 0, b"written past bad tree block copies\n")
        .unwrap();
    fs.close().unwrap();
    let expect = merged(
        &k.manifest,
        &[(
            PathBuf::from("after-damage"),
            entry(
                Kind::File,
                b"written past bad tree block copies\n".to_vec(),
                None,
            ),
        )],
    );
    let set = md::KernelSet::mount(&k.images, &[], &k.mnt(), &["ro", "noatime"]).unwrap();
    expect
        .check_dir(set.root())
        .unwrap_or_else(|e| panic!("{what}: kernel: {e}"));
    set.unmount().unwrap();
}

// ---- 4. degraded -------------------------------------------------------------------------

/// The images at the indices of `present`.
fn subset(images: &[PathBuf], present: &[usize]) -> Vec<PathBuf> {
    present.iter().map(|&i| images[i].clone()).collect()
}

/// A refusal without `degraded` names each missing devid.
fn assert_refused_naming(images: &[PathBuf], present: &[usize], what: &str) {
    let missing: Vec<u64> = (0..images.len())
        .filter(|i| !present.contains(i))
        .map(|i| md::devid_of(&images[i]).unwrap())
        .collect();
    for rw in [false, true] {
        let err = match open_set(&subset(images, present), false, rw) {
            Ok(_) => {
                panic!("{what}: opened (rw {rw}) without devids {missing:?} and without degraded")
            }
            Err(e) => e.to_string(),
        };
        // The first missing one at least.
        let d = missing[0];
        assert!(
            err.contains(&format!("device {d} ")) || err.contains(&format!("devid {d}")),
            "{what}: the refusal (rw {rw}) does not name missing devid {d}: {err}"
        );
    }
}

#[test]
fn raid1_degraded_reads_writes_and_the_kernel_mounts_the_result() {
    let Some(k) = kernel_filled("degraded", 2, 512, "raid1", "raid1", 21) else {
        return;
    };
    let what = k.what.clone();
    for (present, missing) in [(0usize, 2u64), (1, 1)] {
        assert_refused_naming(&k.images, &[present], &what);
        let fs = open_set(&subset(&k.images, &[present]), true, false)
            .unwrap_or_else(|e| panic!("{what}: degraded open without devid {missing}: {e}"));
        check_library(
            &fs,
            &k.manifest,
            &format!("{what}, devid {missing} missing"),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let devs = fs.devices().unwrap();
        let paths: Vec<(u64, Option<PathBuf>)> =
            devs.iter().map(|d| (d.devid, d.path.clone())).collect();
        let want: Vec<(u64, Option<PathBuf>)> = (1..=2u64)
            .map(|d| (d, (d != missing).then(|| k.images[present].clone())))
            .collect();
        assert_eq!(
            paths, want,
            "{what}: devices() with devid {missing} missing"
        );
    }

    // Writes with devid 2 missing: new chunks are SINGLE, on devid 1.
    let one = subset(&k.images, &[0]);
    let (before, devs_before) = {
        let fs = open_set(&one, true, false).unwrap();
        (fs.chunk_usage().unwrap(), fs.devices().unwrap())
    };
    let fs = open_set(&one, true, true)
        .unwrap_or_else(|e| panic!("{what}: read-write degraded open: {e}"));
    // statfs counts what the allocator will make there (SINGLE on devid 1), not RAID1
    // chunks it cannot make: the FUSE space guard believes it, and took the disk for
    // full once the data chunks filled (ENOSPC for a copy that fits).
    let data_free: u64 = before
        .iter()
        .filter(|c| c.flags & BG_DATA != 0)
        .map(|c| c.length - c.used)
        .sum();
    let dev1 = devs_before.iter().find(|d| d.devid == 1).unwrap();
    let unallocated = dev1.total_bytes - dev1.bytes_used;
    let st = fs.statfs().unwrap();
    let avail = st.blocks_avail * u64::from(st.block_size);
    assert!(
        avail + (2 << 20) >= data_free + unallocated,
        "{what}: degraded statfs gives {avail} bytes available; the data chunks hold \
         {data_free} free and devid 1 {unallocated} unallocated"
    );
    let written = oleo_writes(&fs, 3, 24, 21);
    fs.close()
        .unwrap_or_else(|e| panic!("{what}: degraded close: {e}"));
    let expect = merged(&k.manifest, &written.entries);
    let fs = open_set(&one, true, false).unwrap();
    check_library(&fs, &expect, &format!("{what}, after degraded writes"))
        .unwrap_or_else(|e| panic!("{e}"));
    let new = check_new_chunks(
        &before,
        &devs_before,
        &fs.chunk_usage().unwrap(),
        &fs.devices().unwrap(),
        ("single", "single"),
        &[1],
        &format!("{what}, degraded (devid 2 missing)"),
    );
    drop(fs);
    let kinds = chunk_list(&new);
    eprintln!("{what}: degraded oleo made {kinds:?}");
    assert!(
        new.iter().any(|c| c.flags & BG_DATA != 0)
            && new.iter().any(|c| c.flags & BG_METADATA != 0),
        "{what}: degraded writes made no data or no metadata chunk: {kinds:?}"
    );

    // oleo with both devices: devid 2 holds stale copies now.
    let fs = open_set(&shuffled(&k.images, 9), false, false).unwrap();
    check_library(
        &fs,
        &expect,
        &format!("{what}, both devices after degraded writes"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    drop(fs);

    // The kernel: degraded as oleo left it, then whole, then a scrub puts devid 2 right.
    let set = md::KernelSet::mount(&k.images, &[true, false], &k.mnt(), &["ro", "degraded"])
        .unwrap_or_else(|e| panic!("{what}: the kernel cannot mount oleo's degraded writes: {e}"));
    expect
        .check_dir(set.root())
        .unwrap_or_else(|e| panic!("{what}: kernel, degraded: {e}"));
    set.unmount().unwrap();
    let set = md::KernelSet::mount(&k.images, &[], &k.mnt(), &["noatime"])
        .unwrap_or_else(|e| panic!("{what}: the kernel cannot mount both devices after: {e}"));
    expect
        .check_dir(set.root())
        .unwrap_or_else(|e| panic!("{what}: kernel, both devices: {e}"));
    let scrub = set.scrub(true).unwrap();
    assert_eq!(
        scrub.get("uncorrectable_errors"),
        0,
        "{what}: scrub after degraded writes: {scrub:?}"
    );
    // A data block scrub finds no csum for is neither checked nor repaired: its stale
    // copy on devid 2 stays (see kernel_scrub_verifies_every_block_oleo_wrote).
    assert_eq!(
        scrub.get("no_csum"),
        0,
        "{what}: the kernel's scrub found no csum for {} data blocks, so it left their \
         stale copies on devid 2 as they were: {scrub:?}",
        scrub.get("no_csum")
    );
    set.unmount().unwrap();
    let check = md::offline_check(&k.images).unwrap();
    assert!(
        check.clean,
        "{what}: btrfs check after the kernel's scrub:\n{}",
        check.output
    );
}

#[test]
fn raid10_degraded_reads() {
    let Some(k) = kernel_filled("degraded10", 4, 256, "raid10", "raid10", 22) else {
        return;
    };
    for missing in 0..4 {
        let present: Vec<usize> = (0..4).filter(|&i| i != missing).collect();
        assert_refused_naming(&k.images, &present, &k.what);
        let what = format!("{}, devid {} missing", k.what, missing + 1);
        let fs = open_set(&subset(&k.images, &present), true, false)
            .unwrap_or_else(|e| panic!("{what}: degraded open: {e}"));
        check_library(&fs, &k.manifest, &what).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Every `k`-subset of `0..n` left out.
fn left_out(n: usize, k: usize) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    for mask in 0u32..(1 << n) {
        if mask.count_ones() as usize == k {
            out.push((0..n).filter(|i| mask & (1 << i) != 0).collect());
        }
    }
    out
}

/// Every way of leaving `lost` of the `ndevs` members out: refused without `degraded`
/// (naming a missing devid), every file read with it.
fn degraded_reads(data: &str, ndevs: usize, lost: usize, seed: u64) {
    let label = format!("degraded-{data}");
    let Some(k) = kernel_filled(&label, ndevs, 256, data, data, seed) else {
        return;
    };
    for gone in left_out(ndevs, lost) {
        let present: Vec<usize> = (0..ndevs).filter(|i| !gone.contains(i)).collect();
        let what = format!(
            "{}, devids {:?} missing",
            k.what,
            gone.iter().map(|i| i + 1).collect::<Vec<_>>()
        );
        assert_refused_naming(&k.images, &present, &what);
        let fs = open_set(&shuffled(&subset(&k.images, &present), seed), true, false)
            .unwrap_or_else(|e| panic!("{what}: degraded open: {e}"));
        check_library(&fs, &k.manifest, &what).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn raid5_one_missing_reads() {
    degraded_reads("raid5", 3, 1, 23);
}

#[test]
fn raid6_two_missing_reads() {
    degraded_reads("raid6", 4, 2, 24);
}

#[test]
fn raid1c3_two_missing_reads() {
    degraded_reads("raid1c3", 3, 2, 30);
}

#[test]
fn raid1c4_three_missing_reads() {
    degraded_reads("raid1c4", 4, 3, 32);
}

/// One 64 KiB data strip of a pattern file overwritten on its device, every device present:
/// the kernel reads the file right (each bad sector rebuilt from the row's other strip and
/// P). oleo must too: the strip alone, and the whole file in 1 MiB reads, which also cover
/// the strip's row partner (good on disk, but its rebuild would use the bad strip).
/// Nothing is written back (RAID5/6 repair is not implemented).
#[test]
fn raid5_bad_data_strip_is_rebuilt() {
    let Some(k) = kernel_filled("raid5-strip", 3, 256, "raid5", "raid5", 25) else {
        return;
    };
    let what = &k.what;
    let chunks = md::chunk_map_all(&k.images).unwrap();
    let p3 = "patterns/p3";
    let want_p3 = k.manifest.get(p3).unwrap().data.clone();
    let ext = &k.extents[p3];
    // The strip holding p3 at 6 MiB, from its first byte.
    let lx = logical_at(ext, 6 * MIB);
    let c = chunks.iter().find(|c| c.contains(lx)).unwrap();
    let strip = 64 * 1024u64;
    let strip_start = lx - (lx - c.logical) % strip;
    let off = 6 * MIB - (lx - strip_start);
    assert_eq!(
        logical_at(ext, off),
        strip_start,
        "{what}: p3 not contiguous"
    );
    assert_eq!(
        logical_at(ext, off + strip - 1),
        strip_start + strip - 1,
        "{what}: p3 not contiguous"
    );
    let cps = md::copies(&chunks, strip_start);
    let (devid, phys) = cps[0];
    assert_eq!(
        md::copies(&chunks, strip_start + strip - BLOCK as u64)[0],
        (devid, phys + strip - BLOCK as u64),
        "{what}: the strip is not on one device"
    );
    let img = md::image_of_devid(&k.images, devid).unwrap();
    md::overwrite(&img, phys, strip as usize, 0xEE).unwrap();
    let whatx = format!(
        "{what}: the strip of p3 at {off} (logical {strip_start}) overwritten on devid {devid}"
    );

    let set = md::KernelSet::mount(&k.images, &[], &k.mnt(), &["ro", "noatime"]).unwrap();
    let kernel = std::fs::read(set.root().join(p3)).map(|d| d == want_p3);
    set.unmount().unwrap();
    assert!(
        matches!(kernel, Ok(true)),
        "{whatx}: the kernel cannot read p3 ({kernel:?}): the test's premise fails"
    );

    let before = hashes(&k.images);
    let fs = open_set(&shuffled(&k.images, 8), false, false).unwrap();
    let got = read_at(&fs, p3, off, strip as u32);
    assert!(
        matches!(&got, Ok(d) if d[..] == want_p3[off as usize..(off + strip) as usize]),
        "{whatx}: reading just the strip: {:?}",
        got.as_ref().map(|_| "wrong bytes")
    );
    let got = read_at(&fs, p3, 6 * MIB - MIB / 2, MIB as u32);
    let range = (6 * MIB - MIB / 2) as usize..(6 * MIB + MIB / 2) as usize;
    assert!(
        matches!(&got, Ok(d) if d[..] == want_p3[range.clone()]),
        "{whatx}: a 1 MiB read around the strip (so also its row partner): {:?}",
        got.as_ref().map(|_| "wrong bytes")
    );
    check_library(&fs, &k.manifest, &whatx).unwrap_or_else(|e| panic!("{e}"));
    drop(fs);
    assert_eq!(
        hashes(&k.images),
        before,
        "{what}: the read changed the images"
    );
}

/// RAID6 with one device missing and, in the same rows, a data strip of a present device
/// bad: a block whose strip was on the missing device is rebuilt from P with the bad strip
/// (wrong), then from Q leaving the bad strip out. The kernel does it (checked first).
#[test]
fn raid6_missing_device_and_bad_strip_in_one_row() {
    let Some(k) = kernel_filled("raid6-row", 4, 256, "raid6", "raid6", 26) else {
        return;
    };
    let what = &k.what;
    let chunks = md::chunk_map_all(&k.images).unwrap();
    let p3 = "patterns/p3";
    let want_p3 = k.manifest.get(p3).unwrap().data.clone();
    let ext = &k.extents[p3];
    // A strip of p3 whose row partner (the other data strip of the row) holds p3 too.
    let target = 4 * MIB;
    let lx = logical_at(ext, target);
    let c = chunks.iter().find(|c| c.contains(lx)).unwrap();
    let strip = 64 * 1024;
    let nr = (lx - c.logical) / strip;
    let partner = c.logical + (nr ^ 1) * strip + (lx - c.logical) % strip;
    let (missing_devid, _) = md::copies(&chunks, lx)[0];
    let (bad_devid, bad_phys) = md::copies(&chunks, partner)[0];
    assert_ne!(missing_devid, bad_devid);
    let bad_img = md::image_of_devid(&k.images, bad_devid).unwrap();
    md::overwrite(&bad_img, bad_phys, 8 * BLOCK, 0x66).unwrap();
    let present: Vec<usize> = (0..4)
        .filter(|&i| md::devid_of(&k.images[i]).unwrap() != missing_devid)
        .collect();
    let mask: Vec<bool> = (0..4).map(|i| present.contains(&i)).collect();
    let whatx = format!(
        "{what}: devid {missing_devid} missing, the row partner of logical {lx} (logical \
         {partner}) bad on devid {bad_devid}"
    );
    let file_off_of = |l: u64| {
        ext.iter()
            .find(|(_, lo, len)| (*lo..lo + len).contains(&l))
            .map(|(fo, lo, _)| fo + (l - lo))
    };
    let set = md::KernelSet::mount(&k.images, &mask, &k.mnt(), &["ro", "degraded"]).unwrap();
    let kernel = std::fs::read(set.root().join(p3));
    set.unmount().unwrap();
    if !matches!(&kernel, Ok(d) if *d == want_p3) {
        eprintln!(
            "{whatx}: the kernel cannot read p3 either ({:?}); nothing to compare oleo with",
            kernel.map(|_| "wrong bytes")
        );
        return;
    }
    let fs = open_set(&subset(&k.images, &present), true, false).unwrap();
    for l in [lx, partner] {
        let off = file_off_of(l).expect("in p3");
        let got = read_at(&fs, p3, off, 8 * BLOCK as u32);
        assert!(
            matches!(&got, Ok(d) if d[..] == want_p3[off as usize..off as usize + 8 * BLOCK]),
            "{whatx}: p3 at {off} (logical {l}): {:?}",
            got.as_ref().map(|_| "wrong bytes")
        );
    }
    check_library(&fs, &k.manifest, &whatx).unwrap_or_else(|e| panic!("{e}"));
}

// ---- 5. refusals -------------------------------------------------------------------------

#[test]
fn refusals() {
    if !require_root("multi_device refusals") {
        return;
    }
    capture_logs();
    let tmp = TempDir::new("md-refuse").unwrap();
    let ours = md::mkfs_set(tmp.path(), "ours", 2, 256 * MIB, "raid1", "raid1").unwrap();
    let other = md::mkfs_set(tmp.path(), "other", 2, 256 * MIB, "raid1", "raid1").unwrap();

    // A device of another filesystem.
    for rw in [false, true] {
        let err = open_set(&[ours[0].clone(), other[1].clone()], false, rw)
            .err()
            .unwrap_or_else(|| panic!("a member of another filesystem accepted (rw {rw})"))
            .to_string();
        assert!(
            err.contains(other[1].to_str().unwrap()),
            "the refusal does not name {}: {err}",
            other[1].display()
        );
    }
    // A file that is no btrfs at all.
    let junk = tmp.join("junk.img");
    std::fs::write(&junk, vec![0u8; 4 << 20]).unwrap();
    let err = open_set(
        &[ours[0].clone(), ours[1].clone(), junk.clone()],
        false,
        false,
    )
    .err()
    .expect("a device without a superblock accepted")
    .to_string();
    assert!(err.contains("junk.img"), "{err}");

    // The same image twice, also under another name.
    let link = tmp.join("alias.img");
    std::os::unix::fs::symlink(&ours[0], &link).unwrap();
    for twice in [
        vec![ours[0].clone(), ours[0].clone()],
        vec![ours[0].clone(), ours[1].clone(), link.clone()],
    ] {
        for rw in [false, true] {
            let err = open_set(&twice, false, rw)
                .err()
                .unwrap_or_else(|| panic!("{twice:?} accepted (rw {rw})"))
                .to_string();
            assert!(
                err.contains("twice") || err.contains("same"),
                "{twice:?} (rw {rw}): the refusal does not say the device is given twice: {err}"
            );
        }
    }
    // Both given: fine.
    open_set(&[ours[1].clone(), ours[0].clone()], false, true)
        .unwrap()
        .close()
        .unwrap();

    // RAID5/6 are read-only.
    for (data, n) in [("raid5", 3), ("raid6", 4)] {
        let imgs = md::mkfs_set(tmp.path(), data, n, 256 * MIB, data, "raid1").unwrap();
        let err = open_set(&imgs, false, true)
            .err()
            .unwrap_or_else(|| panic!("{data} opened read-write"))
            .to_string();
        assert!(
            err.contains("RAID5/6") && err.contains("read"),
            "{data}: the refusal does not say RAID5/6 is read-only: {err}"
        );
        open_set(&imgs, false, false).unwrap_or_else(|e| panic!("{data}: read-only open: {e}"));
    }
}

/// SINGLE data on two devices, one missing: its chunks are gone. A writable degraded open
/// is refused (as the kernel refuses it: btrfs_check_rw_degradable); a read-only one reads
/// what is left and fails cleanly, never with wrong bytes, on what was on the lost device.
#[test]
fn single_data_device_missing_is_refused_read_write() {
    let Some(k) = kernel_filled("single-missing", 2, 256, "single", "raid1", 27) else {
        return;
    };
    let what = &k.what;
    let chunks = md::chunk_map(&k.images[0]).unwrap();
    // Leave out the device that holds the most used single data.
    let used = kernel_block_group_use(&k.images);
    let on = |devid: u64| -> u64 {
        chunks
            .iter()
            .filter(|c| c.flags & BG_DATA != 0 && c.stripes.iter().any(|s| s.0 == devid))
            .map(|c| used.get(&c.logical).copied().unwrap_or(0))
            .sum()
    };
    let gone_devid = if on(1) >= on(2) { 1 } else { 2 };
    assert!(on(gone_devid) > 0, "{what}: no data on either device?");
    let present = vec![if gone_devid == 1 { 1usize } else { 0 }];
    let what = format!(
        "{what}, devid {gone_devid} (with {} bytes of data) missing",
        on(gone_devid)
    );

    let err = open_set(&subset(&k.images, &present), true, true)
        .err()
        .unwrap_or_else(|| panic!("{what}: a writable degraded open was allowed"))
        .to_string();
    assert!(
        err.contains("chunk") || err.contains("missing"),
        "{what}: the refusal does not say why: {err}"
    );
    // The kernel refuses it too, and mounts it read-only.
    let mask: Vec<bool> = (0..2).map(|i| present.contains(&i)).collect();
    assert!(
        md::KernelSet::mount(&k.images, &mask, &k.mnt(), &["degraded"]).is_err(),
        "{what}: the kernel mounted it writable (the refusal is not the kernel's)"
    );
    let set = md::KernelSet::mount(&k.images, &mask, &k.mnt(), &["ro", "degraded"])
        .unwrap_or_else(|e| panic!("{what}: kernel read-only degraded mount: {e}"));
    set.unmount().unwrap();

    let fs = open_set(&subset(&k.images, &present), true, false)
        .unwrap_or_else(|e| panic!("{what}: read-only degraded open: {e}"));
    let mut lost = 0;
    for (p, e) in &k.manifest.files {
        if e.kind != Kind::File {
            continue;
        }
        match read_path(&fs, p) {
            Ok(d) => assert!(
                d == e.data,
                "{what}: {} reads wrong bytes instead of failing",
                p.display()
            ),
            Err(_) => lost += 1,
        }
    }
    assert!(
        lost > 0,
        "{what}: every file read, none was on devid {gone_devid}?"
    );
}

// ---- the kernel's scrub over what oleo wrote --------------------------------------------

/// Tree blocks whose unused space (a leaf's gap between its item headers and its item data,
/// a node's slots past its last key pointer) is not zero, of all the tree blocks
/// `dump-tree` lists, read from their first copy: (blocks, those with stale bytes).
fn tree_blocks_with_stale_free_space(images: &[PathBuf]) -> (usize, Vec<u64>) {
    let chunks = md::chunk_map_all(images).unwrap();
    let out = Command::new("btrfs")
        .args(["inspect-internal", "dump-tree", "--noscan"])
        .args(images)
        .output()
        .expect("dump-tree");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut blocks: BTreeSet<u64> = BTreeSet::new();
    for l in text.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        if let ["leaf" | "node", b, "items" | "level", ..] = w.as_slice() {
            if let Ok(b) = b.parse() {
                blocks.insert(b);
            }
        }
    }
    const HEADER: usize = 101;
    let mut stale = Vec::new();
    for &b in &blocks {
        let (devid, phys) = md::copies(&chunks, b)[0];
        let img = md::image_of_devid(images, devid).unwrap();
        let blk = md::read_image(&img, phys, 16384).unwrap();
        let nritems = u32::from_le_bytes(blk[0x60..0x64].try_into().unwrap()) as usize;
        let level = blk[0x64];
        let (from, to) = if level == 0 {
            let to = if nritems == 0 {
                blk.len()
            } else {
                // The last item's data offset (from the end of the header).
                let at = HEADER + (nritems - 1) * 25 + 17;
                HEADER + u32::from_le_bytes(blk[at..at + 4].try_into().unwrap()) as usize
            };
            (HEADER + nritems * 25, to)
        } else {
            (HEADER + nritems * 33, blk.len())
        };
        if from < to && to <= blk.len() && blk[from..to].iter().any(|&x| x != 0) {
            stale.push(b);
        }
    }
    (blocks.len(), stale)
}

/// The kernel's scrub checks every data block oleo wrote: it finds a csum for each
/// (`no_csum` 0, as for what the kernel writes itself) and every csum matches. The kernel
/// zeroes the unused space of every tree block it writes (prepare_eb_write: "set btree
/// blocks beyond nritems with 0 to avoid stale content"), and its scrub relies on that:
/// reusing its csum-tree path it reads the key one past a leaf's last item, and a stale
/// EXTENT_CSUM key there makes it skip the rest of that leaf's last csum item.
#[test]
fn kernel_scrub_verifies_every_block_oleo_wrote() {
    let Some(k) = kernel_filled("scrub", 2, 512, "raid1", "raid1", 31) else {
        return;
    };
    let what = k.what.clone();
    let (n, stale) = tree_blocks_with_stale_free_space(&k.images);
    assert!(
        stale.is_empty(),
        "{what}: the kernel left stale bytes in tree blocks {stale:?}"
    );
    let fs = open_set(&k.images, false, true).unwrap();
    let written = oleo_writes(&fs, 8, 24, 31);
    fs.close().unwrap();
    let expect = merged(&k.manifest, &written.entries);

    let set = md::KernelSet::mount(&k.images, &[], &k.mnt(), &["ro", "noatime"]).unwrap();
    expect.check_dir(set.root()).unwrap();
    let scrub = set.scrub(false).unwrap();
    set.unmount().unwrap();
    let (n2, stale) = tree_blocks_with_stale_free_space(&k.images);
    eprintln!(
        "{what}: scrub {scrub:?}; {} of {n2} tree blocks (kernel's: {n}) with stale free space",
        stale.len()
    );
    assert_eq!(
        (scrub.get("csum_errors"), scrub.get("no_csum")),
        (0, 0),
        "{what}: the kernel's scrub of oleo's writes: (csum_errors, no_csum) should be 0: \
         {scrub:?}; {} of the {n2} tree blocks have non-zero unused space (e.g. {:?})",
        stale.len(),
        &stale[..stale.len().min(8)]
    );
    assert!(
        stale.is_empty(),
        "{what}: {} of the {n2} tree blocks oleo left have non-zero unused space (the \
         kernel zeroes it in every block it writes): {:?}",
        stale.len(),
        &stale[..stale.len().min(8)]
    );
}

/// A kernel-filled RAID10 set on four devices and two of them, one of each mirror pair of
/// every chunk, to leave out (None: no such two).
fn raid10_pairwise_missing(label: &str, seed: u64) -> Option<(KernelFilled, Vec<usize>, String)> {
    let k = kernel_filled(label, 4, 256, "raid10", "raid10", seed)?;
    let chunks = md::chunk_map_all(&k.images).unwrap();
    let devid: Vec<u64> = k.images.iter().map(|i| md::devid_of(i).unwrap()).collect();
    let Some(gone) = left_out(4, 2).into_iter().find(|g| {
        let lost: Vec<u64> = g.iter().map(|&i| devid[i]).collect();
        chunks.iter().all(|c| {
            c.stripes
                .chunks(2)
                .all(|pair| pair.iter().any(|s| !lost.contains(&s.0)))
        })
    }) else {
        eprintln!(
            "{}: no two devices are in different pairs of every chunk",
            k.what
        );
        return None;
    };
    let present: Vec<usize> = (0..4).filter(|i| !gone.contains(i)).collect();
    let lost: Vec<u64> = gone.iter().map(|&i| devid[i]).collect();
    let what = format!("{}, devids {lost:?} missing (one of each pair)", k.what);
    Some((k, present, what))
}

/// RAID10 on four devices with two missing, one of each mirror pair of every chunk: every
/// block still has a copy. The kernel reads everything `ro,degraded` (each 64 KiB stripe
/// from the copy that is there); oleo opens it (its check_devices accepts it) and must read
/// everything too, also reads longer than a stripe (which need copy 0 of one stripe and
/// copy 1 of the next).
#[test]
fn raid10_two_missing_from_different_pairs_reads() {
    let Some((k, present, what)) = raid10_pairwise_missing("raid10-two", 28) else {
        return;
    };
    let mask: Vec<bool> = (0..4).map(|i| present.contains(&i)).collect();
    let set = md::KernelSet::mount(&k.images, &mask, &k.mnt(), &["ro", "degraded"])
        .unwrap_or_else(|e| panic!("{what}: kernel ro,degraded: {e}"));
    k.manifest
        .check_dir(set.root())
        .unwrap_or_else(|e| panic!("{what}: the kernel cannot read it all: {e}"));
    set.unmount().unwrap();
    let fs = open_set(&subset(&k.images, &present), true, false)
        .unwrap_or_else(|e| panic!("{what}: read-only degraded open: {e}"));
    // One stripe at a time works (each has a copy) ...
    let p1 = k.manifest.get("patterns/p1").unwrap().data.clone();
    let mut by_stripe = Vec::new();
    for off in (0..p1.len() as u64).step_by(64 << 10) {
        by_stripe.extend(read_at(&fs, "patterns/p1", off, 64 << 10).unwrap());
    }
    assert!(by_stripe == p1, "{what}: p1 read 64 KiB at a time differs");
    // ... and so must longer reads.
    check_library(&fs, &k.manifest, &what).unwrap_or_else(|e| panic!("{e}"));
}

/// The same set writable: the kernel refuses (btrfs_check_rw_degradable tolerates one
/// missing device per RAID10 chunk: "chunk ... missing 2 devices, max tolerance is 1 for
/// writable mount", whichever pairs they are in); so must oleo.
#[test]
fn raid10_two_missing_read_write_is_refused() {
    let Some((k, present, what)) = raid10_pairwise_missing("raid10-two-rw", 29) else {
        return;
    };
    let mask: Vec<bool> = (0..4).map(|i| present.contains(&i)).collect();
    assert!(
        md::KernelSet::mount(&k.images, &mask, &k.mnt(), &["degraded"]).is_err(),
        "{what}: the kernel mounted it writable: the test's premise fails"
    );
    if let Ok(fs) = open_set(&subset(&k.images, &present), true, true) {
        drop(fs);
        panic!(
            "{what}: oleo opened it read-write; the kernel refuses a writable mount with more \
             than one device of a RAID10 chunk missing"
        );
    }
}
