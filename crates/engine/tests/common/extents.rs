//! What `btrfs inspect-internal dump-tree` says of data extents (the items of a file, the
//! extent tree's reference counts), to compare oleo's layout with the kernel's, and what
//! the kernel reads of the files.

use oleo_testkit::KernelMount;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// (file offset, generation, disk_bytenr, offset, num_bytes, type) of every EXTENT_DATA
/// item of inode `ino` in tree `tree`, as `btrfs inspect-internal dump-tree` prints them.
pub fn extent_items(image: &Path, tree: u64, ino: u64) -> Vec<(u64, u64, u64, u64, u64, String)> {
    let out = Command::new("btrfs")
        .args(["inspect-internal", "dump-tree", "-t", &tree.to_string()])
        .arg(image)
        .output()
        .expect("dump-tree");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut items = Vec::new();
    let mut lines = text.lines().peekable();
    let prefix = format!("key ({ino} EXTENT_DATA ");
    while let Some(l) = lines.next() {
        // Leaf items only: a node's key pointers name the same keys.
        let Some(at) = l
            .find(&prefix)
            .filter(|_| l.trim_start().starts_with("item "))
        else {
            continue;
        };
        let rest = &l[at + prefix.len()..];
        let off: u64 = rest.split(')').next().unwrap().parse().unwrap();
        let mut body = Vec::new();
        while let Some(l) = lines.next_if(|l| !l.contains(" key (")) {
            body.push(l);
        }
        let words = |s: &str| -> Vec<String> { s.split_whitespace().map(String::from).collect() };
        let g = words(body[0]);
        let generation: u64 = g[1].parse().unwrap();
        let kind = g
            .last()
            .unwrap()
            .trim_matches(|c| c == '(' || c == ')')
            .to_string();
        if kind == "inline" {
            items.push((off, generation, 0, 0, 0, kind));
            continue;
        }
        let d = words(body[1]);
        let bytenr: u64 = d[4].parse().unwrap();
        let o = words(body[2]);
        items.push((
            off,
            generation,
            bytenr,
            o[3].parse().unwrap(),
            o[5].parse().unwrap(),
            kind,
        ));
    }
    items
}

/// The reference count of every data extent item, in address order.
pub fn data_extent_refs(image: &Path) -> Vec<u64> {
    let out = Command::new("btrfs")
        .args(["inspect-internal", "dump-tree", "-t", "extent"])
        .arg(image)
        .output()
        .expect("dump-tree");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.trim_end().ends_with("flags DATA"))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w[1].parse().expect("refs N")
        })
        .collect()
}

/// The kernel reads every file of `expect` (path under the top level -> bytes).
pub fn kernel_reads<K: AsRef<str>>(image: &Path, mnt: &Path, expect: &BTreeMap<K, Vec<u8>>) {
    let m = KernelMount::mount(image, mnt, &["ro"]).expect("kernel mount");
    for (path, want) in expect {
        let path = path.as_ref();
        let got = std::fs::read(m.path().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(
            got == *want,
            "the kernel reads {path} differently ({} vs {} bytes)",
            got.len(),
            want.len()
        );
    }
    drop(m);
}
