//! `oleo restore` against `btrfs restore`: a kernel-made image, then copies of it damaged at
//! known places (a directory leaf in both DUP copies, one copy of a leaf, the csum leaf,
//! the primary superblock, the root tree's root). Each is restored by both tools; oleo must
//! get at least as many files right, the table is printed, and the image never changes.
//! Also a dry run over every image of btrfs-progs' fsck tests: no panic, no hang.
//!
//! Needs root, loop devices, kernel btrfs, btrfs-progs and setfattr (a skip elsewhere, a
//! failure under CI=true).

use oleo_testkit::cmd::{require_tools, run_with_timeout, sh_ok};
use oleo_testkit::damage::{
    files_under, fsck_image_dir, image_hash, leaf_holding, leaves_of, physical_copies,
    set_super_u64, shorten_last_item, super_copies, super_field, write_at, zero_block,
};
use oleo_testkit::{require_fuse_mount, KernelMount, OleoMount, TempDir};
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
head -c 48000000 /dev/urandom > csummed
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
mkfifo fifo
mknod null c 1 3
"#;

fn tools() -> bool {
    require_fuse_mount("oleo restore vs btrfs restore")
        && require_tools(
            "oleo restore vs btrfs restore",
            &["mkfs.btrfs", "btrfs", "setfattr", "getfattr"],
            "btrfs-progs attr",
        )
}

/// The options of the rescue mount each image also gets: every rescue option, and the
/// first superblock copy where the primary is gone (what oleo's refusal suggests).
fn rescue_opts(img: &Path) -> Vec<&'static str> {
    let mut o = vec!["rescue=all,usebackuproot"];
    let mut magic = [0u8; 8];
    let primary = std::fs::File::open(img).and_then(|f| f.read_exact_at(&mut magic, 65536 + 64));
    if primary.is_err() || &magic != b"_BHRfS_M" {
        o.push("sb=1");
    }
    o
}

/// What a rescue mount of `img` shows: each file reachable by listing, with a hash of its
/// bytes (None where the read failed); at most `cap` files. The image must not change.
fn through_rescue_mount(img: &Path, mnt: &Path, cap: usize) -> BTreeMap<PathBuf, Option<u64>> {
    use std::hash::{Hash, Hasher};
    let before = image_hash(img).unwrap();
    let opts = rescue_opts(img);
    let Ok(m) =
        OleoMount::mount_with_timeout(Path::new(OLEO), img, mnt, &opts, Duration::from_secs(30))
    else {
        return BTreeMap::new();
    };
    let _dog = m.watchdog(Duration::from_secs(60));
    let mut out = BTreeMap::new();
    for (p, d) in files_under(mnt).into_iter().take(cap) {
        out.insert(
            p,
            d.map(|d| {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                d.hash(&mut h);
                h.finish()
            }),
        );
    }
    m.unmount().unwrap();
    assert_eq!(
        image_hash(img).unwrap(),
        before,
        "{}: the rescue mount changed the image",
        img.display()
    );
    out
}

/// Every regular file's bytes, by path relative to `root`.
fn contents(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    files_under(root)
        .into_iter()
        .map(|(p, d)| (p, d.expect("a file of the kernel's mount reads")))
        .collect()
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
            let leaf = leaf_holding(img, "5", &dir_ino.to_string(), "DIR_INDEX").unwrap();
            zero_block(img, leaf, NODESIZE).unwrap();
        }),
    ));
    cases.push((
        "dir leaf, one copy",
        Box::new(move |img| {
            let leaf = leaf_holding(img, "5", &dir_ino.to_string(), "DIR_INDEX").unwrap();
            write_at(
                img,
                physical_copies(img, leaf).unwrap()[0],
                &[0u8; NODESIZE],
            )
            .unwrap();
        }),
    ));
    cases.push((
        "csum leaf",
        Box::new(|img| {
            let leaf = leaf_holding(img, "csum", "EXTENT_CSUM", "EXTENT_CSUM").unwrap();
            zero_block(img, leaf, NODESIZE).unwrap();
        }),
    ));
    cases.push((
        "primary superblock",
        Box::new(|img| write_at(img, 65536, &[0u8; 4096]).unwrap()),
    ));
    cases.push((
        "root tree root",
        Box::new(|img| {
            zero_block(img, super_field(img, "root").unwrap(), NODESIZE).unwrap();
        }),
    ));

    cases.push((
        "chunk tree leaf",
        Box::new(|img| {
            let leaf = leaf_holding(img, "chunk", "FIRST_CHUNK_TREE", "CHUNK_ITEM").unwrap();
            zero_block(img, leaf, NODESIZE).unwrap();
        }),
    ));
    cases.push((
        "half the csum leaves",
        Box::new(|img| {
            let leaves = leaves_of(img, "csum").unwrap();
            assert!(
                leaves.len() >= 2,
                "the csum tree has {} leaves",
                leaves.len()
            );
            for &l in leaves.iter().step_by(2) {
                zero_block(img, l, NODESIZE).unwrap();
            }
        }),
    ));

    let mut table = Vec::new();
    for (i, (name, damage)) in cases.iter().enumerate() {
        let img = tmp.join(format!("case{i}.img"));
        std::fs::copy(&clean, &img).unwrap();
        damage(&img);
        let before = image_hash(&img).unwrap();
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
            image_hash(&img).unwrap() == before,
            "{name}: oleo restore changed the image"
        );
        let shown = through_rescue_mount(&img, &tmp.subdir("rescue-mnt").unwrap(), usize::MAX);
        let n_m = orig
            .iter()
            .filter(|(p, want)| {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                want.hash(&mut h);
                shown.get(*p) == Some(&Some(h.finish()))
            })
            .count();
        // Leaves lost on every copy are reported; one good copy is enough.
        let stdout = String::from_utf8_lossy(&o.stdout);
        let none_skipped = stdout.contains("skipped tree blocks: 0\n");
        assert_eq!(
            none_skipped,
            ![1, 3, 5, 6, 7].contains(&i),
            "{name}: {stdout}"
        );
        let (n_o, n_b) = (correct(&orig, &dest_o), correct(&orig, &dest_b));
        table.push((name.to_string(), n_o, n_m, n_b));
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
            // FIFOs and device nodes are made again (this test runs as root).
            use std::os::unix::fs::FileTypeExt;
            let fifo = std::fs::symlink_metadata(dest_o.join("fifo")).unwrap();
            assert!(fifo.file_type().is_fifo(), "fifo: {fifo:?}");
            let null = std::fs::symlink_metadata(dest_o.join("null")).unwrap();
            assert!(null.file_type().is_char_device(), "null: {null:?}");
            assert_eq!((libc::major(null.rdev()), libc::minor(null.rdev())), (1, 3));
            assert!(stdout.contains(" 2 special files"), "{stdout}");
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
        "{:<24} {:>6} {:>6} {:>6}  (files with correct contents of {})",
        "image",
        "oleo restore",
        "oleo rescue mount",
        "btrfs restore",
        orig.len()
    );
    for (name, o, m, b) in &table {
        println!("{name:<24} {o:>6} {m:>6} {b:>6}");
    }
    for (name, o, m, b) in &table {
        assert!(
            o >= b && m >= b,
            "{name}: oleo restored {o} files right, its rescue mount showed {m}, btrfs restore {b}"
        );
    }
    // Damage that leaves a good copy or only csums behind loses nothing.
    for (name, o, _, _) in &table[2..] {
        assert_eq!(*o, orig.len(), "{name}: every file expected");
    }
}

/// Damage only a sanity check sees, in structures whose checksums are good (issue 40):
/// a superblock field (generation zeroed in the primary, then in every copy) and a csum
/// item whose size is no multiple of the checksum size. `btrfs restore` restores every
/// file of such images; oleo must restore each of them byte-identical too, say on stderr
/// which superblock field it went around, and report the data it could not verify. Its
/// rescue mount shows them all too. The image never changes.
#[test]
fn restore_past_a_bad_superblock_field_or_csum_item_vs_btrfs_restore() {
    if !tools() {
        return;
    }
    let tmp = TempDir::new("restore-insane").unwrap();
    let clean = tmp.join("clean.img");
    sh_ok(
        tmp.path(),
        "truncate -s 256M clean.img && mkfs.btrfs -q -m dup -d single clean.img",
    );
    let mnt = tmp.subdir("mnt").unwrap();
    let m = KernelMount::mount(&clean, &mnt, &["rw", "noatime"]).unwrap();
    sh_ok(
        &mnt,
        "set -e; head -c 5000000 /dev/urandom > big; sync; head -c 300000 /dev/urandom > mid; \
         mkdir d; printf small > d/s; yes 'a line' | head -c 200000 > d/t",
    );
    let orig = contents(&mnt);
    m.unmount().unwrap();

    // (name, damage, what oleo must say on stderr or in its summary)
    let cases: Vec<(&str, Damage, &str)> = vec![
        (
            "primary superblock generation 0",
            Box::new(|img| set_super_u64(img, &[0], 72, 0).unwrap()),
            "superblock copy 0 (at 65536) fails its checks: field generation is 0",
        ),
        (
            "every superblock copy's generation 0",
            Box::new(|img| set_super_u64(img, &super_copies(img).unwrap(), 72, 0).unwrap()),
            "mended from its backup roots: generation",
        ),
        (
            "csum item size no multiple of the checksum size",
            Box::new(|img| {
                let leaf = leaf_holding(img, "csum", "EXTENT_CSUM", "EXTENT_CSUM").unwrap();
                let size = shorten_last_item(img, leaf, NODESIZE).unwrap();
                assert_ne!(size % 4, 0);
            }),
            "copied unverified",
        ),
    ];
    for (i, (name, damage, says)) in cases.iter().enumerate() {
        let img = tmp.join(format!("case{i}.img"));
        std::fs::copy(&clean, &img).unwrap();
        damage(&img);
        let before = image_hash(&img).unwrap();
        let dest_b = tmp.subdir(&format!("btrfs{i}")).unwrap();
        let dest_o = tmp.join(format!("oleo{i}"));
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
        let (stdout, stderr) = (
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
        );
        assert_ne!(
            o.status.code(),
            Some(101),
            "{name}: oleo panicked: {stderr}"
        );
        assert_eq!(
            image_hash(&img).unwrap(),
            before,
            "{name}: the image changed"
        );
        let theirs: Vec<&PathBuf> = orig
            .iter()
            .filter(|(p, d)| std::fs::read(dest_b.join(p)).is_ok_and(|b| &b == *d))
            .map(|(p, _)| p)
            .collect();
        assert_eq!(
            theirs.len(),
            orig.len(),
            "{name}: btrfs restore restores every file of such an image"
        );
        for p in &theirs {
            assert!(
                std::fs::read(dest_o.join(p)).is_ok_and(|b| b == orig[*p]),
                "{name}: {} not restored byte-identical (btrfs restore's is):\n{stdout}\n{stderr}",
                p.display()
            );
        }
        assert!(
            stderr.contains(says) || stdout.contains(says),
            "{name}: oleo does not say {says:?}:\n{stdout}\n{stderr}"
        );
        if name.starts_with("csum") {
            assert!(
                stdout.contains("data copied whose checksums could not be read")
                    && stdout.contains("  unverified: /"),
                "{name}: the unverified files are not reported: {stdout}"
            );
        }
        let shown = through_rescue_mount(&img, &tmp.subdir("rescue-mnt").unwrap(), usize::MAX);
        for p in &theirs {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            orig[*p].hash(&mut h);
            assert_eq!(
                shown.get(*p),
                Some(&Some(h.finish())),
                "{name}: the rescue mount does not show {}",
                p.display()
            );
        }
        println!("{name}: oleo and btrfs restore: all {} files", orig.len());
    }
}

/// The fsck test image files: (case/file name, path), sorted.
fn fsck_sources() -> Vec<(String, PathBuf)> {
    let root = fsck_image_dir();
    let mut out = Vec::new();
    let Ok(cases) = std::fs::read_dir(&root) else {
        return out;
    };
    for case in cases.flatten() {
        let Ok(files) = std::fs::read_dir(case.path()) else {
            continue;
        };
        for f in files.flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            if [".img", ".xz"].iter().any(|e| name.ends_with(e)) {
                let case = case.file_name().to_string_lossy().into_owned();
                out.push((format!("{case}/{name}"), f.path()));
            }
        }
    }
    out.sort();
    out
}

/// btrfs-image's dump magic: such a file holds the metadata only, and `btrfs-image -r`
/// makes an image of it (its data blocks zeroed).
const DUMP_MAGIC: [u8; 8] = [0x8b, 0x66, 0x95, 0x72, 0xe2, 0x25, 0x5c, 0xbd];

/// Unpacks one fsck test image file into the empty directory `work` (decompressed, a
/// btrfs-image dump restored); returns the images made. Nothing is written next to `src`.
fn unpack(src: &Path, work: &Path) -> Vec<PathBuf> {
    std::fs::create_dir_all(work).unwrap();
    let name = src.file_name().unwrap().to_string_lossy().into_owned();
    let image = work.join("image");
    let ok = if name.ends_with(".tar.xz") {
        Command::new("tar")
            .arg("xJf")
            .arg(src)
            .arg("-C")
            .arg(work)
            .status()
    } else if name.ends_with(".xz") {
        std::fs::File::create(&image)
            .and_then(|f| Command::new("xz").arg("-dc").arg(src).stdout(f).status())
    } else {
        std::fs::copy(src, &image).map(|_| std::process::ExitStatus::default())
    };
    if !ok.is_ok_and(|s| s.success()) {
        return Vec::new();
    }
    let mut out = Vec::new();
    for e in std::fs::read_dir(work).unwrap().flatten() {
        let p = e.path();
        let mut magic = [0u8; 8];
        let is_dump = std::fs::File::open(&p).is_ok_and(|f| f.read_exact_at(&mut magic, 0).is_ok())
            && magic == DUMP_MAGIC;
        if is_dump {
            let raw = p.with_extension("restored");
            let st = Command::new("btrfs-image")
                .arg("-r")
                .arg(&p)
                .arg(&raw)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
            let _ = std::fs::remove_file(&p);
            if st.is_ok_and(|s| s.success()) {
                out.push(raw);
            }
        } else if e.file_type().is_ok_and(|t| t.is_file()) {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// The fsck test images, unpacked into `dir`.
fn fsck_images(dir: &Path) -> Vec<PathBuf> {
    fsck_sources()
        .iter()
        .enumerate()
        .flat_map(|(n, (_, src))| unpack(src, &dir.join(n.to_string())))
        .collect()
}

/// A hash of every regular file's bytes under `root`, by relative path (symlinks and
/// special files left out); at most `cap` files, for a tool caught in a directory loop.
fn file_hashes(root: &Path, cap: usize) -> BTreeMap<PathBuf, u64> {
    use std::hash::Hasher;
    use std::io::Read;
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    let mut buf = vec![0u8; 1 << 20];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            if out.len() >= cap {
                return out;
            }
            let Ok(t) = e.file_type() else { continue };
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                if let Ok(mut f) = std::fs::File::open(e.path()) {
                    while let Ok(n) = f.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        h.write(&buf[..n]);
                    }
                }
                let rel = e.path().strip_prefix(root).unwrap().to_path_buf();
                out.insert(rel, h.finish());
            }
        }
    }
    out
}

/// One image's row of the fsck-set table.
#[derive(Default, Clone)]
struct Row {
    image: String,
    /// Regular files (paths) each tool wrote.
    paths: (usize, usize),
    /// Distinct (file name, contents) among them: a file written again under other paths
    /// (a nested subvolume followed again through a snapshot's copy of its entry, a
    /// directory loop) counts once; a file btrfs restore cut short does not count.
    distinct: (usize, usize),
    /// Paths both wrote, and of those, the ones with equal contents.
    common: usize,
    agree: usize,
    /// Paths both wrote with other contents, where btrfs restore's file is a proper prefix
    /// of oleo's (it stopped early), and where it is not.
    btrfs_short: Vec<String>,
    other_diff: Vec<String>,
    /// btrfs restore's exit: a code, or "timeout".
    btrfs_exit: String,
    oleo_exit: String,
    /// Distinct files a rescue mount (`rescue=all,usebackuproot`) showed.
    mount_distinct: usize,
}

fn distinct(files: &BTreeMap<PathBuf, u64>) -> usize {
    files
        .iter()
        .map(|(p, h)| (p.file_name().map(|n| n.to_owned()), *h))
        .collect::<std::collections::BTreeSet<_>>()
        .len()
}

fn exit_of(r: std::io::Result<std::process::ExitStatus>) -> String {
    match r {
        Ok(st) => st.code().map_or_else(|| format!("{st}"), |c| c.to_string()),
        Err(_) => "timeout".into(),
    }
}

/// Restores one fsck image with both tools and compares what they wrote.
fn compare_one(image: &str, img: &Path, work: &Path) -> Row {
    let before = image_hash(img).unwrap();
    let (dest_b, dest_o) = (work.join("btrfs"), work.join("oleo"));
    std::fs::create_dir_all(&dest_b).unwrap();
    // All it can: snapshots, xattrs, symlinks, and on past errors. A directory loop keeps
    // it writing until the timeout: what it wrote by then counts.
    let b = run_with_timeout(
        Command::new("btrfs")
            .args(["restore", "-sxSi"])
            .arg(img)
            .arg(&dest_b),
        Duration::from_secs(15),
    );
    let o = run_with_timeout(
        Command::new(OLEO).arg("restore").arg(img).arg(&dest_o),
        Duration::from_secs(60),
    );
    assert!(
        image_hash(img).unwrap() == before,
        "{image}: the image changed"
    );
    let mnt = work.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let shown: BTreeMap<PathBuf, u64> = through_rescue_mount(img, &mnt, 20_000)
        .into_iter()
        .filter_map(|(p, h)| Some((p, h?)))
        .collect();
    let oleo_exit = exit_of(o);
    assert!(
        oleo_exit != "101" && oleo_exit != "timeout" && oleo_exit.parse::<i32>().is_ok(),
        "{image}: oleo restore ended with {oleo_exit}"
    );
    let cap = 20_000;
    let (hb, ho) = (file_hashes(&dest_b, cap), file_hashes(&dest_o, cap));
    let mut row = Row {
        image: image.to_string(),
        paths: (hb.len(), ho.len()),
        distinct: (distinct(&hb), distinct(&ho)),
        btrfs_exit: exit_of(b),
        oleo_exit,
        mount_distinct: distinct(&shown),
        ..Row::default()
    };
    for (p, h) in &hb {
        let Some(g) = ho.get(p) else { continue };
        row.common += 1;
        if g == h {
            row.agree += 1;
            continue;
        }
        let (bb, ob) = (
            std::fs::read(dest_b.join(p)).unwrap_or_default(),
            std::fs::read(dest_o.join(p)).unwrap_or_default(),
        );
        let name = p.display().to_string();
        if bb.len() < ob.len() && ob.starts_with(&bb) {
            row.btrfs_short.push(name);
        } else {
            row.other_diff.push(name);
        }
    }
    // A file btrfs restore left cut short (it stopped on an error, or was still writing
    // it at the timeout) is not one it restored.
    let mut whole_b = hb.clone();
    whole_b.retain(|p, _| !row.btrfs_short.contains(&p.display().to_string()));
    row.distinct.0 = distinct(&whole_b);
    let _ = std::fs::remove_dir_all(work);
    row
}

/// `oleo restore` against `btrfs restore` over every image of btrfs-progs' fsck tests
/// (btrfs-image dumps restored first: their data reads as zeros, the same for both tools).
/// There is no reference for these images, so the measure is what each tool wrote: per
/// image, the distinct files (name and contents) each restored, and for paths both wrote,
/// whether the contents agree. oleo must restore at least as many on every image and more
/// over the set; contents may differ only where btrfs restore's file is a cut-short prefix
/// of oleo's. The images never change.
#[test]
fn restore_fsck_images_vs_btrfs_restore() {
    if !require_tools(
        "oleo restore vs btrfs restore over the fsck images",
        &["xz", "tar", "btrfs-image", "btrfs"],
        "btrfs-progs xz-utils tar",
    ) {
        return;
    }
    let sources = fsck_sources();
    if sources.is_empty() {
        assert!(
            !oleo_testkit::env::is_ci(),
            "no fsck test images under /work/shared/test-images"
        );
        eprintln!("skipping: no fsck test images");
        return;
    }
    let tmp = TempDir::new("restore-fsck-cmp").unwrap();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let rows = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((name, src)) = sources.get(n) else {
                    break;
                };
                let work = tmp.join(format!("img{n}"));
                for (m, img) in unpack(src, &work).iter().enumerate() {
                    let label = if m == 0 {
                        name.clone()
                    } else {
                        format!("{name}#{m}")
                    };
                    let row = compare_one(&label, img, &work.join(format!("out{m}")));
                    rows.lock().unwrap().push(row);
                }
                let _ = std::fs::remove_dir_all(&work);
            });
        }
    });
    let mut rows = rows.into_inner().unwrap();
    rows.sort_by(|a, b| a.image.cmp(&b.image));
    eprintln!(
        "{:<72} {:>7} {:>7} {:>6} {:>6} {:>6} {:>7} {:>5} {:>5} {:>7} {:>6}",
        "image",
        "b.paths",
        "o.paths",
        "b.dist",
        "o.dist",
        "m.dist",
        "common",
        "agree",
        "b.cut",
        "b.exit",
        "o.exit"
    );
    let (mut tb, mut to, mut tm) = (0, 0, 0);
    for r in &rows {
        eprintln!(
            "{:<72} {:>7} {:>7} {:>6} {:>6} {:>6} {:>7} {:>5} {:>5} {:>7} {:>6}",
            r.image,
            r.paths.0,
            r.paths.1,
            r.distinct.0,
            r.distinct.1,
            r.mount_distinct,
            r.common,
            r.agree,
            r.btrfs_short.len(),
            r.btrfs_exit,
            r.oleo_exit
        );
        tb += r.distinct.0;
        to += r.distinct.1;
        tm += r.mount_distinct;
    }
    eprintln!(
        "{} images; distinct files restored: btrfs restore {tb}, oleo restore {to}; shown by oleo's rescue mount {tm}",
        rows.len()
    );
    for r in &rows {
        assert!(
            r.distinct.1 >= r.distinct.0,
            "{}: oleo restored {} distinct files, btrfs restore {}",
            r.image,
            r.distinct.1,
            r.distinct.0
        );
        assert!(
            r.other_diff.is_empty(),
            "{}: contents differ from btrfs restore's: {:?}",
            r.image,
            r.other_diff
        );
    }
    assert!(to > tb, "oleo {to} distinct files, btrfs restore {tb}");
    // The rescue mount shows at least what btrfs restore writes, image by image.
    assert!(
        tm > tb,
        "the rescue mount showed {tm} distinct files, btrfs restore {tb}"
    );
    for r in &rows {
        assert!(
            r.mount_distinct >= r.distinct.0,
            "{}: the rescue mount showed {} distinct files, btrfs restore {}",
            r.image,
            r.mount_distinct,
            r.distinct.0
        );
    }
    assert!(rows.len() >= 75, "only {} images compared", rows.len());
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
        let before = image_hash(img).unwrap();
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
            assert!(
                image_hash(img).unwrap() == before,
                "{}: image changed",
                img.display()
            );
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
    let places: Vec<u64> = named
        .iter()
        .flat_map(|b| physical_copies(&img, *b).unwrap())
        .collect();
    for p in places {
        write_at(&img, p, &[0u8; NODESIZE]).unwrap();
    }
    let before = image_hash(&img).unwrap();
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
    assert!(image_hash(&img).unwrap() == before, "the image changed");
}
