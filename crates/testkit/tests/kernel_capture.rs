//! Root-only checks of the kit itself against the kernel: images contain what PopulateSpec
//! promises, capture is deterministic across mounts, and pending-log images really have a
//! log tree that the kernel would replay.

use std::time::Instant;

use oleo_testkit::*;

/// Builds a full image, captures it through two separate kernel mounts and expects no
/// difference; then checks that the image has every structure the populate step promises.
#[test]
fn capture_is_deterministic_and_image_is_complete() {
    if !require_root("capture_is_deterministic_and_image_is_complete") {
        return;
    }
    let tmp = TempDir::new("kit-determinism").unwrap();
    let img = tmp.join("full.img");
    let spec = ImageSpec::new("kit-full", seed(0x5eed_0001));
    build_image(&spec, &img).unwrap();

    let t = Instant::now();
    let a = {
        let m = KernelMount::mount(&img, &tmp.join("a"), &[]).unwrap();
        Manifest::capture(m.path()).unwrap()
    };
    eprintln!("captured {} paths in {:.1?}", a.len(), t.elapsed());
    let b = {
        let m = KernelMount::mount(&img, &tmp.join("b"), &[]).unwrap();
        Manifest::capture(m.path()).unwrap()
    };
    let d = Manifest::diff(&a, &b, &CompareRules::kernel_vs_kernel());
    assert!(
        d.is_empty(),
        "two kernel captures differ:\n{}",
        d.join("\n")
    );

    // The manifest sees every kind of inode, links, xattr namespaces and ACLs.
    let kinds: std::collections::BTreeSet<Kind> = a.entries.values().map(|e| e.kind).collect();
    for k in [
        Kind::File,
        Kind::Dir,
        Kind::Symlink,
        Kind::Fifo,
        Kind::Socket,
        Kind::CharDev,
        Kind::BlockDev,
    ] {
        assert!(kinds.contains(&k), "no {k:?} in the image");
    }
    let has_xattr = |prefix: &[u8]| {
        a.entries
            .values()
            .any(|e| e.xattrs.keys().any(|n| n.starts_with(prefix)))
    };
    for ns in [
        &b"user."[..],
        b"security.",
        b"trusted.",
        b"system.posix_acl_access",
        b"system.posix_acl_default",
    ] {
        assert!(has_xattr(ns), "no {} xattr", String::from_utf8_lossy(ns));
    }
    assert!(
        a.entries
            .values()
            .any(|e| e.kind == Kind::File && e.nlink >= 400),
        "no many-links inode"
    );
    assert!(
        a.entries
            .values()
            .any(|e| e.kind == Kind::Dir && e.ino == 2),
        "no placeholder directory"
    );
    assert!(
        a.entries
            .keys()
            .any(|p| p.rsplit(|b| *b == b'/').next().unwrap().len() == 255),
        "no 255-byte name"
    );
    assert!(
        a.entries.keys().any(|p| std::str::from_utf8(p).is_err()),
        "no non-UTF-8 name"
    );
    assert!(
        a.entries
            .values()
            .any(|e| e.target.as_ref().is_some_and(|t| t.len() >= 3900)),
        "no long symlink"
    );
    assert!(
        a.entries.values().any(|e| e.mtime.sec < 0),
        "no pre-1970 timestamp"
    );
    assert!(
        a.entries
            .values()
            .any(|e| e.kind == Kind::File && e.blocks * 512 > e.size + 1024 * 1024),
        "no prealloc past EOF"
    );
    let subvols: std::collections::BTreeSet<u64> = a.entries.values().map(|e| e.dev).collect();
    assert!(
        subvols.len() >= 8,
        "expected many subvolumes/snapshots, saw {} st_devs",
        subvols.len()
    );

    // On disk: every extent flavour is there.
    let stats = image_stats(&img).unwrap();
    eprintln!("image stats: {:?}", stats.counts);
    for key in [
        "inline",
        "inline/zlib",
        "inline/lzo",
        "inline/zstd",
        "regular",
        "regular/zlib",
        "regular/lzo",
        "regular/zstd",
        "prealloc",
        "offset>0",
        "shared",
        "INODE_EXTREF",
        "XATTR_ITEM",
    ] {
        assert!(stats.get(key) > 0, "image has no {key}: {:?}", stats.counts);
    }
}

/// A pending-log image: log_root is set, the committed view lacks the fsynced changes, and
/// a kernel that replays the log (on a copy) shows them.
#[test]
fn pending_log_image_has_a_replayable_log() {
    if !require_root("pending_log_image_has_a_replayable_log") {
        return;
    }
    let tmp = TempDir::new("kit-pending-log").unwrap();
    let img = tmp.join("log.img");
    let spec = ImageSpec::new("kit-log", seed(0x5eed_0002))
        .size_mb(256)
        .populate(PopulateSpec::basic());
    build_image_with_pending_log(&spec, &img).unwrap();
    assert_ne!(superblock_log_root(&img).unwrap(), 0);

    let committed = {
        let m = KernelMount::mount(
            &img,
            &tmp.join("c"),
            &["ro", "noatime", "rescue=nologreplay"],
        )
        .unwrap();
        Manifest::capture(m.path()).unwrap()
    };
    assert!(committed.get(b"pending/existing").is_some());
    assert!(
        committed.get(b"pending/new-file").is_none(),
        "an fsynced-only file is in the committed view"
    );
    assert_ne!(
        superblock_log_root(&img).unwrap(),
        0,
        "the read-only mount must not replay the log"
    );

    let copy = tmp.join("replayed.img");
    std::fs::copy(&img, &copy).unwrap();
    let replayed = {
        let m = KernelMount::mount(&copy, &tmp.join("r"), &["rw", "noatime"]).unwrap();
        Manifest::capture(m.path()).unwrap()
    };
    assert_eq!(
        superblock_log_root(&copy).unwrap(),
        0,
        "replay clears log_root"
    );
    let e = replayed.get(b"pending/existing").unwrap();
    assert_eq!(
        e.xattrs.get(&b"user.logged"[..]).map(Vec::as_slice),
        Some(&b"only in the log"[..])
    );
    assert!(replayed.get(b"pending/new-file").is_some());
    assert!(replayed.get(b"pending/created-then-dir-fsynced").is_some());
}
