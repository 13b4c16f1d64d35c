//! READ answers are written straight into the reply buffer (a FUSE ring entry's payload,
//! or a buffer the server thread keeps): the devices read into it, holes and tails are
//! filled in place. That buffer still holds the previous answer, so every byte a read does
//! not get from the disk must be written anyway. Files the kernel wrote (plain, sparse,
//! inline, compressed, preallocated, an unaligned tail; on one device and on a RAID0 and
//! RAID1 pair) are read through an oleo mount right after large reads of random data, with
//! O_DIRECT and buffered, over io_uring and /dev/fuse, and must give the kernel's bytes.
//!
//! Needs root, FUSE and kernel btrfs (a skip elsewhere, a failure under CI=true).

use oleo::device::IoBuf;
use oleo_testkit::ops::Rng;
use oleo_testkit::*;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

/// Runs a shell command; Err with its output when it fails.
fn sh(script: &str) -> Result<(), String> {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{script}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn random(rng: &mut Rng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.next() as u8).collect()
}

/// The files the kernel writes, and the bytes each must read back as.
fn contents(seed: u64) -> Vec<(&'static str, Vec<u8>)> {
    let mut rng = Rng::new(seed);
    let big = random(&mut rng, 4 << 20);
    let mut sparse = vec![0u8; (1 << 20) + 1234];
    sparse[..65536].copy_from_slice(&random(&mut rng, 65536));
    sparse[512 << 10..(512 << 10) + 65536].copy_from_slice(&random(&mut rng, 65536));
    let inline = random(&mut rng, 100);
    let tail = random(&mut rng, (3 << 20) + 777);
    // Compressible: runs of one byte.
    let compressed: Vec<u8> = (0..(1 << 20) + 4000)
        .map(|i| (i / 3000) as u8 ^ 0x5a)
        .collect();
    let mut prealloc = vec![0u8; 1 << 20];
    prealloc[300 << 10..(300 << 10) + 4096].copy_from_slice(&random(&mut rng, 4096));
    vec![
        ("big", big),
        ("sparse", sparse),
        ("inline", inline),
        ("tail", tail),
        ("compressed/c", compressed),
        ("prealloc", prealloc),
    ]
}

/// Writes `files` through a kernel mount at `mnt` (sparse and preallocated ones as such).
fn write_with_kernel(mnt: &Path, files: &[(&str, Vec<u8>)]) {
    std::fs::create_dir(mnt.join("compressed")).unwrap();
    sh(&format!(
        "setfattr -n btrfs.compression -v zstd {}",
        mnt.join("compressed").display()
    ))
    .expect("setfattr btrfs.compression");
    for (name, data) in files {
        let path = mnt.join(name);
        let f = File::create(&path).unwrap();
        match *name {
            "sparse" => {
                f.write_all_at(&data[..65536], 0).unwrap();
                f.write_all_at(&data[512 << 10..(512 << 10) + 65536], 512 << 10)
                    .unwrap();
                f.set_len(data.len() as u64).unwrap();
            }
            "prealloc" => {
                sh(&format!("fallocate -l {} {}", data.len(), path.display())).expect("fallocate");
                f.write_all_at(&data[300 << 10..(300 << 10) + 4096], 300 << 10)
                    .unwrap();
            }
            _ => f.write_all_at(data, 0).unwrap(),
        }
        f.sync_all().unwrap();
    }
}

/// The whole file read with O_DIRECT in 1 MiB requests (aligned buffer, as databases do).
fn read_direct(path: &Path, len: usize) -> Vec<u8> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap_or_else(|e| panic!("open O_DIRECT {}: {e}", path.display()));
    let mut buf = IoBuf::zeroed(1 << 20);
    let mut out = Vec::with_capacity(len);
    loop {
        let n = f
            .read_at(&mut buf, out.len() as u64)
            .unwrap_or_else(|e| panic!("O_DIRECT read of {}: {e}", path.display()));
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    out
}

/// The whole file read through the page cache, its pages dropped first so that each read
/// reaches the server.
fn read_buffered(path: &Path) -> Vec<u8> {
    let f = File::open(path).unwrap();
    // SAFETY: advice on an open descriptor.
    unsafe {
        libc::posix_fadvise(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
            0,
            libc::POSIX_FADV_DONTNEED,
        )
    };
    std::fs::read(path).unwrap()
}

fn check_reads(mnt: &Path, files: &[(&str, Vec<u8>)], what: &str) {
    let big = &files[0];
    for (name, want) in files.iter().skip(1) {
        for direct in [true, false] {
            // Fill the reply buffers with random bytes first.
            let path = mnt.join(big.0);
            let junk = if direct {
                read_direct(&path, big.1.len())
            } else {
                read_buffered(&path)
            };
            assert!(junk == big.1, "{what}: {} read wrong", big.0);
            let path = mnt.join(name);
            let got = if direct {
                read_direct(&path, want.len())
            } else {
                read_buffered(&path)
            };
            assert_eq!(got.len(), want.len(), "{what}: length of {name}");
            if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
                panic!(
                    "{what}: {name} ({}) differs from what the kernel wrote at byte {i}: {:#x} instead of {:#x}",
                    if direct { "O_DIRECT" } else { "buffered" },
                    got[i],
                    want[i]
                );
            }
        }
    }
}

/// Makes the set with mkfs.btrfs (`profile` for data, RAID1 metadata on two devices) and
/// fills it through the kernel.
fn make_set(dir: &Path, devices: usize, profile: &str, files: &[(&str, Vec<u8>)]) -> Vec<PathBuf> {
    let images: Vec<PathBuf> = (0..devices)
        .map(|i| dir.join(format!("d{i}.img")))
        .collect();
    for img in &images {
        File::create(img).unwrap().set_len(512 << 20).unwrap();
    }
    let loops: Vec<_> = images
        .iter()
        .map(|i| LoopDevice::attach(i, false).expect("losetup"))
        .collect();
    let devs: Vec<String> = loops
        .iter()
        .map(|l| l.path().display().to_string())
        .collect();
    let meta = if devices > 1 { "raid1" } else { "dup" };
    sh(&format!(
        "mkfs.btrfs -q -f -d {profile} -m {meta} {}",
        devs.join(" ")
    ))
    .expect("mkfs.btrfs");
    let mnt = dir.join("kmnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let extra: String = devs[1..].iter().map(|d| format!(",device={d}")).collect();
    sh(&format!(
        "mount -o noatime{extra} {} {}",
        devs[0],
        mnt.display()
    ))
    .expect("mount");
    write_with_kernel(&mnt, files);
    sh(&format!("umount {}", mnt.display())).expect("umount");
    if devices > 1 {
        let _ = sh(&format!("btrfs device scan --forget {}", devs.join(" ")));
    }
    drop(loops);
    images
}

fn run(devices: usize, profile: &str) {
    let what = format!("read_reply_buffer ({devices} device(s), {profile})");
    if !require_root(&what) || !require_fuse(&what) || !require_mkfs_features(&what, &[]) {
        return;
    }
    let dir = TempDir::new("read-reply").unwrap();
    let files = contents(seed(0x5eed_0b0f) ^ devices as u64);
    let images = make_set(dir.path(), devices, profile, &files);
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    for uring in ["on", "off"] {
        let mut args = vec!["mount".to_string(), "-f".to_string(), "-o".to_string()];
        args.push(format!("ro,fuse_uring={uring}"));
        args.extend(images.iter().map(|i| i.display().to_string()));
        args.push(mnt.display().to_string());
        let mut child = std::process::Command::new(OLEO)
            .args(&args)
            .spawn()
            .expect("oleo mount");
        let t = std::time::Instant::now();
        while !is_mounted(&mnt) {
            assert!(t.elapsed().as_secs() < 20, "{what}: no mount");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        check_reads(&mnt, &files, &format!("{what}, fuse_uring={uring}"));
        sh(&format!("umount {}", mnt.display())).expect("umount oleo");
        assert!(child.wait().unwrap().success(), "{what}: oleo failed");
    }
}

#[test]
fn reads_into_a_used_reply_buffer_single() {
    run(1, "single");
}

#[test]
fn reads_into_a_used_reply_buffer_raid0() {
    run(2, "raid0");
}

#[test]
fn reads_into_a_used_reply_buffer_raid1() {
    run(2, "raid1");
}
