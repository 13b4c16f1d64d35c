//! Write transactions end to end: files created (and deleted) as raw items in tree 5 of
//! `oleo mkfs` and `mkfs.btrfs` images, committed, then judged by `btrfs check --readonly`,
//! the kernel (loop mount + listing) and oleo's own reader. Needs root and btrfs-progs;
//! without them it prints `SKIP: ...` (and fails under CI=true).
//!
//! Random choices are seeded; the seed is printed and `OLEO_TEST_SEED` replays it.
//! `OLEO_TEST_KEEP=1` keeps a copy of each committed image as /tmp/NAME-N.img.

use oleo::format::csum::name_hash;
use oleo::format::items::{DirEntryItem, InodeItem, InodeRef, Timespec};
use oleo::format::key::{item, objectid, Key};
use oleo::{Filesystem, OpenOptions, Transaction};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT_DIR: u64 = 256;
const IMAGE_BYTES: u64 = 512 << 20;

struct Rng(u64);

impl Rng {
    /// Seeded as every randomized test (testkit's `seeds`: replayable, fixed under CI).
    fn from_env(test: &str) -> Rng {
        Rng(oleo_testkit::ops::seeds(test, 1)[0] | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// True when the test cannot run here (after printing why).
/// True when the test cannot run here: root, loop devices, kernel btrfs, btrfs-progs.
fn missing_env() -> bool {
    !oleo_testkit::require_root("transaction tests")
}

struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("oleo-txn-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }

    fn image(&self) -> PathBuf {
        self.0.join("image")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.join("mnt")).output();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

enum Maker {
    Oleo { nodesize: u32 },
    Progs { args: &'static [&'static str] },
}

fn make_image(path: &Path, maker: &Maker) {
    let f = std::fs::File::create(path).expect("create image");
    f.set_len(IMAGE_BYTES).expect("size image");
    drop(f);
    match maker {
        Maker::Oleo { nodesize } => {
            let opts = oleo::mkfs::MkfsOptions {
                nodesize: *nodesize,
                ..Default::default()
            };
            oleo::mkfs::mkfs(path, &opts).expect("oleo mkfs");
        }
        Maker::Progs { args } => {
            let out = Command::new("mkfs.btrfs")
                .arg("-q")
                .arg("-f")
                .args(*args)
                .arg(path)
                .output()
                .expect("run mkfs.btrfs");
            assert!(
                out.status.success(),
                "mkfs.btrfs failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// `btrfs check --readonly` must exit 0 and print no error or warning.
fn btrfs_check(path: &Path, when: &str) {
    if let Err(text) = oleo_testkit::btrfs_check(path, false) {
        panic!("btrfs check {when} failed:\n{text}");
    }
}

/// What the root directory should hold: name -> inode number; plus the counters a
/// creator needs.
#[derive(Default)]
struct Model {
    files: BTreeMap<Vec<u8>, (u64, u64)>,
    next_ino: u64,
    next_index: u64,
}

impl Model {
    fn new() -> Model {
        Model {
            files: BTreeMap::new(),
            next_ino: 257,
            next_index: 2,
        }
    }
}

fn now() -> Timespec {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Timespec {
        sec: d.as_secs() as i64,
        nsec: d.subsec_nanos(),
    }
}

fn fs_key(objectid: u64, ty: u8, offset: u64) -> Key {
    Key::new(objectid, ty, offset)
}

/// Changes the root directory's INODE_ITEM: size by `delta`, times and transid.
fn touch_root_dir(txn: &mut Transaction<'_>, delta: i64) -> oleo::Result<()> {
    let key = fs_key(ROOT_DIR, item::INODE_ITEM, 0);
    let body = txn
        .lookup(objectid::FS_TREE, &key)?
        .ok_or(oleo::Error::NotFound)?;
    let mut inode = InodeItem::parse(&body).map_err(|e| oleo::Error::corrupt(0, e.to_string()))?;
    inode.size = (inode.size as i64 + delta) as u64;
    inode.transid = txn.generation();
    inode.sequence += 1;
    inode.ctime = now();
    inode.mtime = inode.ctime;
    let new = inode.to_bytes();
    txn.update_item(objectid::FS_TREE, &key, |b| b.copy_from_slice(&new))
}

fn create_file(txn: &mut Transaction<'_>, model: &mut Model, name: &[u8]) -> oleo::Result<bool> {
    let hash = name_hash(name);
    let dir_item_key = fs_key(ROOT_DIR, item::DIR_ITEM, hash);
    if txn.lookup(objectid::FS_TREE, &dir_item_key)?.is_some() {
        return Ok(false); // a hash collision: keep the test simple, pick another name
    }
    let (ino, index, t, ts) = (model.next_ino, model.next_index, txn.generation(), now());
    let inode = InodeItem {
        generation: t,
        transid: t,
        nlink: 1,
        mode: 0o100644,
        atime: ts,
        ctime: ts,
        mtime: ts,
        otime: ts,
        ..Default::default()
    };
    let entry = DirEntryItem {
        location: fs_key(ino, item::INODE_ITEM, 0),
        transid: t,
        file_type: 1,
        name,
        data: &[],
    }
    .to_bytes()
    .map_err(|e| oleo::Error::InvalidArgument(e.to_string()))?;
    let iref = InodeRef::to_bytes_all(&[InodeRef {
        index,
        name: name.to_vec(),
    }])
    .map_err(|e| oleo::Error::InvalidArgument(e.to_string()))?;
    txn.insert_item(
        objectid::FS_TREE,
        fs_key(ino, item::INODE_ITEM, 0),
        &inode.to_bytes(),
    )?;
    txn.insert_item(
        objectid::FS_TREE,
        fs_key(ino, item::INODE_REF, ROOT_DIR),
        &iref,
    )?;
    txn.insert_item(objectid::FS_TREE, dir_item_key, &entry)?;
    txn.insert_item(
        objectid::FS_TREE,
        fs_key(ROOT_DIR, item::DIR_INDEX, index),
        &entry,
    )?;
    touch_root_dir(txn, 2 * name.len() as i64)?;
    model.files.insert(name.to_vec(), (ino, index));
    model.next_ino += 1;
    model.next_index += 1;
    Ok(true)
}

fn delete_file(txn: &mut Transaction<'_>, model: &mut Model, name: &[u8]) -> oleo::Result<()> {
    let (ino, index) = model.files.remove(name).ok_or(oleo::Error::NotFound)?;
    txn.delete_item(objectid::FS_TREE, &fs_key(ino, item::INODE_ITEM, 0))?;
    txn.delete_item(objectid::FS_TREE, &fs_key(ino, item::INODE_REF, ROOT_DIR))?;
    txn.delete_item(
        objectid::FS_TREE,
        &fs_key(ROOT_DIR, item::DIR_ITEM, name_hash(name)),
    )?;
    txn.delete_item(objectid::FS_TREE, &fs_key(ROOT_DIR, item::DIR_INDEX, index))?;
    touch_root_dir(txn, -2 * name.len() as i64)
}

fn random_name(rng: &mut Rng, model: &Model) -> Vec<u8> {
    loop {
        let len = 1 + rng.below(40) as usize;
        let name: Vec<u8> = (0..len)
            .map(|_| b"abcdefghijklmnopqrstuvwxyz0123456789_-."[rng.below(39) as usize])
            .collect();
        if name != b"." && name != b".." && !model.files.contains_key(&name) {
            return name;
        }
    }
}

/// One transaction: `create` new files, `delete` random existing ones; commits.
fn run_txn(fs: &mut Filesystem, model: &mut Model, rng: &mut Rng, create: usize, delete: usize) {
    let before = fs.superblock().generation;
    let (writes_before, flushes_before) = fs.io_counts();
    let generation = fs
        .with_transaction(|txn| {
            let mut made = 0;
            while made < create {
                let name = random_name(rng, model);
                if create_file(txn, model, &name)? {
                    made += 1;
                }
            }
            for _ in 0..delete.min(model.files.len()) {
                let pick = rng.below(model.files.len() as u64) as usize;
                let name = model.files.keys().nth(pick).cloned().unwrap_or_default();
                delete_file(txn, model, &name)?;
            }
            Ok(())
        })
        .expect("transaction")
        .0;
    assert_eq!(generation, before + 1);
    assert_eq!(fs.superblock().generation, generation);
    // One flush after the tree blocks, one after the superblocks; nothing else.
    let (writes, flushes) = fs.io_counts();
    assert_eq!(flushes - flushes_before, 2, "flushes in one commit");
    assert!(
        writes - writes_before >= 3,
        "blocks and at least one superblock"
    );
}

/// oleo's reader sees exactly the model.
fn check_with_oleo(fs: &Filesystem, model: &Model) {
    let mut seen = BTreeMap::new();
    fs.readdir(fs.root(), 0, &mut |e| {
        seen.insert(e.name, e.id.ino);
        true
    })
    .expect("readdir");
    let want: BTreeMap<Vec<u8>, u64> = model
        .files
        .iter()
        .map(|(n, (ino, _))| (n.clone(), *ino))
        .collect();
    assert_eq!(seen, want, "oleo lists other names than were created");
    for (name, (ino, _)) in model.files.iter().take(50) {
        let id = fs.lookup(fs.root(), name).expect("lookup");
        assert_eq!(id.ino, *ino);
        let attr = fs.getattr(id).expect("getattr");
        assert_eq!(attr.size, 0);
    }
}

/// The kernel mounts the image and lists exactly the model's names; check again after.
fn check_with_kernel(scratch: &Scratch, model: &Model) {
    let mnt = scratch.0.join("mnt");
    std::fs::create_dir_all(&mnt).expect("mountpoint");
    let out = Command::new("mount")
        .args(["-o", "loop"])
        .arg(scratch.image())
        .arg(&mnt)
        .output()
        .expect("run mount");
    assert!(
        out.status.success(),
        "kernel mount failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Result<Vec<Vec<u8>>, _> = std::fs::read_dir(&mnt).map(|rd| {
        rd.filter_map(|e| e.ok())
            .map(|e| {
                use std::os::unix::ffi::OsStrExt;
                e.file_name().as_bytes().to_vec()
            })
            .collect()
    });
    umount(&mnt);
    let mut listed = listed.expect("kernel readdir");
    listed.sort();
    let want: Vec<Vec<u8>> = model.files.keys().cloned().collect();
    assert_eq!(
        listed, want,
        "the kernel lists other names than were created"
    );
    btrfs_check(&scratch.image(), "after the kernel mount");
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

fn open_rw(path: &Path) -> Filesystem {
    Filesystem::open_rw(path, OpenOptions::default()).expect("open read-write")
}

/// Several transactions on one image, with all three judges after each phase.
fn scenario(name: &str, maker: Maker, plan: &[(usize, usize)]) {
    if missing_env() {
        return;
    }
    let mut rng = Rng::from_env(name);
    let scratch = Scratch::new(name);
    make_image(&scratch.image(), &maker);
    btrfs_check(&scratch.image(), "of the fresh image");
    let mut model = Model::new();
    for (i, &(create, delete)) in plan.iter().enumerate() {
        let mut fs = open_rw(&scratch.image());
        run_txn(&mut fs, &mut model, &mut rng, create, delete);
        check_with_oleo(&fs, &model);
        drop(fs);
        btrfs_check(&scratch.image(), &format!("after commit {}", i + 1));
        if std::env::var("OLEO_TEST_KEEP").is_ok() {
            let _ = std::fs::copy(scratch.image(), format!("/tmp/{name}-{}.img", i + 1));
        }
    }
    check_with_kernel(&scratch, &model);
    // The kernel's own commit at unmount must not disturb what oleo reads; and oleo can
    // write on top of a kernel-written generation.
    let mut fs = open_rw(&scratch.image());
    check_with_oleo(&fs, &model);
    run_txn(&mut fs, &mut model, &mut rng, 20, 5);
    drop(fs);
    btrfs_check(&scratch.image(), "after a commit on top of the kernel's");
    let fs = Filesystem::open(scratch.image(), OpenOptions::default()).expect("reopen");
    check_with_oleo(&fs, &model);
}

#[test]
fn oleo_mkfs_three_commits() {
    scenario(
        "oleo-mkfs",
        Maker::Oleo { nodesize: 16384 },
        &[(300, 0), (200, 100), (50, 120)],
    );
}

#[test]
fn oleo_mkfs_small_nodes_many_files() {
    scenario(
        "oleo-mkfs-4k",
        Maker::Oleo { nodesize: 4096 },
        &[(2000, 0), (1000, 1500)],
    );
}

#[test]
fn progs_default_features() {
    scenario(
        "progs-default",
        Maker::Progs { args: &[] },
        &[(10, 0), (1000, 300)],
    );
}

#[test]
fn progs_small_nodes_5000_files() {
    scenario(
        "progs-4k",
        Maker::Progs {
            args: &["--nodesize", "4096"],
        },
        &[(5000, 0), (500, 2000), (100, 100)],
    );
}

#[test]
fn progs_other_checksums_and_profiles() {
    scenario(
        "progs-xxhash",
        Maker::Progs {
            args: &["--csum", "xxhash", "-m", "single"],
        },
        &[(300, 100)],
    );
    scenario(
        "progs-sha256",
        Maker::Progs {
            args: &["--csum", "sha256", "--nodesize", "8192"],
        },
        &[(300, 100)],
    );
    scenario(
        "progs-blake2",
        Maker::Progs {
            args: &["--csum", "blake2", "-m", "dup"],
        },
        &[(200, 50)],
    );
}

/// Several commits in one open filesystem, reads in between see each new state.
#[test]
fn commits_in_one_session() {
    if missing_env() {
        return;
    }
    let mut rng = Rng::from_env("one-session");
    let scratch = Scratch::new("one-session");
    make_image(
        &scratch.image(),
        &Maker::Progs {
            args: &["--nodesize", "4096"],
        },
    );
    let mut model = Model::new();
    let mut fs = open_rw(&scratch.image());
    for (create, delete) in [(400, 0), (100, 200), (0, 0), (300, 50)] {
        run_txn(&mut fs, &mut model, &mut rng, create, delete);
        check_with_oleo(&fs, &model);
    }
    drop(fs);
    btrfs_check(&scratch.image(), "after four commits in one session");
    check_with_kernel(&scratch, &model);
}

/// A commit that dies after K device writes (before or during the superblock) leaves the
/// image at a generation btrfs check accepts; before the superblock, the previous one.
#[test]
fn interrupted_commit_keeps_previous_generation() {
    if missing_env() {
        return;
    }
    let mut rng = Rng::from_env("interrupted");
    let scratch = Scratch::new("interrupted");
    make_image(
        &scratch.image(),
        &Maker::Progs {
            args: &["--nodesize", "4096"],
        },
    );
    let mut model = Model::new();
    let mut fs = open_rw(&scratch.image());
    run_txn(&mut fs, &mut model, &mut rng, 200, 0);
    let committed = fs.superblock().generation;
    drop(fs);
    for round in 0..3 {
        let fs = open_rw(&scratch.image());
        let budget = rng.below(60);
        fs.fail_writes_after(budget);
        let mut scratch_model = Model {
            files: model.files.clone(),
            next_ino: model.next_ino,
            next_index: model.next_index,
        };
        let r = fs.with_transaction(|txn| {
            for _ in 0..300 {
                let name = random_name(&mut rng, &scratch_model);
                create_file(txn, &mut scratch_model, &name)?;
            }
            Ok(())
        });
        eprintln!(
            "round {round}: failing after {budget} writes: {:?}",
            r.as_ref().err()
        );
        assert!(
            r.is_err(),
            "the commit should have hit the injected failure"
        );
        drop(fs);
        let fs = Filesystem::open(scratch.image(), OpenOptions::default()).expect("reopen");
        assert_eq!(fs.superblock().generation, committed);
        check_with_oleo(&fs, &model);
        drop(fs);
        btrfs_check(
            &scratch.image(),
            &format!("after interrupted commit {round}"),
        );
    }
    let mut fs = open_rw(&scratch.image());
    run_txn(&mut fs, &mut model, &mut rng, 100, 30);
    drop(fs);
    btrfs_check(&scratch.image(), "after a commit following the failures");
    check_with_kernel(&scratch, &model);
}

#[test]
fn oleo_mkfs_block_group_tree() {
    if missing_env() {
        return;
    }
    let mut rng = Rng::from_env("oleo-bgt");
    let scratch = Scratch::new("oleo-bgt");
    let f = std::fs::File::create(scratch.image()).expect("create image");
    f.set_len(IMAGE_BYTES).expect("size image");
    drop(f);
    let mut opts = oleo::mkfs::MkfsOptions::default();
    opts.features.block_group_tree = true;
    oleo::mkfs::mkfs(scratch.image(), &opts).expect("oleo mkfs");
    let mut model = Model::new();
    let mut fs = open_rw(&scratch.image());
    run_txn(&mut fs, &mut model, &mut rng, 600, 200);
    drop(fs);
    btrfs_check(&scratch.image(), "after a commit with the block group tree");
    check_with_kernel(&scratch, &model);
}

/// Without skinny metadata the transaction refuses to start, and the image is untouched.
#[test]
fn non_skinny_metadata_is_refused() {
    if missing_env() {
        return;
    }
    let scratch = Scratch::new("non-skinny");
    make_image(
        &scratch.image(),
        &Maker::Progs {
            args: &["-O", "^skinny-metadata"],
        },
    );
    let fs = open_rw(&scratch.image());
    let generation = fs.superblock().generation;
    match fs.start_transaction() {
        Err(oleo::Error::Unsupported(why)) => assert!(why.contains("skinny"), "{why}"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a transaction started on a non-skinny image"),
    }
    drop(fs);
    let fs = Filesystem::open(scratch.image(), OpenOptions::default()).expect("reopen");
    assert_eq!(fs.superblock().generation, generation);
}

/// After a kernel snapshot of tree 5, its blocks are shared: copying one is refused (and
/// nothing is written), rather than corrupting the reference counts.
#[test]
fn writes_to_a_snapshotted_tree_keep_the_snapshot() {
    if missing_env() {
        return;
    }
    let mut rng = Rng::from_env("snapshot");
    let scratch = Scratch::new("snapshot");
    make_image(
        &scratch.image(),
        &Maker::Progs {
            args: &["--nodesize", "4096"],
        },
    );
    let mut model = Model::new();
    let mut fs = open_rw(&scratch.image());
    run_txn(&mut fs, &mut model, &mut rng, 500, 0);
    drop(fs);
    let mnt = scratch.0.join("mnt");
    std::fs::create_dir_all(&mnt).expect("mountpoint");
    let ok = |c: &mut Command| c.output().is_ok_and(|o| o.status.success());
    assert!(ok(Command::new("mount")
        .args(["-o", "loop"])
        .arg(scratch.image())
        .arg(&mnt)));
    let snap_ok = ok(Command::new("btrfs")
        .args(["subvolume", "snapshot"])
        .arg(&mnt)
        .arg(mnt.join("snap")));
    umount(&mnt);
    assert!(snap_ok, "btrfs subvolume snapshot failed");
    let snap_names: std::collections::BTreeSet<Vec<u8>> = model.files.keys().cloned().collect();
    // The kernel gave the snapshot's entry the next directory index.
    model.next_index += 1000;
    // Tree 5 now shares every block below its root with the snapshot: copying them must
    // move the back references (update_ref_for_cow), in one commit and across several.
    let mut fs = open_rw(&scratch.image());
    run_txn(&mut fs, &mut model, &mut rng, 300, 200);
    run_txn(&mut fs, &mut model, &mut rng, 200, 100);
    drop(fs);
    btrfs_check(&scratch.image(), "after writing to a snapshotted tree");
    let fs = Filesystem::open(scratch.image(), OpenOptions::default()).expect("reopen");
    let list = |dir: oleo::InodeId| {
        let mut names = std::collections::BTreeSet::new();
        fs.readdir(dir, 0, &mut |e| {
            names.insert(e.name.clone());
            true
        })
        .expect("readdir");
        names
    };
    let mut want_top: std::collections::BTreeSet<Vec<u8>> = model.files.keys().cloned().collect();
    want_top.insert(b"snap".to_vec());
    assert_eq!(list(fs.root()), want_top, "tree 5 after the writes");
    let snap = fs.lookup(fs.root(), b"snap").expect("snapshot entry");
    assert_eq!(list(snap), snap_names, "the snapshot must not change");
    drop(fs);
    assert!(ok(Command::new("mount")
        .args(["-o", "loop,ro"])
        .arg(scratch.image())
        .arg(&mnt)));
    let names = |p: &Path| -> std::collections::BTreeSet<Vec<u8>> {
        use std::os::unix::ffi::OsStrExt;
        std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().as_bytes().to_vec())
            .collect()
    };
    let (top, in_snap) = (names(&mnt), names(&mnt.join("snap")));
    umount(&mnt);
    assert_eq!(top, want_top, "the kernel's tree 5");
    assert_eq!(in_snap, snap_names, "the kernel's snapshot");
}

/// Quota groups would go stale: refused before anything is written.
#[test]
fn quotas_are_refused() {
    if missing_env() {
        return;
    }
    let scratch = Scratch::new("quota");
    make_image(
        &scratch.image(),
        &Maker::Progs {
            args: &["-R", "quota"],
        },
    );
    let fs = open_rw(&scratch.image());
    let started = fs.start_transaction().map(drop);
    match started {
        Err(oleo::Error::Unsupported(why)) => assert!(why.contains("quota"), "{why}"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(()) => panic!("a transaction started with quotas enabled"),
    }
}

/// Changing the chunk tree copies its blocks into SYSTEM block groups and moves the
/// superblock's chunk root.
#[test]
fn chunk_tree_blocks_go_to_system_block_groups() {
    if missing_env() {
        return;
    }
    let scratch = Scratch::new("chunk-tree");
    make_image(&scratch.image(), &Maker::Progs { args: &[] });
    let fs = open_rw(&scratch.image());
    let old_chunk_root = fs.superblock().chunk_root;
    let dev_item = Key::new(objectid::DEV_ITEMS, item::DEV_ITEM, 1);
    let (generation, _) = fs
        .with_transaction(|txn| txn.update_item(objectid::CHUNK_TREE, &dev_item, |_| ()))
        .expect("commit");
    let sb = fs.superblock().clone();
    assert_ne!(sb.chunk_root, old_chunk_root);
    assert_eq!(sb.chunk_root_generation, generation);
    // The superblock's SYSTEM chunks are where the chunk tree must live.
    let sys = sb.sys_chunks().expect("sys chunks");
    assert!(
        sys.iter()
            .any(|(s, c)| (*s..s + c.length).contains(&sb.chunk_root)),
        "chunk root {} is outside the SYSTEM chunks",
        sb.chunk_root
    );
    drop(fs);
    btrfs_check(&scratch.image(), "after moving the chunk root");
    check_with_kernel(&scratch, &Model::new());
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Data references are queued and netted per transaction (delayed refs): a file written,
/// overwritten, partly cloned and deleted before one commit leaves exactly the clone's
/// extents behind, and deleting the clone gives every byte back.
#[test]
fn data_refs_added_and_dropped_in_one_transaction() {
    if missing_env() {
        return;
    }
    let scratch = Scratch::new("delayed-data-refs");
    make_image(&scratch.image(), &Maker::Progs { args: &[] });
    let fs = open_rw(&scratch.image());
    assert_eq!(
        data_extents(&fs),
        Vec::new(),
        "a new filesystem has no data"
    );
    let root = fs.root();
    let new = oleo::NewInode::file(0o644);
    let a = fs.mknod(root, b"a", &new).expect("create a").id;
    let b = fs.mknod(root, b"b", &new).expect("create b").id;
    let generation = fs.superblock().generation;
    fs.write(a, 0, &pattern(1, 1 << 20)).expect("write a");
    fs.write(a, 256 << 10, &pattern(2, 512 << 10))
        .expect("overwrite a");
    fs.write(a, 0, &pattern(3, 64 << 10))
        .expect("overwrite a again");
    let copied = fs
        .copy_file_range(a, 256 << 10, b, 0, 512 << 10)
        .expect("clone into b");
    assert_eq!(copied, 512 << 10);
    let truncate = oleo::SetAttr {
        size: Some(0),
        ..Default::default()
    };
    fs.setattr(a, &truncate).expect("truncate a");
    fs.unlink(root, b"a").expect("unlink a");
    assert_eq!(
        fs.superblock().generation,
        generation,
        "the test wants everything in one transaction"
    );
    fs.sync().expect("commit");
    assert_eq!(
        fs.read(b, 0, 512 << 10).expect("read b"),
        pattern(2, 512 << 10)
    );
    let mut extents = data_extents(&fs);
    assert_eq!(
        extents.iter().map(|&(_, len)| len).sum::<u64>(),
        512 << 10,
        "only the second write's extents stay (b shares them): {extents:?}"
    );
    for e in fs.file_extents(b).expect("b's extents") {
        let at = e.logical.expect("b's data is in extents");
        extents.retain(|&(start, len)| !(start <= at && at < start + len));
    }
    assert!(extents.is_empty(), "extents b does not use: {extents:?}");
    drop(fs);
    btrfs_check(&scratch.image(), "after netted data refs");
    let fs = open_rw(&scratch.image());
    fs.unlink(fs.root(), b"b").expect("unlink b");
    fs.sync().expect("commit");
    assert_eq!(data_extents(&fs), Vec::new(), "no data extent outlives b");
    drop(fs);
    btrfs_check(&scratch.image(), "after the clone went");
}

/// Every data extent item (bytenr, length) of the committed extent tree.
fn data_extents(fs: &Filesystem) -> Vec<(u64, u64)> {
    let root = fs
        .tree_root(objectid::EXTENT_TREE)
        .expect("extent tree")
        .expect("extent tree root");
    let mut out = Vec::new();
    fs.walk_tree(
        &root,
        &mut |tb| {
            if tb.is_leaf() {
                for slot in 0..tb.nritems() {
                    let key = tb.key_at(slot).expect("key");
                    if key.item_type == item::EXTENT_ITEM {
                        out.push((key.objectid, key.offset));
                    }
                }
            }
        },
        &mut |e| panic!("walking the extent tree: {e}"),
    )
    .expect("walk");
    out
}
