//! `oleo inspect` on a kernel-made image with subvolumes, a nested one, read-only and
//! writable snapshots of a file changed (and renamed) between them and a received
//! subvolume: `subvolumes` against `btrfs subvolume list -a -u -q -R -g -c` and `show`,
//! `versions` against sha256sum through the kernel mount, `file` against stat and getfattr;
//! the image is never written. The damaged images of btrfs-progs' fsck set give an error
//! or output, never a panic or a hang.
//!
//! Needs root, loop devices, kernel btrfs, btrfs-progs, sha256sum and setfattr (a skip
//! elsewhere, a failure under CI=true).

use oleo_testkit::cmd::{btrfs_in, require_tools, sh_ok};
use oleo_testkit::{empty_image, KernelMount, TempDir};
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

fn oleo(args: &[&str]) -> Output {
    Command::new(OLEO).args(args).output().unwrap()
}

fn oleo_ok(args: &[&str]) -> String {
    let o = oleo(args);
    assert!(
        o.status.success(),
        "oleo {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn file_hash(p: &Path) -> String {
    let out = Command::new("sha256sum").arg(p).output().unwrap();
    assert!(out.status.success(), "sha256sum {}", p.display());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// A digest of a file's data and where it lies (holes skipped: restored dumps are
/// sparse and terabytes long), with its length.
fn sparse_digest(p: &Path) -> String {
    use sha2::{Digest, Sha256};
    use std::io::{Seek, SeekFrom};
    use std::os::fd::AsRawFd;
    let mut f = std::fs::File::open(p).unwrap();
    let len = f.metadata().unwrap().len();
    let mut h = Sha256::new();
    h.update(len.to_le_bytes());
    let mut off = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    while off < len {
        // SAFETY: lseek on an open descriptor.
        let data = unsafe { libc::lseek(f.as_raw_fd(), off as i64, libc::SEEK_DATA) };
        if data < 0 {
            break;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(f.as_raw_fd(), data, libc::SEEK_HOLE) };
        let (data, hole) = (data as u64, (hole.max(data) as u64).min(len));
        h.update(data.to_le_bytes());
        f.seek(SeekFrom::Start(data)).unwrap();
        let mut at = data;
        while at < hole {
            let n = ((hole - at) as usize).min(buf.len());
            f.read_exact(&mut buf[..n]).unwrap();
            h.update(&buf[..n]);
            at += n as u64;
        }
        off = hole.max(data + 1);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// `key value` pairs of one `btrfs subvolume list` line (`top level` as `top`).
fn list_fields(line: &str) -> HashMap<String, String> {
    let line = line.replace("top level", "top");
    let w: Vec<&str> = line.split_whitespace().collect();
    let mut m = HashMap::new();
    for pair in w.chunks(2) {
        if let [k, v] = pair {
            m.insert(k.to_string(), v.to_string());
        }
    }
    m
}

/// What the kernel shows, kept before unmounting.
struct Kernel {
    list: Vec<HashMap<String, String>>,
    readonly: HashMap<String, bool>,
    /// Subvolume path -> (path of the file in it, sha256).
    versions: HashMap<String, (String, String)>,
    size: u64,
}

fn make_image(dir: &TempDir) -> (PathBuf, Kernel) {
    let img = dir.join("k.img");
    empty_image(&img, 512, &[]).unwrap();
    let k = KernelMount::mount(&img, &dir.join("mnt"), &["rw", "noatime"]).unwrap();
    let m = k.path().to_path_buf();
    btrfs_in(&["subvolume", "create", "vol"], &m);
    sh_ok(
        &m,
        "set -e; mkdir vol/dir; printf one > vol/dir/f; mkdir vol/holder; \
         setfattr -n user.note -v hello vol/dir/f",
    );
    btrfs_in(&["subvolume", "create", "vol/holder/nested"], &m);
    btrfs_in(&["subvolume", "snapshot", "-r", "vol", "s1"], &m);
    sh_ok(&m, "set -e; head -c 200000 /dev/urandom > vol/dir/f; sync");
    btrfs_in(&["subvolume", "snapshot", "vol", "s2"], &m);
    sh_ok(
        &m,
        "set -e; mv s2/dir/f s2/dir/moved; printf three >> s2/dir/moved",
    );
    sh_ok(&m, "set -e; mkdir snaps; printf four >> vol/dir/f; sync");
    btrfs_in(&["subvolume", "snapshot", "-r", "vol", "snaps/s3"], &m);
    sh_ok(
        &m,
        "set -e; mkdir recv; btrfs send -q s1 | btrfs receive -q recv; sync",
    );
    let mut versions = HashMap::new();
    for (sub, f) in [
        ("vol", "dir/f"),
        ("s1", "dir/f"),
        ("s2", "dir/moved"),
        ("snaps/s3", "dir/f"),
    ] {
        versions.insert(
            sub.to_string(),
            (f.to_string(), file_hash(&m.join(sub).join(f))),
        );
    }
    sh_ok(&m, "sync");
    let listing = btrfs_in(
        &["subvolume", "list", "-a", "-u", "-q", "-R", "-g", "-c", "."],
        &m,
    );
    let list: Vec<_> = listing.lines().map(list_fields).collect();
    assert!(list.len() >= 6, "btrfs subvolume list: {listing}");
    let mut readonly = HashMap::new();
    for l in &list {
        let path = l["path"].trim_start_matches("<FS_TREE>/").to_string();
        let show = btrfs_in(&["subvolume", "show", &path], &m);
        let flags = show
            .lines()
            .find_map(|l| l.trim().strip_prefix("Flags:"))
            .unwrap_or_else(|| panic!("no Flags in btrfs subvolume show {path}: {show}"));
        let id = show
            .lines()
            .find_map(|l| l.trim().strip_prefix("Subvolume ID:"))
            .unwrap();
        assert_eq!(id.trim(), l["ID"], "btrfs subvolume show {path}");
        readonly.insert(path, flags.trim() == "readonly");
    }
    let md = std::fs::metadata(m.join("vol/dir/f")).unwrap();
    let kernel = Kernel {
        list,
        readonly,
        versions,
        size: md.len(),
    };
    drop(k);
    (img, kernel)
}

#[test]
fn inspect_matches_the_kernel_and_never_writes() {
    const WHAT: &str = "oleo inspect against btrfs subvolume list/show and sha256sum";
    if !require_tools(
        WHAT,
        &["btrfs", "mkfs.btrfs", "sha256sum", "setfattr"],
        "btrfs-progs coreutils attr",
    ) {
        return;
    }
    let dir = TempDir::new("inspect").unwrap();
    let (img, k) = make_image(&dir);
    let img_s = img.to_str().unwrap();
    let before = file_hash(&img);

    // subvolumes: every one the kernel lists, same fields; the top level besides.
    let text = oleo_ok(&["inspect", img_s, "subvolumes"]);
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header[0], "ID");
    let rows: HashMap<String, HashMap<&str, String>> = lines
        .map(|l| {
            let row: HashMap<&str, String> = header
                .iter()
                .copied()
                .zip(l.split_whitespace().map(String::from))
                .collect();
            (row["ID"].clone(), row)
        })
        .collect();
    assert_eq!(rows.len(), k.list.len() + 1, "{text}");
    assert_eq!(rows["5"]["PATH"], "/");
    for l in &k.list {
        let r = &rows[&l["ID"]];
        let path = l["path"].trim_start_matches("<FS_TREE>/");
        assert_eq!(r["PATH"], path);
        assert_eq!(r["GEN"], l["gen"], "{path}");
        assert_eq!(r["OTRANSID"], l["cgen"], "{path}");
        assert_eq!(r["PARENT"], l["top"], "{path}");
        assert_eq!(r["UUID"], l["uuid"], "{path}");
        assert_eq!(r["PARENT_UUID"], l["parent_uuid"], "{path}");
        assert_eq!(r["RECEIVED_UUID"], l["received_uuid"], "{path}");
        let ro = if k.readonly[path] { "ro" } else { "rw" };
        assert_eq!(r["FLAGS"], ro, "{path}");
    }
    let recv = rows.values().find(|r| r["PATH"] == "recv/s1").unwrap();
    assert_eq!(
        recv["RECEIVED_UUID"],
        rows.values().find(|r| r["PATH"] == "s1").unwrap()["UUID"]
    );
    let nested = rows
        .values()
        .find(|r| r["PATH"] == "vol/holder/nested")
        .unwrap();
    assert_eq!(
        nested["PARENT"],
        rows.values().find(|r| r["PATH"] == "vol").unwrap()["ID"]
    );
    let json = oleo_ok(&["inspect", img_s, "subvolumes", "--json"]);
    assert!(json.trim_start().starts_with('[') && json.trim_end().ends_with(']'));
    assert_eq!(json.matches("\"id\": ").count(), rows.len(), "{json}");

    // versions, asked from any member of the lineage: the four versions, no other.
    for start in ["vol/dir/f", "s2/dir/moved", "snaps/s3/dir/f"] {
        let text = oleo_ok(&["inspect", img_s, "versions", start]);
        let mut got = HashMap::new();
        for l in text.lines().skip(1) {
            let c: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(c.len(), 7, "{l}");
            got.insert(c[5].to_string(), (c[6].to_string(), c[4].to_string()));
        }
        assert_eq!(got, k.versions, "versions {start}:\n{text}");
    }
    let hashes: std::collections::HashSet<_> = k.versions.values().map(|v| &v.1).collect();
    // s3 was taken of vol after its last change; s1 and s2 hold older content.
    assert_eq!(hashes.len(), 3, "{:?}", k.versions);
    assert_eq!(k.versions["vol"].1, k.versions["snaps/s3"].1);
    let json = oleo_ok(&["inspect", img_s, "versions", "vol/dir/f", "--json"]);
    for (path, sha) in k.versions.values() {
        assert!(json.contains(&format!("\"sha256\": \"{sha}\"")), "{json}");
        assert!(json.contains(&format!("\"path\": \"{path}\"")), "{json}");
    }

    // file: attributes, the xattr, the extents.
    let text = oleo_ok(&["inspect", img_s, "file", "vol/dir/f"]);
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
            .unwrap_or_else(|| panic!("no {name}:\n{text}"))
    };
    assert_eq!(field("size "), k.size.to_string());
    assert_eq!(field("kind "), "file");
    assert_eq!(field("xattrs "), "1");
    assert!(text.contains("  5        user.note\n"), "{text}");
    let mtime = field("mtime ");
    assert!(mtime.ends_with('Z'), "{mtime}");
    assert!(field("extents ").parse::<u32>().unwrap() >= 1, "{text}");
    let json = oleo_ok(&["inspect", img_s, "file", "vol/dir/f", "--json"]);
    assert!(json.contains(&format!("\"size\": {}", k.size)), "{json}");
    assert!(
        json.contains("{\"name\": \"user.note\", \"size\": 5}"),
        "{json}"
    );

    let o = oleo(&["inspect", img_s, "versions", "vol/dir/none"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/vol/dir/none"));

    assert_eq!(file_hash(&img), before, "oleo inspect wrote to the image");
}

/// The fsck image set: $OLEO_FSCK_IMAGES, else beside the checkout (as hostile_images.rs).
fn fsck_images() -> PathBuf {
    if let Some(d) = std::env::var_os("OLEO_FSCK_IMAGES") {
        return PathBuf::from(d);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/test-images/btrfs-progs-fsck")
}

/// `oleo ARGS` with a time bound: its exit code (None: killed by a signal) and stdout.
fn bounded(args: &[&str], scratch: &Path) -> (Option<i32>, String) {
    let out_path = scratch.join("stdout");
    let out = std::fs::File::create(&out_path).unwrap();
    let mut child = Command::new(OLEO)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let st = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("oleo {args:?} hung (killed after 60 s)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut s = String::new();
    let _ = std::fs::File::open(&out_path)
        .unwrap()
        .read_to_string(&mut s);
    (st.code(), s)
}

/// A `btrfs-image` dump (most of the set) restored in place when `btrfs-image` is there.
fn restore_dump(img: &Path) {
    let mut magic = [0u8; 8];
    let dump = std::fs::File::open(img)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == 0xbd5c_25e2_7295_668b_u64.to_le_bytes();
    let raw = img.with_extension("raw");
    if dump
        && Command::new("btrfs-image")
            .arg("-r")
            .arg(img)
            .arg(&raw)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    {
        std::fs::rename(&raw, img).unwrap();
    }
}

/// Up to 6 regular files' paths from the top level, found with the library (errors skip).
fn some_files(img: &Path) -> Vec<String> {
    let opts = oleo::OpenOptions {
        read_only: true,
        subvolid: Some(5),
        ..oleo::OpenOptions::default()
    };
    let Ok(fs) = oleo::Filesystem::open(img, opts) else {
        return Vec::new();
    };
    let mut files = Vec::new();
    let mut dirs = vec![(fs.root(), String::new())];
    let mut seen = 0;
    while let Some((dir, path)) = dirs.pop() {
        seen += 1;
        if seen > 50 || files.len() >= 6 {
            break;
        }
        let _ = fs.readdir(dir, 0, &mut |e| {
            let name = String::from_utf8_lossy(&e.name).into_owned();
            if name == "." || name == ".." || name.contains(char::is_whitespace) {
                return true;
            }
            let p = format!("{path}/{name}");
            match e.kind {
                oleo::FileKind::File => files.push(p),
                oleo::FileKind::Dir if path.matches('/').count() < 3 => dirs.push((e.id, p)),
                _ => {}
            }
            files.len() < 6
        });
    }
    files
}

#[test]
fn damaged_images_never_panic_or_hang() {
    let dir = fsck_images();
    let mut srcs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .flat_map(|e| std::fs::read_dir(e.path()).into_iter().flatten())
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let n = p.to_string_lossy();
            n.ends_with(".img") || n.ends_with(".img.xz") || n.ends_with(".raw.xz")
        })
        .collect();
    srcs.sort();
    if srcs.is_empty() || Command::new("xz").arg("--version").output().is_err() {
        let msg = format!("no images under {} or no xz", dir.display());
        assert!(
            !oleo_testkit::is_ci(),
            "{msg} (CI=true: they must be present)"
        );
        eprintln!("SKIP: oleo inspect on damaged images: {msg}");
        return;
    }
    eprintln!("{} images from {}", srcs.len(), dir.display());
    let scratch = TempDir::new("inspect-damaged").unwrap();
    let (mut opened, mut probed) = (0, 0);
    for (i, src) in srcs.iter().enumerate() {
        let img = scratch.join(format!("{i}.img"));
        if src.to_string_lossy().ends_with(".xz") {
            let f = std::fs::File::create(&img).unwrap();
            let st = Command::new("xz")
                .arg("-dc")
                .arg(src)
                .stdout(f)
                .status()
                .unwrap();
            assert!(st.success(), "xz -dc {}", src.display());
        } else {
            std::fs::copy(src, &img).unwrap();
        }
        restore_dump(&img);
        let before = sparse_digest(&img);
        let s = img.to_str().unwrap();
        let (code, out) = bounded(&["inspect", s, "subvolumes"], scratch.path());
        assert!(
            matches!(code, Some(0) | Some(1)),
            "{}: inspect subvolumes exited {code:?}",
            src.display()
        );
        if code == Some(0) {
            opened += 1;
        }
        // Every subvolume root listed: its versions and its attributes.
        let paths: Vec<String> = out
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().nth(10).map(String::from))
            .filter(|p| !p.starts_with('<'))
            .collect();
        let files = some_files(&img);
        probed += files.len();
        for p in paths.iter().take(4).chain(&files) {
            for verb in ["versions", "file"] {
                let (code, _) = bounded(&["inspect", s, verb, p], scratch.path());
                assert!(
                    matches!(code, Some(0) | Some(1)),
                    "{}: inspect {verb} {p} exited {code:?}",
                    src.display()
                );
            }
        }
        assert_eq!(
            sparse_digest(&img),
            before,
            "{}: image written",
            src.display()
        );
    }
    eprintln!("{opened} opened, {probed} files inspected");
    assert!(opened > 0, "no damaged image opened at all");
}
