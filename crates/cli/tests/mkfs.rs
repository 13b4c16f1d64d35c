//! `oleo mkfs` against the reference tools, one test per option set:
//! 1. `oleo mkfs` on a sparse image; `oleo dump-super` and `oleo::Filesystem::open` read it;
//! 2. `btrfs check --readonly` must be clean and `btrfs inspect-internal dump-super` must
//!    show what was asked for (needs btrfs-progs);
//! 3. the kernel mounts it read-write, writes files, a hole and a subvolume, unmounts;
//!    `btrfs check` is clean again and oleo reads back exactly what the kernel wrote
//!    (needs root, loop devices, kernel btrfs).
//!
//! Missing tools print `SKIP: ...` (a failure under `CI=true`). A newer btrfs-progs in
//! /opt/btrfs-progs-bpo (see oleo-testkit) is used as a second checker when present.

use oleo::{Filesystem, InodeId, OpenOptions};
use oleo_testkit::env::{find_in_path, skip};
use oleo_testkit::ops::pattern;
use oleo_testkit::{require_root, KernelMount, TempDir};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");
const NEWER_PROGS: &str = "/opt/btrfs-progs-bpo/bin/btrfs";
const MIB: u64 = 1 << 20;

/// One option set and what the superblock must say about it.
struct Case {
    name: &'static str,
    args: &'static [&'static str],
    size: u64,
    nodesize: u32,
    csum_type: u16,
    incompat_on: u64,
    incompat_off: u64,
    compat_ro: u64,
    label: &'static str,
    /// Pass `--uuid` (a fresh one per run, so parallel runs never share an fsid).
    set_uuid: bool,
}

const MIXED_BACKREF: u64 = 0x1;
const EXTENDED_IREF: u64 = 0x40;
const SKINNY: u64 = 0x100;
const NO_HOLES: u64 = 0x200;
const BIG_METADATA: u64 = 0x20;
const FST: u64 = 0x3;
const BGT: u64 = 0x8;

const DEFAULT: Case = Case {
    name: "default",
    args: &[],
    size: 256 * MIB,
    nodesize: 16384,
    csum_type: 0,
    incompat_on: MIXED_BACKREF | EXTENDED_IREF | SKINNY | NO_HOLES | BIG_METADATA,
    incompat_off: 0,
    compat_ro: FST,
    label: "",
    set_uuid: false,
};

fn run(cmd: &mut Command) -> (bool, String) {
    let desc = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{desc}: {e}"));
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!text.contains("panicked"), "{desc} panicked:\n{text}");
    (out.status.success(), text)
}

fn run_ok(cmd: &mut Command) -> String {
    let desc = format!("{cmd:?}");
    let (ok, text) = run(cmd);
    assert!(ok, "{desc} failed:\n{text}");
    text
}

/// `key value` lines of a dump-super, first occurrence of each key.
fn fields(text: &str) -> HashMap<String, String> {
    let mut m = HashMap::new();
    for line in text.lines() {
        let mut it = line.trim().splitn(2, char::is_whitespace);
        if let (Some(k), Some(v)) = (it.next(), it.next()) {
            m.entry(k.to_string())
                .or_insert_with(|| v.trim().to_string());
        }
    }
    m
}

fn field<'a>(m: &'a HashMap<String, String>, k: &str) -> &'a str {
    m.get(k)
        .map(String::as_str)
        .unwrap_or_else(|| panic!("no `{k}` in dump-super"))
}

fn hex(v: &str) -> u64 {
    let v = v.split_whitespace().next().unwrap_or(v);
    u64::from_str_radix(v.trim_start_matches("0x"), 16).unwrap_or_else(|_| panic!("{v}"))
}

fn fresh_uuid() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let p = std::process::id() as u64;
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        (t >> 32) as u32,
        (t >> 16) as u16,
        t & 0xfff,
        p & 0xfff,
        (t ^ (p << 20)) & 0xffff_ffff_ffff
    )
}

/// `btrfs check --readonly` must pass and say nothing suspicious.
fn assert_check_clean(btrfs: &Path, image: &Path, when: &str) {
    let (ok, text) = run(Command::new(btrfs).args(["check", "--readonly"]).arg(image));
    let suspicious: Vec<&str> = text
        .lines()
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            (l.contains("error") && !l.contains("no error found"))
                || l.contains("warning")
                || l.contains("wrong")
                || l.contains("mismatch")
                || l.contains("invalid")
                || l.contains("not found")
        })
        .collect();
    assert!(
        ok && suspicious.is_empty(),
        "{} check {when}: exit ok={ok}, suspicious lines {suspicious:?}\n{text}",
        btrfs.display()
    );
}

fn checkers() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = find_in_path("btrfs").into_iter().collect();
    if Path::new(NEWER_PROGS).exists() {
        v.push(PathBuf::from(NEWER_PROGS));
    }
    v
}

fn mkfs(case: &Case, image: &Path) -> Option<String> {
    let uuid = case.set_uuid.then(fresh_uuid);
    let size = case.size.to_string();
    let mut cmd = Command::new(OLEO);
    cmd.args(["mkfs", "--size", &size]).args(case.args);
    if !case.label.is_empty() {
        cmd.args(["--label", case.label]);
    }
    if let Some(u) = &uuid {
        cmd.args(["--uuid", u]);
    }
    let out = run_ok(cmd.arg(image));
    assert!(out.contains("UUID:"), "no summary:\n{out}");
    if let Some(u) = &uuid {
        assert!(
            out.contains(u.as_str()),
            "summary lacks the uuid {u}:\n{out}"
        );
    }
    uuid
}

/// What the superblock must say, in btrfs-progs' or oleo's dump-super spelling.
fn check_super(case: &Case, m: &HashMap<String, String>, uuid: Option<&str>, fresh: bool) {
    let name = case.name;
    assert_eq!(field(m, "nodesize"), case.nodesize.to_string(), "{name}");
    assert_eq!(field(m, "sectorsize"), "4096", "{name}");
    assert_eq!(field(m, "total_bytes"), case.size.to_string(), "{name}");
    assert_eq!(field(m, "num_devices"), "1", "{name}");
    let csum = field(m, "csum_type");
    assert!(
        csum.starts_with(&format!("{} ", case.csum_type)),
        "{name}: csum_type {csum}"
    );
    let incompat = hex(field(m, "incompat_flags"));
    assert_eq!(
        incompat & case.incompat_on,
        case.incompat_on,
        "{name}: incompat {incompat:#x}"
    );
    assert_eq!(
        incompat & case.incompat_off,
        0,
        "{name}: incompat {incompat:#x}"
    );
    let compat_ro = hex(field(m, "compat_ro_flags"));
    if fresh {
        assert_eq!(compat_ro, case.compat_ro, "{name}: compat_ro");
        assert_eq!(field(m, "generation"), "1", "{name}");
    }
    let label = m.get("label").map(String::as_str).unwrap_or("");
    assert_eq!(label, case.label, "{name}: label");
    if let Some(u) = uuid {
        assert_eq!(field(m, "fsid"), u, "{name}: fsid");
    }
}

fn read_all(fs: &Filesystem, id: InodeId) -> Vec<u8> {
    let size = fs.getattr(id).unwrap().size;
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        let chunk = fs.read(id, out.len() as u64, 1 << 20).unwrap();
        assert!(!chunk.is_empty(), "short read at {}", out.len());
        out.extend_from_slice(&chunk);
    }
    out
}

fn lookup_path(fs: &Filesystem, path: &str) -> InodeId {
    path.split('/').fold(fs.root(), |dir, name| {
        fs.lookup(dir, name.as_bytes())
            .unwrap_or_else(|e| panic!("lookup {path}: {e}"))
    })
}

/// What the kernel writes and oleo must read back: (path, content).
fn workload() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("hello.txt", b"hello from the kernel\n".to_vec()),
        ("big.bin", pattern(7, 3 << 20)),
        ("dir/nested.txt", b"nested\n".to_vec()),
        ("sub/inner.txt", b"in a subvolume\n".to_vec()),
    ]
}

fn kernel_round_trip(case: &Case, tmp: &TempDir, image: &Path) {
    let mnt = tmp.subdir("mnt").unwrap();
    let km = KernelMount::mount(image, &mnt, &["rw", "noatime"])
        .unwrap_or_else(|e| panic!("{}: kernel mount failed: {e}", case.name));
    std::fs::create_dir(mnt.join("dir")).unwrap();
    run_ok(
        Command::new("btrfs")
            .args(["subvolume", "create"])
            .arg(mnt.join("sub")),
    );
    for (path, data) in workload() {
        std::fs::write(mnt.join(path), data).unwrap();
    }
    // A file with a hole: explicit hole items on ^no-holes, none otherwise.
    let sparse = std::fs::File::create(mnt.join("sparse.bin")).unwrap();
    use std::os::unix::fs::FileExt;
    sparse.write_all_at(&pattern(3, 4096), MIB).unwrap();
    sparse.set_len(2 * MIB).unwrap();
    drop(sparse);
    km.sync().unwrap();
    km.unmount().unwrap();

    for btrfs in checkers() {
        assert_check_clean(&btrfs, image, "after the kernel wrote to it");
    }
    let fs = Filesystem::open(image, OpenOptions::default())
        .unwrap_or_else(|e| panic!("{}: oleo cannot open it after the kernel: {e}", case.name));
    for (path, data) in workload() {
        let got = read_all(&fs, lookup_path(&fs, path));
        assert!(got == data, "{}: {path} differs", case.name);
    }
    let sparse = read_all(&fs, lookup_path(&fs, "sparse.bin"));
    assert_eq!(sparse.len() as u64, 2 * MIB);
    assert!(sparse[..MIB as usize].iter().all(|&b| b == 0));
    assert_eq!(
        &sparse[MIB as usize..MIB as usize + 4096],
        &pattern(3, 4096)[..]
    );
    assert!(sparse[MIB as usize + 4096..].iter().all(|&b| b == 0));
}

fn check_case(case: &Case) {
    let tmp = TempDir::new(&format!("mkfs-{}", case.name)).unwrap();
    let image = tmp.join("fs.img");
    let uuid = mkfs(case, &image);

    // oleo reads its own output.
    let ours = fields(&run_ok(Command::new(OLEO).arg("dump-super").arg(&image)));
    check_super(case, &ours, uuid.as_deref(), true);
    let fs = Filesystem::open(&image, OpenOptions::default())
        .unwrap_or_else(|e| panic!("{}: oleo cannot open it: {e}", case.name));
    let mut names = Vec::new();
    fs.readdir(fs.root(), 0, &mut |e| {
        names.push(e.name);
        true
    })
    .unwrap();
    assert!(
        names.is_empty(),
        "{}: fresh root dir lists {names:?}",
        case.name
    );
    drop(fs);

    let btrfs = checkers();
    if btrfs.is_empty() {
        skip(case.name, "needs btrfs-progs (`btrfs check`)");
        return;
    }
    for b in &btrfs {
        assert_check_clean(b, &image, "on the fresh image");
    }
    let progs = fields(&run_ok(
        Command::new(&btrfs[0])
            .args(["inspect-internal", "dump-super"])
            .arg(&image),
    ));
    check_super(case, &progs, uuid.as_deref(), true);

    if !require_root(&format!("mkfs {} kernel round trip", case.name)) {
        return;
    }
    kernel_round_trip(case, &tmp, &image);
    let after = fields(&run_ok(
        Command::new(&btrfs[0])
            .args(["inspect-internal", "dump-super"])
            .arg(&image),
    ));
    check_super(case, &after, uuid.as_deref(), false);
}

macro_rules! cases {
    ($($test:ident: $case:expr;)*) => {$(
        #[test]
        fn $test() {
            check_case(&$case);
        }
    )*};
}

cases! {
    defaults: DEFAULT;
    csum_crc32c: Case { name: "crc32c", args: &["--csum", "crc32c"], ..DEFAULT };
    csum_xxhash: Case { name: "xxhash", args: &["--csum", "xxhash"], csum_type: 1, ..DEFAULT };
    csum_sha256: Case { name: "sha256", args: &["--csum", "sha256"], csum_type: 2, ..DEFAULT };
    csum_blake2: Case { name: "blake2", args: &["--csum", "blake2"], csum_type: 3, ..DEFAULT };
    nodesize_4k: Case {
        name: "nodesize-4k",
        args: &["--nodesize", "4096"],
        nodesize: 4096,
        incompat_on: MIXED_BACKREF | EXTENDED_IREF | SKINNY | NO_HOLES,
        ..DEFAULT
    };
    nodesize_16k: Case { name: "nodesize-16k", args: &["--nodesize", "16384"], ..DEFAULT };
    nodesize_64k: Case {
        name: "nodesize-64k",
        args: &["--nodesize", "65536"],
        nodesize: 65536,
        ..DEFAULT
    };
    no_holes_off: Case {
        name: "no-holes-off",
        args: &["-O", "^no-holes"],
        incompat_on: MIXED_BACKREF | EXTENDED_IREF | SKINNY,
        incompat_off: NO_HOLES,
        ..DEFAULT
    };
    free_space_tree_off: Case {
        name: "fst-off",
        args: &["-O", "^free-space-tree"],
        compat_ro: 0,
        ..DEFAULT
    };
    skinny_off: Case {
        name: "skinny-off",
        args: &["-O", "^skinny-metadata"],
        incompat_on: MIXED_BACKREF | EXTENDED_IREF | NO_HOLES,
        incompat_off: SKINNY,
        ..DEFAULT
    };
    block_group_tree: Case {
        name: "bgt",
        args: &["-O", "block-group-tree"],
        compat_ro: FST | BGT,
        ..DEFAULT
    };
    block_group_tree_small_nodes: Case {
        name: "bgt-4k",
        args: &["-O", "block-group-tree", "--nodesize", "4096"],
        nodesize: 4096,
        incompat_on: MIXED_BACKREF | EXTENDED_IREF | SKINNY | NO_HOLES,
        compat_ro: FST | BGT,
        ..DEFAULT
    };
    metadata_single: Case { name: "meta-single", args: &["-m", "single"], ..DEFAULT };
    data_dup: Case { name: "data-dup", args: &["-d", "dup"], size: 1 << 30, ..DEFAULT };
    size_128m: Case { name: "128m", size: 128 * MIB, ..DEFAULT };
    size_1g: Case { name: "1g", size: 1 << 30, ..DEFAULT };
    size_10g: Case { name: "10g", size: 10 << 30, ..DEFAULT };
    // The 64 MiB superblock mirror lies inside the first metadata stripe (37 to 84 MiB in
    // mkfs.btrfs 6.2's layout): the 64 KiB of the chunk mapped there must stay unallocated.
    superblock_mirror_in_metadata: Case { name: "sb-mirror", size: 940 * MIB, ..DEFAULT };
    label_and_uuid: Case { name: "label-uuid", label: "oleo-test", set_uuid: true, ..DEFAULT };
}

#[test]
fn refuses_what_it_cannot_do() {
    let tmp = TempDir::new("mkfs-refusals").unwrap();
    let image = tmp.join("fs.img");
    for args in [
        &["-O", "mixed-bg"][..],
        &["-O", "raid56"],
        &["-m", "raid1"],
        &["--nodesize", "2048"],
        &["--sectorsize", "16384"],
        &["--csum", "md5"],
        &["-O", "^free-space-tree,block-group-tree"],
    ] {
        let (ok, text) = run(Command::new(OLEO)
            .args(["mkfs", "--size", "256M"])
            .args(args)
            .arg(&image));
        assert!(!ok, "{args:?} was accepted:\n{text}");
        assert!(
            text.starts_with("oleo:") || text.contains("error"),
            "{args:?}: {text}"
        );
    }
    let (ok, text) = run(Command::new(OLEO)
        .args(["mkfs", "--size", "16M"])
        .arg(&image));
    assert!(!ok && text.contains("too small"), "{text}");
    // Several devices are mkfs_multi.rs's; the same one twice is refused.
    let (ok, text) = run(Command::new(OLEO)
        .args(["mkfs", "--size", "256M"])
        .arg(tmp.join("a.img"))
        .arg(tmp.join("a.img")));
    assert!(!ok && text.contains("given twice"), "{text}");
    let (ok, text) = run(Command::new(OLEO).arg("mkfs").arg(tmp.join("missing.img")));
    assert!(!ok && text.contains("give a size"), "{text}");
}

#[test]
fn formats_an_existing_file_at_its_size() {
    let tmp = TempDir::new("mkfs-existing").unwrap();
    let image = tmp.join("fs.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(300 * MIB)
        .unwrap();
    run_ok(Command::new(OLEO).args(["mkfs", "-q"]).arg(&image));
    let fs = Filesystem::open(&image, OpenOptions::default()).unwrap();
    assert_eq!(fs.superblock().total_bytes, 300 * MIB);
    assert_eq!(fs.superblock().dev_item.total_bytes, 300 * MIB);
}
