//! Compression of new data through an oleo mount, against kernel btrfs: the same shell
//! session (cp, dd, truncate, chattr +c/+m, the btrfs.compression property set, removed,
//! refused and inherited, small files inline) runs on both under the same mount options;
//! what the user sees (exit codes, lsattr, getfattr, contents) must be identical, and
//! compsize (on a kernel mount of each image) must find the same algorithms per file and
//! about the same disk usage. `btrfs check --check-data-csum` must pass on oleo's image.
//!
//! Needs root, FUSE, kernel btrfs and compsize (a skip elsewhere, a failure under CI=true).

use oleo_testkit::cmd::sh;
use oleo_testkit::ops::pattern;
use oleo_testkit::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

/// dd copies with read and write: cp and cat would clone (copy_file_range), and the copy
/// would keep the source's extents whatever the destination's flags.
const DD: &str = "bs=256k status=none";

/// The files the session leaves, for compsize.
const FILES: &[&str] = &[
    "zeros",
    "text",
    "noise",
    "tiny",
    "tiny_noise",
    "three",
    "four",
    "five",
    "pd/f",
    "pd/text",
    "pd/sub/text",
    "nd/text",
    "mt",
    "ct",
    "pover",
    "ptrunc",
    "refl",
    "grow",
];

/// The tests of this file run their shell sessions one at a time: a `sync` of one landing
/// while another's `dd` copies a 128 KiB block writes the first pages back alone, on
/// either side, and splits an extent the other side keeps whole (ptrunc: "oleo 94208 vs
/// kernel 131072" uncompressed bytes, seen here once in five runs of this file).
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// A user's session; `src` holds `text` and `noise` to copy from. The kernel compresses at
/// writeback, oleo as each write arrives (FUSE writes back at every close): where one file
/// is written twice, a sync between makes the kernel see the same two writes, and flags
/// that writing may change are listed after a sync. A truncation ends on a sector: the
/// kernel zeroes the tail of a last partial sector at once (a new extent), oleo when the
/// file grows again.
fn session(dir: &Path, src: &Path) -> Vec<(String, bool, String)> {
    let s = src.display();
    let steps = [
        "head -c 300000 /dev/zero > zeros && md5sum zeros".to_string(),
        format!("dd if={s}/text of=text {DD} && dd if={s}/noise of=noise {DD} && md5sum text noise"),
        "printf hello > tiny".into(),
        format!("head -c 100 {s}/noise > tiny_noise"),
        "head -c 3000 /dev/zero > three && head -c 4096 /dev/zero > four && head -c 5000 /dev/zero > five".into(),
        "sync && lsattr noise text | cut -c1-22".into(),
        "mkdir pd && setfattr -n btrfs.compression -v zstd pd && lsattr -d pd | cut -c1-22".into(),
        "touch pd/f && mkdir pd/sub && lsattr -d pd/f pd/sub | cut -c1-22 && getfattr --only-values -n btrfs.compression pd/f && echo && getfattr --only-values -n btrfs.compression pd/sub".into(),
        format!("dd if=text of=pd/text {DD} && dd if=text of=pd/sub/text {DD} && head -c 70000 zeros >> pd/f"),
        "setfattr -n btrfs.compression -v bogus pd/f".into(),
        "setfattr -n btrfs.other -v 1 pd/f".into(),
        format!("mkdir nd && setfattr -n btrfs.compression -v no nd && dd if=text of=nd/text {DD} && sync && lsattr -d nd nd/text | cut -c1-22"),
        "getfattr --only-values -n btrfs.compression nd/text".into(),
        format!("touch mt && chattr +m mt && dd if=text of=mt {DD} && sync && lsattr mt | cut -c1-22"),
        format!("touch ct && chattr +c ct && dd if=text of=ct {DD} && sync && lsattr ct | cut -c1-22 && getfattr --only-values -n btrfs.compression ct"),
        "setfattr -x btrfs.compression pd && lsattr -d pd | cut -c1-22".into(),
        "touch cn && chattr +C cn && setfattr -n btrfs.compression -v zstd cn".into(),
        format!("dd if=text of=pover {DD} && sync && dd if={s}/noise of=pover bs=4096 seek=10 count=3 conv=notrunc 2>/dev/null && md5sum pover"),
        // One write of one extent's worth: a truncation keeps the whole first extent, and
        // where writeback (the kernel's, under load) cut a longer file is not ours to test.
        "dd if=text of=ptrunc bs=128k count=1 status=none && sync && truncate -s 69632 ptrunc && md5sum ptrunc".into(),
        // FICLONE does not pass FUSE: cp clones through copy_file_range.
        "cp --reflink=auto text refl && dd if=zeros of=refl bs=4096 seek=40 count=2 conv=notrunc 2>/dev/null && md5sum refl text".into(),
        // Appends on 128 KiB boundaries, of data that compresses: the kernel cuts extents
        // where its writeback happens to start (a sync of another test may come between
        // two writes), and a few incompressible first bytes would mark the file NOCOMPRESS
        // whenever they went out alone.
        format!("head -c 131072 text > grow && dd if=text {DD} >> grow && sync && md5sum grow && lsattr grow | cut -c1-22"),
        // Not tiny and tiny_noise: the kernel marks them NOCOMPRESS, oleo does not (see
        // compression::compress_inline); their extents are compared below.
        "sync && lsattr noise text zeros three four five | cut -c1-22".into(),
    ];
    steps
        .iter()
        .map(|step| {
            let (ok, out) = sh(dir, step);
            (step.clone(), ok, out)
        })
        .collect()
}

/// compsize's per-algorithm lines for each file: algorithm -> (disk, uncompressed).
fn usage(mnt: &Path) -> BTreeMap<String, BTreeMap<String, (u64, u64)>> {
    let mut all = BTreeMap::new();
    for f in FILES {
        let out = Command::new("compsize")
            .arg("-b")
            .arg(mnt.join(f))
            .output()
            .expect("compsize");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut by_type = BTreeMap::new();
        for l in text.lines().skip_while(|l| !l.starts_with("TOTAL")).skip(1) {
            let w: Vec<&str> = l.split_whitespace().collect();
            if w.len() >= 4 {
                by_type.insert(
                    w[0].to_string(),
                    (w[2].parse().unwrap_or(0), w[3].parse().unwrap_or(0)),
                );
            }
        }
        all.insert(f.to_string(), by_type);
    }
    all
}

fn compare(options: &[&str], label: &str) {
    let _turn = one_at_a_time();
    if !(require_root(label) && require_fuse(label)) {
        return;
    }
    for tool in ["lsattr", "chattr", "getfattr", "setfattr", "compsize"] {
        if oleo_testkit::env::find_in_path(tool).is_none() {
            assert!(!is_ci(), "{tool} is missing");
            eprintln!("skip: {tool} is missing");
            return;
        }
    }
    let tmp = TempDir::new(&format!("oleo-compress-{label}")).expect("tempdir");
    let src = tmp.subdir("src").unwrap();
    let text: Vec<u8> = (0..20000)
        .flat_map(|i| {
            format!("line {i}: the quick brown fox jumps over the lazy dog\n").into_bytes()
        })
        .take(1_000_000)
        .collect();
    std::fs::write(src.join("text"), &text).unwrap();
    std::fs::write(src.join("noise"), pattern(7, 600_000)).unwrap();

    let kimage = tmp.join("kimage");
    image::empty_image(&kimage, 512, &[]).expect("mkfs.btrfs");
    let mut kopts = vec!["rw"];
    kopts.extend_from_slice(options);
    let (kernel, kusage, ksums) = {
        let m = KernelMount::mount(&kimage, &tmp.join("kmnt"), &kopts).expect("kernel mount");
        let r = session(m.path(), &src);
        sh(m.path(), "sync");
        let u = usage(m.path());
        let sums = sh(m.path(), &format!("md5sum {}", FILES.join(" ")));
        drop(m);
        (r, u, sums)
    };
    let image = tmp.join("image");
    image::empty_image(&image, 512, &[]).expect("mkfs.btrfs");
    let mnt = tmp.join("mnt");
    let m = OleoMount::mount_rw(Path::new(OLEO), &image, &mnt, options).expect("oleo mount");
    let ours = session(m.path(), &src);
    drop(m);
    for (k, o) in kernel.iter().zip(&ours) {
        assert_eq!(k, o, "{label}: `{}`: kernel btrfs vs oleo", k.0);
    }
    assert_btrfs_check(&image, label);
    let m = KernelMount::mount(&image, &tmp.join("kmnt2"), &[]).expect("kernel mount");
    // The kernel reads from oleo's image what it wrote itself.
    assert_eq!(
        sh(m.path(), &format!("md5sum {}", FILES.join(" "))),
        ksums,
        "{label}: file contents on oleo's image vs the kernel's"
    );
    let ousage = usage(m.path());
    drop(m);
    eprintln!("{label}: compsize per file, kernel {kusage:?}\noleo {ousage:?}");
    for f in FILES {
        // The kernel cuts extents where its writeback starts, and a sync of a test running
        // beside this one may start it between two writes: a lone sector then goes out
        // uncompressed. Such crumbs (at most two sectors of "none" beside an algorithm)
        // are left out of the comparison, and the byte counts get their size as slack.
        let crumbs = |u: &BTreeMap<String, (u64, u64)>| {
            let mut u = u.clone();
            if u.len() > 1 && u.get("none").is_some_and(|&(_, r)| r <= 8192) {
                u.remove("none");
            }
            u
        };
        let (k, o) = (crumbs(&kusage[*f]), crumbs(&ousage[*f]));
        let kt: Vec<&String> = k.keys().collect();
        let ot: Vec<&String> = o.keys().collect();
        assert_eq!(
            kt, ot,
            "{label}: {f}: algorithms (kernel {k:?}, oleo {o:?})"
        );
        for (t, &(kd, kr)) in &k {
            let (od, or) = o[t];
            assert!(
                or.abs_diff(kr) <= 8192,
                "{label}: {f}: {t} uncompressed bytes: oleo {or} vs kernel {kr}"
            );
            // Another build of the same compressor may end a stream a sector apart.
            let slack = kr / 131072 * 4096 + 2 * 4096;
            assert!(
                od.abs_diff(kd) <= slack,
                "{label}: {f}: {t}: oleo {od} vs kernel {kd} disk bytes"
            );
        }
    }
}

#[test]
fn no_compress_option_properties_and_flags() {
    compare(&[], "plain");
}

#[test]
fn compress_zstd() {
    compare(&["compress=zstd"], "zstd");
}

#[test]
fn compress_force_zlib() {
    compare(&["compress-force=zlib:9"], "force-zlib");
}

#[test]
fn compress_lzo() {
    compare(&["compress=lzo"], "lzo");
}

/// `oleo property` sets and shows the compression property on a mount and on an image; the
/// kernel then sees the same property and flag, and compresses with it.
#[test]
fn property_command_on_mount_and_image() {
    let _turn = one_at_a_time();
    if !(require_root("property") && require_fuse("property")) {
        return;
    }
    let tmp = TempDir::new("oleo-compress-property").expect("tempdir");
    let image = tmp.join("image");
    image::empty_image(&image, 256, &[]).expect("mkfs.btrfs");
    let oleo = |args: &[&str]| {
        let out = Command::new(OLEO).args(args).output().expect("oleo");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        )
    };
    let mnt = tmp.join("mnt");
    let m = OleoMount::mount_rw(Path::new(OLEO), &image, &mnt, &[]).expect("oleo mount");
    let d = mnt.join("d");
    std::fs::create_dir(&d).unwrap();
    std::fs::write(mnt.join("f"), b"").unwrap();
    let ds = d.to_str().unwrap();
    assert!(oleo(&["property", "set", ds, "compression", "zstd"]).0);
    assert_eq!(
        oleo(&["property", "get", ds]),
        (true, "compression=zstd".into())
    );
    assert_eq!(
        sh(&mnt, "lsattr -d d | cut -c1-22").1,
        "--------c-------------"
    );
    assert!(!oleo(&["property", "set", ds, "compression", "bogus"]).0);
    assert_eq!(
        oleo(&["property", "get", mnt.to_str().unwrap()]),
        (true, "ro=false".into())
    );
    drop(m);
    let img = image.to_str().unwrap();
    assert!(
        oleo(&[
            "property",
            "set",
            "--image",
            img,
            "/f",
            "compression",
            "lzo"
        ])
        .0
    );
    assert_eq!(
        oleo(&[
            "property",
            "get",
            "--image",
            image.to_str().unwrap(),
            "/f",
            "compression"
        ]),
        (true, "compression=lzo".into())
    );
    assert_btrfs_check(&image, "after oleo property");
    let k = KernelMount::mount(&image, &tmp.join("kmnt"), &["rw"]).expect("kernel mount");
    assert_eq!(
        sh(
            k.path(),
            "lsattr -d d f | cut -c1-22 && getfattr --only-values -n btrfs.compression f"
        )
        .1,
        "--------c-------------\n--------c-------------\nlzo"
    );
    sh(
        k.path(),
        "yes compressible | head -c 1000000 > f && mkdir d/e && sync",
    );
    let (disk, ram) = oleo_testkit::check::compsize(&k.path().join("f"));
    assert!(
        disk * 4 < ram,
        "the kernel did not compress f: {disk} of {ram}"
    );
    assert_eq!(
        sh(k.path(), "getfattr --only-values -n btrfs.compression d/e").1,
        "zstd"
    );
}
