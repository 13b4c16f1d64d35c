//! Many threads through one FUSE mount: seeded random operations (create, write, truncate,
//! rename, unlink, read, fsync, syncfs) by N threads at once, each on its own directory and
//! on one they share (names carry the thread, so each model is exact whatever the
//! interleaving). Then the mount must show every thread's files as its model says, and
//! after unmounting `btrfs check` and the kernel must agree.
//!
//! Needs root and FUSE (SKIP without; a failure under CI=true). `OLEO_TEST_SEED` replays
//! the operation sequences.

use oleo_testkit::ops::Rng;
use oleo_testkit::*;
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

type Files = BTreeMap<String, Vec<u8>>;

fn worker(root: &Path, t: usize, seed: u64, ops: usize) -> Files {
    let mut rng = Rng::new(seed ^ (t as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let own = format!("t{t}");
    std::fs::create_dir(root.join(&own)).unwrap();
    let mut files = Files::new();
    let mut next = 0;
    for step in 0..ops {
        let names: Vec<String> = files.keys().cloned().collect();
        let pick = |rng: &mut Rng| names[rng.below(names.len() as u64) as usize].clone();
        let ctx = |op: &str| format!("thread {t} step {step} ({op}), seed {seed}");
        let fresh = |rng: &mut Rng, next: &mut u64| {
            *next += 1;
            if rng.chance(30) {
                format!("shared/t{t}-f{next}")
            } else {
                format!("{own}/f{next}")
            }
        };
        match rng.below(100) {
            0..=14 => {
                let path = fresh(&mut rng, &mut next);
                std::fs::File::create(root.join(&path))
                    .unwrap_or_else(|e| panic!("{}: {e}", ctx("create")));
                files.insert(path, Vec::new());
            }
            15..=54 if !names.is_empty() => {
                let path = pick(&mut rng);
                let len = 1 + rng.below(200 << 10) as usize;
                let off = rng.below(512 << 10) as usize;
                let fill = rng.next() as u8;
                let data: Vec<u8> = (0..len).map(|i| fill.wrapping_add((i / 5) as u8)).collect();
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(root.join(&path))
                    .unwrap_or_else(|e| panic!("{} {path}: {e}", ctx("open")));
                f.seek(SeekFrom::Start(off as u64)).unwrap();
                f.write_all(&data)
                    .unwrap_or_else(|e| panic!("{}: {e}", ctx("write")));
                if rng.chance(25) {
                    f.sync_all()
                        .unwrap_or_else(|e| panic!("{}: {e}", ctx("fsync")));
                }
                let m = files.get_mut(&path).unwrap();
                if m.len() < off + len {
                    m.resize(off + len, 0);
                }
                m[off..off + len].copy_from_slice(&data);
            }
            55..=61 if !names.is_empty() => {
                let path = pick(&mut rng);
                let size = rng.below(600 << 10);
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(root.join(&path))
                    .and_then(|f| f.set_len(size))
                    .unwrap_or_else(|e| panic!("{}: {e}", ctx("truncate")));
                files.get_mut(&path).unwrap().resize(size as usize, 0);
            }
            62..=71 if !names.is_empty() => {
                let from = pick(&mut rng);
                let to = if rng.chance(40) {
                    pick(&mut rng)
                } else {
                    fresh(&mut rng, &mut next)
                };
                std::fs::rename(root.join(&from), root.join(&to))
                    .unwrap_or_else(|e| panic!("{} {from} -> {to}: {e}", ctx("rename")));
                if from != to {
                    let content = files.remove(&from).unwrap();
                    files.insert(to, content);
                }
            }
            72..=79 if !names.is_empty() => {
                let path = pick(&mut rng);
                std::fs::remove_file(root.join(&path))
                    .unwrap_or_else(|e| panic!("{}: {e}", ctx("unlink")));
                files.remove(&path);
            }
            80..=95 if !names.is_empty() => {
                let path = pick(&mut rng);
                let mut got = Vec::new();
                std::fs::File::open(root.join(&path))
                    .and_then(|mut f| f.read_to_end(&mut got))
                    .unwrap_or_else(|e| panic!("{}: {e}", ctx("read")));
                assert!(
                    got == files[&path],
                    "{}: {path} reads other bytes",
                    ctx("read")
                );
            }
            96..=97 => {
                std::fs::File::open(root)
                    .and_then(|d| d.sync_all())
                    .unwrap_or_else(|e| panic!("{}: {e}", ctx("syncfs")));
            }
            _ => {}
        }
    }
    files
}

fn listing(root: &Path) -> Files {
    let mut out = Files::new();
    for d in std::fs::read_dir(root).unwrap() {
        let d = d.unwrap();
        let dname = d.file_name().into_string().unwrap();
        for f in std::fs::read_dir(d.path()).unwrap() {
            let f = f.unwrap();
            let name = f.file_name().into_string().unwrap();
            out.insert(format!("{dname}/{name}"), std::fs::read(f.path()).unwrap());
        }
    }
    out
}

fn compare(want: &Files, got: &Files, who: &str) {
    let w: Vec<_> = want.keys().collect();
    let g: Vec<_> = got.keys().collect();
    assert_eq!(w, g, "{who} lists other files than the threads made");
    for (path, data) in want {
        assert!(got[path] == *data, "{who}: {path} holds other bytes");
    }
}

fn run(threads: usize, ops: usize) {
    let name = format!("fuse-concurrent-{threads}");
    if !(require_root(&name) && require_fuse(&name)) {
        return;
    }
    let seed = oleo_testkit::seed(7);
    eprintln!("{name}: seed {seed} (OLEO_TEST_SEED={seed} replays the operations)");
    let dir = TempDir::new(&name).unwrap();
    let image = dir.join("image");
    let out = Command::new(OLEO)
        .args(["mkfs", "-q", "--size", "3G"])
        .arg(&image)
        .output()
        .unwrap();
    assert!(out.status.success(), "oleo mkfs: {out:?}");
    let mnt = dir.subdir("mnt").unwrap();
    // A short commit interval: periodic commits race the threads too.
    let m = OleoMount::mount_rw(Path::new(OLEO), &image, &mnt, &["commit=1"]).unwrap();
    let root: PathBuf = m.path().to_path_buf();
    std::fs::create_dir(root.join("shared")).unwrap();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let root = root.clone();
            std::thread::spawn(move || worker(&root, t, seed, ops))
        })
        .collect();
    let mut want = Files::new();
    for w in workers {
        want.extend(w.join().expect("a worker panicked"));
    }
    compare(&want, &listing(&root), "the mount");
    m.unmount().unwrap();
    assert_btrfs_check(&image, &format!("{threads} threads through FUSE"));
    let kmnt = dir.subdir("kmnt").unwrap();
    let k = KernelMount::mount(&image, &kmnt, &["ro"]).unwrap();
    compare(&want, &listing(k.path()), "the kernel");
    k.unmount().unwrap();
}

#[test]
fn fuse_eight_threads() {
    run(8, 200);
}

#[test]
fn fuse_thirty_two_threads() {
    run(32, 60);
}
