//! `oleo dump-tree` and `oleo dump-super` against btrfs-progs on the same image.
//!
//! Each test builds a seeded image with mkfs.btrfs and the kernel driver (files of every
//! kind, xattrs, links, compressed and preallocated extents, subvolumes, snapshots, quotas),
//! then dumps it with both tools and compares: the tree structure (every block header line,
//! node pointer and item line, in order) must be identical; so must the decoded bodies of the
//! fs tree (names masked, as btrfs-progs prints them raw); and the superblock fields.
//!
//! Needs root, loop devices, kernel btrfs and btrfs-progs; without them each test prints
//! `SKIP:` and passes, except under `CI=true`, where that is a failure. Replay with
//! `OLEO_TEST_SEED=<seed>`; keep the image with `OLEO_KEEP_TMP=1`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use oleo_testkit::*;

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

/// The main image's seed (unless OLEO_TEST_SEED says otherwise).
const MAIN_SEED: u64 = 0xd0_7ee5;

/// Beyond this many differences a report is cut.
const MAX_REPORTED: usize = 40;

fn requirements_met(what: &str) -> bool {
    // require_root also checks for mkfs.btrfs and btrfs; it prints `SKIP: ...` (or panics
    // under CI=true) when something is missing.
    require_root(&format!("{what} (needs root and mkfs.btrfs)"))
}

/// Runs a command, returns stdout (lossy: names may be any bytes), panics on failure.
fn stdout_of(cmd: &mut Command) -> String {
    let desc = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{desc}: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{desc} panicked:\n{stderr}");
    assert!(
        out.status.success(),
        "{desc} failed ({}):\n{stderr}",
        out.status
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn oleo(args: &[&str]) -> String {
    stdout_of(Command::new(OLEO).args(args))
}

/// btrfs-progs, with dates in UTC as oleo prints them, and dump-tree walking depth-first as
/// oleo does (progs defaults to breadth-first: nodes of a level, then the next level).
fn progs(args: &[&str]) -> String {
    let mut c = Command::new("btrfs");
    c.arg("inspect-internal").arg(args[0]);
    if args[0] == "dump-tree" {
        c.arg("--dfs");
    }
    stdout_of(c.args(&args[1..]).env("TZ", "UTC"))
}

fn is_tree_header(line: &str) -> bool {
    !line.starts_with(char::is_whitespace)
        && (line == "root tree"
            || line == "chunk tree"
            || line == "log root tree"
            || line.contains(" tree key ("))
}

/// The lines that give a dump its structure: tree headers, block headers, node pointers and
/// item headers, in order (trailing blanks trimmed: progs ends tree headers with a space).
fn structure(dump: &str) -> Vec<String> {
    dump.lines()
        .map(str::trim_end)
        .filter(|l| {
            is_tree_header(l)
                || l.starts_with("leaf ")
                || l.starts_with("node ")
                || l.starts_with("\titem ")
                || l.starts_with("\tkey (")
        })
        .map(str::to_string)
        .collect()
}

/// Every key a dump shows for items and node pointers: the `(OBJECTID TYPE OFFSET)` after
/// `item N key` / `key`.
fn keys(dump: &str) -> Vec<String> {
    dump.lines()
        .filter_map(|l| {
            let rest = if let Some(r) = l.strip_prefix("\titem ") {
                r.split_once(" key ")?.1
            } else {
                l.strip_prefix("\tkey ")?
            };
            let end = rest.find(')')?;
            Some(rest[..=end].to_string())
        })
        .collect()
}

/// Item type names among the item keys of a dump, with counts.
fn item_types(dump: &str) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for l in dump.lines().filter(|l| l.starts_with("\titem ")) {
        if let Some(k) = keys(&format!("{l}\n")).first() {
            if let Some(t) = k.split_whitespace().nth(1) {
                *m.entry(t.to_string()).or_insert(0) += 1;
            }
        }
    }
    m
}

/// The decoded bodies of the items btrfs-progs and oleo print alike, names and xattr values
/// masked (progs prints their raw bytes, oleo escapes them, and a raw newline in a name would
/// split a progs line). Lines oleo adds (checksum counts) are left out by the prefix list.
fn bodies(dump: &str) -> Vec<String> {
    const PREFIXES: &[&str] = &[
        "generation ",
        "block group ",
        "sequence ",
        "atime ",
        "ctime ",
        "mtime ",
        "otime ",
        "location key ",
        "transid ",
        "index ",
        "inline extent data ",
        "extent data ",
        "extent compression ",
        "prealloc data ",
        "refs ",
        "tree block ",
        "extent data backref ",
        "shared data backref ",
        "shared block backref ",
        "range start ",
        "block group used ",
        "free space info ",
        "free space extent",
        "dev extent ",
        "chunk_objectid ",
        "chunk_tree_uuid ",
        "devid ",
        "length ",
        "stripe ",
        "dev_uuid ",
        "subvol_id ",
        "root_dirid ",
        "last_snapshot ",
        "drop_progress ",
        "level ",
        "uuid ",
        "parent_uuid ",
        "received_uuid ",
        "ctransid ",
        "stime ",
        "rtime ",
        "referenced ",
        "exclusive ",
        "max_referenced ",
        "rsv_referenced ",
        "write_errs ",
    ];
    let mut out = Vec::new();
    for l in dump.lines() {
        if is_tree_header(l.trim_end())
            || l.starts_with("leaf ")
            || l.starts_with("node ")
            || l.starts_with("\titem ")
        {
            out.push(l.trim_end().to_string());
            continue;
        }
        let Some(body) = l.strip_prefix("\t\t") else {
            continue;
        };
        let body = body.trim_start_matches('\t');
        if !PREFIXES.iter().any(|p| body.starts_with(p)) {
            continue;
        }
        let masked = match body.find("name: ") {
            Some(i) => format!("{}name: <masked>", &body[..i]),
            None => signed_seconds(body),
        };
        out.push(masked);
    }
    out
}

/// `atime SEC.NSEC (DATE)` with SEC as a signed number: btrfs-progs prints times before 1970
/// as huge unsigned values (18446744073709551615.999999999 for -1.999999999).
fn signed_seconds(body: &str) -> String {
    let Some((field, rest)) = body.split_once(' ') else {
        return body.to_string();
    };
    if !["atime", "ctime", "mtime", "otime", "stime", "rtime"].contains(&field) {
        return body.to_string();
    }
    let Some((sec, rest)) = rest.split_once('.') else {
        return body.to_string();
    };
    match sec.parse::<u64>() {
        Ok(v) => format!("{field} {}.{rest}", v as i64),
        Err(_) => body.to_string(),
    }
}

/// Describes the first differences between two line lists, or None when they are equal.
fn diff(what: &str, ours: &[String], theirs: &[String]) -> Option<String> {
    if ours == theirs {
        return None;
    }
    let mut report = format!(
        "{what}: oleo has {} lines, btrfs-progs {}\n",
        ours.len(),
        theirs.len()
    );
    let mut shown = 0;
    let n = ours.len().max(theirs.len());
    for i in 0..n {
        let (a, b) = (ours.get(i), theirs.get(i));
        if a != b {
            report.push_str(&format!(
                "  line {i}:\n    oleo:  {}\n    progs: {}\n",
                a.map_or("<none>", |s| s),
                b.map_or("<none>", |s| s)
            ));
            shown += 1;
            if shown >= MAX_REPORTED {
                report.push_str("  ...\n");
                break;
            }
        }
    }
    Some(report)
}

/// `name value` lines of a dump-super output; the value is the first word after the name
/// (progs writes `leafsize (deprecated)`; such lines are skipped by taking only known names).
fn super_fields(text: &str) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for l in text.lines() {
        let mut it = l.split_whitespace();
        if let (Some(k), Some(v)) = (it.next(), it.next()) {
            m.entry(k.to_string()).or_insert_with(|| v.to_string());
        }
    }
    m
}

/// Builds the image: testkit's full populate, then quotas (with a level-1 qgroup and a
/// relation) so that the quota tree has every item kind.
fn build_main_image(tmp: &TempDir) -> std::path::PathBuf {
    let image = tmp.join("main.img");
    let spec = ImageSpec::new("dump-tree", seed(MAIN_SEED)).populate(PopulateSpec {
        big_dir: 400,
        ..PopulateSpec::full()
    });
    build_image(&spec, &image).unwrap_or_else(|e| panic!("building the image: {e}"));
    let mp = tmp.subdir("quota-mnt").expect("mount point");
    let m = KernelMount::mount(&image, &mp, &["rw"]).expect("kernel mount for quotas");
    let btrfs = |args: &[&str]| {
        let mut c = Command::new("btrfs");
        c.args(args).arg(m.path());
        oleo_testkit::cmd::run(&mut c).unwrap_or_else(|e| panic!("{e}"));
    };
    btrfs(&["quota", "enable"]);
    // Enabling starts a rescan; an assign during it fails with EINPROGRESS.
    btrfs(&["quota", "rescan", "-w"]);
    btrfs(&["qgroup", "create", "1/100"]);
    btrfs(&["qgroup", "assign", "--no-rescan", "0/5", "1/100"]);
    btrfs(&["quota", "rescan", "-w"]);
    m.sync().expect("sync");
    m.unmount().expect("unmount");
    image
}

/// Compares oleo's and btrfs-progs' dumps of `img` (whole image, fs tree, and the decoded
/// bodies of `body_trees`, pairs of oleo `--tree` argument and progs `-t` id); returns the
/// whole progs dump.
fn compare_with_progs(
    tmp: &TempDir,
    img: &str,
    body_trees: &[(&str, &str)],
    failures: &mut Vec<String>,
) -> String {
    // The whole image: same trees, blocks and items, in the same order.
    let ours_all = oleo(&["dump-tree", img]);
    let theirs_all = progs(&["dump-tree", img]);
    std::fs::write(tmp.join("oleo.txt"), &ours_all).ok();
    std::fs::write(tmp.join("progs.txt"), &theirs_all).ok();
    failures.extend(diff(
        "whole dump: structure",
        &structure(&ours_all),
        &structure(&theirs_all),
    ));
    for l in ours_all.lines().filter(|l| l.contains("ERROR")) {
        failures.push(format!("whole dump: oleo printed {l:?}"));
    }
    for l in ours_all
        .lines()
        .filter(|l| l.contains(" item, ") && l.ends_with(" bytes:"))
    {
        failures.push(format!("whole dump: an item was not decoded: {l:?}"));
    }
    let types = item_types(&theirs_all);
    eprintln!("item types in the image: {types:?}");
    if item_types(&ours_all) != types {
        failures.push(format!(
            "item type counts differ: oleo {:?}",
            item_types(&ours_all)
        ));
    }

    // The fs tree: the same set of keys (and order), and the same decoded bodies.
    let ours_fs = oleo(&["dump-tree", img, "--tree", "5"]);
    let theirs_fs = progs(&["dump-tree", "-t", "5", img]);
    let (ok, tk) = (keys(&ours_fs), keys(&theirs_fs));
    if ok.is_empty() {
        failures.push("fs tree: oleo printed no keys".into());
    }
    let (os, ts): (BTreeSet<_>, BTreeSet<_>) = (ok.iter().collect(), tk.iter().collect());
    if os != ts {
        let only_ours: Vec<_> = os.difference(&ts).take(MAX_REPORTED).collect();
        let only_theirs: Vec<_> = ts.difference(&os).take(MAX_REPORTED).collect();
        failures.push(format!(
            "fs tree keys differ:\n  only in oleo: {only_ours:?}\n  only in progs: {only_theirs:?}"
        ));
    }
    failures.extend(diff("fs tree: key order", &ok, &tk));
    failures.extend(diff(
        "fs tree: decoded items",
        &bodies(&ours_fs),
        &bodies(&theirs_fs),
    ));
    for (name, id) in body_trees {
        let ours = oleo(&["dump-tree", img, "--tree", name]);
        let theirs = progs(&["dump-tree", "-t", id, img]);
        failures.extend(diff(
            &format!("tree {name}: decoded items"),
            &bodies(&ours),
            &bodies(&theirs),
        ));
    }
    theirs_all
}

fn require_types(what: &str, dump: &str, wanted: &[&str], failures: &mut Vec<String>) {
    let types = item_types(dump);
    for t in wanted {
        if !types.contains_key(*t) {
            failures.push(format!("{what}: the test image has no {t} item"));
        }
    }
}

fn finish(tmp: &mut TempDir, seed: u64, failures: Vec<String>) {
    if !failures.is_empty() {
        tmp.keep();
        panic!(
            "{} problem(s) (seed {seed}; image and dumps kept in {}):\n{}",
            failures.len(),
            tmp.path().display(),
            failures.join("\n")
        );
    }
}

#[test]
fn dump_tree_and_dump_super_match_btrfs_progs() {
    let what = "dump_tree_and_dump_super_match_btrfs_progs";
    if !requirements_met(what) {
        return;
    }
    let mut tmp = TempDir::new("dump-tree").expect("temp dir");
    let image = build_main_image(&tmp);
    let img = image.to_str().expect("utf-8 path");
    let mut failures: Vec<String> = Vec::new();

    // A subvolume and the trees whose bodies progs prints the same way in every version.
    let theirs_all = compare_with_progs(
        &tmp,
        img,
        &[
            ("chunk", "3"),
            ("dev", "4"),
            ("extent", "2"),
            ("256", "256"),
        ],
        &mut failures,
    );
    // The item types the populate step must produce, so that the comparison covers them.
    require_types(
        what,
        &theirs_all,
        &[
            "INODE_ITEM",
            "INODE_REF",
            "INODE_EXTREF",
            "XATTR_ITEM",
            "DIR_ITEM",
            "DIR_INDEX",
            "EXTENT_DATA",
            "EXTENT_CSUM",
            "ROOT_ITEM",
            "ROOT_REF",
            "ROOT_BACKREF",
            "EXTENT_ITEM",
            "METADATA_ITEM",
            "BLOCK_GROUP_ITEM",
            "FREE_SPACE_INFO",
            "FREE_SPACE_EXTENT",
            "DEV_EXTENT",
            "DEV_ITEM",
            "CHUNK_ITEM",
            "UUID_KEY_SUBVOL",
            "PERSISTENT_ITEM",
            "QGROUP_STATUS",
            "QGROUP_INFO",
            "QGROUP_LIMIT",
            "QGROUP_RELATION",
        ],
        &mut failures,
    );
    for kind in [
        "type 0 (inline)",
        "type 1 (regular)",
        "type 2 (prealloc)",
        "extent compression 1 (zlib)",
        "extent compression 2 (lzo)",
        "extent compression 3 (zstd)",
        "type SYMLINK",
        "type XATTR",
    ] {
        if !theirs_all.contains(kind) {
            failures.push(format!("the test image has no {kind:?}"));
        }
    }

    // Tree names and ids select the same tree, and the same blocks progs shows for it.
    for (name, id) in [
        ("root", "1"),
        ("extent", "2"),
        ("chunk", "3"),
        ("dev", "4"),
        ("fs", "5"),
        ("csum", "7"),
        ("quota", "8"),
        ("uuid", "9"),
        ("free-space", "10"),
    ] {
        let by_name = oleo(&["dump-tree", img, "--tree", name]);
        let by_id = oleo(&["dump-tree", img, "-t", id]);
        if by_name != by_id {
            failures.push(format!("--tree {name} and --tree {id} differ"));
        }
        failures.extend(diff(
            &format!("--tree {name}: structure"),
            &structure(&by_name),
            &structure(&progs(&["dump-tree", "-t", id, img])),
        ));
    }
    let reloc = oleo(&["dump-tree", img, "--tree", "data-reloc"]);
    if !reloc.starts_with("data reloc tree key (DATA_RELOC_TREE ROOT_ITEM 0)\n") {
        failures.push(format!(
            "--tree data-reloc starts with {:?}",
            reloc.lines().next()
        ));
    }

    // dump-super: the fields both tools print, value by value.
    let ours_super = super_fields(&oleo(&["dump-super", img]));
    let theirs_super = super_fields(&progs(&["dump-super", img]));
    for f in [
        "generation",
        "root",
        "chunk_root",
        "nodesize",
        "sectorsize",
        "root_level",
        "chunk_root_level",
        "chunk_root_generation",
        "log_root",
        "total_bytes",
        "bytes_used",
        "num_devices",
        "fsid",
        "metadata_uuid",
        "csum_type",
        "incompat_flags",
        "compat_ro_flags",
        "dev_item.devid",
        "dev_item.uuid",
    ] {
        let (a, b) = (ours_super.get(f), theirs_super.get(f));
        if a.is_none() || a != b {
            failures.push(format!("dump-super {f}: oleo {a:?}, btrfs-progs {b:?}"));
        }
    }

    // Errors are reported, not panics.
    for (args, expect) in [
        (vec!["--tree", "no-such-tree"], "unknown tree"),
        (vec!["--tree", "4242"], "not found"),
        (vec!["--tree", "log"], "no log tree"),
    ] {
        let out = Command::new(OLEO)
            .arg("dump-tree")
            .arg(img)
            .args(&args)
            .output()
            .expect("run oleo");
        let err = String::from_utf8_lossy(&out.stderr);
        if out.status.success() || !err.contains(expect) || err.contains("panicked") {
            failures.push(format!(
                "dump-tree {args:?}: status {}, stderr {err:?} (expected failure with {expect:?})",
                out.status
            ));
        }
    }

    // A reader that goes away (`| head`): oleo stops quietly.
    let mut child = Command::new(OLEO)
        .args(["dump-tree", img])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn oleo");
    {
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        for _ in 0..5 {
            lines.next();
        }
    }
    let out = child.wait_with_output().expect("wait for oleo");
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || err.contains("panicked") {
        failures.push(format!(
            "dump-tree | head: status {}, stderr {err:?}",
            out.status
        ));
    }
    finish(&mut tmp, seed(MAIN_SEED), failures);
}

/// 4 KiB nodes (trees three levels deep), non-skinny extent items (tree block info), xxhash
/// checksums, explicit holes, and enough snapshots that tree block refs no longer fit inline
/// (keyed TREE_BLOCK_REF items) and changed snapshots share blocks by parent (FULL_BACKREF).
#[test]
fn dump_tree_matches_btrfs_progs_with_small_nodes() {
    let what = "dump_tree_matches_btrfs_progs_with_small_nodes";
    if !requirements_met(what) {
        return;
    }
    let mut tmp = TempDir::new("dump-tree-small").expect("temp dir");
    let image = tmp.join("small.img");
    let seed = seed(0x5_4a11);
    let spec = ImageSpec::new("dump-tree-small", seed)
        .mkfs(&[
            "--nodesize",
            "4096",
            "--csum",
            "xxhash",
            "-O",
            "^skinny-metadata,^no-holes",
        ])
        .populate(PopulateSpec {
            // Long symlinks and big xattrs do not fit 4 KiB nodes.
            links: false,
            xattrs: false,
            acls: false,
            big_dir: 3000,
            ..PopulateSpec::basic()
        });
    build_image(&spec, &image).unwrap_or_else(|e| panic!("building the image: {e}"));
    {
        let mp = tmp.subdir("mnt").expect("mount point");
        let m = KernelMount::mount(&image, &mp, &["rw"]).expect("kernel mount");
        let snaps = m.path().join("snaps");
        std::fs::create_dir_all(&snaps).expect("mkdir");
        for i in 0..40 {
            let mut c = Command::new("btrfs");
            c.args(["subvolume", "snapshot", "-r"])
                .arg(m.path())
                .arg(snaps.join(format!("s{i}")));
            oleo_testkit::cmd::run(&mut c).unwrap_or_else(|e| panic!("{e}"));
        }
        // Changing the top level after the snapshots makes its blocks shared by parent.
        for i in (0..3000).step_by(97) {
            let p = m.path().join("bigdir").join(format!("changed-{i}"));
            std::fs::write(p, b"x").expect("write");
        }
        m.sync().expect("sync");
        m.unmount().expect("unmount");
    }
    let img = image.to_str().expect("utf-8 path");
    let mut failures = Vec::new();
    let theirs_all =
        compare_with_progs(&tmp, img, &[("extent", "2"), ("chunk", "3")], &mut failures);
    require_types(
        what,
        &theirs_all,
        &[
            "EXTENT_ITEM",
            "TREE_BLOCK_REF",
            "EXTENT_DATA",
            "EXTENT_CSUM",
        ],
        &mut failures,
    );
    for kind in ["node ", " level 2 ", "tree block key (", "FULL_BACKREF"] {
        if !theirs_all.contains(kind) {
            failures.push(format!("the test image has no {kind:?}"));
        }
    }
    finish(&mut tmp, seed, failures);
}

#[test]
fn dump_tree_shows_a_pending_log_tree() {
    let what = "dump_tree_shows_a_pending_log_tree";
    if !requirements_met(what) {
        return;
    }
    let mut tmp = TempDir::new("dump-tree-log").expect("temp dir");
    let image = tmp.join("log.img");
    let spec = ImageSpec::new("dump-tree-log", seed(0x106)).populate(PopulateSpec::none());
    build_image_with_pending_log(&spec, &image).unwrap_or_else(|e| panic!("building: {e}"));
    let img = image.to_str().expect("utf-8 path");
    let mut failures = Vec::new();

    let ours = oleo(&["dump-tree", img]);
    let theirs = progs(&["dump-tree", img]);
    failures.extend(diff(
        "whole dump with a log: structure",
        &structure(&ours),
        &structure(&theirs),
    ));
    let ours_log = oleo(&["dump-tree", img, "--tree", "log"]);
    let types = item_types(&ours_log);
    for t in [
        "ROOT_ITEM",
        "INODE_ITEM",
        "DIR_INDEX",
        "DIR_LOG_INDEX",
        "EXTENT_DATA",
    ] {
        if !types.contains_key(t) {
            failures.push(format!("--tree log: no {t} item (types: {types:?})"));
        }
    }
    if !ours_log.starts_with("log root tree\n")
        || !ours_log.contains("\nlog tree key (TREE_LOG ROOT_ITEM 5)\n")
    {
        failures.push(format!(
            "--tree log: unexpected headers: {:?}",
            ours_log
                .lines()
                .filter(|l| is_tree_header(l))
                .collect::<Vec<_>>()
        ));
    }
    failures.extend(diff(
        "log trees: decoded items",
        &bodies(&ours_log),
        &bodies(
            &theirs
                .lines()
                .scan(false, |in_log, l| {
                    // progs prints the log root tree after the chunk tree and the log trees
                    // last; keep just those sections, in that order.
                    if is_tree_header(l.trim_end()) {
                        *in_log = l.starts_with("log ");
                    }
                    Some(if *in_log { Some(l) } else { None })
                })
                .flatten()
                .collect::<Vec<_>>()
                .join("\n"),
        ),
    ));
    for l in ours.lines().filter(|l| l.contains("ERROR")) {
        failures.push(format!("oleo printed {l:?}"));
    }
    finish(&mut tmp, seed(0x106), failures);
}
