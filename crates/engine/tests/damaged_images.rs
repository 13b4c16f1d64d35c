//! Images the tests damage themselves. Two small filesystems are built once with mkfs.btrfs
//! and the kernel (4 KiB nodes + crc32c, and 16 KiB nodes + xxhash + no-holes off; both DUP
//! metadata and single data), with the same seeded content (inline, regular,
//! compressed (zlib/lzo/zstd, inline too), prealloc, sparse, nodatasum, xattrs, links,
//! special files, a subvolume and a snapshot, a directory of a few hundred entries), then
//! copies are damaged:
//!
//! * tree blocks: random bit flips in both copies (checksum now wrong), in one copy (the other
//!   copy must be read: the walk equals the pristine one), a whole block zeroed in one copy;
//! * hostile tree blocks whose checksum is recomputed after the damage, so that the tree
//!   checker and the item parsers see it: targeted item fields set to boundary values, node
//!   pointers turned into cycles, random structured mutations;
//! * the superblock: the primary damaged (a mirror is used), all copies damaged (refused),
//!   hostile fields with a valid checksum;
//! * file data: a flipped bit is `Error::DataChecksum` (EIO) naming inode, offset and logical
//!   address, logged, while the rest of the file and every other file read fine;
//! * the image truncated at many sizes.
//!
//! Every case runs on its own thread with a time bound: no panic, no hang, and the specific
//! expectation where there is one. Needs root, loop devices, kernel btrfs and btrfs-progs:
//! without them it prints `SKIP: ...` (and fails under CI=true).
//! `OLEO_TEST_SEED=N` replays a run (the seed is printed).

mod common;

use common::{bounded, check_image, walk, ImageResult, Limits, Outcome, Rng, Walk, EIO};
use oleo::format::items::{block_group, ChunkItem};
use oleo::format::key::item;
use oleo::format::tree_block::{HEADER_SIZE, ITEM_SIZE, KEY_PTR_SIZE};
use oleo::format::{CsumType, TreeBlock};
use oleo::{Error, Filesystem, InodeId, OpenOptions};
use oleo_testkit::{KernelMount, TempDir};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(20);
const IMAGE_SIZE: u64 = 256 << 20;
const SUPER: u64 = 65536;
const SUPER_MIRROR1: u64 = 64 << 20;

// ---------------------------------------------------------------------------------------------
// Log capture: oleo logs through `log`; lines are kept per thread so that concurrent tests
// (and their identical block addresses) do not see each other's lines.

struct Capture;

static LOGS: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            let t = std::thread::current().name().unwrap_or("").to_string();
            LOGS.lock()
                .unwrap()
                .push((t, format!("{} {}", r.level(), r.args())));
        }
    }
    fn flush(&self) {}
}

fn init_logs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = log::set_logger(&Capture);
        log::set_max_level(log::LevelFilter::Warn);
    });
}

/// Removes and returns the lines logged by the `bounded` run called `name`.
fn take_logs(name: &str) -> Vec<String> {
    let thread = format!("bounded-{name}");
    let mut all = LOGS.lock().unwrap();
    let (mine, rest): (Vec<_>, Vec<_>) = all.drain(..).partition(|(t, _)| *t == thread);
    *all = rest;
    mine.into_iter().map(|(_, l)| l).collect()
}

// ---------------------------------------------------------------------------------------------
// The base image.

#[derive(Clone, Debug)]
struct LiveBlock {
    bytenr: u64,
    generation: u64,
    level: u8,
    owner: u64,
    /// Physical offsets of its copies (two with DUP metadata).
    copies: Vec<u64>,
}

/// A chunk's stripe: logical start, physical start, length, type bits.
#[derive(Clone, Copy, Debug)]
struct Stripe {
    logical: u64,
    physical: u64,
    len: u64,
    flags: u64,
}

struct Base {
    /// Which variant (mkfs options), for messages.
    label: &'static str,
    nodesize: usize,
    /// The image's non-zero runs (offset, bytes): a static is never dropped, so the image
    /// is kept in memory rather than in a temp file that would outlive the test process.
    image: Vec<(u64, Vec<u8>)>,
    seed: u64,
    csum: CsumType,
    pristine: Walk,
    blocks: Vec<LiveBlock>,
    stripes: Vec<Stripe>,
    /// Files written by the test, by path from the top level, with their content.
    known: Vec<(String, Vec<u8>)>,
    /// Physical offset of each 4 KiB sector of `target.bin`.
    target_phys: Vec<u64>,
    /// Physical offset of each 4 KiB sector of `nocow/raw.bin` (no data checksums).
    nocow_phys: Vec<u64>,
}

/// The variants: (label, nodesize, extra mkfs options). The second has 16 KiB nodes, 8-byte
/// xxhash checksums and explicit hole extents (no-holes off).
const VARIANTS: &[(&str, usize, &[&str])] = &[
    ("n4k-crc32c", 4096, &["--csum", "crc32c"]),
    (
        "n16k-xxhash-holes",
        16384,
        &["--csum", "xxhash", "-O", "^no-holes"],
    ),
];

static BASES: OnceLock<Vec<Base>> = OnceLock::new();

/// The base images (built once per test binary); empty when the environment cannot build
/// them (after a `SKIP:` line; under CI=true that panics instead).
fn bases() -> &'static [Base] {
    init_logs();
    BASES.get_or_init(|| {
        if !can_build() {
            return Vec::new();
        }
        let seed = oleo_testkit::seed(0x0DA6_A6ED);
        eprintln!("damaged images: seed {seed} (replay with OLEO_TEST_SEED={seed})");
        VARIANTS
            .iter()
            .enumerate()
            .map(|(i, &(label, nodesize, args))| build_base(label, nodesize, args, seed ^ i as u64))
            .collect()
    })
}

fn sh(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: cannot start: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn text(rng: &mut Rng, len: usize) -> Vec<u8> {
    const WORDS: &[&str] = &[
        "btrfs ", "oleo ", "extent ", "tree ", "chunk ", "csum\n", "a ",
    ];
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        v.extend_from_slice(WORDS[rng.below(WORDS.len() as u64) as usize].as_bytes());
    }
    v.truncate(len);
    v
}

/// Writes the content through the kernel; returns the files to check by content.
fn populate(mp: &Path, rng: &mut Rng) -> Vec<(String, Vec<u8>)> {
    let mut known = Vec::new();
    let mut put = |rel: &str, data: Vec<u8>| {
        std::fs::write(mp.join(rel), &data).unwrap();
        known.push((rel.to_string(), data));
    };
    put("small.txt", b"a small inline file\n".repeat(5));
    put("target.bin", rng.bytes(64 << 10));
    put("other.bin", rng.bytes(200 << 10));
    // A hole, then data at 1 MiB.
    let f = File::create(mp.join("sparse.bin")).unwrap();
    f.write_all_at(&rng.bytes(8192), 1 << 20).unwrap();
    drop(f);
    sh(Command::new("fallocate")
        .args(["-l", "128K"])
        .arg(mp.join("prealloc.bin")));
    // nodatasum: +C on the directory is inherited by new files.
    std::fs::create_dir(mp.join("nocow")).unwrap();
    sh(Command::new("chattr").arg("+C").arg(mp.join("nocow")));
    put("nocow/raw.bin", rng.bytes(16 << 10));
    for alg in ["zlib", "lzo", "zstd"] {
        let d = format!("comp-{alg}");
        std::fs::create_dir(mp.join(&d)).unwrap();
        sh(Command::new("btrfs")
            .args(["property", "set"])
            .arg(mp.join(&d))
            .args(["compression", alg]));
        put(&format!("{d}/big.txt"), text(rng, 300 << 10));
        put(&format!("{d}/tiny.txt"), text(rng, 1500));
    }
    std::fs::create_dir(mp.join("dir")).unwrap();
    for i in 0..300 {
        let pad = "x".repeat(rng.below(40) as usize);
        std::fs::write(mp.join(format!("dir/entry-{i:04}-{pad}")), format!("{i}")).unwrap();
    }
    std::fs::hard_link(mp.join("other.bin"), mp.join("dir/hard")).unwrap();
    std::os::unix::fs::symlink("target.bin", mp.join("link")).unwrap();
    std::os::unix::fs::symlink("d/".repeat(1000), mp.join("link-long")).unwrap();
    for (f, n, v) in [
        ("small.txt", "user.a", "value".to_string()),
        ("target.bin", "user.big", "v".repeat(1000)),
        ("dir", "user.dir", "on a directory".to_string()),
    ] {
        sh(Command::new("setfattr")
            .args(["-n", n, "-v", &v])
            .arg(mp.join(f)));
    }
    sh(Command::new("mkfifo").arg(mp.join("fifo")));
    sh(Command::new("mknod")
        .arg(mp.join("chr"))
        .args(["c", "1", "3"]));
    sh(Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(mp.join("sv")));
    put("sv/in-sub.bin", rng.bytes(20 << 10));
    sh(Command::new("btrfs")
        .args(["subvolume", "snapshot", "-r"])
        .arg(mp.join("sv"))
        .arg(mp.join("snap")));
    known
}

/// Runs `f` on every base image; a failure on one does not hide the others.
fn for_each_base(f: fn(&Base)) {
    let failed: Vec<&str> = bases()
        .iter()
        .filter(|b| std::panic::catch_unwind(|| f(b)).is_err())
        .map(|b| b.label)
        .collect();
    assert!(
        failed.is_empty(),
        "failed on base images {failed:?} (see above)"
    );
}

fn can_build() -> bool {
    let what = "damaged images";
    if !oleo_testkit::require_root(what) {
        return false;
    }
    for tool in ["setfattr", "chattr", "fallocate", "mknod", "mkfifo"] {
        if oleo_testkit::env::find_in_path(tool).is_none() {
            return oleo_testkit::env::skip(
                what,
                &format!("needs `{tool}` (apt-get install attr e2fsprogs util-linux coreutils)"),
            );
        }
    }
    true
}

fn build_base(label: &'static str, nodesize: usize, mkfs_args: &[&str], seed: u64) -> Base {
    let start = Instant::now();
    let dir = TempDir::new(&format!("damaged-{label}")).expect("temp dir");
    let image = dir.join("base.img");
    File::create(&image).unwrap().set_len(IMAGE_SIZE).unwrap();
    sh(Command::new("mkfs.btrfs")
        .args([
            "-f", "-q", "-s", "4096", "-m", "dup", "-d", "single", "-L", "damaged",
        ])
        .args(["-n", &nodesize.to_string()])
        .args(mkfs_args)
        .arg(&image));
    let mp = dir.subdir("mnt").unwrap();
    let mut rng = Rng(seed);
    let m = KernelMount::mount(&image, &mp, &["rw", "noatime"]).expect("kernel mount");
    let known = populate(m.path(), &mut rng);
    m.sync().unwrap();
    m.unmount().expect("unmount");

    // What oleo sees in the pristine image is the reference for every damaged copy.
    let fs = Filesystem::open(&image, OpenOptions::default()).expect("pristine image opens");
    let pristine = walk(&fs, &Limits::default());
    assert_eq!(
        pristine.errors, 0,
        "the pristine image walks without errors: {:?}",
        pristine.first_errors
    );
    for (path, data) in &known {
        let id = fs.resolve_path(fs.root(), path.as_bytes()).unwrap();
        assert_eq!(
            &fs.read(id, 0, data.len() as u32 + 10).unwrap(),
            data,
            "{path} reads back what was written"
        );
    }
    let csum = fs.superblock().csum_type();
    let fsid = fs.superblock().metadata_fsid();

    // Every live tree block, and the chunk stripes (from the chunk tree's leaves).
    let mut live: BTreeMap<u64, LiveBlock> = BTreeMap::new();
    let mut stripes = Vec::new();
    for id in fs.tree_ids().unwrap() {
        let root = fs.tree_root(id).unwrap().unwrap();
        fs.walk_tree(
            &root,
            &mut |b| {
                live.entry(b.bytenr()).or_insert(LiveBlock {
                    bytenr: b.bytenr(),
                    generation: b.generation(),
                    level: b.level(),
                    owner: b.owner(),
                    copies: Vec::new(),
                });
                if id == 3 && b.is_leaf() {
                    for slot in 0..b.nritems() {
                        let it = b.item(slot).unwrap();
                        if it.key.item_type == item::CHUNK_ITEM {
                            let c = ChunkItem::parse(b.item_data(slot).unwrap()).unwrap();
                            for s in &c.stripes {
                                stripes.push(Stripe {
                                    logical: it.key.offset,
                                    physical: s.offset,
                                    len: c.length,
                                    flags: c.chunk_type,
                                });
                            }
                        }
                    }
                }
            },
            &mut |e| panic!("pristine walk_tree: {e}"),
        )
        .unwrap();
    }
    drop(fs);

    // Find the copies: scan the image for blocks with our fsid, a live bytenr and generation,
    // and a good checksum.
    let img = std::fs::read(&image).unwrap();
    for off in (0..img.len()).step_by(4096) {
        let b = &img[off..(off + nodesize).min(img.len())];
        if b.len() < nodesize || b[32..48] != fsid {
            continue;
        }
        let tb = TreeBlock::new(b).unwrap();
        if let Some(l) = live.get_mut(&tb.bytenr()) {
            if l.generation == tb.generation() && csum.verify(&b[32..], &b[..32]) {
                l.copies.push(off as u64);
            }
        }
    }
    let blocks: Vec<LiveBlock> = live.into_values().collect();
    for b in &blocks {
        assert_eq!(b.copies.len(), 2, "DUP metadata: two copies of {b:?}");
    }
    let find_sectors = |data: &[u8]| -> Vec<u64> {
        data.chunks(4096)
            .map(|sector| {
                let hits: Vec<u64> = stripes
                    .iter()
                    .filter(|s| s.flags & block_group::DATA != 0)
                    .flat_map(|s| (s.physical..s.physical + s.len).step_by(4096))
                    .filter(|&p| {
                        let p = p as usize;
                        img.get(p..p + sector.len()) == Some(sector)
                    })
                    .collect();
                assert_eq!(
                    hits.len(),
                    1,
                    "one physical copy of each random data sector"
                );
                hits[0]
            })
            .collect()
    };
    let content = |p: &str| &known.iter().find(|(k, _)| k == p).unwrap().1;
    let target_phys = find_sectors(content("target.bin"));
    let nocow_phys = find_sectors(content("nocow/raw.bin"));
    // Non-zero 4 KiB blocks, coalesced into runs.
    let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
    for (i, blk) in img.chunks(4096).enumerate() {
        if blk.iter().all(|&b| b == 0) {
            continue;
        }
        let off = i as u64 * 4096;
        match runs.last_mut() {
            Some((o, d)) if *o + d.len() as u64 == off => d.extend_from_slice(blk),
            _ => runs.push((off, blk.to_vec())),
        }
    }
    drop(img);
    drop(dir);
    eprintln!(
        "damaged images: base {label} built in {:.1?}: {} live tree blocks, {} entries walked ({})",
        start.elapsed(),
        blocks.len(),
        pristine.entries,
        pristine.summary()
    );
    Base {
        label,
        nodesize,
        image: runs,
        seed,
        csum,
        pristine,
        blocks,
        stripes,
        known,
        target_phys,
        nocow_phys,
    }
}

// ---------------------------------------------------------------------------------------------
// Working copies and trials.

/// A private copy of the base image that trials damage and then repair.
struct Work {
    _dir: TempDir,
    path: PathBuf,
    file: File,
}

impl Work {
    fn new(base: &Base, label: &str) -> Work {
        let dir = TempDir::new(label).unwrap();
        let path = dir.join("work.img");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        file.set_len(IMAGE_SIZE).unwrap();
        for (off, data) in &base.image {
            file.write_all_at(data, *off).unwrap();
        }
        Work {
            _dir: dir,
            path,
            file,
        }
    }

    fn read(&self, off: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        self.file.read_exact_at(&mut b, off).unwrap();
        b
    }

    /// Applies the edits; returns what undoes them.
    fn damage(&self, edits: &[(u64, Vec<u8>)]) -> Vec<(u64, Vec<u8>)> {
        let undo = edits
            .iter()
            .map(|(o, d)| (*o, self.read(*o, d.len())))
            .collect();
        for (o, d) in edits {
            self.file.write_all_at(d, *o).unwrap();
        }
        undo
    }

    fn restore(&self, undo: Vec<(u64, Vec<u8>)>) {
        for (o, d) in undo.into_iter().rev() {
            self.file.write_all_at(&d, o).unwrap();
        }
    }
}

/// Runs one open+walk of `path` under the time bound. A panic or hang is pushed to
/// `failures`; otherwise the result and the lines oleo logged are returned.
fn trial(
    name: &str,
    path: &Path,
    failures: &mut Vec<String>,
) -> Option<(ImageResult, Vec<String>)> {
    let out = check_image(name, path, LIMIT);
    let logs = take_logs(name);
    match out {
        Outcome::Done(r) => Some((r, logs)),
        Outcome::Panicked(p) => {
            println!("{name}: PANIC: {p}");
            failures.push(format!("{name}: PANIC: {p}"));
            None
        }
        Outcome::Hung(d) => {
            println!("{name}: HANG after {d:?}");
            failures.push(format!("{name}: HANG: still running after {d:?}"));
            None
        }
    }
}

fn finish_on(base: &Base, test: &str, failures: Vec<String>) {
    assert!(
        failures.is_empty(),
        "{test} on base {}: {} failures:\n{}",
        base.label,
        failures.len(),
        failures.join("\n")
    );
}

/// The digest lines that differ between two walks (at most a few, for messages).
fn diff(a: &Walk, b: &Walk) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in &a.digest {
        match b.digest.get(k) {
            Some(w) if w == v => {}
            Some(w) => out.push(format!("{k}: {v} -> {w}")),
            None => out.push(format!("{k}: missing")),
        }
    }
    for k in b.digest.keys() {
        if !a.digest.contains_key(k) {
            out.push(format!("{k}: extra"));
        }
    }
    out.truncate(5);
    out
}

/// Recomputes a tree block's checksum (so the damage reaches the checker and parsers).
fn fix_csum(csum: CsumType, block: &mut [u8]) {
    let c = csum.compute(&block[32..]);
    block[..32].copy_from_slice(&c);
}

fn flip_bits(rng: &mut Rng, data: &mut [u8], range: std::ops::Range<usize>, n: usize) -> String {
    let mut bits = Vec::new();
    for _ in 0..n {
        let bit = range.start * 8 + rng.below(((range.end - range.start) * 8) as u64) as usize;
        data[bit / 8] ^= 1 << (bit % 8);
        bits.push(bit);
    }
    format!("bits {bits:?}")
}

// ---------------------------------------------------------------------------------------------
// Tests.

/// The reference itself: the pristine image walks without errors and reads back the content.
#[test]
fn pristine_base_image_reads_back() {
    for_each_base(pristine_base_image_reads_back_on);
}

fn pristine_base_image_reads_back_on(base: &Base) {
    assert!(base.pristine.entries > 300);
    assert_eq!(base.pristine.errors, 0);
    println!("pristine: {}", base.pristine.summary());
}

/// Bit flips in a tree block's two copies: the block is rejected (the error names it), and
/// the rest is read or refused; never a panic or hang.
#[test]
fn tree_block_bit_flips_in_both_copies() {
    for_each_base(tree_block_bit_flips_in_both_copies_on);
}

fn tree_block_bit_flips_in_both_copies_on(base: &Base) {
    let mut rng = Rng(base.seed ^ 0xB17F_11B5);
    let work = Work::new(base, "flip-both");
    let mut failures = Vec::new();
    let (mut refused, mut walked) = (0, 0);
    for n in 0..100 {
        let b = &base.blocks[rng.below(base.blocks.len() as u64) as usize];
        let mut block = work.read(b.copies[0], base.nodesize);
        let nbits = 1 + rng.below(8) as usize;
        // Not in the checksum field: only its first csum_type.size() bytes are compared, so
        // flips in its padding are (rightly) harmless.
        let what = flip_bits(&mut rng, &mut block, 32..base.nodesize, nbits);
        let edits: Vec<_> = b.copies.iter().map(|&p| (p, block.clone())).collect();
        let undo = work.damage(&edits);
        let name = format!("flip-both-{n}");
        let needle = format!("logical {}", b.bytenr);
        if let Some((r, logs)) = trial(&name, &work.path, &mut failures) {
            let named = match &r {
                ImageResult::Refused(e) => {
                    refused += 1;
                    e.to_string().contains(&needle)
                }
                ImageResult::Walked(w) => {
                    walked += 1;
                    w.mentions(&needle)
                }
            };
            if !named {
                failures.push(format!(
                    "{name}: block {} (owner {} level {}, {what}) damaged but no error names it: {}",
                    b.bytenr,
                    b.owner,
                    b.level,
                    r.describe()
                ));
            }
            if !logs
                .iter()
                .any(|l| l.contains(&format!("tree block {}", b.bytenr)))
            {
                failures.push(format!(
                    "{name}: no log line names tree block {}: {logs:?}",
                    b.bytenr
                ));
            }
        }
        work.restore(undo);
    }
    println!("flip-both: {walked} walked, {refused} refused");
    finish_on(base, "tree_block_bit_flips_in_both_copies", failures);
}

/// With DUP metadata a bad copy is replaced by the other: bit flips in one copy, or one copy
/// zeroed, leave everything readable exactly as in the pristine image.
#[test]
fn one_bad_dup_copy_reads_the_other() {
    for_each_base(one_bad_dup_copy_reads_the_other_on);
}

fn one_bad_dup_copy_reads_the_other_on(base: &Base) {
    let mut rng = Rng(base.seed ^ 0x000D_0B1E);
    let work = Work::new(base, "one-copy");
    let mut failures = Vec::new();
    // Every live block: copy 0 zeroed, copy 0 with bit flips, copy 1 zeroed.
    let cases = base
        .blocks
        .iter()
        .flat_map(|b| [(b, 0usize, true), (b, 0, false), (b, 1, true)]);
    for (n, (b, copy, zero)) in cases.enumerate() {
        let mut block = work.read(b.copies[copy], base.nodesize);
        let what = if zero {
            block.fill(0);
            "zeroed".to_string()
        } else {
            // Past the checksum field, whose padding beyond the digest is not compared.
            let k = 1 + rng.below(16) as usize;
            flip_bits(&mut rng, &mut block, 32..base.nodesize, k)
        };
        let undo = work.damage(&[(b.copies[copy], block)]);
        let name = format!("one-copy-{n}");
        if let Some((r, logs)) = trial(&name, &work.path, &mut failures) {
            match r {
                ImageResult::Refused(e) => failures.push(format!(
                    "{name}: copy {copy} of block {} {what}: refused ({e}) although copy {} is good",
                    b.bytenr,
                    1 - copy
                )),
                ImageResult::Walked(w) => {
                    let d = diff(&base.pristine, &w);
                    if w.errors != 0 || !d.is_empty() {
                        failures.push(format!(
                            "{name}: copy {copy} of block {} (owner {} level {}) {what}: walk differs from pristine: {:?} {d:?}",
                            b.bytenr, b.owner, b.level, w.first_errors
                        ));
                    }
                }
            }
            // Copy 0 is read first: its damage must be logged, naming the block.
            if copy == 0
                && !logs
                    .iter()
                    .any(|l| l.contains(&format!("tree block {}", b.bytenr)))
            {
                failures.push(format!("{name}: no log line names tree block {}", b.bytenr));
            }
        }
        work.restore(undo);
    }
    println!(
        "one-copy: {} blocks checked, 3 ways each",
        base.blocks.len()
    );
    finish_on(base, "one_bad_dup_copy_reads_the_other", failures);
}

/// Interesting values for a field of `width` bytes that held `orig`.
fn interesting(rng: &mut Rng, orig: u64, width: usize) -> u64 {
    let v = match rng.below(24) {
        0 => 0,
        1 => 1,
        2 => 2,
        3 => 0x7f,
        4 => 0x80,
        5 => 0xff,
        6 => 0x100,
        7 => 0xfff,
        8 => 0x1000,
        9 => 0xffff,
        10 => 0x1_0000,
        11 => 0x7fff_ffff,
        12 => 0xffff_ffff,
        13 => 1 << 32,
        14 => 1 << 40,
        15 => 1 << 60,
        16 => 1 << 63,
        17 => u64::MAX,
        18 => u64::MAX - 0xfff,
        19 => orig.wrapping_add(1),
        20 => orig.wrapping_sub(1),
        21 => orig.wrapping_add(4096),
        22 => orig.wrapping_mul(2),
        _ => rng.next(),
    };
    if width == 8 {
        v
    } else {
        v & ((1u64 << (width * 8)) - 1)
    }
}

fn get(b: &[u8], off: usize, width: usize) -> u64 {
    let mut v = [0u8; 8];
    v[..width].copy_from_slice(&b[off..off + width]);
    u64::from_le_bytes(v)
}

fn set(b: &mut [u8], off: usize, width: usize, v: u64) {
    b[off..off + width].copy_from_slice(&v.to_le_bytes()[..width]);
}

/// Engine-interpreted item fields: (item type, offset in the body, width, name).
const FIELDS: &[(u8, usize, usize, &str)] = &[
    (item::INODE_ITEM, 0, 8, "inode.generation"),
    (item::INODE_ITEM, 16, 8, "inode.size"),
    (item::INODE_ITEM, 24, 8, "inode.nbytes"),
    (item::INODE_ITEM, 40, 4, "inode.nlink"),
    (item::INODE_ITEM, 52, 4, "inode.mode"),
    (item::INODE_ITEM, 56, 8, "inode.rdev"),
    (item::INODE_ITEM, 64, 8, "inode.flags"),
    (item::INODE_ITEM, 120, 4, "inode.atime.nsec"),
    (item::EXTENT_DATA, 8, 8, "extent.ram_bytes"),
    (item::EXTENT_DATA, 16, 1, "extent.compression"),
    (item::EXTENT_DATA, 20, 1, "extent.type"),
    (item::EXTENT_DATA, 21, 8, "extent.disk_bytenr"),
    (item::EXTENT_DATA, 29, 8, "extent.disk_num_bytes"),
    (item::EXTENT_DATA, 37, 8, "extent.offset"),
    (item::EXTENT_DATA, 45, 8, "extent.num_bytes"),
    (item::DIR_INDEX, 0, 8, "dir_index.location.objectid"),
    (item::DIR_INDEX, 8, 1, "dir_index.location.type"),
    (item::DIR_INDEX, 25, 2, "dir_index.data_len"),
    (item::DIR_INDEX, 27, 2, "dir_index.name_len"),
    (item::DIR_INDEX, 29, 1, "dir_index.type"),
    (item::DIR_ITEM, 0, 8, "dir_item.location.objectid"),
    (item::DIR_ITEM, 8, 1, "dir_item.location.type"),
    (item::DIR_ITEM, 27, 2, "dir_item.name_len"),
    (item::XATTR_ITEM, 25, 2, "xattr.data_len"),
    (item::XATTR_ITEM, 27, 2, "xattr.name_len"),
    (item::INODE_REF, 0, 8, "inode_ref.index"),
    (item::INODE_REF, 8, 2, "inode_ref.name_len"),
    (item::ROOT_ITEM, 160, 8, "root.generation"),
    (item::ROOT_ITEM, 168, 8, "root.root_dirid"),
    (item::ROOT_ITEM, 176, 8, "root.bytenr"),
    (item::ROOT_ITEM, 216, 4, "root.refs"),
    (item::ROOT_ITEM, 238, 1, "root.level"),
    (item::ROOT_REF, 0, 8, "root_ref.dirid"),
    (item::ROOT_REF, 16, 2, "root_ref.name_len"),
    (item::ROOT_BACKREF, 0, 8, "root_backref.dirid"),
    (item::ROOT_BACKREF, 16, 2, "root_backref.name_len"),
    (item::CHUNK_ITEM, 0, 8, "chunk.length"),
    (item::CHUNK_ITEM, 16, 8, "chunk.stripe_len"),
    (item::CHUNK_ITEM, 24, 8, "chunk.type"),
    (item::CHUNK_ITEM, 44, 2, "chunk.num_stripes"),
    (item::CHUNK_ITEM, 46, 2, "chunk.sub_stripes"),
    (item::CHUNK_ITEM, 48, 8, "chunk.stripe0.devid"),
    (item::CHUNK_ITEM, 56, 8, "chunk.stripe0.offset"),
    (item::EXTENT_CSUM, 0, 4, "csum.first"),
];

/// Header fields of a block: (offset, width, name).
const HEADER_FIELDS: &[(usize, usize, &str)] = &[
    (48, 8, "bytenr"),
    (56, 8, "flags"),
    (80, 8, "generation"),
    (88, 8, "owner"),
    (96, 4, "nritems"),
    (100, 1, "level"),
];

/// Where a leaf's item `slot` has its body, if sane.
fn body_range(tb: &TreeBlock, slot: usize) -> Option<(usize, usize)> {
    let it = tb.item(slot).ok()?;
    let start = HEADER_SIZE + it.offset as usize;
    (start + it.size as usize <= tb.bytes().len()).then_some((start, it.size as usize))
}

/// A hostile (checksum-valid) block, built from a live one by one structured mutation.
fn mutate(rng: &mut Rng, base: &Base, block: &mut [u8]) -> String {
    let tb = TreeBlock::new(block).unwrap();
    let (n, leaf) = (tb.nritems(), tb.is_leaf());
    let kind = rng.below(6);
    match kind {
        0 => {
            let k = 1 + rng.below(24) as usize;
            flip_bits(rng, block, 32..base.nodesize, k)
        }
        1 => {
            let (off, w, name) = HEADER_FIELDS[rng.below(HEADER_FIELDS.len() as u64) as usize];
            let v = interesting(rng, get(block, off, w), w);
            set(block, off, w, v);
            format!("header.{name} = {v:#x}")
        }
        2 if n > 0 && leaf => {
            let slot = rng.below(n as u64) as usize;
            let fields = [
                (0, 8, "objectid"),
                (8, 1, "type"),
                (9, 8, "offset"),
                (17, 4, "data_offset"),
                (21, 4, "data_size"),
            ];
            let (off, w, name) = fields[rng.below(5) as usize];
            let at = HEADER_SIZE + slot * ITEM_SIZE + off;
            let v = interesting(rng, get(block, at, w), w);
            set(block, at, w, v);
            format!("item {slot}.{name} = {v:#x}")
        }
        2 if n > 0 => {
            let slot = rng.below(n as u64) as usize;
            let at = HEADER_SIZE + slot * KEY_PTR_SIZE;
            match rng.below(4) {
                0 | 1 => {
                    // Point at another live block, maybe an ancestor or itself: a cycle.
                    let other = &base.blocks[rng.below(base.blocks.len() as u64) as usize];
                    set(block, at + 17, 8, other.bytenr);
                    if rng.below(2) == 0 {
                        set(block, at + 25, 8, other.generation);
                    }
                    format!(
                        "ptr {slot} -> block {} (level {})",
                        other.bytenr, other.level
                    )
                }
                2 => {
                    let v = interesting(rng, get(block, at + 17, 8), 8);
                    set(block, at + 17, 8, v);
                    format!("ptr {slot}.blockptr = {v:#x}")
                }
                _ => {
                    let v = interesting(rng, get(block, at + 25, 8), 8);
                    set(block, at + 25, 8, v);
                    format!("ptr {slot}.generation = {v:#x}")
                }
            }
        }
        3 | 4 if n > 0 && leaf => {
            let slot = rng.below(n as u64) as usize;
            let Some((start, size)) = body_range(&tb, slot) else {
                return "nothing".into();
            };
            if size == 0 {
                return "empty body".into();
            }
            let key = tb.item_key(slot).unwrap();
            let w = [1usize, 2, 4, 8][rng.below(4) as usize].min(size);
            let off = start + rng.below((size - w + 1) as u64) as usize;
            let v = interesting(rng, get(block, off, w), w);
            set(block, off, w, v);
            format!(
                "item {slot} {key:?} body+{} ({w} bytes) = {v:#x}",
                off - start
            )
        }
        _ if n > 1 => {
            let (a, b) = (rng.below(n as u64) as usize, rng.below(n as u64) as usize);
            let size = if leaf { ITEM_SIZE } else { KEY_PTR_SIZE };
            let (pa, pb) = (HEADER_SIZE + a * size, HEADER_SIZE + b * size);
            let tmp = block[pa..pa + size].to_vec();
            block.copy_within(pb..pb + size, pa);
            block[pb..pb + size].copy_from_slice(&tmp);
            format!("swap slots {a} and {b}")
        }
        _ => {
            let k = 1 + rng.below(4) as usize;
            flip_bits(rng, block, HEADER_SIZE..base.nodesize, k)
        }
    }
}

/// Applies `f` to block `b` in both copies with a recomputed checksum, runs a trial, undoes.
fn hostile_block_trial(
    base: &Base,
    work: &Work,
    b: &LiveBlock,
    name: &str,
    failures: &mut Vec<String>,
    f: impl FnOnce(&mut [u8]) -> String,
) -> Option<(String, ImageResult)> {
    let mut block = work.read(b.copies[0], base.nodesize);
    let what = f(&mut block);
    fix_csum(base.csum, &mut block);
    let edits: Vec<_> = b.copies.iter().map(|&p| (p, block.clone())).collect();
    let undo = work.damage(&edits);
    let r = trial(name, &work.path, failures);
    work.restore(undo);
    match r {
        Some((r, _)) => Some((what, r)),
        None => {
            failures.push(format!(
                "{name}: (block {} owner {} level {}) {what}",
                b.bytenr, b.owner, b.level
            ));
            None
        }
    }
}

/// Every engine-interpreted item field, in one item of each type, set to boundary values
/// with a valid checksum: the checker or the engine must cope.
#[test]
fn hostile_item_fields_with_valid_checksums() {
    for_each_base(hostile_item_fields_with_valid_checksums_on);
}

fn hostile_item_fields_with_valid_checksums_on(base: &Base) {
    let mut rng = Rng(base.seed ^ 0x17E4_F1E1D);
    let work = Work::new(base, "fields");
    let mut failures = Vec::new();
    // Leaves holding each item type: (block, slot).
    // Leaves holding each item type: (block, slot), by class: the item type, and for file
    // extents also the compression and extent type (inline, regular, prealloc).
    let mut by_class: BTreeMap<(u8, u8, u8), Vec<(usize, usize)>> = BTreeMap::new();
    for (i, b) in base.blocks.iter().enumerate().filter(|(_, b)| b.level == 0) {
        let block = work.read(b.copies[0], base.nodesize);
        let tb = TreeBlock::new(&block).unwrap();
        for slot in 0..tb.nritems() {
            let ty = tb.item_key(slot).unwrap().item_type;
            let body = tb.item_data(slot).unwrap();
            let class = if ty == item::EXTENT_DATA && body.len() > 20 {
                (ty, body[16], body[20])
            } else {
                (ty, 0, 0)
            };
            by_class.entry(class).or_default().push((i, slot));
        }
    }
    let (mut count, mut refused) = (0, 0);
    let start = Instant::now();
    for &(ty, off, width, field) in FIELDS {
        for (_, places) in by_class.range((ty, 0, 0)..=(ty, 255, 255)) {
            for value in [0u64, 1, u64::MAX, 1 << 60, u64::MAX - 0xfff, rng.next()] {
                let (bi, slot) = places[rng.below(places.len() as u64) as usize];
                let b = &base.blocks[bi];
                let v = if width == 8 {
                    value
                } else {
                    value & ((1u64 << (width * 8)) - 1)
                };
                let name = format!("field-{count}");
                count += 1;
                let r = hostile_block_trial(base, &work, b, &name, &mut failures, |block| {
                    let tb = TreeBlock::new(block).unwrap();
                    let key = tb.item_key(slot).unwrap();
                    match body_range(&tb, slot) {
                        Some((s, size)) if off + width <= size => {
                            set(block, s + off, width, v);
                            format!("{field} of {key:?} = {v:#x}")
                        }
                        _ => format!("{field}: body too small"),
                    }
                });
                if let Some((_, ImageResult::Refused(_))) = r {
                    refused += 1;
                }
            }
        }
    }
    println!(
        "fields: {count} trials ({refused} refused) in {:.1?}",
        start.elapsed()
    );
    finish_on(base, "hostile_item_fields_with_valid_checksums", failures);
}

/// Node pointers turned into cycles (to the block itself, to the root of its tree, to a
/// sibling) and levels/nritems set to extremes, with valid checksums.
#[test]
fn hostile_node_pointers_and_headers() {
    for_each_base(hostile_node_pointers_and_headers_on);
}

fn hostile_node_pointers_and_headers_on(base: &Base) {
    let work = Work::new(base, "nodes");
    let mut failures = Vec::new();
    let mut count = 0;
    let roots: Vec<&LiveBlock> = {
        let mut by_owner: HashMap<u64, &LiveBlock> = HashMap::new();
        for b in &base.blocks {
            let e = by_owner.entry(b.owner).or_insert(b);
            if b.level > e.level {
                *e = b;
            }
        }
        by_owner.into_values().collect()
    };
    for b in base.blocks.iter().filter(|b| b.level > 0) {
        let root = roots.iter().find(|r| r.owner == b.owner).unwrap();
        for (target, gen) in [
            (b.bytenr, b.generation),
            (root.bytenr, root.generation),
            (b.bytenr + base.nodesize as u64, b.generation),
            (0, 0),
            (u64::MAX - 4095, b.generation),
        ] {
            let name = format!("node-{count}");
            count += 1;
            hostile_block_trial(base, &work, b, &name, &mut failures, |block| {
                set(block, HEADER_SIZE + 17, 8, target);
                set(block, HEADER_SIZE + 25, 8, gen);
                format!("ptr 0 of {} -> {target}", b.bytenr)
            });
        }
    }
    for b in base.blocks.iter().step_by(3) {
        for (off, w, v) in [
            (96usize, 4usize, u32::MAX as u64),
            (96, 4, 0),
            (96, 4, 200),
            (100, 1, 7),
            (100, 1, 255),
            (100, 1, b.level as u64 + 1),
        ] {
            let name = format!("header-{count}");
            count += 1;
            hostile_block_trial(base, &work, b, &name, &mut failures, |block| {
                set(block, off, w, v);
                format!("header+{off} = {v}")
            });
        }
    }
    println!("nodes/headers: {count} trials");
    finish_on(base, "hostile_node_pointers_and_headers", failures);
}

/// Random structured mutations of random live blocks, checksum recomputed.
#[test]
fn hostile_tree_blocks_random_mutations() {
    for_each_base(hostile_tree_blocks_random_mutations_on);
}

fn hostile_tree_blocks_random_mutations_on(base: &Base) {
    let mut rng = Rng(base.seed ^ 0x4A11_D00D);
    let work = Work::new(base, "mutate");
    let mut failures = Vec::new();
    let n = std::env::var("OLEO_MUTATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500usize);
    let start = Instant::now();
    let (mut refused, mut clean) = (0, 0);
    for i in 0..n {
        let b = base.blocks[rng.below(base.blocks.len() as u64) as usize].clone();
        let name = format!("mutate-{i}");
        let mut r2 = Rng(rng.next());
        match hostile_block_trial(base, &work, &b, &name, &mut failures, |block| {
            mutate(&mut r2, base, block)
        }) {
            Some((_, ImageResult::Refused(_))) => refused += 1,
            Some((_, ImageResult::Walked(w))) if w.errors == 0 => clean += 1,
            _ => {}
        }
    }
    println!(
        "mutate: {n} trials ({refused} refused, {clean} without errors) in {:.1?}",
        start.elapsed()
    );
    finish_on(base, "hostile_tree_blocks_random_mutations", failures);
}

fn superblock_csum_fix(csum: CsumType, sb: &mut [u8]) {
    let c = csum.compute(&sb[32..4096]);
    sb[..32].copy_from_slice(&c);
}

/// Primary superblock damaged: a mirror is used and everything reads as before. All copies
/// damaged: a clear refusal. Hostile fields with a valid checksum: no panic or hang.
#[test]
fn superblock_damage() {
    for_each_base(superblock_damage_on);
}

fn superblock_damage_on(base: &Base) {
    let mut rng = Rng(base.seed ^ 0x5B5B);
    let work = Work::new(base, "super");
    let mut failures = Vec::new();
    let primary = work.read(SUPER, 4096);
    let mirror = work.read(SUPER_MIRROR1, 4096);
    // A mirror differs from the primary only in its checksum and bytenr.
    assert_eq!(
        primary[56..],
        mirror[56..],
        "superblock mirror 1 matches the primary"
    );

    // Primary only: bit flips, zeroed, wrong bytenr, bad magic.
    for n in 0..8 {
        let mut sb = primary.clone();
        let what = match n {
            0 => {
                sb.fill(0);
                "zeroed".to_string()
            }
            1 => {
                sb[64] ^= 1;
                "bad magic".to_string()
            }
            2 => {
                set(&mut sb, 48, 8, SUPER_MIRROR1);
                superblock_csum_fix(base.csum, &mut sb);
                "claims another bytenr".to_string()
            }
            _ => {
                let k = 1 + rng.below(8) as usize;
                flip_bits(&mut rng, &mut sb, 0..4096, k)
            }
        };
        // Without btrfs's magic the primary is no damaged btrfs superblock but something
        // else (a reformatted device): refused, never brought back from a stale copy.
        let magic = &sb[64..72] == b"_BHRfS_M";
        let undo = work.damage(&[(SUPER, sb)]);
        let name = format!("super-primary-{n}");
        if let Some((r, logs)) = trial(&name, &work.path, &mut failures) {
            match r {
                ImageResult::Refused(e)
                    if !magic && e.to_string().contains("no btrfs superblock at 64 KiB") => {}
                ImageResult::Walked(w)
                    if magic && w.errors == 0 && diff(&base.pristine, &w).is_empty() =>
                {
                    if !logs.iter().any(|l| l.contains("superblock")) {
                        failures.push(format!("{name}: mirror used without a warning: {logs:?}"));
                    }
                }
                other => failures.push(format!(
                    "{name}: primary {what}: expected {}, got {}",
                    if magic {
                        "the mirror to be used"
                    } else {
                        "a refusal naming the missing superblock"
                    },
                    other.describe()
                )),
            }
        }
        work.restore(undo);
    }

    // Every copy damaged: refused, with a message about the superblock.
    for n in 0..4 {
        let mut edits = Vec::new();
        for off in [SUPER, SUPER_MIRROR1] {
            let mut sb = work.read(off, 4096);
            if n == 0 {
                sb.fill(0);
            } else {
                let k = 1 + rng.below(4) as usize;
                flip_bits(&mut rng, &mut sb, 0..4096, k);
            }
            edits.push((off, sb));
        }
        let undo = work.damage(&edits);
        let name = format!("super-all-{n}");
        if let Some((r, _)) = trial(&name, &work.path, &mut failures) {
            match r {
                ImageResult::Refused(Error::Unusable(m)) if m.contains("superblock") => {
                    println!("{name}: refused: {m}")
                }
                other => failures.push(format!(
                    "{name}: all superblocks damaged: expected a refusal naming the superblock, got {}",
                    other.describe()
                )),
            }
        }
        work.restore(undo);
    }

    // Hostile fields in the primary, checksum fixed (so it is believed).
    const SB_FIELDS: &[(usize, usize, &str)] = &[
        (72, 8, "generation"),
        (80, 8, "root"),
        (88, 8, "chunk_root"),
        (96, 8, "log_root"),
        (112, 8, "total_bytes"),
        (120, 8, "bytes_used"),
        (128, 8, "root_dir_objectid"),
        (136, 8, "num_devices"),
        (144, 4, "sectorsize"),
        (148, 4, "nodesize"),
        (152, 4, "leafsize"),
        (160, 4, "sys_chunk_array_size"),
        (164, 8, "chunk_root_generation"),
        (188, 8, "incompat_flags"),
        (196, 2, "csum_type"),
        (198, 1, "root_level"),
        (199, 1, "chunk_root_level"),
        (200, 1, "log_root_level"),
        (201, 8, "dev_item.devid"),
        (811 + 17, 8, "sys_chunk.length"),
        (811 + 17 + 16, 8, "sys_chunk.stripe_len"),
        (811 + 17 + 24, 8, "sys_chunk.type"),
        (811 + 17 + 44, 2, "sys_chunk.num_stripes"),
        (811 + 17 + 48, 8, "sys_chunk.stripe0.devid"),
        (811 + 17 + 56, 8, "sys_chunk.stripe0.offset"),
        (811 + 8, 1, "sys_chunk.key.type"),
        (811 + 9, 8, "sys_chunk.key.offset"),
    ];
    let mut count = 0;
    for &(off, w, field) in SB_FIELDS {
        let orig = get(&primary, off, w);
        let mask = if w == 8 {
            u64::MAX
        } else {
            (1u64 << (w * 8)) - 1
        };
        let mut values = vec![
            0,
            1,
            u64::MAX,
            u64::MAX - 0xfff,
            1 << 60,
            1 << 31,
            65536,
            orig.wrapping_add(1),
            orig.wrapping_sub(1),
            orig.wrapping_mul(2),
        ];
        values.extend((0..3).map(|_| interesting(&mut rng, orig, w)));
        let mut values: Vec<u64> = values.into_iter().map(|v| v & mask).collect();
        values.sort_unstable();
        values.dedup();
        for v in values {
            let mut sb = primary.clone();
            set(&mut sb, off, w, v);
            superblock_csum_fix(base.csum, &mut sb);
            let undo = work.damage(&[(SUPER, sb)]);
            let name = format!("super-field-{count}");
            count += 1;
            if trial(&name, &work.path, &mut failures).is_none() {
                failures.push(format!("{name}: superblock {field} = {v:#x}"));
            }
            work.restore(undo);
        }
    }
    println!("superblock: {count} hostile-field trials");
    finish_on(base, "superblock_damage", failures);
}

/// A flipped bit in file data: reading that sector is `DataChecksum` (EIO) naming inode,
/// file offset and logical address, and a log line says so; the other sectors of the file
/// and every other file read exactly as before. Without data checksums (nodatasum) the read
/// succeeds with the damaged bytes. Random damage anywhere in data chunks is only ever a
/// data checksum error.
#[test]
fn data_corruption_is_eio_and_contained() {
    for_each_base(data_corruption_is_eio_and_contained_on);
}

fn data_corruption_is_eio_and_contained_on(base: &Base) {
    let mut rng = Rng(base.seed ^ 0xDA7A);
    let work = Work::new(base, "data");
    let mut failures = Vec::new();
    let target = &base
        .known
        .iter()
        .find(|(p, _)| p == "target.bin")
        .unwrap()
        .1;
    let logical_of = |phys: u64| {
        base.stripes
            .iter()
            .find(|s| {
                s.flags & block_group::DATA != 0 && (s.physical..s.physical + s.len).contains(&phys)
            })
            .map(|s| s.logical + (phys - s.physical))
            .unwrap()
    };

    for n in 0..4 {
        let sector = rng.below(base.target_phys.len() as u64) as usize;
        let phys = base.target_phys[sector];
        let mut data = work.read(phys, 4096);
        let k = 1 + rng.below(3) as usize;
        let what = flip_bits(&mut rng, &mut data, 0..4096, k);
        let undo = work.damage(&[(phys, data)]);
        let name = format!("data-{n}");
        let path = work.path.clone();
        let expect_logical = logical_of(phys);
        let target_c = target.clone();
        let pristine = base.pristine.clone();
        let out = bounded(&name, LIMIT, move || -> Result<u64, String> {
            let fs = Filesystem::open(&path, OpenOptions::default()).map_err(|e| e.to_string())?;
            let id: InodeId = fs
                .resolve_path(fs.root(), b"target.bin")
                .map_err(|e| e.to_string())?;
            // The whole file: EIO, naming the inode, offset and logical address.
            match fs.read(id, 0, target_c.len() as u32) {
                Err(e @ Error::DataChecksum { .. }) => {
                    let Error::DataChecksum {
                        ino,
                        offset,
                        logical,
                        ..
                    } = e
                    else {
                        unreachable!()
                    };
                    if e.errno() != EIO
                        || ino != id.ino
                        || offset != sector as u64 * 4096
                        || logical != expect_logical
                    {
                        return Err(format!(
                            "wrong error {e} (errno {}): expected inode {} offset {} logical {expect_logical}",
                            e.errno(), id.ino, sector * 4096
                        ));
                    }
                }
                other => {
                    return Err(format!(
                        "reading the damaged file gave {other:?}, expected DataChecksum"
                    ))
                }
            }
            // Each other sector reads fine; the damaged one fails again.
            for s in 0..target_c.len() / 4096 {
                let r = fs.read(id, s as u64 * 4096, 4096);
                match (s == sector, r) {
                    (true, Err(Error::DataChecksum { .. })) => {}
                    (false, Ok(d)) if d == target_c[s * 4096..(s + 1) * 4096] => {}
                    (_, r) => {
                        return Err(format!(
                            "sector {s} (damaged: {sector}): {:?}",
                            r.map(|d| d.len())
                        ))
                    }
                }
            }
            // Everything else reads as in the pristine image.
            let w = walk(&fs, &Limits::default());
            let d: Vec<String> = diff(&pristine, &w)
                .into_iter()
                .filter(|l| !l.contains("/target.bin:"))
                .collect();
            if !d.is_empty() || w.other_errors != 0 {
                return Err(format!("other files changed: {d:?} {:?}", w.first_errors));
            }
            Ok(id.ino)
        });
        let logs = take_logs(&name);
        match out {
            Outcome::Done(Ok(ino)) => {
                let want = [
                    format!("inode {ino} "),
                    format!("offset {}", sector * 4096),
                    format!("logical {expect_logical}"),
                ];
                if !logs
                    .iter()
                    .any(|l| want.iter().all(|w| l.contains(w.as_str())))
                {
                    failures.push(format!("{name}: no log line naming {want:?}: {logs:?}"));
                }
                println!("{name}: sector {sector} ({what}): EIO as expected");
            }
            Outcome::Done(Err(e)) => failures.push(format!("{name}: sector {sector} {what}: {e}")),
            Outcome::Panicked(p) => failures.push(format!("{name}: PANIC {p}")),
            Outcome::Hung(d) => failures.push(format!("{name}: HANG {d:?}")),
        }
        work.restore(undo);
    }

    // nodatasum: no checksum to catch it; the damaged bytes are returned.
    {
        let raw = &base
            .known
            .iter()
            .find(|(p, _)| p == "nocow/raw.bin")
            .unwrap()
            .1;
        let phys = base.nocow_phys[1];
        let mut data = work.read(phys, 4096);
        data[100] ^= 0x40;
        let undo = work.damage(&[(phys, data)]);
        let path = work.path.clone();
        let mut expect = raw.clone();
        expect[4096 + 100] ^= 0x40;
        match bounded("nodatasum", LIMIT, move || {
            let fs = Filesystem::open(&path, OpenOptions::default()).unwrap();
            let id = fs.resolve_path(fs.root(), b"nocow/raw.bin").unwrap();
            fs.read(id, 0, expect.len() as u32).map(|d| d == expect)
        }) {
            Outcome::Done(Ok(true)) => {}
            Outcome::Done(r) => failures.push(format!("nodatasum: {r:?}")),
            Outcome::Panicked(p) => failures.push(format!("nodatasum: PANIC {p}")),
            Outcome::Hung(d) => failures.push(format!("nodatasum: HANG {d:?}")),
        }
        take_logs("nodatasum");
        work.restore(undo);
    }

    // Random damage in data chunks (compressed extents included): only data checksum errors.
    let data_stripes: Vec<Stripe> = base
        .stripes
        .iter()
        .filter(|s| s.flags & block_group::DATA != 0)
        .copied()
        .collect();
    let mut n = 0;
    while n < 12 {
        let s = data_stripes[rng.below(data_stripes.len() as u64) as usize];
        let phys = s.physical + rng.below(s.len / 4096) * 4096;
        let mut data = work.read(phys, 4096);
        if data.iter().all(|&b| b == 0) || base.nocow_phys.contains(&phys) {
            continue; // unused space
        }
        let k = 1 + rng.below(64) as usize;
        flip_bits(&mut rng, &mut data, 0..4096, k);
        let undo = work.damage(&[(phys, data)]);
        let name = format!("data-random-{n}");
        n += 1;
        if let Some((r, _)) = trial(&name, &work.path, &mut failures) {
            match r {
                ImageResult::Walked(w) if w.other_errors == 0 && !w.data_csum_errors.is_empty() => {}
                other => failures.push(format!(
                    "{name}: data at physical {phys} damaged: expected only data checksum errors, got {}",
                    other.describe()
                )),
            }
        }
        work.restore(undo);
    }
    finish_on(base, "data_corruption_is_eio_and_contained", failures);
}

/// The image cut short at many sizes: refused when the superblock is gone, otherwise read
/// as far as it goes; never a panic or hang.
#[test]
fn truncated_images() {
    for_each_base(truncated_images_on);
}

fn truncated_images_on(base: &Base) {
    let mut rng = Rng(base.seed ^ 0x7C0A7E);
    let work = Work::new(base, "truncate");
    let mut failures = Vec::new();
    let used = base
        .blocks
        .iter()
        .flat_map(|b| b.copies.iter().copied())
        .chain(base.target_phys.iter().copied())
        .max()
        .unwrap()
        + 4096;
    let mut sizes = vec![
        0,
        1,
        4096,
        SUPER,
        SUPER + 2048,
        SUPER + 4095,
        SUPER + 4096,
        1 << 20,
        4 << 20,
        16 << 20,
        SUPER_MIRROR1,
        SUPER_MIRROR1 + 4096,
        used / 2,
        used - 4096,
        used,
        IMAGE_SIZE - 4096,
    ];
    for _ in 0..10 {
        sizes.push(rng.below(used));
    }
    // Largest first: each truncation only removes more of the same copy.
    sizes.sort_unstable();
    sizes.dedup();
    sizes.reverse();
    for size in sizes {
        work.file.set_len(size).unwrap();
        let name = format!("truncate-{size}");
        if let Some((r, _)) = trial(&name, &work.path, &mut failures) {
            println!("{name}: {}", r.describe());
            if size < SUPER + 4096 {
                match r {
                    ImageResult::Refused(Error::Unusable(m)) if m.contains("superblock") => {}
                    other => failures.push(format!(
                        "{name}: no complete superblock: expected a refusal naming it, got {}",
                        other.describe()
                    )),
                }
            }
        }
    }
    finish_on(base, "truncated_images", failures);
}
