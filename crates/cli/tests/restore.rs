//! `oleo restore` against `btrfs restore`: a kernel-made image, then copies of it damaged at
//! known places (a directory leaf in both DUP copies, one copy of a leaf, the csum leaf,
//! the primary superblock, the root tree's root). Each is restored by both tools; oleo must
//! get at least as many files right, the table is printed, and the image never changes.
//! Also a dry run over every image of btrfs-progs' fsck tests: no panic, no hang.
//!
//! Needs root, loop devices, kernel btrfs, btrfs-progs and setfattr (a skip elsewhere, a
//! failure under CI=true).

use oleo_testkit::cmd::{require_tools, run_with_timeout, sh_ok};
use oleo_testkit::{require_root, KernelMount, TempDir};
use std::collections::BTreeMap;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

/// mkfs.btrfs's default tree block size.
const NODESIZE: usize = 16384;

/// Damages a copy of the image in place.
type Damage = Box<dyn Fn(&Path)>;

const POPULATE: &str = r#"
set -e
printf 'hello' > inline
head -c 3000000 /dev/urandom > big
head -c 70000 /dev/urandom > mid
ln mid mid_link
mkdir -p deep/a/b/c && printf 'deep file\n' > deep/a/b/c/f
mkdir comp
setfattr -n btrfs.compression -v zstd comp
yes 'oleo restore test line' | head -c 1000000 > comp/text
yes y | head -c 3000 > comp/small
mkdir lzo
setfattr -n btrfs.compression -v lzo lzo
yes 'lzo line' | head -c 500000 > lzo/text
ln -s big sym
ln -s deep/a/b/c dirsym
setfattr -n user.a -v hello mid
chown 1234:567 inline
chmod 640 inline
touch -d '2001-02-03 04:05:06' big
mkdir many
for i in $(seq 1 1500); do printf "file $i\n" > many/f$i; done
"#;

fn tools() -> bool {
    require_root("oleo restore vs btrfs restore")
        && require_tools(
            "oleo restore vs btrfs restore",
            &["mkfs.btrfs", "btrfs", "setfattr", "getfattr"],
            "btrfs-progs attr",
        )
}

/// A hash of the image's data regions (holes skipped, so a sparse terabyte is quick).
fn sha(path: &Path) -> u64 {
    use std::hash::Hasher;
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).expect("open image");
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut pos = 0i64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        // SAFETY: plain lseek calls on an open descriptor.
        let data = unsafe { libc::lseek(f.as_raw_fd(), pos, libc::SEEK_DATA) };
        if data < 0 {
            break;
        }
        let hole = unsafe { libc::lseek(f.as_raw_fd(), data, libc::SEEK_HOLE) };
        h.write_i64(data);
        let mut at = data;
        while at < hole {
            let n = ((hole - at) as usize).min(buf.len());
            f.read_exact_at(&mut buf[..n], at as u64)
                .expect("read image");
            h.write(&buf[..n]);
            at += n as i64;
        }
        pos = hole;
    }
    h.finish()
}

/// Every regular file's bytes, by path relative to `root`.
fn contents(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                let rel = e.path().strip_prefix(root).unwrap().to_path_buf();
                out.insert(rel, std::fs::read(e.path()).unwrap());
            }
        }
    }
    out
}

fn correct(orig: &BTreeMap<PathBuf, Vec<u8>>, dest: &Path) -> usize {
    orig.iter()
        .filter(|(rel, data)| std::fs::read(dest.join(rel)).is_ok_and(|d| &d == *data))
        .count()
}

fn out(cmd: &mut Command) -> String {
    let o = cmd.output().expect("run");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The physical offsets of the copies of logical `addr`, from the chunk tree's dump.
fn physical(image: &Path, addr: u64) -> Vec<u64> {
    let dump = out(Command::new("btrfs")
        .args(["inspect-internal", "dump-tree", "-t", "chunk"])
        .arg(image));
    let mut res = Vec::new();
    let mut cur: Option<(u64, u64)> = None;
    for line in dump.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if line.contains("CHUNK_ITEM") && w.first() == Some(&"item") {
            let start: u64 = w[5].trim_end_matches(')').parse().unwrap();
            cur = Some((start, 0));
        } else if w.first() == Some(&"length") {
            if let Some(c) = cur.as_mut() {
                c.1 = w[1].parse().unwrap();
            }
        } else if w.first() == Some(&"stripe") && w.contains(&"offset") {
            let (start, len) = cur.unwrap();
            if (start..start + len).contains(&addr) {
                let off: u64 = w[w.iter().position(|x| *x == "offset").unwrap() + 1]
                    .parse()
                    .unwrap();
                res.push(off + addr - start);
            }
        }
    }
    assert!(!res.is_empty(), "no chunk maps {addr}");
    res
}

/// The first non-root leaf of tree `tree` holding an item of `ino` of type `ty`.
fn leaf_with(image: &Path, tree: &str, ino: &str, ty: &str) -> u64 {
    let dump = out(Command::new("btrfs")
        .args(["inspect-internal", "dump-tree", "-t", tree])
        .arg(image));
    let mut leaf = 0;
    let want = format!("key ({ino} {ty} ");
    for line in dump.lines() {
        let t = line.trim_start();
        if t.starts_with("leaf ") {
            leaf = t.split_whitespace().nth(1).unwrap().parse().unwrap();
        } else if t.contains(&want) && leaf != 0 {
            return leaf;
        }
    }
    panic!("no leaf of tree {tree} holds ({ino} {ty})");
}

fn super_field(image: &Path, field: &str) -> u64 {
    let d = out(Command::new("btrfs")
        .args(["inspect-internal", "dump-super"])
        .arg(image));
    d.lines()
        .find_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.first() == Some(&field)).then(|| w[1].parse().unwrap())
        })
        .unwrap()
}

fn zero(image: &Path, at: u64, len: usize) {
    let f = std::fs::OpenOptions::new().write(true).open(image).unwrap();
    f.write_all_at(&vec![0u8; len], at).unwrap();
}

#[test]
fn restore_damaged_images_vs_btrfs_restore() {
    if !tools() {
        return;
    }
    let tmp = TempDir::new("restore").unwrap();
    let clean = tmp.join("clean.img");
    sh_ok(
        tmp.path(),
        "truncate -s 512M clean.img && mkfs.btrfs -q -m dup -d single clean.img",
    );
    let mnt = tmp.subdir("mnt").unwrap();
    let m = KernelMount::mount(&clean, &mnt, &["rw", "noatime"]).unwrap();
    sh_ok(&mnt, POPULATE);
    let dir_ino = std::fs::metadata(mnt.join("many")).unwrap().ino();
    let orig = contents(&mnt);
    let meta: BTreeMap<PathBuf, std::fs::Metadata> = orig
        .keys()
        .map(|p| (p.clone(), std::fs::symlink_metadata(mnt.join(p)).unwrap()))
        .collect();
    m.unmount().unwrap();

    let mut cases: Vec<(&str, Damage)> = vec![("clean", Box::new(|_| {}))];
    cases.push((
        "dir leaf, both copies",
        Box::new(move |img| {
            let leaf = leaf_with(img, "5", &dir_ino.to_string(), "DIR_INDEX");
            physical(img, leaf)
                .into_iter()
                .for_each(|p| zero(img, p, NODESIZE));
        }),
    ));
    cases.push((
        "dir leaf, one copy",
        Box::new(move |img| {
            let leaf = leaf_with(img, "5", &dir_ino.to_string(), "DIR_INDEX");
            zero(img, physical(img, leaf)[0], NODESIZE);
        }),
    ));
    cases.push((
        "csum leaf",
        Box::new(|img| {
            let leaf = leaf_with(img, "csum", "EXTENT_CSUM", "EXTENT_CSUM");
            physical(img, leaf)
                .into_iter()
                .for_each(|p| zero(img, p, NODESIZE));
        }),
    ));
    cases.push(("primary superblock", Box::new(|img| zero(img, 65536, 4096))));
    cases.push((
        "root tree root",
        Box::new(|img| {
            let root = super_field(img, "root");
            physical(img, root)
                .into_iter()
                .for_each(|p| zero(img, p, NODESIZE));
        }),
    ));

    let mut table = Vec::new();
    for (i, (name, damage)) in cases.iter().enumerate() {
        let img = tmp.join(format!("case{i}.img"));
        std::fs::copy(&clean, &img).unwrap();
        damage(&img);
        let before = sha(&img);
        let dest_b = tmp.join(format!("btrfs{i}"));
        let dest_o = tmp.join(format!("oleo{i}"));
        std::fs::create_dir_all(&dest_b).unwrap();
        let _ = Command::new("btrfs")
            .args(["restore", "-xmSi"])
            .arg(&img)
            .arg(&dest_b)
            .output();
        let o = Command::new(OLEO)
            .arg("restore")
            .arg(&img)
            .arg(&dest_o)
            .output()
            .unwrap();
        assert_ne!(
            o.status.code(),
            Some(101),
            "{name}: oleo panicked: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            sha(&img) == before,
            "{name}: oleo restore changed the image"
        );
        // Leaves lost on every copy are reported; one good copy is enough.
        let stdout = String::from_utf8_lossy(&o.stdout);
        let none_skipped = stdout.contains("skipped tree blocks: 0\n");
        assert_eq!(none_skipped, ![1, 3, 5].contains(&i), "{name}: {stdout}");
        let (n_o, n_b) = (correct(&orig, &dest_o), correct(&orig, &dest_b));
        table.push((name.to_string(), n_o, n_b));
        if i == 0 {
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            assert_eq!(n_o, orig.len(), "clean image: every file byte-identical");
            assert_eq!(n_b, orig.len(), "clean image: btrfs restore too");
            for (rel, want) in &meta {
                let got = std::fs::symlink_metadata(dest_o.join(rel)).unwrap();
                assert_eq!(got.mode(), want.mode(), "{rel:?} mode");
                assert_eq!(
                    (got.uid(), got.gid()),
                    (want.uid(), want.gid()),
                    "{rel:?} owner"
                );
                assert_eq!(
                    (got.mtime(), got.mtime_nsec()),
                    (want.mtime(), want.mtime_nsec()),
                    "{rel:?} mtime"
                );
            }
            assert_eq!(
                std::fs::read_link(dest_o.join("sym")).unwrap(),
                Path::new("big")
            );
            let x = out(Command::new("getfattr")
                .args(["--only-values", "-n", "user.a"])
                .arg(dest_o.join("mid")));
            assert_eq!(x, "hello");
            assert_eq!(
                std::fs::metadata(dest_o.join("mid")).unwrap().ino(),
                std::fs::metadata(dest_o.join("mid_link")).unwrap().ino(),
                "hard links restored as links"
            );
        }
    }
    println!(
        "{:<24} {:>6} {:>6}  (files with correct contents of {})",
        "image",
        "oleo",
        "btrfs",
        orig.len()
    );
    for (name, o, b) in &table {
        println!("{name:<24} {o:>6} {b:>6}");
    }
    for (name, o, b) in &table {
        assert!(
            o >= b,
            "{name}: oleo restored {o} files right, btrfs restore {b}"
        );
    }
    // Damage that leaves a good copy or only csums behind loses nothing.
    for (name, o, _) in &table[2..] {
        assert_eq!(*o, orig.len(), "{name}: every file expected");
    }
}

/// The fsck test images, decompressed (btrfs-image dumps restored) into `dir`.
fn fsck_images(dir: &Path) -> Vec<PathBuf> {
    let root = Path::new("/work/shared/test-images/btrfs-progs-fsck");
    let mut out = Vec::new();
    let Ok(cases) = std::fs::read_dir(root) else {
        return out;
    };
    let mut cases: Vec<PathBuf> = cases.flatten().map(|e| e.path()).collect();
    cases.sort();
    for (n, case) in cases.iter().enumerate() {
        let Ok(files) = std::fs::read_dir(case) else {
            continue;
        };
        for (m, f) in files.flatten().enumerate() {
            let p = f.path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let work = dir.join(format!("{n}-{m}"));
            std::fs::create_dir_all(&work).unwrap();
            let q = |s: &Path| format!("'{}'", s.display());
            let script = if name.ends_with(".tar.xz") {
                format!("tar xJf {} -C {}", q(&p), q(&work))
            } else if name.ends_with(".xz") {
                format!("xz -dc {} > {}/image", q(&p), q(&work))
            } else if name.ends_with(".img") {
                format!(
                    "btrfs-image -r {p} {w}/image 2>/dev/null || cp {p} {w}/image",
                    p = q(&p),
                    w = q(&work)
                )
            } else {
                continue;
            };
            let _ = Command::new("sh").arg("-c").arg(&script).status();
            for e in std::fs::read_dir(&work).unwrap().flatten() {
                if e.file_type().is_ok_and(|t| t.is_file()) {
                    out.push(e.path());
                }
            }
        }
    }
    out
}

#[test]
fn restore_dry_run_over_fsck_images_never_panics() {
    if !require_tools(
        "oleo restore over fsck images",
        &["xz", "tar", "btrfs-image"],
        "btrfs-progs xz-utils tar",
    ) {
        return;
    }
    let tmp = TempDir::new("restore-fsck").unwrap();
    let images = fsck_images(tmp.path());
    if images.is_empty() {
        assert!(
            !oleo_testkit::env::is_ci(),
            "no fsck test images under /work/shared/test-images"
        );
        eprintln!("skipping: no fsck test images");
        return;
    }
    for (n, img) in images.iter().enumerate() {
        let before = sha(img);
        // The dry run, then a real one (the data paths meet the damage too), with the scan
        // for older roots; and the roots' listing.
        for run in ["dry", "real", "list"] {
            let (dry, list) = (run == "dry", run == "list");
            let dest = tmp.join(format!("dest{n}"));
            let mut cmd = Command::new(OLEO);
            cmd.arg("restore").arg(img);
            if list {
                cmd.arg("--list-roots").stdout(std::process::Stdio::null());
            } else {
                cmd.arg(&dest).arg("--older");
            }
            if dry {
                cmd.arg("--dry-run");
            }
            let st = run_with_timeout(&mut cmd, Duration::from_secs(60))
                .unwrap_or_else(|e| panic!("{}: {e} (a hang?)", img.display()));
            assert_ne!(
                st.code(),
                Some(101),
                "{}: oleo restore panicked",
                img.display()
            );
            assert!(st.code().is_some(), "{}: killed", img.display());
            assert!(sha(img) == before, "{}: image changed", img.display());
            assert!(
                !(dry || list) || !dest.exists(),
                "{}: {run} wrote",
                img.display()
            );
            let _ = std::fs::remove_dir_all(&dest);
        }
    }
    println!(
        "restores (dry and real, --older) and root listings over {} fsck images: no panic, \
         no hang",
        images.len()
    );
}

/// A name already in DEST that is no directory (a symlink out of DEST, as an earlier entry
/// of the same name in a hostile image would leave) is never followed: nothing is written
/// outside DEST, the clash is reported, and everything else is restored.
#[test]
fn restore_never_writes_through_a_link_in_dest() {
    if !tools() {
        return;
    }
    let tmp = TempDir::new("restore-link").unwrap();
    let img = tmp.join("i.img");
    sh_ok(tmp.path(), "truncate -s 256M i.img && mkfs.btrfs -q i.img");
    let mnt = tmp.subdir("mnt").unwrap();
    let m = KernelMount::mount(&img, &mnt, &["rw"]).unwrap();
    sh_ok(
        &mnt,
        "mkdir -p a/b && echo inside > a/f && echo deeper > a/b/g && echo top > t",
    );
    m.unmount().unwrap();
    let outside = tmp.subdir("outside").unwrap();
    let dest = tmp.subdir("dest").unwrap();
    std::os::unix::fs::symlink(&outside, dest.join("a")).unwrap();
    let o = Command::new(OLEO)
        .arg("restore")
        .arg(&img)
        .arg(&dest)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(101), "panicked: {err}");
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "restore wrote through the link in DEST: {err}"
    );
    assert!(
        err.contains("no directory"),
        "the clash is not reported: {err}"
    );
    assert_eq!(std::fs::read(dest.join("t")).unwrap(), b"top\n");
}

/// Every root of tree 5 the image names (its ROOT_ITEM and the four backup roots) zeroed on
/// every copy: a plain restore finds nothing, `--older` finds an older root of tree 5 by
/// scanning the metadata (the roots `--list-roots` lists) and restores the files it held.
#[test]
fn restore_older_roots_found_by_scanning() {
    if !tools() {
        return;
    }
    let tmp = TempDir::new("restore-older").unwrap();
    let img = tmp.join("o.img");
    sh_ok(
        tmp.path(),
        "truncate -s 256M o.img && mkfs.btrfs -q -m dup o.img",
    );
    let mnt = tmp.subdir("mnt").unwrap();
    let m = KernelMount::mount(&img, &mnt, &["rw", "noatime"]).unwrap();
    // One commit per file: tree 5 gets a new root each time.
    sh_ok(
        &mnt,
        "for i in 1 2 3 4 5 6 7 8 9 10; do echo file $i > f$i; sync; done",
    );
    m.unmount().unwrap();
    let mut named: Vec<u64> = out(Command::new("btrfs")
        .args(["inspect-internal", "dump-super", "-f"])
        .arg(&img))
    .lines()
    .filter_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        (w.first() == Some(&"backup_fs_root:")).then(|| w[1].parse().unwrap())
    })
    .collect();
    let tree5 = out(Command::new("btrfs")
        .args(["inspect-internal", "dump-tree", "-t", "5"])
        .arg(&img));
    let current = tree5
        .lines()
        .find_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            matches!(w.first(), Some(&"leaf") | Some(&"node")).then(|| w[1].parse().unwrap())
        })
        .expect("tree 5's root");
    named.push(current);
    let listed = out(Command::new(OLEO)
        .args(["restore", "--list-roots"])
        .arg(&img));
    let older: Vec<u64> = listed
        .lines()
        .skip(1)
        .filter_map(|l| {
            let w: Vec<u64> = l
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            (w.len() == 4 && w[0] == 5 && !named.contains(&w[3])).then_some(w[3])
        })
        .collect();
    assert!(
        !older.is_empty(),
        "no older root of tree 5 listed besides {named:?}:\n{listed}"
    );
    // btrfs-find-root's root tree blocks, current and older, are all in the list.
    let found = out(Command::new("btrfs-find-root").arg(&img));
    let theirs: Vec<(u64, u64)> = found
        .lines()
        .filter_map(|l| {
            let n: Vec<u64> = l
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|x| x.parse().ok())
                .collect();
            if l.starts_with("Found tree root at") || l.starts_with("Well block") {
                Some((n[0], n[1]))
            } else {
                None
            }
        })
        .collect();
    assert!(
        !theirs.is_empty(),
        "btrfs-find-root found nothing:\n{found}"
    );
    for (bytenr, generation) in theirs {
        assert!(
            listed
                .lines()
                .any(|l| l == format!("1 {generation} 0 {bytenr}")
                    || l.starts_with(&format!("1 {generation} "))
                        && l.ends_with(&format!(" {bytenr}"))),
            "btrfs-find-root's {bytenr} (gen {generation}) is not listed:\n{listed}"
        );
    }
    // Mapped first: btrfs-progs cannot read the chunk tree once tree 5 is gone.
    let places: Vec<u64> = named.iter().flat_map(|b| physical(&img, *b)).collect();
    for p in places {
        zero(&img, p, NODESIZE);
    }
    let before = sha(&img);
    let plain = tmp.subdir("plain").unwrap();
    let o = Command::new(OLEO)
        .arg("restore")
        .arg(&img)
        .arg(&plain)
        .output()
        .unwrap();
    assert_ne!(o.status.code(), Some(101));
    assert!(
        !plain.join("f1").exists(),
        "tree 5 read without an older root?"
    );
    let dest = tmp.subdir("older").unwrap();
    let o = Command::new(OLEO)
        .args(["restore", "--older"])
        .arg(&img)
        .arg(&dest)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "restore --older: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(std::fs::read(dest.join("f1")).unwrap(), b"file 1\n");
    // An older root shows an older state: a file it holds is whole, or empty when the
    // root was written between its creation and its data (the kernel writes a changed
    // leaf out within a transaction too, and copies it again after).
    for i in 1..=10 {
        if let Ok(got) = std::fs::read(dest.join(format!("f{i}"))) {
            assert!(
                got.is_empty() || got == format!("file {i}\n").into_bytes(),
                "f{i}: {got:?}"
            );
        }
    }
    assert!(sha(&img) == before, "the image changed");
}
