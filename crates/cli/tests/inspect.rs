//! `oleo inspect` on a kernel-made image with subvolumes, a nested one, read-only and
//! writable snapshots of a file changed (and renamed) between them and a received
//! subvolume: `subvolumes` against `btrfs subvolume list -a -u -q -R -g -c` and `show`,
//! `versions` against sha256sum through the kernel mount, `file` against stat and getfattr;
//! the image is never written. `deleted` and `undelete` on files the kernel removed: found
//! by name and size, copied out byte for byte, and never claimed verified once their space
//! holds other data. The damaged images of btrfs-progs' fsck set give an error or output,
//! never a panic or a hang.
//!
//! Needs root, loop devices, kernel btrfs, btrfs-progs, sha256sum and setfattr (a skip
//! elsewhere, a failure under CI=true).

use oleo_testkit::cmd::{btrfs_in, require_tools, sh_ok};
use oleo_testkit::damage::{physical_copies, super_field, write_at};
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
            assert_eq!(c.len(), 8, "{l}");
            // Rows of older root trees show only content no current row shows.
            if c[6] != "current" {
                assert!(!k.versions.values().any(|v| v.1 == c[4]), "{text}");
                continue;
            }
            got.insert(c[5].to_string(), (c[7].to_string(), c[4].to_string()));
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
    let dir = oleo_testkit::damage::fsck_image_dir();
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
        let (code, _) = bounded(&["inspect", s, "deleted"], scratch.path());
        assert!(
            matches!(code, Some(0) | Some(1)),
            "{}: inspect deleted exited {code:?}",
            src.display()
        );
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

/// `oleo ARGS` that must succeed and leave `img` as it was.
fn oleo_ro(img: &Path, args: &[&str]) -> String {
    let before = file_hash(img);
    let out = oleo_ok(args);
    assert_eq!(file_hash(img), before, "oleo {args:?} wrote to the image");
    out
}

/// `oleo inspect IMG undelete INO DEST`, which must succeed and leave the image as it was.
fn undelete(img: &Path, ino: &str, dest: &str) -> String {
    oleo_ro(
        img,
        &["inspect", img.to_str().unwrap(), "undelete", ino, dest],
    )
}

/// The raw value of `"name": ` in one line of `deleted --json` (strings unquoted).
fn jfield<'a>(line: &'a str, name: &str) -> &'a str {
    let at = line
        .find(&format!("\"{name}\": "))
        .unwrap_or_else(|| panic!("no {name} in {line}"))
        + name.len()
        + 4;
    let rest = &line[at..];
    match rest.strip_prefix('"') {
        Some(r) => &r[..r.find('"').unwrap()],
        None => &rest[..rest.find([',', '}']).unwrap()],
    }
}

/// The `deleted --json` line of the inode with best-known path `path`, if listed.
fn deleted_line<'a>(json: &'a str, path: &str) -> Option<&'a str> {
    json.lines()
        .filter(|l| l.trim_start().starts_with("{\"status\": \"deleted\""))
        .find(|l| jfield(l, "path") == path)
}

/// The files the test removes, by path in the image.
const REMOVED: [&str; 4] = ["/small", "/big", "/sub/deeper/nested", "/z/comp"];

#[test]
fn deleted_files_are_found_and_copied_out() {
    const WHAT: &str = "oleo inspect deleted/undelete on files the kernel removed";
    if !require_tools(
        WHAT,
        &[
            "btrfs",
            "mkfs.btrfs",
            "sha256sum",
            "fallocate",
            "df",
            "setfattr",
        ],
        "btrfs-progs coreutils util-linux attr",
    ) {
        return;
    }
    let dir = TempDir::new("undelete").unwrap();
    let img = dir.join("u.img");
    empty_image(&img, 512, &[]).unwrap();
    // nodiscard: a discard on a loop device punches the freed extents out of the file.
    let k = KernelMount::mount(&img, &dir.join("mnt"), &["rw", "noatime", "nodiscard"]).unwrap();
    let m = k.path().to_path_buf();
    // An inline file, one of three extents (three commits), one compressed, one two
    // directories down; `keeper` stays, so the data block group is never emptied. z/comp is
    // the newest inode: its number comes back after a remount.
    sh_ok(
        &m,
        "set -e; head -c 1000000 /dev/urandom > keeper; printf 'a small inline file\\n' > small; \
         head -c 1048576 /dev/urandom > big; sync; head -c 1048576 /dev/urandom >> big; sync; \
         head -c 500000 /dev/urandom >> big; mkdir -p sub/deeper; \
         head -c 300000 /dev/urandom > sub/deeper/nested; mkdir z; \
         btrfs property set z compression zstd; yes 'a compressible line' | head -c 1000000 > z/comp; \
         setfattr -n user.note -v kept small; ln -s some/target lnk; sync",
    );
    let mut want = HashMap::new();
    for p in REMOVED {
        let bytes = std::fs::read(m.join(&p[1..])).unwrap();
        want.insert(p, bytes);
    }
    sh_ok(&m, "set -e; rm -r small big sub z/comp lnk; sync");
    k.unmount().unwrap();
    let s = img.to_str().unwrap();

    let json = oleo_ro(&img, &["inspect", s, "deleted", "--json"]);
    let text = oleo_ro(&img, &["inspect", s, "deleted"]);
    assert!(
        text.lines().skip(1).all(|l| l.starts_with("deleted ")),
        "{text}"
    );
    let out = dir.join("out");
    std::fs::create_dir(&out).unwrap();
    for p in REMOVED {
        let l = deleted_line(&json, p).unwrap_or_else(|| panic!("{p} not listed:\n{json}"));
        assert_eq!(jfield(l, "size"), want[p].len().to_string(), "{l}");
        assert_eq!(jfield(l, "kind"), "file", "{l}");
        assert_eq!(jfield(l, "name"), p.rsplit('/').next().unwrap(), "{l}");
        assert_eq!(jfield(l, "data"), "verified", "{l}");
        let dest = out.join(p.rsplit('/').next().unwrap());
        let ino = jfield(l, "inode");
        undelete(&img, ino, dest.to_str().unwrap());
        assert!(
            std::fs::read(&dest).unwrap() == want[p],
            "{p}: bytes differ"
        );
    }
    // The deleted directories are listed, under their paths.
    for d in ["/sub", "/sub/deeper"] {
        let l = deleted_line(&json, d).unwrap_or_else(|| panic!("{d} not listed:\n{json}"));
        assert_eq!(jfield(l, "kind"), "dir", "{l}");
    }
    assert!(
        deleted_line(&json, "/keeper").is_none(),
        "a live file listed:\n{json}"
    );
    let l = deleted_line(&json, "/small").unwrap();
    assert!(l.contains("\"xattrs\": [\"user.note\"]"), "{l}");
    let l = deleted_line(&json, "/lnk").unwrap_or_else(|| panic!("/lnk not listed:\n{json}"));
    assert_eq!(jfield(l, "kind"), "symlink", "{l}");
    let dest = out.join("lnk");
    undelete(&img, jfield(l, "inode"), dest.to_str().unwrap());
    assert_eq!(std::fs::read_link(&dest).unwrap(), Path::new("some/target"));
    // Never over an existing file.
    let l = deleted_line(&json, "/small").unwrap();
    let o = oleo(&[
        "inspect",
        s,
        "undelete",
        jfield(l, "inode"),
        out.join("small").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(std::fs::read(out.join("small")).unwrap() == want["/small"]);
    // --all: each file in its own directory.
    let all = dir.join("all");
    let text = undelete(&img, "--all", all.to_str().unwrap());
    assert_eq!(text.lines().count(), REMOVED.len() + 1, "{text}");
    for p in REMOVED {
        let l = deleted_line(&json, p).unwrap();
        let f = all
            .join("5")
            .join(format!(
                "{}.{}",
                jfield(l, "inode"),
                jfield(l, "generation")
            ))
            .join(p.rsplit('/').next().unwrap());
        assert!(std::fs::read(&f).unwrap() == want[p], "{}", f.display());
    }

    // The kernel hands z/comp's inode number to the next new file after a mount: the
    // deleted one is still told apart (by generation), the new one is live.
    let k = KernelMount::mount(&img, &dir.join("mnt"), &["rw", "noatime", "nodiscard"]).unwrap();
    sh_ok(k.path(), "set -e; printf new > z/new; sync");
    let new_ino = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(k.path().join("z/new")).unwrap().ino()
    };
    k.unmount().unwrap();
    let old = deleted_line(&json, "/z/comp").unwrap();
    assert_eq!(
        jfield(old, "inode"),
        new_ino.to_string(),
        "not reused: {old}"
    );
    let json = oleo_ro(&img, &["inspect", s, "deleted", "--json"]);
    assert!(deleted_line(&json, "/z/new").is_none(), "{json}");
    let l = deleted_line(&json, "/z/comp").unwrap_or_else(|| panic!("{json}"));
    assert_eq!(jfield(l, "generation"), jfield(old, "generation"));
    let dest = dir.join("comp-again");
    let said = undelete(&img, &new_ino.to_string(), dest.to_str().unwrap());
    // That session's commits may have reused the leaf of some of its extent items: then
    // it must not say verified.
    assert!(
        jfield(l, "data") != "verified" || std::fs::read(&dest).unwrap() == want["/z/comp"],
        "{said}\n{json}"
    );
    eprintln!("z/comp after its number was reused: {}", jfield(l, "data"));

    // Then the free space is filled: what is listed as verified must still be the bytes.
    let k = KernelMount::mount(&img, &dir.join("mnt"), &["rw", "noatime", "nodiscard"]).unwrap();
    sh_ok(
        k.path(),
        "set -e; avail=$(df -B1 --output=avail . | tail -1); \
         for slack in 1 2 4 8 16 32; do \
           fallocate -l $((avail - slack * 1048576)) fill && break; done; \
         test -e fill; sync",
    );
    k.unmount().unwrap();
    let json = oleo_ro(&img, &["inspect", s, "deleted", "--json"]);
    let out = dir.join("out2");
    std::fs::create_dir(&out).unwrap();
    let mut states = Vec::new();
    for p in REMOVED {
        let Some(l) = deleted_line(&json, p) else {
            states.push((p, "gone".to_string()));
            continue;
        };
        let state = jfield(l, "data").to_string();
        let dest = out.join(p.rsplit('/').next().unwrap());
        undelete(&img, jfield(l, "inode"), dest.to_str().unwrap());
        if state == "verified" {
            assert!(
                std::fs::read(&dest).unwrap() == want[p],
                "{p}: verified, bytes differ"
            );
        }
        states.push((p, state));
    }
    eprintln!("after the fill: {states:?}");
    assert!(
        states.iter().any(|(_, s)| s != "verified"),
        "the fill reused nothing: {states:?}"
    );
}

/// A file overwritten in the last commit: `versions` shows its bytes now, and the bytes
/// before from the backup root of the commit before (kernel-made image; hashes from the
/// kernel's mount); `--older` finds them too. The image is never written.
#[test]
fn versions_in_older_roots() {
    if !require_tools(
        "oleo inspect versions in older roots",
        &["btrfs", "mkfs.btrfs", "sha256sum"],
        "btrfs-progs coreutils",
    ) {
        return;
    }
    let dir = TempDir::new("versions-older").unwrap();
    let img = dir.join("v.img");
    empty_image(&img, 256, &[]).unwrap();
    let k = KernelMount::mount(&img, &dir.join("mnt"), &["rw", "noatime"]).unwrap();
    let m = k.path().to_path_buf();
    sh_ok(&m, "set -e; head -c 100000 /dev/urandom > f; sync");
    let old = file_hash(&m.join("f"));
    sh_ok(&m, "set -e; head -c 70000 /dev/urandom > f; sync");
    let new = file_hash(&m.join("f"));
    k.unmount().unwrap();
    let s = img.to_str().unwrap();
    for extra in [&[][..], &["--older"][..]] {
        let before = file_hash(&img);
        let mut args = vec!["inspect", s, "versions", "f", "--json"];
        args.extend_from_slice(extra);
        let json = oleo_ok(&args);
        assert_eq!(file_hash(&img), before, "oleo {args:?} wrote to the image");
        let row = |sha: &str| {
            json.lines()
                .find(|l| l.contains(&format!("\"sha256\": \"{sha}\"")))
                .unwrap_or_else(|| panic!("{extra:?}: no version {sha}:\n{json}"))
                .to_string()
        };
        assert!(row(&new).contains("\"root\": \"current\""), "{json}");
        let o = row(&old);
        assert!(!o.contains("\"root\": \"current\""), "{json}");
        assert!(o.contains("\"size\": 100000"), "{o}");
    }
    // With the root tree's root block lost, inspect opens from a backup root by itself.
    let root = super_field(&img, "root").unwrap();
    for p in physical_copies(&img, root).unwrap() {
        write_at(&img, p, &[0u8; 16384]).unwrap();
    }
    let before = file_hash(&img);
    let o = oleo(&["inspect", s, "versions", "f", "--json"]);
    assert_eq!(file_hash(&img), before);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("opened with rescue=all,usebackuproot"),
        "{err}"
    );
    assert!(out.contains(&old), "{out}");
}
