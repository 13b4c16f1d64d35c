//! The library's own create rate, without FUSE or the kernel: empty files made from N
//! threads, one directory each, a lookup of the name before each create (as the VFS does),
//! then the commit. What `bench/` measures through a mount is this plus FUSE.
//!
//!     cargo run --release -p oleo --example create_files -- IMAGE THREADS FILES_PER_THREAD

use oleo::{Filesystem, NewInode, OpenOptions};
use std::time::Instant;

/// The allocator oleo's binary uses.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> oleo::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: create_files IMAGE THREADS FILES_PER_THREAD");
        std::process::exit(2);
    }
    let threads: usize = args[2].parse().expect("THREADS: a number");
    let files: usize = args[3].parse().expect("FILES_PER_THREAD: a number");
    let fs = Filesystem::open_rw(&args[1], OpenOptions::default())?;
    let root = fs.root();
    let start = Instant::now();
    std::thread::scope(|s| -> oleo::Result<()> {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let fs = &fs;
                s.spawn(move || -> oleo::Result<()> {
                    let dir = fs.mkdir(root, format!("d{t}").as_bytes(), &NewInode::dir(0o755))?;
                    let mut lap = Instant::now();
                    for i in 0..files {
                        let name = format!("file-{i:08}");
                        let _ = fs.lookup(dir.id, name.as_bytes());
                        fs.mknod(dir.id, name.as_bytes(), &NewInode::file(0o644))?;
                        // The rate of each 50,000 files: flat if nothing grows with the
                        // transaction.
                        if (i + 1) % 50_000 == 0 && t == 0 {
                            let rate = 50_000.0 / lap.elapsed().as_secs_f64();
                            println!("thread 0, files {}: {rate:.0}/s", i + 1);
                            lap = Instant::now();
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("worker panicked"))
    })?;
    let made = start.elapsed().as_secs_f64();
    let commit = Instant::now();
    fs.close()?;
    let n = threads * files;
    println!(
        "{n} files in {made:.2} s ({:.0}/s), commit {:.2} s",
        n as f64 / made,
        commit.elapsed().as_secs_f64()
    );
    Ok(())
}
