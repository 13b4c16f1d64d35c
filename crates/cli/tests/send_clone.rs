//! Shared and compressed extents through send and receive, against the kernel.
//!
//! `oleo send` of kernel-made snapshots with reflinks (whole files, a partial clone, an
//! unaligned tail), compressed files (zstd, lzo, zlib) and extents shared with another
//! snapshot (`-c`): `btrfs receive --dump` shows CLONEs for the reflinks and, with
//! `--compressed-data`, ENCODED_WRITEs for the compressed extents; the kernel's `btrfs
//! receive` makes the same trees, with the clones sharing their extents (the same physical
//! offsets in `filefrag -v`) and the compressed data still compressed (compsize).
//!
//! The other way, the kernel's `btrfs send` (protocol 2, `--compressed-data`, `-c`)
//! received by `oleo receive --image`: the kernel mounts the image and sees the same trees,
//! the clones shared (across subvolumes too) and the compressed extents compressed.
//! Every image written is judged by `btrfs check --check-data-csum`.
//!
//! Needs root, loop devices, kernel btrfs, btrfs-progs, xfs_io, filefrag and compsize (a
//! skip elsewhere, a failure under CI=true).

use oleo_testkit::check::compsize;
use oleo_testkit::cmd::{btrfs_in, require_tools, sh_ok};
use oleo_testkit::{assert_btrfs_check, empty_image, oleo_mkfs, KernelMount, Manifest, TempDir};
use std::path::{Path, PathBuf};
use std::process::{Command as Cmd, Output};

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

const TOOLS: &[&str] = &["btrfs", "xfs_io", "filefrag", "compsize"];
const PACKAGES: &str = "btrfs-progs xfsprogs e2fsprogs btrfs-compsize";

/// Run in subvolume `vol` (mounted with compress=zstd): reflinked files, a partial
/// clone, an unaligned tail, a file sharing its own extent, files compressed three ways.
const POPULATE: &str = r#"
set -e
head -c 1000000 /dev/urandom > a
cp --reflink=always a b
xfs_io -f -c "reflink a 65536 8192 131072" -c "pwrite -q 0 8192" partial
head -c 5000 /dev/urandom > tail
cp --reflink=always tail tail2
head -c 262144 /dev/urandom > self
xfs_io -c "reflink self 0 262144 131072" self
mkdir zstd lzo zlib plain
btrfs property set lzo compression lzo
btrfs property set zlib compression zlib
for d in zstd lzo zlib; do
  yes "compressible line for $d" | head -c 600000 > $d/text
done
cp --reflink=always zstd/text zstd/text2
head -c 200 /dev/urandom > plain/inline
sync
"#;

fn oleo_ok(args: &[&str]) -> Output {
    let o = Cmd::new(OLEO).args(args).output().unwrap();
    assert!(
        o.status.success(),
        "oleo {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn assert_same(want: &Manifest, root: &Path, how: &str) {
    let got = Manifest::capture(root).unwrap();
    let diffs = want.sent_differences(&got);
    assert!(diffs.is_empty(), "{how}:\n{}", diffs.join("\n"));
}

/// `filefrag -v`'s extents of `f`: (first logical block, last, first physical block).
fn extents(f: &Path) -> Vec<(u64, u64, u64)> {
    let out = Cmd::new("filefrag").arg("-v").arg(f).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "filefrag {}: {text}", f.display());
    let range = |c: &str| -> Option<(u64, u64)> {
        let (a, b) = c.trim().split_once("..")?;
        Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
    };
    text.lines()
        .filter_map(|l| {
            let mut cols = l.split(':');
            cols.next()?.trim().parse::<u64>().ok()?;
            let (first, last) = range(cols.next()?)?;
            let (phys, _) = range(cols.next()?)?;
            Some((first, last, phys))
        })
        .collect()
}

/// The physical block of `f`'s logical block `block`.
fn physical(f: &Path, block: u64) -> Option<u64> {
    extents(f)
        .into_iter()
        .find(|&(first, last, _)| (first..=last).contains(&block))
        .map(|(first, _, phys)| phys + (block - first))
}

/// Block `a_block` of `a` and block `b_block` of `b` are the same block on disk.
fn assert_shared(a: &Path, a_block: u64, b: &Path, b_block: u64, how: &str) {
    let (pa, pb) = (physical(a, a_block), physical(b, b_block));
    assert!(
        pa.is_some() && pa == pb,
        "{how}: {} block {a_block} at {pa:?}, {} block {b_block} at {pb:?}: not shared \
         ({:?}, {:?})",
        a.display(),
        b.display(),
        extents(a),
        extents(b)
    );
}

/// compsize of a directory: (disk bytes, uncompressed bytes).
fn compressed(dir: &Path) -> (u64, u64) {
    let (disk, plain) = compsize(dir);
    assert!(plain > 0, "compsize of {}: no data", dir.display());
    (disk, plain)
}

struct Source {
    img: PathBuf,
    base: Manifest,
    snap: Manifest,
    other: Manifest,
}

/// `vol` populated, `base` its read-only snapshot; then `vol` gets a new file and another
/// reflink of `a`, and `snap` is taken; `other`, an unrelated subvolume holding a reflink
/// of `vol/a`, is snapshotted as `othersnap`.
fn make_source(dir: &TempDir) -> Source {
    let img = dir.join("source.img");
    empty_image(&img, 512, &[]).unwrap();
    let k = KernelMount::mount(&img, &dir.join("source"), &["rw", "compress=zstd"]).unwrap();
    let m = k.path().to_path_buf();
    btrfs_in(&["subvolume", "create", "vol"], &m);
    btrfs_in(&["subvolume", "create", "other"], &m);
    sh_ok(&m.join("vol"), POPULATE);
    btrfs_in(&["subvolume", "snapshot", "-r", "vol", "base"], &m);
    sh_ok(
        &m,
        "set -e; head -c 300000 /dev/urandom > vol/new; cp --reflink=always vol/a vol/a3
         cp --reflink=always vol/a other/x; printf 'x' > other/small; sync",
    );
    btrfs_in(&["subvolume", "snapshot", "-r", "vol", "snap"], &m);
    btrfs_in(&["subvolume", "snapshot", "-r", "other", "othersnap"], &m);
    let src = Source {
        img: img.clone(),
        base: Manifest::capture(&m.join("base")).unwrap(),
        snap: Manifest::capture(&m.join("snap")).unwrap(),
        other: Manifest::capture(&m.join("othersnap")).unwrap(),
    };
    k.unmount().unwrap();
    src
}

fn dump(stream: &Path, dir: &Path) -> String {
    btrfs_in(
        &["receive", "--dump", "-f", &stream.display().to_string()],
        dir,
    )
}

/// The dump's lines of command `cmd` for paths ending in `file`.
fn lines<'a>(dump: &'a str, cmd: &str, file: &str) -> Vec<&'a str> {
    dump.lines()
        .filter(|l| {
            let mut w = l.split_whitespace();
            w.next() == Some(cmd) && w.next().is_some_and(|p| p.ends_with(file))
        })
        .collect()
}

#[test]
fn oleo_sends_clones_and_compressed_extents() {
    let what = "oleo_sends_clones_and_compressed_extents";
    if !require_tools(what, TOOLS, PACKAGES) {
        return;
    }
    let dir = TempDir::new("send-clone").unwrap();
    let src = make_source(&dir);
    let src_s = src.img.display().to_string();
    for (name, flags) in [
        ("v1", &["--proto", "1"][..]),
        ("v2", &["--proto", "2"][..]),
        ("v2c", &["--proto", "2", "--compressed-data"][..]),
    ] {
        let compressed_data = name == "v2c";
        let base = dir.join(format!("base.{name}"));
        let snap = dir.join(format!("snap.{name}"));
        let other = dir.join(format!("other.{name}"));
        let send = |out: &Path, extra: &[&str], what: &str| {
            let out_s = out.display().to_string();
            let mut args = vec!["send", "--image", &src_s, "-f", &out_s];
            args.extend_from_slice(flags);
            args.extend_from_slice(extra);
            args.push(what);
            oleo_ok(&args);
        };
        send(&base, &[], "/base");
        send(&snap, &["-c", "/base"], "/snap");
        send(&other, &["-c", "/base"], "/othersnap");

        let d = dump(&base, &dir.join("."));
        for f in ["/b", "/partial", "/tail2", "/zstd/text2", "/self"] {
            assert!(
                !lines(&d, "clone", f).is_empty(),
                "{name}: no clone of {f}:\n{d}"
            );
        }
        // Of these only partial's own first 8 KiB is written.
        for f in ["/b", "/partial", "/tail2", "/zstd/text2"] {
            assert!(
                lines(&d, "write", f).len() <= 1,
                "{name}: {f} written:\n{d}"
            );
        }
        assert!(
            lines(&d, "clone", "/a").is_empty(),
            "{name}: a cloned:\n{d}"
        );
        for f in ["/zstd/text", "/lzo/text", "/zlib/text"] {
            let enc = lines(&d, "encoded_write", f);
            if compressed_data {
                assert!(!enc.is_empty(), "{name}: no encoded_write of {f}:\n{d}");
                assert!(lines(&d, "write", f).is_empty(), "{name}: {f} written");
            } else {
                assert!(enc.is_empty(), "{name}: encoded_write without the flag");
            }
        }
        let d = dump(&snap, &dir.join("."));
        for f in ["/a", "/a3", "/b"] {
            assert!(
                !lines(&d, "clone", f).is_empty(),
                "{name}: {f} not cloned:\n{d}"
            );
        }
        assert!(
            !lines(&d, "write", "/new").is_empty(),
            "{name}: new not sent"
        );
        let d = dump(&other, &dir.join("."));
        assert!(
            !lines(&d, "clone", "/x").is_empty(),
            "{name}: x not cloned:\n{d}"
        );

        // The kernel receives the three streams into a fresh btrfs.
        let dst = dir.join(format!("kernel.{name}.img"));
        empty_image(&dst, 512, &[]).unwrap();
        let k = KernelMount::mount(&dst, &dir.join(format!("k.{name}")), &["rw"]).unwrap();
        let at = k.path().display().to_string();
        for s in [&base, &snap, &other] {
            btrfs_in(&["receive", "-f", &s.display().to_string(), &at], k.path());
        }
        sh_ok(k.path(), "sync");
        let m = k.path();
        assert_same(&src.base, &m.join("base"), &format!("{name}: base"));
        assert_same(&src.snap, &m.join("snap"), &format!("{name}: snap"));
        assert_same(
            &src.other,
            &m.join("othersnap"),
            &format!("{name}: othersnap"),
        );
        assert_shared(&m.join("base/a"), 0, &m.join("base/b"), 0, name);
        assert_shared(&m.join("base/a"), 16, &m.join("base/partial"), 2, name);
        assert_shared(&m.join("base/a"), 0, &m.join("snap/a3"), 0, name);
        assert_shared(&m.join("base/a"), 0, &m.join("othersnap/x"), 0, name);
        assert_shared(&m.join("base/tail"), 0, &m.join("base/tail2"), 0, name);
        assert_shared(&m.join("base/self"), 0, &m.join("base/self"), 64, name);
        // zstd came from the mount option, which the receiver lacks: written plainly
        // unless sent compressed (lzo and zlib directories carry their property).
        let (disk, plain) = compressed(&m.join("base/zstd"));
        if compressed_data {
            assert!(disk * 4 < plain, "{name}: zstd stored {disk} of {plain}");
        } else {
            assert!(disk >= plain, "{name}: zstd stored {disk} of {plain}");
        }
        for c in ["lzo", "zlib"] {
            let (disk, plain) = compressed(&m.join("base").join(c));
            assert!(disk * 4 < plain, "{name}: {c} stored {disk} of {plain}");
        }
        k.unmount().unwrap();
        assert_btrfs_check(&dst, &format!("btrfs receive of oleo's {name} streams"));
        std::fs::remove_file(&dst).unwrap();

        // oleo receives them too, sharing and keeping compression as the kernel does.
        let dst = dir.join(format!("oleo.{name}.img"));
        oleo_mkfs(OLEO, &dst, 512);
        let dst_s = dst.display().to_string();
        for s in [&base, &snap, &other] {
            let s = s.display().to_string();
            oleo_ok(&["receive", "--image", &dst_s, "-f", &s, "/"]);
        }
        assert_btrfs_check(&dst, &format!("oleo receive of oleo's {name} streams"));
        let k = KernelMount::mount(&dst, &dir.join(format!("o.{name}")), &["ro"]).unwrap();
        let m = k.path();
        assert_same(&src.base, &m.join("base"), &format!("oleo {name}: base"));
        assert_same(&src.snap, &m.join("snap"), &format!("oleo {name}: snap"));
        assert_same(
            &src.other,
            &m.join("othersnap"),
            &format!("oleo {name}: other"),
        );
        assert_shared(&m.join("base/a"), 0, &m.join("othersnap/x"), 0, name);
        assert_shared(&m.join("base/a"), 0, &m.join("snap/a3"), 0, name);
        assert_shared(&m.join("base/a"), 16, &m.join("base/partial"), 2, name);
        assert_shared(&m.join("base/self"), 0, &m.join("base/self"), 64, name);
        if compressed_data {
            for c in ["zstd", "lzo", "zlib"] {
                let (disk, plain) = compressed(&m.join("base").join(c));
                assert!(
                    disk * 4 < plain,
                    "oleo {name}: {c} stored {disk} of {plain}"
                );
            }
        }
        k.unmount().unwrap();
        for f in [&base, &snap, &other, &dst] {
            std::fs::remove_file(f).unwrap();
        }
    }
}

#[test]
fn oleo_receive_keeps_kernel_clones_and_compression() {
    let what = "oleo_receive_keeps_kernel_clones_and_compression";
    if !require_tools(what, TOOLS, PACKAGES) {
        return;
    }
    let dir = TempDir::new("receive-clone").unwrap();
    let src = make_source(&dir);
    let k = KernelMount::mount(&src.img, &dir.join("ksrc"), &["ro"]).unwrap();
    let m = k.path();
    let streams: Vec<PathBuf> = ["base", "snap", "other"]
        .iter()
        .map(|n| dir.join(format!("{n}.kernel")))
        .collect();
    let send = |out: &Path, extra: &[&str], snap: &str| {
        let mut args = vec!["send", "-q", "--proto", "2", "--compressed-data", "-f"];
        let out_s = out.display().to_string();
        args.push(&out_s);
        args.extend_from_slice(extra);
        args.push(snap);
        btrfs_in(&args, m);
    };
    send(&streams[0], &[], "base");
    // The kernel makes base the parent of snap (an incremental stream); othersnap shares
    // no history with it, so base is named its parent: its x is cloned from base, another
    // subvolume on the receiving side.
    send(&streams[1], &["-c", "base"], "snap");
    send(&streams[2], &["-p", "base"], "othersnap");
    k.unmount().unwrap();
    let d = dump(&streams[0], &dir.join("."));
    assert!(!lines(&d, "encoded_write", "/zstd/text").is_empty(), "{d}");
    assert!(!lines(&d, "clone", "/b").is_empty(), "{d}");
    let d = dump(&streams[2], &dir.join("."));
    assert!(
        !lines(&d, "clone", "/x").is_empty(),
        "no clone from base: {d}"
    );

    let dst = dir.join("oleo.img");
    oleo_mkfs(OLEO, &dst, 512);
    let dst_s = dst.display().to_string();
    for s in &streams {
        let s = s.display().to_string();
        oleo_ok(&["receive", "--image", &dst_s, "-f", &s, "/"]);
    }
    assert_btrfs_check(&dst, "oleo receive of the kernel's streams");
    let k = KernelMount::mount(&dst, &dir.join("o"), &["ro"]).unwrap();
    let m = k.path();
    assert_same(&src.base, &m.join("base"), "base");
    assert_same(&src.snap, &m.join("snap"), "snap");
    assert_same(&src.other, &m.join("othersnap"), "othersnap");
    assert_shared(&m.join("base/a"), 0, &m.join("base/b"), 0, "b");
    assert_shared(&m.join("base/a"), 16, &m.join("base/partial"), 2, "partial");
    assert_shared(&m.join("base/tail"), 0, &m.join("base/tail2"), 0, "tail2");
    assert_shared(&m.join("base/self"), 0, &m.join("base/self"), 64, "self");
    assert_shared(&m.join("base/a"), 0, &m.join("snap/a3"), 0, "a3");
    // Across subvolumes: othersnap's clone from base.
    assert_shared(&m.join("base/a"), 0, &m.join("othersnap/x"), 0, "x");
    for c in ["zstd", "lzo", "zlib"] {
        let (disk, plain) = compressed(&m.join("base").join(c));
        assert!(disk * 4 < plain, "{c} stored {disk} of {plain}");
    }
    k.unmount().unwrap();
}

#[test]
fn clone_sources_must_be_read_only_snapshots() {
    let what = "clone_sources_must_be_read_only_snapshots";
    if !require_tools(what, &["btrfs"], "btrfs-progs") {
        return;
    }
    let dir = TempDir::new("send-clone-refused").unwrap();
    let img = dir.join("s.img");
    empty_image(&img, 256, &[]).unwrap();
    let k = KernelMount::mount(&img, &dir.join("m"), &["rw"]).unwrap();
    btrfs_in(&["subvolume", "create", "vol"], k.path());
    std::fs::write(k.path().join("vol/f"), b"x").unwrap();
    btrfs_in(&["subvolume", "snapshot", "-r", "vol", "snap"], k.path());
    k.unmount().unwrap();
    let img_s = img.display().to_string();
    let out = dir.join("out");
    let out_s = out.display().to_string();
    for (c, why) in [("vol", "not read-only"), ("nothere", "nothere")] {
        let o = Cmd::new(OLEO)
            .args(["send", "--image", &img_s, "-c", c, "-f", &out_s, "snap"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "-c {c} accepted");
        assert!(
            err.contains("clone source") && err.contains(why),
            "-c {c}: {err}"
        );
        assert!(!out.exists(), "a refused send left a stream");
    }
    let o = Cmd::new(OLEO)
        .args([
            "send",
            "--image",
            &img_s,
            "--compressed-data",
            "-f",
            &out_s,
            "snap",
        ])
        .output()
        .unwrap();
    assert!(
        !o.status.success(),
        "--compressed-data accepted with protocol 1"
    );
}

/// A stream whose CLONE names a subvolume the receiving filesystem does not have (here
/// `base`, a `-c` source of `othersnap`) is refused naming its uuid: nothing outside the
/// subvolume being received changes, and that one stays writable, without received uuid.
#[test]
fn a_clone_from_a_subvolume_the_receiver_lacks_is_refused() {
    let what = "a_clone_from_a_subvolume_the_receiver_lacks_is_refused";
    if !require_tools(what, TOOLS, PACKAGES) {
        return;
    }
    let dir = TempDir::new("clone-missing").unwrap();
    let src = make_source(&dir);
    let src_s = src.img.display().to_string();
    let stream = dir.join("other.stream");
    let stream_s = stream.display().to_string();
    oleo_ok(&[
        "send",
        "--image",
        &src_s,
        "-c",
        "base",
        "-f",
        &stream_s,
        "othersnap",
    ]);
    let d = dump(&stream, &dir.join("."));
    assert!(!lines(&d, "clone", "/x").is_empty(), "no clone: {d}");
    let base_uuid = {
        let k = KernelMount::mount(&src.img, &dir.join("ksrc"), &["ro"]).unwrap();
        let show = btrfs_in(&["subvolume", "show", "base"], k.path());
        k.unmount().unwrap();
        show.lines()
            .find_map(|l| l.trim().strip_prefix("UUID:"))
            .map(|u| u.trim().to_string())
            .expect("base's uuid")
    };

    let dst = dir.join("dst.img");
    oleo_mkfs(OLEO, &dst, 256);
    let k = KernelMount::mount(&dst, &dir.join("kd"), &["rw"]).unwrap();
    std::fs::write(k.path().join("keep"), b"untouched").unwrap();
    k.unmount().unwrap();
    let dst_s = dst.display().to_string();
    let o = Cmd::new(OLEO)
        .args(["receive", "--image", &dst_s, "-f", &stream_s, "/"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "a clone from a missing subvolume applied"
    );
    assert!(
        err.contains("clone source") && err.contains(&base_uuid),
        "refusal does not name the clone source {base_uuid}: {err}"
    );
    assert_btrfs_check(&dst, "a receive refused at a CLONE");
    let k = KernelMount::mount(&dst, &dir.join("kd"), &["ro"]).unwrap();
    let m = k.path();
    assert_eq!(std::fs::read(m.join("keep")).unwrap(), b"untouched");
    let show = btrfs_in(&["subvolume", "show", "othersnap"], m);
    assert!(
        show.lines()
            .any(|l| l.trim().starts_with("Received UUID:") && l.trim().ends_with('-')),
        "the cut subvolume has a received uuid: {show}"
    );
    assert!(
        show.contains("Flags:") && !show.contains("readonly"),
        "the cut subvolume is read-only: {show}"
    );
    k.unmount().unwrap();
}
