//! Logs that are damaged or come from elsewhere: a damaged log refuses a writable open and
//! names `nologreplay`; btrfs-progs' log images replay (or are refused) cleanly; randomly
//! damaged log blocks never panic or hang an open.

mod common;

use common::tree_log::*;
use oleo::{Filesystem, OpenOptions};
use oleo_testkit::{require_root, superblock_log_root, TempDir};
use std::fs::{self, OpenOptions as StdOpen};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

#[test]
fn a_damaged_log_refuses_the_writable_open_and_names_nologreplay() {
    let name = "a_damaged_log_refuses_the_writable_open_and_names_nologreplay";
    let _ = env_logger::builder().is_test(true).try_init();
    if !require_root(name) {
        return;
    }
    let tmp = TempDir::new("log-damaged").expect("temp dir");
    let image = build_logged(
        &tmp,
        "log-damaged",
        0x10a2,
        true,
        |top| fs::write(top.join("f"), pattern(3, 8192)),
        |top| {
            write_at(&top.join("f"), 0, &pattern(4, 4096))?;
            fsync(&top.join("f"))
        },
    );
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
    let seed = oleo_testkit::seed(0x10c0);
    let setup = |top: &Path| {
        for d in ["a", "b", "a/c"] {
            fs::create_dir(top.join(d))?;
            for i in 0..3 {
                fs::write(top.join(format!("{d}/f{i}")), pattern(seed ^ i, 30000))?;
            }
        }
        Ok(())
    };
    let image = build_logged(&tmp, "log-fuzz", seed, false, setup, |top| {
        random_changes(top, seed, 40)
    });
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
