//! The library's own rate for 4 KiB writes at random places of preallocated files, without
//! FUSE or the kernel: what the seed-002 and snapshot-under-write rows ask of the engine.
//! Each thread fallocates a file of its own, then writes 4 KiB pieces at random sector
//! offsets of it (a fixed seed per thread) until the time is up, as the kernel's writeback
//! of a FUSE mount sends them (`write_keep_times`). Then the commit.
//!
//!     cargo run --release -p oleo --example prealloc_fill -- IMAGE THREADS MIB SECONDS
//!
//! `SAME_FILE=1` in the environment has every thread write into one file instead.

use oleo::{FallocMode, Filesystem, NewInode, OpenOptions};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The allocator oleo's binary uses.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> oleo::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5 {
        eprintln!("usage: prealloc_fill IMAGE THREADS MIB SECONDS");
        std::process::exit(2);
    }
    let threads: usize = args[2].parse().expect("THREADS: a number");
    let mib: u64 = args[3].parse().expect("MIB: a number");
    let seconds: f64 = args[4].parse().expect("SECONDS: a number");
    let same = std::env::var("SAME_FILE").is_ok_and(|v| v == "1");
    let fs = Filesystem::open_rw(&args[1], OpenOptions::default())?;
    let root = fs.root();
    let size = mib << 20;
    let files: Vec<_> = (0..if same { 1 } else { threads })
        .map(|t| -> oleo::Result<_> {
            let f = fs.mknod(root, format!("f{t}").as_bytes(), &NewInode::file(0o644))?;
            fs.fallocate(f.id, 0, size, FallocMode::Allocate { keep_size: false })?;
            Ok(f.id)
        })
        .collect::<oleo::Result<_>>()?;
    fs.sync()?;
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|s| -> oleo::Result<()> {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (fs, stop, done) = (&fs, &stop, &done);
                let id = files[if same { 0 } else { t }];
                s.spawn(move || -> oleo::Result<()> {
                    let data = vec![0x5au8 ^ t as u8; 4096];
                    // xorshift64, seeded per thread: the same offsets every run.
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (t as u64 + 1);
                    let sectors = size / 4096;
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        fs.write_keep_times(id, (x % sectors) * 4096, &data, false)?;
                        n += 1;
                    }
                    done.fetch_add(n, Ordering::Relaxed);
                    Ok(())
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(seconds));
        stop.store(true, Ordering::Relaxed);
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("worker panicked"))
    })?;
    let took = start.elapsed().as_secs_f64();
    let n = done.load(Ordering::Relaxed);
    let commit = Instant::now();
    fs.close()?;
    println!(
        "{n} writes in {took:.2} s ({:.0}/s, {:.1} us each per thread), commit {:.2} s",
        n as f64 / took,
        took * 1e6 * threads as f64 / n as f64,
        commit.elapsed().as_secs_f64()
    );
    Ok(())
}
