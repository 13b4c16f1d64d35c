//! Chunk allocation end to end: `Transaction::alloc_chunk` on images from oleo's mkfs and
//! mkfs.btrfs (single and DUP metadata, with and without the block group tree, mixed
//! block groups), then judged by `btrfs check --readonly`, `btrfs inspect-internal
//! dump-tree` (the new chunks' sizes against what the kernel makes on the same device
//! size), the kernel (read-write loop mount, a file written, unmounted, checked again) and
//! oleo reopening the image (read-only, and read-write: every block group and its free
//! space must load). Needs root and btrfs-progs; without them it prints `SKIP: ...` (and
//! fails under CI=true).

use oleo::format::csum::name_hash;
use oleo::format::items::block_group as bg;
use oleo::format::items::DirEntryItem;
use oleo::format::key::{item, objectid, Key};
use oleo::{Error, Filesystem, OpenOptions, Transaction};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const ROOT_DIR: u64 = 256;

/// Prints why the test cannot run (a failure under CI=true); always true.
fn skip(why: &str) -> bool {
    !oleo_testkit::env::skip("chunk_alloc tests", why)
}

/// True when the test cannot run here (after printing why).
/// True when the test cannot run here: root, loop devices, kernel btrfs, btrfs-progs.
fn missing_env() -> bool {
    !oleo_testkit::require_root("chunk_alloc tests")
}

struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("oleo-chunk-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }

    fn image(&self) -> PathBuf {
        self.0.join("image")
    }

    fn mnt(&self) -> PathBuf {
        self.0.join("mnt")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.mnt()).output();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[derive(Clone, Copy, Debug)]
enum Maker {
    Oleo {
        metadata_dup: bool,
        block_group_tree: bool,
    },
    /// mkfs.btrfs with these arguments; `features` are `-O` features it must know (a
    /// newer mkfs.btrfs is looked for when the distribution's lacks them).
    Progs {
        args: &'static [&'static str],
        features: &'static [&'static str],
    },
}

/// Formats a sparse image of `bytes`. False (after a skip message) when no mkfs.btrfs
/// here has the features.
fn make_image(path: &Path, bytes: u64, maker: Maker) -> bool {
    let f = std::fs::File::create(path).expect("create image");
    f.set_len(bytes).expect("size image");
    drop(f);
    match maker {
        Maker::Oleo {
            metadata_dup,
            block_group_tree,
        } => {
            let mut opts = oleo::mkfs::MkfsOptions::default();
            opts.features.block_group_tree = block_group_tree;
            if !metadata_dup {
                opts.metadata_profile = oleo::mkfs::Profile::Single;
            }
            oleo::mkfs::mkfs(path, &opts).expect("oleo mkfs");
        }
        Maker::Progs { args, features } => {
            let Some(mkfs) = oleo_testkit::env::mkfs_btrfs_for(features) else {
                return !skip(&format!("no mkfs.btrfs here knows {features:?}"));
            };
            let mut c = Command::new(mkfs);
            c.args(["-q", "-f"]).args(args);
            if !features.is_empty() {
                c.arg("-O").arg(features.join(","));
            }
            let out = c.arg(path).output().expect("run mkfs.btrfs");
            assert!(
                out.status.success(),
                "mkfs.btrfs {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    true
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run a tool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

/// `btrfs check --readonly` must exit 0 and print no error or warning.
fn btrfs_check(path: &Path, when: &str) {
    if let Err(text) = oleo_testkit::btrfs_check(path, false) {
        panic!("btrfs check {when} failed:\n{text}");
    }
}

/// One chunk as btrfs-progs prints it: (logical, length, type as "METADATA|DUP").
type ChunkLine = (u64, u64, String);

/// The chunk tree as `btrfs inspect-internal dump-tree` reads it (not oleo's parser).
fn chunk_tree(path: &Path) -> BTreeMap<u64, ChunkLine> {
    let text = run(Command::new("btrfs")
        .args(["inspect-internal", "dump-tree", "-t", "chunk"])
        .arg(path));
    let mut out = BTreeMap::new();
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        let Some(rest) = l.split("CHUNK_ITEM ").nth(1) else {
            continue;
        };
        let logical: u64 = rest
            .split(')')
            .next()
            .and_then(|s| s.trim().parse().ok())
            .expect("chunk key");
        let body = lines.next().expect("chunk body line");
        let words: Vec<&str> = body.split_whitespace().collect();
        let field = |name: &str| {
            words
                .iter()
                .position(|w| *w == name)
                .and_then(|i| words.get(i + 1))
                .copied()
                .unwrap_or_default()
                .to_string()
        };
        let length = field("length").parse().expect("chunk length");
        out.insert(logical, (logical, length, field("type")));
    }
    out
}

/// The superblock's dev_item.bytes_used and sys_array_size, as dump-super prints them.
fn super_fields(path: &Path) -> (u64, u64) {
    let text = run(Command::new("btrfs")
        .args(["inspect-internal", "dump-super"])
        .arg(path));
    let get = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| {
                let mut w = l.split_whitespace();
                (w.next() == Some(name)).then(|| w.next()?.parse().ok())?
            })
            .unwrap_or_else(|| panic!("dump-super shows no {name}"))
    };
    (get("dev_item.bytes_used"), get("sys_array_size"))
}

fn type_name(flags: u64) -> String {
    let ty = match flags & bg::TYPE_MASK {
        bg::DATA => "DATA",
        bg::METADATA => "METADATA",
        bg::SYSTEM => "SYSTEM",
        _ => "DATA|METADATA",
    };
    let profile = if flags & bg::DUP != 0 {
        "DUP"
    } else {
        "single"
    };
    format!("{ty}|{profile}")
}

/// Xattrs of the top-level directory: a cheap way to fill metadata with real items.
#[derive(Default)]
struct Xattrs {
    values: BTreeMap<Vec<u8>, Vec<u8>>,
    next: u64,
}

impl Xattrs {
    /// Adds one xattr with a `len`-byte value (false: its name hash was taken).
    fn add(&mut self, txn: &mut Transaction<'_>, len: usize) -> oleo::Result<bool> {
        let n = self.next;
        self.next += 1;
        let name = format!("user.chunk-test.{n}").into_bytes();
        let key = Key::new(ROOT_DIR, item::XATTR_ITEM, name_hash(&name));
        if txn.lookup(objectid::FS_TREE, &key)?.is_some() {
            return Ok(false);
        }
        let value: Vec<u8> = (0..len)
            .map(|i| (n as usize).wrapping_mul(31).wrapping_add(i) as u8)
            .collect();
        let body = DirEntryItem {
            location: Key::new(0, 0, 0),
            transid: txn.generation(),
            file_type: 8, // BTRFS_FT_XATTR
            name: &name,
            data: &value,
        }
        .to_bytes()
        .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        txn.insert_item(objectid::FS_TREE, key, &body)?;
        self.values.insert(name, value);
        Ok(true)
    }

    fn remove(&mut self, txn: &mut Transaction<'_>, name: &[u8]) -> oleo::Result<()> {
        let key = Key::new(ROOT_DIR, item::XATTR_ITEM, name_hash(name));
        txn.delete_item(objectid::FS_TREE, &key)?;
        self.values.remove(name);
        Ok(())
    }

    /// oleo reads back every value (a sample of at most `limit`).
    fn verify(&self, fs: &Filesystem, limit: usize) {
        let root = fs.root();
        for (name, value) in self.values.iter().take(limit) {
            assert_eq!(
                &fs.getxattr(root, name).expect("getxattr"),
                value,
                "xattr {}",
                String::from_utf8_lossy(name)
            );
        }
    }
}

/// Unmounts, retrying while something (udev probing the new device) holds it busy.
fn umount(mnt: &Path) {
    let mut last = String::new();
    for _ in 0..50 {
        let out = Command::new("umount")
            .arg(mnt)
            .output()
            .expect("run umount");
        if out.status.success() {
            return;
        }
        last = String::from_utf8_lossy(&out.stderr).into_owned();
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("umount {} failed: {last}", mnt.display());
}

/// The kernel mounts the image read-write, writes a file (data and metadata) and unmounts;
/// btrfs check is clean afterwards; oleo reads the file back.
fn kernel_writes_a_file(scratch: &Scratch, name: &str) {
    let mnt = scratch.mnt();
    std::fs::create_dir_all(&mnt).expect("mountpoint");
    run(Command::new("mount")
        .args(["-o", "loop"])
        .arg(scratch.image())
        .arg(&mnt));
    let data: Vec<u8> = (0..(3 * MIB + 12345) as usize)
        .map(|i| (i % 251) as u8 ^ name.len() as u8)
        .collect();
    let wrote = std::fs::write(mnt.join(name), &data).and_then(|_| {
        std::fs::create_dir(mnt.join(format!("{name}.dir")))?;
        std::fs::File::open(mnt.join(name))?.sync_all()
    });
    umount(&mnt);
    wrote.expect("the kernel writes a file");
    btrfs_check(&scratch.image(), &format!("after the kernel wrote {name}"));
    let fs = Filesystem::open(scratch.image(), OpenOptions::default()).expect("reopen");
    let id = fs
        .lookup(fs.root(), name.as_bytes())
        .expect("oleo finds the file");
    let back = fs
        .read(id, 0, data.len() as u32 + 10)
        .expect("oleo reads it");
    assert!(back == data, "oleo reads other bytes than the kernel wrote");
}

/// oleo opens it read-write and starts a transaction: every block group and its free space
/// must load (the free space tree is checked item by item there).
fn oleo_reopens(path: &Path) {
    let fs = Filesystem::open_rw(path, OpenOptions::default()).expect("reopen rw");
    fs.start_transaction()
        .expect("a transaction loads every block group");
}

/// The chunks new since `before`, which must be exactly `made` (logical, kind flags).
fn check_new_chunks(
    path: &Path,
    before: &BTreeMap<u64, ChunkLine>,
    made: &[(u64, u64, u64)],
) -> BTreeMap<u64, ChunkLine> {
    let after = chunk_tree(path);
    let new: Vec<&ChunkLine> = after
        .iter()
        .filter(|(l, _)| !before.contains_key(l))
        .map(|(_, c)| c)
        .collect();
    let want: Vec<ChunkLine> = made
        .iter()
        .map(|&(logical, flags, len)| (logical, len, type_name(flags)))
        .collect();
    let got: Vec<ChunkLine> = new.into_iter().cloned().collect();
    assert_eq!(got, want, "new chunks as btrfs-progs reads them");
    after
}

fn open_rw(path: &Path) -> Filesystem {
    Filesystem::open_rw(path, OpenOptions::default()).expect("open read-write")
}

/// Sizes a 6.x kernel gives new chunks on a 1 GiB device (seen in images it wrote: a data
/// chunk of 117440512 bytes and METADATA|DUP stripes of 117440512 bytes, i.e. 10% of the
/// device rounded up to 16 MiB), and SYSTEM chunks of 32 MiB (the type's limit).
fn kernel_size_1g(kind: u64) -> u64 {
    if kind == bg::SYSTEM {
        32 * MIB
    } else {
        112 * MIB
    }
}

/// DATA, METADATA and SYSTEM chunks, several in one transaction and more in later ones.
fn every_type(name: &str, maker: Maker) {
    if missing_env() {
        return;
    }
    let scratch = Scratch::new(name);
    let img = scratch.image();
    if !make_image(&img, GIB, maker) {
        return;
    }
    btrfs_check(&img, "of the fresh image");
    let mut chunks = chunk_tree(&img);
    // The profile mkfs chose for each type (what new chunks must use).
    let profiles: BTreeMap<u64, u64> = [
        (bg::DATA, "DATA|"),
        (bg::METADATA, "METADATA|"),
        (bg::SYSTEM, "SYSTEM|"),
    ]
    .into_iter()
    .map(|(kind, prefix)| {
        let c = chunks
            .values()
            .rfind(|c| c.2.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} chunk"));
        (kind, if c.2.ends_with("DUP") { bg::DUP } else { 0 })
    })
    .collect();
    let mut xattrs = Xattrs::default();
    let mut fs = open_rw(&img);
    let plans: [&[u64]; 3] = [
        &[bg::DATA, bg::METADATA, bg::SYSTEM],
        &[bg::METADATA],
        &[bg::SYSTEM, bg::DATA],
    ];
    let (mut dev_used, _) = super_fields(&img);
    for (round, plan) in plans.iter().enumerate() {
        let mut made = Vec::new();
        fs.with_transaction(|txn| {
            assert!(matches!(
                txn.alloc_chunk(bg::DATA | bg::SYSTEM),
                Err(Error::InvalidArgument(_))
            ));
            for &kind in plan.iter() {
                let before = txn.available(kind);
                let logical = txn.alloc_chunk(kind)?;
                let flags = kind | profiles[&kind];
                let len = kernel_size_1g(kind);
                assert!(
                    txn.available(kind) >= before + len - 4 * 65536,
                    "{}: the new group is not available at once",
                    type_name(flags)
                );
                made.push((logical, flags, len));
                // Items between allocations: the new groups serve tree blocks at once.
                for _ in 0..50 {
                    xattrs.add(txn, 3000)?;
                }
            }
            Ok(())
        })
        .expect("transaction with new chunks");
        xattrs.verify(&fs, usize::MAX);
        drop(fs);
        btrfs_check(&img, &format!("after round {round}"));
        chunks = check_new_chunks(&img, &chunks, &made);
        let (used, _) = super_fields(&img);
        let grew: u64 = made
            .iter()
            .map(|&(_, flags, len)| len * if flags & bg::DUP != 0 { 2 } else { 1 })
            .sum();
        assert_eq!(
            used,
            dev_used + grew,
            "dev_item.bytes_used after round {round}"
        );
        dev_used = used;
        oleo_reopens(&img);
        fs = open_rw(&img);
        let sys = fs.superblock().sys_chunks().expect("sys_chunk_array");
        for &(logical, flags, _) in &made {
            assert_eq!(
                sys.iter().any(|(l, _)| *l == logical),
                flags & bg::SYSTEM != 0,
                "sys_chunk_array and chunk {logical}"
            );
        }
    }
    drop(fs);
    kernel_writes_a_file(&scratch, "kernel-file");
    // oleo writes on top of the kernel's commit, into the new groups too.
    let fs = open_rw(&img);
    fs.with_transaction(|txn| {
        for _ in 0..200 {
            xattrs.add(txn, 2000)?;
        }
        Ok(())
    })
    .expect("a commit after the kernel's");
    xattrs.verify(&fs, usize::MAX);
    drop(fs);
    btrfs_check(&img, "after a commit on top of the kernel's");
    keep(&scratch, name);
}

/// `OLEO_TEST_KEEP=1` keeps a copy of the final image as /tmp/oleo-chunk-NAME.img.
fn keep(scratch: &Scratch, name: &str) {
    if std::env::var("OLEO_TEST_KEEP").is_ok() {
        let _ = std::fs::copy(scratch.image(), format!("/tmp/oleo-chunk-{name}.img"));
    }
}

#[test]
fn oleo_mkfs_dup_metadata() {
    every_type(
        "oleo-dup",
        Maker::Oleo {
            metadata_dup: true,
            block_group_tree: false,
        },
    );
}

#[test]
fn oleo_mkfs_single_metadata_block_group_tree() {
    every_type(
        "oleo-single-bgt",
        Maker::Oleo {
            metadata_dup: false,
            block_group_tree: true,
        },
    );
}

#[test]
fn progs_default() {
    every_type(
        "progs-default",
        Maker::Progs {
            args: &[],
            features: &[],
        },
    );
}

#[test]
fn progs_single_metadata() {
    every_type(
        "progs-single",
        Maker::Progs {
            args: &["-m", "single", "--nodesize", "4096"],
            features: &[],
        },
    );
}

#[test]
fn progs_block_group_tree() {
    every_type(
        "progs-bgt",
        Maker::Progs {
            args: &[],
            features: &["block-group-tree"],
        },
    );
}

/// Mixed block groups: a DATA or METADATA request makes a DATA|METADATA chunk.
#[test]
fn progs_mixed_block_groups() {
    if missing_env() {
        return;
    }
    let scratch = Scratch::new("mixed");
    let img = scratch.image();
    if !make_image(
        &img,
        GIB,
        Maker::Progs {
            args: &["--mixed"],
            features: &[],
        },
    ) {
        return;
    }
    let before = chunk_tree(&img);
    let fs = open_rw(&img);
    let mut xattrs = Xattrs::default();
    let mut made = Vec::new();
    fs.with_transaction(|txn| {
        for kind in [bg::METADATA, bg::DATA] {
            let logical = txn.alloc_chunk(kind)?;
            made.push((logical, bg::DATA | bg::METADATA, 112 * MIB));
            for _ in 0..100 {
                xattrs.add(txn, 1000)?;
            }
        }
        Ok(())
    })
    .expect("transaction");
    drop(fs);
    btrfs_check(&img, "after mixed chunks");
    check_new_chunks(&img, &before, &made);
    oleo_reopens(&img);
    kernel_writes_a_file(&scratch, "mixed-file");
    keep(&scratch, "mixed");
}

/// SYSTEM chunks until the superblock's sys_chunk_array (2048 bytes) is full: then a clean
/// NoSpace, and the transaction still commits.
#[test]
fn system_chunks_until_the_superblock_array_is_full() {
    if missing_env() {
        return;
    }
    let scratch = Scratch::new("sys-array");
    let img = scratch.image();
    make_image(
        &img,
        GIB,
        Maker::Progs {
            args: &[],
            features: &[],
        },
    );
    let (_, array_before) = super_fields(&img);
    let fs = open_rw(&img);
    let mut made = 0u64;
    for round in 0..2 {
        let (_, full) = fs
            .with_transaction(|txn| {
                for _ in 0..8 {
                    match txn.alloc_chunk(bg::SYSTEM) {
                        Ok(_) => made += 1,
                        Err(Error::NoSpace) => {
                            assert!(txn.poisoned().is_none());
                            return Ok(true);
                        }
                        Err(e) => return Err(e),
                    }
                }
                Ok(false)
            })
            .expect("transaction");
        assert_eq!(full, round == 1, "round {round}");
    }
    drop(fs);
    btrfs_check(&img, "with a full sys_chunk_array");
    // DUP: a 17-byte key and a 112-byte chunk item each.
    let (_, array) = super_fields(&img);
    assert_eq!(array, array_before + made * 129);
    assert!(
        array + 129 > 2048 && array <= 2048,
        "array of {array} bytes"
    );
    oleo_reopens(&img);
    kernel_writes_a_file(&scratch, "sys-file");
    keep(&scratch, "sys-array");
}

/// Raw item inserts fill metadata; whenever little is left a new METADATA chunk comes,
/// until the device is full and alloc_chunk says NoSpace (nothing changed: the
/// transaction commits). Then some items go (space freed in the new groups) and the
/// kernel writes into the image.
fn fill_metadata(name: &str, maker: Maker, bytes: u64, value_len: usize) {
    if missing_env() {
        return;
    }
    let scratch = Scratch::new(name);
    let img = scratch.image();
    if !make_image(&img, bytes, maker) {
        return;
    }
    let before = chunk_tree(&img);
    let reserve = 4 * MIB;
    let mut xattrs = Xattrs::default();
    let fs = open_rw(&img);
    let mut chunks = 0;
    let mut commits = 0;
    loop {
        let (_, full) = fs
            .with_transaction(|txn| {
                for _ in 0..1500 {
                    if txn.available(bg::METADATA) < reserve {
                        match txn.alloc_chunk(bg::METADATA) {
                            Ok(_) => {
                                chunks += 1;
                                continue;
                            }
                            Err(Error::NoSpace) => return Ok(true),
                            Err(e) => return Err(e),
                        }
                    }
                    xattrs.add(txn, value_len)?;
                }
                Ok(false)
            })
            .unwrap_or_else(|e| panic!("commit {commits}: {e}"));
        commits += 1;
        if full {
            break;
        }
        assert!(commits < 500, "the device never filled up");
    }
    eprintln!(
        "{name}: {} xattrs, {chunks} new metadata chunks, {commits} commits",
        xattrs.values.len()
    );
    assert!(chunks >= 2, "only {chunks} metadata chunks were made");
    // Full: past the reserved first MiB, less unallocated device space than the smallest
    // chunk (a 64 KiB stripe each).
    let (dev_used, _) = super_fields(&img);
    let left = bytes - MIB - dev_used;
    eprintln!("{name}: {left} bytes of the device left unallocated");
    assert!(left < 2 * 65536, "{left} bytes of the device are left");
    let after = chunk_tree(&img);
    let new_meta = after
        .keys()
        .filter(|l| !before.contains_key(l))
        .filter(|l| after[l].2.starts_with("METADATA"))
        .count();
    assert_eq!(new_meta, chunks);
    // Full: another try changes nothing and the (empty) transaction still commits.
    let generation = fs.superblock().generation;
    fs.with_transaction(|txn| {
        assert!(matches!(txn.alloc_chunk(bg::METADATA), Err(Error::NoSpace)));
        assert!(txn.poisoned().is_none());
        Ok(())
    })
    .expect("commit after NoSpace");
    assert_eq!(fs.superblock().generation, generation + 1);
    xattrs.verify(&fs, 2000);
    drop(fs);
    btrfs_check(&img, "with a full device");
    oleo_reopens(&img);
    // Free a third of the items, so the kernel has room. Copy-on-write needs space to free
    // space: small batches of neighbouring keys (each leaf copied once, then emptied).
    let fs = open_rw(&img);
    let mut names: Vec<Vec<u8>> = xattrs.values.keys().cloned().collect();
    names.sort_by_key(|n| name_hash(n));
    names.truncate(names.len() / 3);
    for batch in names.chunks(300) {
        fs.with_transaction(|txn| {
            for n in batch {
                xattrs.remove(txn, n)?;
            }
            Ok(())
        })
        .expect("deleting items");
    }
    xattrs.verify(&fs, usize::MAX);
    drop(fs);
    btrfs_check(&img, "after freeing items");
    oleo_reopens(&img);
    kernel_writes_a_file(&scratch, "after-full");
    let fs = Filesystem::open(&img, OpenOptions::default()).expect("reopen");
    xattrs.verify(&fs, usize::MAX);
    keep(&scratch, name);
}

#[test]
fn fill_metadata_dup_progs() {
    fill_metadata(
        "fill-progs-dup",
        Maker::Progs {
            args: &[],
            features: &[],
        },
        256 * MIB,
        5000,
    );
}

#[test]
fn fill_metadata_single_oleo_block_group_tree() {
    fill_metadata(
        "fill-oleo-single-bgt",
        Maker::Oleo {
            metadata_dup: false,
            block_group_tree: true,
        },
        256 * MIB,
        5000,
    );
}

#[test]
fn fill_metadata_small_nodes_progs_block_group_tree() {
    fill_metadata(
        "fill-progs-4k-bgt",
        Maker::Progs {
            args: &["--nodesize", "4096"],
            features: &["block-group-tree"],
        },
        160 * MIB,
        1200,
    );
}

/// A DATA chunk needs metadata for its items: with metadata nearly exhausted, alloc_chunk
/// makes a METADATA chunk first (as the kernel makes a SYSTEM one before it runs short).
#[test]
fn data_chunk_makes_metadata_room_first() {
    if missing_env() {
        return;
    }
    let scratch = Scratch::new("meta-first");
    let img = scratch.image();
    make_image(
        &img,
        GIB,
        Maker::Progs {
            args: &[],
            features: &[],
        },
    );
    let before = chunk_tree(&img);
    let mut xattrs = Xattrs::default();
    let fs = open_rw(&img);
    let mut made = Vec::new();
    fs.with_transaction(|txn| {
        while txn.available(bg::METADATA) > 700 << 10 {
            xattrs.add(txn, 5000)?;
        }
        let meta_end = chunk_tree_end(txn)?;
        let data = txn.alloc_chunk(bg::DATA)?;
        made.push((meta_end, bg::METADATA | bg::DUP, 112 * MIB));
        made.push((data, bg::DATA, 112 * MIB));
        assert!(txn.available(bg::METADATA) > 100 * MIB);
        Ok(())
    })
    .expect("transaction");
    drop(fs);
    btrfs_check(&img, "after a data chunk with little metadata left");
    check_new_chunks(&img, &before, &made);
    oleo_reopens(&img);
    kernel_writes_a_file(&scratch, "meta-first");
}

/// Where the next chunk goes: after the highest one (from the chunk tree as T sees it).
fn chunk_tree_end(txn: &mut Transaction<'_>) -> oleo::Result<u64> {
    let mut end = 0;
    txn.for_each_in_range(
        objectid::CHUNK_TREE,
        Key::new(objectid::FIRST_CHUNK_TREE, item::CHUNK_ITEM, 0),
        Key::new(objectid::FIRST_CHUNK_TREE, item::CHUNK_ITEM, u64::MAX),
        |key, body| {
            let len = u64::from_le_bytes(body[..8].try_into().unwrap());
            end = end.max(key.offset + len);
            Ok(std::ops::ControlFlow::Continue(()))
        },
    )?;
    Ok(end)
}
