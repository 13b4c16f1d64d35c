//! The cargo-fuzz targets of `fuzz/`, run on stable Rust as a short seeded random test:
//! valid seeds (a superblock, leaves and nodes holding every interpreted item type, zlib,
//! zstd and LZO streams) are mutated (bit flips, interesting values, truncation, splicing)
//! and fed to the same entry points the fuzz targets call (`fuzz_entry/mod.rs`).
//! A panic fails the test and saves the input under `$CARGO_TARGET_TMPDIR` for replay with
//! `cargo +nightly fuzz run TARGET FILE`.
//!
//! `OLEO_FUZZ_SEED=N` replays a run, `OLEO_FUZZ_SECS=S` sets the time per target (default 4),
//! `OLEO_FUZZ_CORPUS=DIR` writes the seeds as a starting corpus for cargo-fuzz
//! (`DIR/<target>/seed-N`).

mod fuzz_entry;

use oleo_format::csum::{name_hash, CsumType};
use oleo_format::key::{item, Key};
use oleo_format::superblock::MAGIC;
use oleo_format::tree_block::{HEADER_SIZE, ITEM_SIZE, KEY_PTR_SIZE};
use oleo_format::validate::{check_tree_block, Expect};
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

// ---- seeds ------------------------------------------------------------------------------------

const FSID_BYTE: u8 = 0xab;
const BYTENR: u64 = 1 << 20;

fn put(b: &mut [u8], off: usize, v: &[u8]) {
    b[off..off + v.len()].copy_from_slice(v);
}

fn chunk_item(length: u64, flags: u64, stripes: &[(u64, u64)]) -> Vec<u8> {
    let mut c = vec![0u8; 48 + 32 * stripes.len()];
    put(&mut c, 0, &length.to_le_bytes());
    put(&mut c, 8, &2u64.to_le_bytes());
    put(&mut c, 16, &65536u64.to_le_bytes());
    put(&mut c, 24, &flags.to_le_bytes());
    put(&mut c, 32, &65536u32.to_le_bytes());
    put(&mut c, 36, &65536u32.to_le_bytes());
    put(&mut c, 40, &4096u32.to_le_bytes());
    put(&mut c, 44, &(stripes.len() as u16).to_le_bytes());
    put(&mut c, 46, &1u16.to_le_bytes());
    for (i, (devid, off)) in stripes.iter().enumerate() {
        put(&mut c, 48 + 32 * i, &devid.to_le_bytes());
        put(&mut c, 56 + 32 * i, &off.to_le_bytes());
    }
    c
}

fn superblock_seed() -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    put(&mut b, 32, &[FSID_BYTE; 16]);
    put(&mut b, 48, &65536u64.to_le_bytes());
    put(&mut b, 64, &MAGIC.to_le_bytes());
    put(&mut b, 72, &9u64.to_le_bytes()); // generation
    put(&mut b, 80, &30408704u64.to_le_bytes()); // root
    put(&mut b, 88, &22020096u64.to_le_bytes()); // chunk_root
    put(&mut b, 112, &(256u64 << 20).to_le_bytes());
    put(&mut b, 128, &6u64.to_le_bytes());
    put(&mut b, 136, &1u64.to_le_bytes());
    for off in [144, 148, 152, 156] {
        put(&mut b, off, &4096u32.to_le_bytes());
    }
    put(&mut b, 164, &5u64.to_le_bytes());
    put(&mut b, 188, &0x341u64.to_le_bytes());
    put(&mut b, 201, &1u64.to_le_bytes()); // dev_item.devid
    let key = Key::new(256, item::CHUNK_ITEM, 22020096).to_bytes();
    let chunk = chunk_item(
        8 << 20,
        oleo_format::items::block_group::SYSTEM | oleo_format::items::block_group::DUP,
        &[(1, 22020096), (1, 30408704)],
    );
    put(&mut b, 811, &key);
    put(&mut b, 811 + 17, &chunk);
    put(&mut b, 160, &((17 + chunk.len()) as u32).to_le_bytes());
    let c = CsumType::Crc32c.compute(&b[32..]);
    put(&mut b, 0, &c);
    b
}

fn dir_entry(loc: Key, ty: u8, name: &[u8], data: &[u8]) -> Vec<u8> {
    let mut e = Vec::new();
    e.extend_from_slice(&loc.to_bytes());
    e.extend_from_slice(&7u64.to_le_bytes());
    e.extend_from_slice(&(data.len() as u16).to_le_bytes());
    e.extend_from_slice(&(name.len() as u16).to_le_bytes());
    e.push(ty);
    e.extend_from_slice(name);
    e.extend_from_slice(data);
    e
}

/// Leaf items (key, body) that pass the tree checker: one of every interpreted kind.
fn leaf_items() -> Vec<(Key, Vec<u8>)> {
    let mut inode = vec![0u8; 160];
    put(&mut inode, 0, &5u64.to_le_bytes());
    put(&mut inode, 16, &10000u64.to_le_bytes());
    put(&mut inode, 40, &1u32.to_le_bytes());
    put(&mut inode, 52, &0o100644u32.to_le_bytes());
    let mut iref = Vec::new();
    iref.extend_from_slice(&2u64.to_le_bytes());
    iref.extend_from_slice(&4u16.to_le_bytes());
    iref.extend_from_slice(b"file");
    let mut extref = Vec::new();
    extref.extend_from_slice(&256u64.to_le_bytes());
    extref.extend_from_slice(&3u64.to_le_bytes());
    extref.extend_from_slice(&4u16.to_le_bytes());
    extref.extend_from_slice(b"link");
    let mut inline = vec![0u8; 21];
    put(&mut inline, 0, &5u64.to_le_bytes());
    put(&mut inline, 8, &11u64.to_le_bytes());
    inline.extend_from_slice(b"hello world");
    let mut reg = vec![0u8; 53];
    put(&mut reg, 8, &8192u64.to_le_bytes());
    reg[20] = 1;
    put(&mut reg, 21, &(13u64 << 20).to_le_bytes());
    put(&mut reg, 29, &8192u64.to_le_bytes());
    put(&mut reg, 45, &8192u64.to_le_bytes());
    let mut zreg = reg.clone();
    zreg[16] = 3;
    let mut root = vec![0u8; 439];
    put(&mut root, 160, &5u64.to_le_bytes());
    put(&mut root, 168, &256u64.to_le_bytes());
    put(&mut root, 176, &(30u64 << 20).to_le_bytes());
    put(&mut root, 216, &1u32.to_le_bytes());
    put(&mut root, 239, &5u64.to_le_bytes());
    let mut rref = Vec::new();
    rref.extend_from_slice(&256u64.to_le_bytes());
    rref.extend_from_slice(&2u64.to_le_bytes());
    rref.extend_from_slice(&2u16.to_le_bytes());
    rref.extend_from_slice(b"sv");
    let mut extent = Vec::new();
    extent.extend_from_slice(&1u64.to_le_bytes());
    extent.extend_from_slice(&5u64.to_le_bytes());
    extent.extend_from_slice(&1u64.to_le_bytes());
    extent.push(item::EXTENT_DATA_REF);
    for v in [5u64, 257, 0] {
        extent.extend_from_slice(&v.to_le_bytes());
    }
    extent.extend_from_slice(&1u32.to_le_bytes());
    let target = Key::new(257, item::INODE_ITEM, 0);
    let mut v = vec![
        (Key::new(256, item::INODE_ITEM, 0), {
            let mut d = inode.clone();
            put(&mut d, 52, &0o40755u32.to_le_bytes());
            d
        }),
        (
            Key::new(256, item::DIR_ITEM, name_hash(b"file")),
            dir_entry(target, 1, b"file", b""),
        ),
        (
            Key::new(256, item::DIR_INDEX, 2),
            dir_entry(target, 1, b"file", b""),
        ),
        (Key::new(257, item::INODE_ITEM, 0), inode),
        (Key::new(257, item::INODE_REF, 256), iref),
        (Key::new(257, item::INODE_EXTREF, 99), extref),
        (
            Key::new(257, item::XATTR_ITEM, name_hash(b"user.x")),
            dir_entry(Key::default(), 8, b"user.x", b"value"),
        ),
        (Key::new(257, item::EXTENT_DATA, 0), reg),
        (Key::new(257, item::EXTENT_DATA, 8192), zreg),
        (Key::new(258, item::EXTENT_DATA, 0), inline),
        (Key::new(259, item::ROOT_ITEM, 0), root),
        (Key::new(259, item::ROOT_REF, 260), rref),
        (Key::new(260, item::EXTENT_ITEM, 4096), extent),
        (
            Key::new(261, item::CHUNK_ITEM, 13 << 20),
            chunk_item(8 << 20, 1, &[(1, 13 << 20)]),
        ),
        (
            Key::new(
                oleo_format::key::objectid::EXTENT_CSUM,
                item::EXTENT_CSUM,
                13 << 20,
            ),
            vec![0x5a; 4 * 4],
        ),
    ];
    v.sort_by_key(|(k, _)| *k);
    v
}

fn header(b: &mut [u8], nritems: usize, level: u8) {
    put(b, 32, &[FSID_BYTE; 16]);
    put(b, 48, &BYTENR.to_le_bytes());
    put(b, 80, &7u64.to_le_bytes());
    put(b, 88, &5u64.to_le_bytes());
    put(b, 96, &(nritems as u32).to_le_bytes());
    b[100] = level;
}

/// Context bytes the tree_block entry point decodes to: nodesize 4096, sectorsize 4096,
/// crc32c, fsid FSID_BYTE, generation 100.
fn ctx_prefix() -> Vec<u8> {
    vec![0, 0, 0, FSID_BYTE, 100, 0, 0, 0]
}

fn leaf_seed() -> Vec<u8> {
    let items = leaf_items();
    let mut b = vec![0u8; 4096];
    header(&mut b, items.len(), 0);
    let mut end = 4096 - HEADER_SIZE;
    for (slot, (k, body)) in items.iter().enumerate() {
        end -= body.len();
        let h = HEADER_SIZE + slot * ITEM_SIZE;
        put(&mut b, h, &k.to_bytes());
        put(&mut b, h + 17, &(end as u32).to_le_bytes());
        put(&mut b, h + 21, &(body.len() as u32).to_le_bytes());
        put(&mut b, HEADER_SIZE + end, body);
    }
    let c = CsumType::Crc32c.compute(&b[32..]);
    put(&mut b, 0, &c);
    b
}

fn node_seed() -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    header(&mut b, 3, 1);
    for slot in 0..3u64 {
        let p = HEADER_SIZE + slot as usize * KEY_PTR_SIZE;
        put(&mut b, p, &Key::new(256 + slot * 10, 1, 0).to_bytes());
        put(&mut b, p + 17, &((2 + slot) << 20).to_le_bytes());
        put(&mut b, p + 25, &6u64.to_le_bytes());
    }
    let c = CsumType::Crc32c.compute(&b[32..]);
    put(&mut b, 0, &c);
    b
}

/// A literal-only LZO1X block (what lzo emits for incompressible data) in btrfs framing.
fn lzo_seed(data: &[u8]) -> Vec<u8> {
    let mut block = vec![(data.len() + 17) as u8];
    block.extend_from_slice(data);
    block.extend_from_slice(&[0x11, 0, 0]);
    let mut out = Vec::new();
    out.extend_from_slice(&((8 + block.len()) as u32).to_le_bytes());
    out.extend_from_slice(&(block.len() as u32).to_le_bytes());
    out.extend_from_slice(&block);
    out
}

fn decompression_seeds() -> Vec<Vec<u8>> {
    let data: Vec<u8> = (0..20000u32)
        .map(|i| (i % 251) as u8 ^ (i / 97) as u8)
        .collect();
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(3));
    z.write_all(&data).unwrap();
    let zlib = z.finish().unwrap();
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    enc.set_pledged_src_size(Some(data.len() as u64)).unwrap();
    enc.write_all(&data).unwrap();
    let zst = enc.finish().unwrap();
    let lzo = lzo_seed(b"0123456789abcdefghijklmnopqrstuvwxyz");
    // Prefix: algorithm, output bound / 4 (u16), sector size index.
    let with = |alg: u8, s: &[u8]| {
        let mut v = vec![alg, 0x40, 0x13, 0];
        v.extend_from_slice(s);
        v
    };
    vec![
        with(1, &zlib),
        with(3, &zst),
        with(2, &lzo),
        with(0, &data[..300]),
    ]
}

// ---- mutation and the loop --------------------------------------------------------------------

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>], input: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(4) {
        let len = input.len();
        match rng.below(9) {
            0 | 1 if len > 0 => {
                let bit = rng.below(len * 8);
                input[bit / 8] ^= 1 << (bit % 8);
            }
            2 if len > 0 => {
                let i = rng.below(len);
                input[i] = rng.next() as u8;
            }
            3 | 4 if len >= 8 => {
                let w = [1usize, 2, 4, 8][rng.below(4)];
                let i = rng.below(len - w + 1);
                let v: u64 = match rng.below(10) {
                    0 => 0,
                    1 => u64::MAX,
                    2 => 1 << 63,
                    3 => 1 << 60,
                    4 => 0xffff_ffff,
                    5 => 0x7fff_ffff,
                    6 => 4096,
                    7 => 65536,
                    8 => rng.below(300) as u64,
                    _ => rng.next(),
                };
                input[i..i + w].copy_from_slice(&v.to_le_bytes()[..w]);
            }
            5 if len > 0 => input.truncate(rng.below(len)),
            6 => {
                let n = rng.below(64);
                input.extend((0..n).map(|_| rng.next() as u8));
            }
            7 if len > 0 => {
                // Splice a piece of another seed in.
                let other = &seeds[rng.below(seeds.len())];
                if !other.is_empty() {
                    let from = rng.below(other.len());
                    let n = rng.below(other.len() - from).min(len) + 1;
                    let at = rng.below(len);
                    let n = n.min(len - at).min(other.len() - from);
                    input[at..at + n].copy_from_slice(&other[from..from + n]);
                }
            }
            _ if len > 16 => {
                // Copy a range within the input (duplicated items, keys, headers).
                let n = rng.below(len / 2) + 1;
                let (a, b) = (rng.below(len - n + 1), rng.below(len - n + 1));
                input.copy_within(a..a + n, b);
            }
            _ => input.push(rng.next() as u8),
        }
    }
}

thread_local! {
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Panics of fuzz inputs are expected to be caught: keep them from flooding the output
/// (per thread, so other tests running at the same time still report theirs).
fn quiet_panics(on: bool) {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(|q| q.get()) {
                prev(info)
            }
        }));
    });
    QUIET.with(|q| q.set(on));
}

fn seed() -> u64 {
    std::env::var("OLEO_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
}

fn budget() -> Duration {
    let secs: f64 = std::env::var("OLEO_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4.0);
    Duration::from_secs_f64(secs)
}

/// Feeds the seeds and then mutations of them to `target` until the time budget is spent.
fn run(name: &str, seeds: Vec<Vec<u8>>, target: fn(&[u8])) {
    if let Ok(dir) = std::env::var("OLEO_FUZZ_CORPUS") {
        let d = std::path::Path::new(&dir).join(name);
        std::fs::create_dir_all(&d).unwrap();
        for (i, s) in seeds.iter().enumerate() {
            std::fs::write(d.join(format!("seed-{i}")), s).unwrap();
        }
    }
    let seed = seed();
    let mut rng = Rng(seed);
    let start = Instant::now();
    let limit = budget();
    let mut n = 0u64;
    let mut slowest = Duration::ZERO;
    quiet_panics(true);
    let mut failure = None;
    while n < seeds.len() as u64 || start.elapsed() < limit {
        let mut input = seeds[rng.below(seeds.len())].clone();
        if n >= seeds.len() as u64 {
            mutate(&mut rng, &seeds, &mut input);
        } else {
            input = seeds[n as usize].clone();
        }
        let t = Instant::now();
        let r = catch_unwind(AssertUnwindSafe(|| target(&input)));
        let took = t.elapsed();
        slowest = slowest.max(took);
        n += 1;
        if let Err(p) = r {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            failure = Some((format!("panic: {msg}"), input));
            break;
        }
        if took > Duration::from_secs(2) {
            failure = Some((format!("one input took {took:?}"), input));
            break;
        }
    }
    quiet_panics(false);
    if let Some((what, input)) = failure {
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("fuzz-crash-{name}-{seed}"));
        std::fs::write(&path, &input).unwrap();
        // Run it again with the normal hook, for the location and backtrace.
        let _ = catch_unwind(AssertUnwindSafe(|| target(&input)));
        panic!(
            "{name}: {what} after {n} inputs (OLEO_FUZZ_SEED={seed}); input saved to {} \
             (replay: cargo +nightly fuzz run {name} {})",
            path.display(),
            path.display()
        );
    }
    println!(
        "{name}: {n} inputs in {:.1?} (seed {seed}, replay with OLEO_FUZZ_SEED={seed}), slowest {slowest:.1?}",
        start.elapsed()
    );
}

#[test]
fn seeds_are_valid() {
    // The tree seeds must pass the checker, or mutations of them would explore little.
    let ctx_bytes = ctx_prefix();
    for seed in [leaf_seed(), node_seed()] {
        let mut input = ctx_bytes.clone();
        input.extend_from_slice(&seed);
        let ctx = fuzz_ctx(&input);
        let expect = Expect {
            bytenr: BYTENR,
            ..Default::default()
        };
        check_tree_block(&seed, &ctx, &expect).expect("seed block passes the tree checker");
    }
    oleo_format::Superblock::parse(&superblock_seed()).expect("seed superblock parses");
    let s = oleo_format::Superblock::parse(&superblock_seed()).unwrap();
    assert_eq!(s.sys_chunks().unwrap().len(), 1);
}

/// The context `fuzz_entry::tree_block` derives (kept in step with it).
fn fuzz_ctx(b: &[u8]) -> oleo_format::validate::FsContext {
    oleo_format::validate::FsContext {
        nodesize: [4096u32, 8192, 16384, 65536][(b[0] % 4) as usize],
        sectorsize: 4096,
        csum_type: CsumType::Crc32c,
        metadata_fsid: [b[3]; 16],
        super_generation: u64::from_le_bytes([b[4], b[5], b[6], b[7], 0, 0, 0, 0]),
    }
}

#[test]
fn fuzz_superblock() {
    let mut random = vec![0u8; 4096];
    let mut r = Rng(7);
    random.iter_mut().for_each(|b| *b = r.next() as u8);
    run(
        "superblock",
        vec![superblock_seed(), random, vec![]],
        fuzz_entry::superblock,
    );
}

#[test]
fn fuzz_tree_block() {
    let mut seeds = Vec::new();
    for block in [leaf_seed(), node_seed()] {
        let mut s = ctx_prefix();
        s.extend_from_slice(&block);
        seeds.push(s);
    }
    seeds.push(vec![0u8; 200]);
    run("tree_block", seeds, fuzz_entry::tree_block);
}

#[test]
fn fuzz_items() {
    let seeds: Vec<Vec<u8>> = leaf_items()
        .into_iter()
        .map(|(k, body)| {
            let mut v = vec![k.item_type];
            v.extend_from_slice(&body);
            v
        })
        .collect();
    run("items", seeds, fuzz_entry::items);
}

#[test]
fn fuzz_decompression() {
    run(
        "decompression",
        decompression_seeds(),
        fuzz_entry::decompression,
    );
}
