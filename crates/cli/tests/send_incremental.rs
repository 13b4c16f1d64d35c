//! `oleo send --image -p PARENT` (incremental sends, protocols 1 and 2): a chain of
//! read-only snapshots the kernel made, with every kind of change between them (data
//! overwritten, appended, truncated, punched; renames within and across directories,
//! directory moves into new directories and under moved siblings, swaps, a directory
//! moved under its former child, files replaced by directories and back, hard links added
//! and removed, a directory deleted with hard links in it, an inode number reused, xattrs,
//! default ACLs, owners, modes, capabilities, symlinks, fifos, compressed data). The
//! first snapshot is sent full, each next one with -p the one before; the kernel's
//! `btrfs receive` and `oleo receive --image` apply the streams one after the other and
//! every received snapshot must be the sent one (Manifest::sent_differences), the
//! receiving image `btrfs check` clean; the received snapshots are sent on the same way.
//! Streams carry only what changed. Several snapshots go in one `oleo send`. A seeded
//! random chain does the same (seed printed; OLEO_TEST_SEED replays), and so does one that
//! oleo made through its mount (clones, preallocation, compression; --compressed-data
//! too). A writable parent and a parent that is no subvolume are refused.
//!
//! Needs root, loop devices, kernel btrfs, btrfs-progs, setfattr, setfacl, fallocate and
//! FUSE (a skip elsewhere, a failure under CI=true).

use oleo_testkit::cmd::{btrfs_in, require_tools, sh_ok};
use oleo_testkit::ops::{apply_path, random_op, Rng};
use oleo_testkit::{
    btrfs_check, empty_image, oleo_mkfs, require_root, seed, KernelMount, Manifest, TempDir,
};
use std::path::{Path, PathBuf};
use std::process::{Command as Cmd, Output};

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

/// The first snapshot's tree.
const STEP0: &str = r#"
set -e
mkdir -p a/b/c d e swap1 swap2 mv1/inner/leaf sib1/in sib2
head -c 300000 /dev/urandom > big
head -c 1000000 /dev/urandom > mid
head -c 70000 /dev/urandom > app
head -c 500000 /dev/urandom > trunc
head -c 800000 /dev/urandom > punch
head -c 400000 /dev/urandom > zeroed
printf hello > inline
printf one > a/f1
printf two > a/b/f2
printf three > a/b/c/f3
printf s1 > swap1/x
printf s2 > swap2/y
printf in > mv1/inner/leaf/f
printf file > becomes_dir
mkdir becomes_file && printf in > becomes_file/inside
ln big hard_a
ln big d/hard_b
setfattr -n user.keep -v 1 big
setfattr -n user.change -v old big
setfattr -n user.gone -v x big
ln -s target1 sym1
mkfifo fifo1
mknod cdev c 1 3
printf reuse > reused
chmod 640 inline
chown 10:20 inline
setfattr -n user.dir -v d a
touch -d '@1000000000.5' a/f1
mkdir comp
setfattr -n btrfs.compression -v zstd comp
yes 'oleo incremental send line' | head -c 1000000 > comp/text
"#;

/// The changes before each next snapshot.
const STEPS: [&str; 4] = [
    r#"
set -e
head -c 4096 /dev/urandom | dd of=mid bs=4096 seek=100 conv=notrunc status=none
head -c 50000 /dev/urandom >> app
truncate -s 100000 trunc
fallocate -p -o 102400 -l 307200 punch
printf new > newfile
mv a/b/f2 a/f2_renamed
mv a/f1 a/f1_renamed
mv d/hard_b e/hard_b
ln newfile e/newlink
setfattr -n user.change -v new big
setfattr -x user.gone big
setfattr -n user.added -v y big
chmod 600 inline
chown 30:40 inline
mkdir newdir && mv a/b newdir/b
rm becomes_dir && mkdir becomes_dir && printf x > becomes_dir/f
rm -r becomes_file && printf now_file > becomes_file
rm reused && printf newinode > reused
printf X | dd of=comp/text bs=1 seek=500000 conv=notrunc status=none
cp --reflink=always mid comp/mid_ref
"#,
    r#"
set -e
mv swap1 tmpswap && mv swap2 swap1 && mv tmpswap swap2
mv sib1 sib2/sib1_inside && mv sib2 sib2_renamed
rm hard_a
rm -r newdir/b/c
ln -sf target2 sym1
rm fifo1 && mkfifo fifo2
mv mv1 d/mv1
mv d/mv1/inner top_inner
rm cdev
head -c 10000 /dev/urandom > newfile
fallocate -z -o 65536 -l 131072 zeroed
fallocate -o 2000000 -l 100000 zeroed
setfacl -d -m u:1234:rx .
touch -d '@1000000000' mid
ln mid d/mid_link
printf only > d/only && ln d/only d/only2
"#,
    r#"
set -e
setfacl -k .
mkdir fresh && printf f > fresh/file && mkfifo fresh/fifo
rm -r swap1 swap2
mv d/only2 rescued
rm -r d
mv e/hard_b hard_only
mv big e/big_moved
rm e/newlink
chown 5:6 mid
chmod 4755 app
setfattr -n security.capability -v 0x0100000200040000000000000000000000000000 app
mkdir -p x/y/z && printf deep > x/y/z/f
head -c 200000 /dev/urandom > zeroed
head -c 8192 /dev/urandom | dd of=comp/mid_ref bs=4096 seek=20 conv=notrunc status=none
yes 'more' | head -c 100000 >> comp/text
"#,
    r#"
set -e
head -c 1000 /dev/urandom >> app
mv x/y/z top_z && mv x top_z/x
rm -r newdir
printf c > fresh/file2 && ln fresh/file2 fresh/file2b && rm fresh/file
mv fresh/fifo fresh/fifo_renamed
ln -s "$(printf 'odd\ntarget')" fresh/odd_sym
setfattr -x user.dir a
truncate -s 3000000 trunc
printf tail | dd of=trunc bs=1 seek=2999000 conv=notrunc status=none
mv inline e/inline && mkdir inline
"#,
];

fn oleo(args: &[&str]) -> Output {
    Cmd::new(OLEO).args(args).output().unwrap()
}

fn oleo_ok(args: &[&str]) -> Output {
    let o = oleo(args);
    assert!(
        o.status.success(),
        "oleo {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// A source image with subvolume `vol` and read-only snapshots s0, s1, ... of it, each
/// taken after `change(vol, i, remount)`; returns the image and what the kernel shows in
/// each. `remount()` unmounts and mounts the image again (the kernel then hands out the
/// highest free inode number again, which a deleted inode may have had).
fn chain(
    dir: &TempDir,
    n: usize,
    mut change: impl FnMut(&Path, usize, &dyn Fn()),
) -> (PathBuf, Vec<Manifest>) {
    let img = dir.join("source.img");
    empty_image(&img, 512, &[]).unwrap();
    let k = KernelMount::mount(&img, &dir.join("source"), &["rw", "noatime"]).unwrap();
    let m = k.path().to_path_buf();
    let remount = || {
        let script = format!(
            "umount '{0}' && mount -t btrfs -o noatime '{1}' '{0}'",
            m.display(),
            k.device().display()
        );
        sh_ok(Path::new("/"), &script);
    };
    btrfs_in(&["subvolume", "create", "vol"], &m);
    let mut want = Vec::new();
    for i in 0..n {
        change(&m.join("vol"), i, &remount);
        let s = format!("s{i}");
        btrfs_in(&["subvolume", "snapshot", "-r", "vol", &s], &m);
        want.push(Manifest::capture(&m.join(&s)).unwrap());
    }
    k.unmount().unwrap();
    (img, want)
}

/// Sends s0 full and each next snapshot with -p the one before; the stream files.
fn send_chain(dir: &TempDir, src: &Path, n: usize, proto: &str) -> Vec<PathBuf> {
    let src_s = src.display().to_string();
    let from = src.file_stem().unwrap().to_string_lossy();
    (0..n)
        .map(|i| {
            let stream = dir.join(format!("{from}.s{i}.v{proto}"));
            let stream_s = stream.display().to_string();
            let snap = format!("/s{i}");
            let parent = format!("/s{}", i.saturating_sub(1));
            let mut args = vec!["send", "--image", &src_s, "--proto", proto, "-f", &stream_s];
            if i > 0 {
                args.extend(["-p", &parent]);
            }
            args.push(&snap);
            oleo_ok(&args);
            if i > 0 {
                let dump = btrfs_in(&["receive", "--dump", "-f", &stream_s], &dir.join("."));
                assert!(
                    dump.lines()
                        .next()
                        .is_some_and(|l| l.starts_with("snapshot")),
                    "v{proto} s{i}: the stream does not start with SNAPSHOT:\n{dump}"
                );
            }
            stream
        })
        .collect()
}

fn assert_same(want: &Manifest, root: &Path, how: &str) {
    let got = Manifest::capture(root).unwrap();
    let diffs = want.sent_differences(&got);
    assert!(diffs.is_empty(), "{how}:\n{}", diffs.join("\n"));
}

/// The kernel's `btrfs receive` applies the streams one after the other into a fresh
/// btrfs; each received snapshot must be the sent one, the image clean. Returns the image.
fn kernel_receives(dir: &TempDir, streams: &[PathBuf], want: &[Manifest], how: &str) -> PathBuf {
    let dst = dir.join(format!("kernel.{how}.img"));
    empty_image(&dst, 512, &[]).unwrap();
    let k = KernelMount::mount(&dst, &dir.join(format!("kdst.{how}")), &["noatime"]).unwrap();
    let at = k.path().display().to_string();
    for (i, s) in streams.iter().enumerate() {
        btrfs_in(&["receive", "-f", &s.display().to_string(), &at], k.path());
        assert_same(
            &want[i],
            &k.path().join(format!("s{i}")),
            &format!("btrfs receive of {how} stream s{i}"),
        );
    }
    k.unmount().unwrap();
    if let Err(e) = btrfs_check(&dst, true) {
        panic!("btrfs check of the image the kernel received {how} into:\n{e}");
    }
    dst
}

/// The same with `oleo receive --image`.
fn oleo_receives(dir: &TempDir, streams: &[PathBuf], want: &[Manifest], how: &str) {
    let dst = dir.join(format!("oleo.{how}.img"));
    oleo_mkfs(OLEO, &dst, 512);
    let dst_s = dst.display().to_string();
    for s in streams {
        oleo_ok(&[
            "receive",
            "--image",
            &dst_s,
            "-f",
            &s.display().to_string(),
            "/",
        ]);
    }
    if let Err(e) = btrfs_check(&dst, true) {
        panic!("btrfs check of the image oleo received {how} into:\n{e}");
    }
    let k = KernelMount::mount(&dst, &dir.join(format!("odst.{how}")), &["noatime"]).unwrap();
    for (i, w) in want.iter().enumerate() {
        assert_same(
            w,
            &k.path().join(format!("s{i}")),
            &format!("oleo receive --image of {how} stream s{i}"),
        );
    }
    k.unmount().unwrap();
    std::fs::remove_file(&dst).unwrap();
}

/// The bytes a `btrfs receive --dump` says are written to `path`.
fn written(dump: &str, path: &str) -> u64 {
    dump.lines()
        .filter(|l| l.starts_with("write") && l.split_whitespace().nth(1) == Some(path))
        .map(|l| {
            l.rsplit("len=")
                .next()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no len in {l}"))
        })
        .sum()
}

fn tools(what: &str) -> bool {
    require_tools(
        what,
        &[
            "btrfs",
            "setfattr",
            "setfacl",
            "fallocate",
            "mknod",
            "mkfifo",
        ],
        "btrfs-progs attr acl util-linux",
    )
}

#[test]
fn incremental_chain_is_received_as_each_snapshot() {
    if !tools("incremental_chain_is_received_as_each_snapshot") {
        return;
    }
    let dir = TempDir::new("send-incr").unwrap();
    let (src, want) = chain(&dir, 5, |vol, i, remount| {
        if i == 2 {
            // The newest inode goes, and its number comes back for a directory.
            sh_ok(vol, "rm reuse_me");
            remount();
            sh_ok(vol, "mkdir reuse_me && printf x > reuse_me/f");
        }
        sh_ok(vol, if i == 0 { STEP0 } else { STEPS[i - 1] });
        if i == 1 {
            drop(std::os::unix::net::UnixListener::bind(vol.join("e/sock")).unwrap());
            sh_ok(vol, "printf r > reuse_me");
        }
    });
    let ino = |s: usize| want[s].get(b"reuse_me").map(|e| (e.ino, e.kind));
    assert!(
        ino(1).unwrap().0 == ino(2).unwrap().0 && ino(1).unwrap().1 != ino(2).unwrap().1,
        "inode number not reused: {:?} {:?}",
        ino(1),
        ino(2)
    );
    for proto in ["1", "2"] {
        let streams = send_chain(&dir, &src, want.len(), proto);
        // s1 carries what changed, not whole files: the one block overwritten in `mid`,
        // nothing of `big` (its xattrs changed), the hole punched in `punch` (a FALLOCATE
        // in protocol 2, zeros in 1), the extent rewritten in `comp/text`.
        let dump = btrfs_in(
            &["receive", "--dump", "-f", &streams[1].display().to_string()],
            &dir.join("."),
        );
        assert_eq!(written(&dump, "./s1/mid"), 4096, "v{proto}:\n{dump}");
        assert_eq!(written(&dump, "./s1/big"), 0, "v{proto}:\n{dump}");
        // One byte changed in a compressed file: its one 128 KiB extent goes again.
        let text = written(&dump, "./s1/comp/text");
        assert!(
            text > 0 && text <= 128 << 10,
            "v{proto}: {text} bytes of comp/text"
        );
        let punched = dump
            .lines()
            .any(|l| l.starts_with("fallocate") && l.contains("./s1/punch "));
        assert_eq!(punched, proto == "2", "v{proto}:\n{dump}");
        if proto == "1" {
            assert_eq!(written(&dump, "./s1/punch"), 307200, "v1:\n{dump}");
        }
        let received = kernel_receives(&dir, &streams, &want, &format!("v{proto}"));
        oleo_receives(&dir, &streams, &want, &format!("v{proto}"));
        // The received snapshots sent on (a backup's backup): they name themselves and
        // their parents by received uuid, and their new inodes have the receiver's numbers.
        let relayed = send_chain(&dir, &received, want.len(), proto);
        let again = kernel_receives(&dir, &relayed, &want, &format!("relay.v{proto}"));
        for f in streams.iter().chain(&relayed).chain([&received, &again]) {
            std::fs::remove_file(f).unwrap();
        }
    }
    several_in_one_stream(&dir, &src, &want);
}

/// Several snapshots in one `oleo send`, as `btrfs send` writes them: a whole stream of
/// each in turn, each from -p PARENT when given (s0 and s4 full, then s1, s2 and s3 from
/// s0); with -e one stream of them all.
fn several_in_one_stream(dir: &TempDir, src: &Path, want: &[Manifest]) {
    let src_s = src.display().to_string();
    let full = dir.join("several.full");
    let inc = dir.join("several.inc");
    let (full_s, inc_s) = (full.display().to_string(), inc.display().to_string());
    oleo_ok(&["send", "--image", &src_s, "-f", &full_s, "/s0", "/s4"]);
    oleo_ok(&[
        "send", "--image", &src_s, "-f", &inc_s, "-p", "/s0", "/s1", "/s2", "/s3",
    ]);
    // With -e: one stream, one END; the receiver takes both snapshots of it.
    let one = dir.join("several.one");
    let one_s = one.display().to_string();
    oleo_ok(&["send", "--image", &src_s, "-e", "-f", &one_s, "/s0", "/s4"]);
    let dump = btrfs_in(&["receive", "--dump", "-f", &one_s], &dir.join("."));
    let subvols = dump.lines().filter(|l| l.starts_with("subvol ")).count();
    assert_eq!(subvols, 2, "-e stream:\n{dump}");
    let bytes = std::fs::read(&one).unwrap();
    let magic = b"btrfs-stream\0";
    let headers = bytes.windows(magic.len()).filter(|w| w == magic).count();
    assert_eq!(headers, 1, "-e stream with {headers} headers");
    let dst = dir.join("several-e.img");
    empty_image(&dst, 512, &[]).unwrap();
    let k = KernelMount::mount(&dst, &dir.join("several-e"), &["noatime"]).unwrap();
    btrfs_in(
        &["receive", "-f", &one_s, &k.path().display().to_string()],
        k.path(),
    );
    for i in [0, 4] {
        assert_same(
            &want[i],
            &k.path().join(format!("s{i}")),
            &format!("btrfs receive of s{i} from a -e stream"),
        );
    }
    k.unmount().unwrap();

    let dst = dir.join("several.img");
    empty_image(&dst, 512, &[]).unwrap();
    let k = KernelMount::mount(&dst, &dir.join("several"), &["noatime"]).unwrap();
    let at = k.path().display().to_string();
    btrfs_in(&["receive", "-f", &full_s, &at], k.path());
    btrfs_in(&["receive", "-f", &inc_s, &at], k.path());
    for (i, w) in want.iter().enumerate() {
        assert_same(
            w,
            &k.path().join(format!("s{i}")),
            &format!("btrfs receive of s{i} among several snapshots in one stream"),
        );
    }
    k.unmount().unwrap();
}

#[test]
fn random_incremental_chain_is_received_as_each_snapshot() {
    let what = "random_incremental_chain_is_received_as_each_snapshot";
    if !tools(what) {
        return;
    }
    let seed = seed(0x5eed_0001);
    eprintln!("{what}: seed {seed:#x} (OLEO_TEST_SEED={seed:#x} replays it)");
    let mut rng = Rng::new(seed);
    let dir = TempDir::new("send-incr-random").unwrap();
    let (src, want) = chain(&dir, 8, |vol, i, _| {
        let ops = if i == 0 { 120 } else { 60 };
        for _ in 0..ops {
            let op = random_op(&mut rng, vol, false);
            // Failures (a name that exists, a directory that is not empty) are part of
            // the mix: the tree is what it is afterwards.
            let _ = apply_path(vol, &op);
        }
    });
    let sizes: Vec<usize> = want.iter().map(Manifest::len).collect();
    eprintln!("{what}: paths in the snapshots: {sizes:?}");
    assert!(sizes.iter().all(|&n| n > 10), "trees too small: {sizes:?}");
    for proto in ["1", "2"] {
        let streams = send_chain(&dir, &src, want.len(), proto);
        let received = kernel_receives(&dir, &streams, &want, &format!("random.v{proto}"));
        for f in streams.iter().chain([&received]) {
            std::fs::remove_file(f).unwrap();
        }
    }
}

#[test]
fn writable_parents_and_non_subvolumes_are_refused() {
    let what = "writable_parents_and_non_subvolumes_are_refused";
    if !require_root(what) || !tools(what) {
        return;
    }
    let dir = TempDir::new("send-incr-refused").unwrap();
    let img = dir.join("s.img");
    empty_image(&img, 256, &[]).unwrap();
    let k = KernelMount::mount(&img, &dir.join("m"), &["rw"]).unwrap();
    btrfs_in(&["subvolume", "create", "vol"], k.path());
    std::fs::create_dir(k.path().join("vol/dir")).unwrap();
    btrfs_in(&["subvolume", "snapshot", "-r", "vol", "snap"], k.path());
    k.unmount().unwrap();
    let img_s = img.display().to_string();
    let out = dir.join("out");
    let out_s = out.display().to_string();
    for (parent, says) in [
        ("vol", "not read-only"),
        ("snap/dir", "Not a Btrfs subvolume"),
        ("missing", "no such file"),
    ] {
        let o = oleo(&[
            "send", "--image", &img_s, "-p", parent, "-f", &out_s, "snap",
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "send -p {parent} succeeded");
        assert!(
            err.contains(&format!("-p /{parent}")) && err.contains(says),
            "send -p {parent}: {err}"
        );
        assert!(!out.exists(), "a refused send left a stream");
    }
    // A snapshot sent from itself is an empty change the kernel takes.
    oleo_ok(&["send", "--image", &img_s, "-f", &out_s, "snap"]);
    let inc = dir.join("inc");
    let inc_s = inc.display().to_string();
    oleo_ok(&[
        "send", "--image", &img_s, "-p", "snap", "-f", &inc_s, "snap",
    ]);
    let dump = btrfs_in(&["receive", "--dump", "-f", &inc_s], &dir.join("."));
    assert!(dump.starts_with("snapshot"), "{dump}");
}

/// A chain of snapshots oleo made (random operations through an oleo mount with
/// compress=zstd, reflinks through copy_file_range, preallocation, every file type, then
/// `oleo subvolume snapshot -r`), sent by oleo from the unmounted image (full, then
/// incremental; protocols 1, 2 and 2 with --compressed-data), received by the kernel:
/// each received snapshot is what the kernel reads from oleo's image, and the receiving
/// image passes btrfs check.
#[test]
fn oleo_made_random_chain_is_received_by_the_kernel() {
    let what = "oleo_made_random_chain_is_received_by_the_kernel";
    if !tools(what) || !oleo_testkit::require_fuse(what) {
        return;
    }
    let seed = seed(0x5eed_0002);
    eprintln!("{what}: seed {seed:#x} (OLEO_TEST_SEED={seed:#x} replays it)");
    let mut rng = Rng::new(seed);
    let dir = TempDir::new("send-oleo-made").unwrap();
    let img = dir.join("oleo_made.img");
    oleo_mkfs(OLEO, &img, 512);
    let n = 5;
    {
        let mnt = dir.join("om");
        let m = oleo_testkit::OleoMount::mount_rw(
            Path::new(OLEO),
            &img,
            &mnt,
            &["compress=zstd", "noatime"],
        )
        .unwrap();
        let top = m.path().to_path_buf();
        let vol = top.join("vol");
        oleo_ok(&["subvolume", "create", &vol.display().to_string()]);
        for i in 0..n {
            for _ in 0..if i == 0 { 120 } else { 50 } {
                let op = random_op(&mut rng, &vol, false);
                let _ = apply_path(&vol, &op);
            }
            // What random_op has no word for: clones (FICLONE does not pass FUSE: cp
            // falls back to copy_file_range, which oleo answers with a clone),
            // preallocation, a compressible file.
            sh_ok(
                &vol,
                &format!(
                    "set -e
                     head -c {len} /dev/urandom > r{i}
                     cp --reflink=auto r{i} clone{i}
                     fallocate -l 200000 pre{i}
                     printf data | dd of=pre{i} bs=1 seek=70000 conv=notrunc status=none
                     yes line{i} | head -c 300000 > text{i}
                     mkfifo fifo{i}",
                    len = 100_000 + 50_000 * i
                ),
            );
            if i > 0 {
                // Random operations may have taken them already.
                let p = i - 1;
                sh_ok(
                    &vol,
                    &format!("rm -rf r{p}; if [ -f clone{p} ]; then mv clone{p} moved{i}; fi"),
                );
            }
            oleo_ok(&[
                "subvolume",
                "snapshot",
                "-r",
                &vol.display().to_string(),
                &top.join(format!("s{i}")).display().to_string(),
            ]);
        }
        m.unmount().unwrap();
    }
    if let Err(e) = btrfs_check(&img, true) {
        panic!("btrfs check of the image oleo made:\n{e}");
    }
    let want: Vec<Manifest> = {
        let k = KernelMount::mount(&img, &dir.join("kmade"), &["ro"]).unwrap();
        let w = (0..n)
            .map(|i| Manifest::capture(&k.path().join(format!("s{i}"))).unwrap())
            .collect();
        k.unmount().unwrap();
        w
    };
    for proto in ["1", "2"] {
        let streams = send_chain(&dir, &img, n, proto);
        let received = kernel_receives(&dir, &streams, &want, &format!("oleo-made.v{proto}"));
        for f in streams.iter().chain([&received]) {
            std::fs::remove_file(f).unwrap();
        }
    }
    // Protocol 2 with compressed data: the last snapshot whole, then from s0.
    let img_s = img.display().to_string();
    let streams: Vec<PathBuf> = (0..2)
        .map(|k| {
            let stream = dir.join(format!("compressed.{k}"));
            let s = stream.display().to_string();
            let last = format!("/s{}", n - 1);
            let mut args = vec!["send", "--image", &img_s, "--proto", "2"];
            args.extend(["--compressed-data", "-f", &s]);
            if k == 1 {
                args.extend(["-p", "/s0"]);
            }
            args.push(if k == 0 { "/s0" } else { &last });
            oleo_ok(&args);
            stream
        })
        .collect();
    let dump = btrfs_in(
        &["receive", "--dump", "-f", &streams[0].display().to_string()],
        &dir.join("."),
    );
    assert!(
        dump.lines().any(|l| l.starts_with("encoded_write")),
        "no encoded_write for oleo's compressed files:\n{dump}"
    );
    assert!(
        dump.lines()
            .any(|l| l.starts_with("clone") && l.contains("/clone0")),
        "clone0 (a copy_file_range clone of r0) is not sent as a CLONE:\n{dump}"
    );
    let dst = dir.join("kernel.compressed.img");
    empty_image(&dst, 512, &[]).unwrap();
    let k = KernelMount::mount(&dst, &dir.join("kdst.compressed"), &["noatime"]).unwrap();
    let at = k.path().display().to_string();
    for (s, (i, w)) in streams.iter().zip([(0, &want[0]), (n - 1, &want[n - 1])]) {
        btrfs_in(&["receive", "-f", &s.display().to_string(), &at], k.path());
        assert_same(w, &k.path().join(format!("s{i}")), "compressed-data stream");
    }
    k.unmount().unwrap();
    if let Err(e) = btrfs_check(&dst, true) {
        panic!("btrfs check after the compressed-data streams:\n{e}");
    }
}
