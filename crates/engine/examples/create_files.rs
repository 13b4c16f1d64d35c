//! The library's own create rate, without FUSE or the kernel: empty files made from N
//! threads, one directory each, a lookup of the name before each create (as the VFS does),
//! then the commit. What `bench/` measures through a mount is this plus FUSE.
//!
//!     cargo run --release -p oleo --example create_files -- IMAGE THREADS FILES_PER_THREAD
//!
//! `THRASH_KIB=N` in the environment writes N KiB of other memory between two files, as the
//! kernel and the application do between two requests to a FUSE server: how much of the
//! daemon's cost per create is caches found cold. `PINGPONG=process` (or `thread`) makes a
//! round trip through a pipe to another process (or thread) between two files, as a FUSE
//! request does, and times the creates alone: what switching to another address space and
//! back costs the engine's next create (one thread only). `ALTERNATE=CPU,CPU` makes the
//! files of one directory by two threads pinned to those CPUs, taking turns, one file
//! each, as a FUSE server's queue threads do when the application moves between CPUs.

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
    let thrash_kib: usize = std::env::var("THRASH_KIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let files: usize = args[3].parse().expect("FILES_PER_THREAD: a number");
    if let Ok(cpus) = std::env::var("ALTERNATE") {
        let cpus: Vec<usize> = cpus.split(',').map(|c| c.parse().expect("CPU")).collect();
        return alternate(&args[1], files, &cpus);
    }
    let pingpong = std::env::var("PINGPONG").ok();
    let partner = pingpong.as_deref().map(partner);
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
                    let mut other = vec![0u8; thrash_kib * 1024];
                    let mut thrashing = std::time::Duration::ZERO;
                    let mut creating = std::time::Duration::ZERO;
                    for i in 0..files {
                        if let Some((to, from)) = partner.filter(|_| t == 0) {
                            round_trip(to, from);
                        }
                        let c = Instant::now();
                        if thrash_kib > 0 {
                            let t = Instant::now();
                            for b in other.iter_mut().step_by(64) {
                                *b = b.wrapping_add(1);
                            }
                            thrashing += t.elapsed();
                        }
                        let name = format!("file-{i:08}");
                        let _ = fs.lookup(dir.id, name.as_bytes());
                        fs.mknod(dir.id, name.as_bytes(), &NewInode::file(0o644))?;
                        creating += c.elapsed();
                        // The rate of each 50,000 files: flat if nothing grows with the
                        // transaction.
                        if (i + 1) % 50_000 == 0 && t == 0 {
                            let rate = 50_000.0 / lap.elapsed().as_secs_f64();
                            println!("thread 0, files {}: {rate:.0}/s", i + 1);
                            lap = Instant::now();
                        }
                    }
                    if t == 0 {
                        println!(
                            "thread 0: {:.2} us per lookup and create",
                            creating.as_secs_f64() * 1e6 / files as f64
                        );
                    }
                    if thrash_kib > 0 && t == 0 {
                        println!(
                            "thread 0: {:.2} s of it writing other memory",
                            thrashing.as_secs_f64()
                        );
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

/// A partner that answers each byte written to it with a byte back: a child process or a
/// thread. Returns (write end to it, read end from it).
fn partner(kind: &str) -> (i32, i32) {
    let (mut a, mut b) = ([0i32; 2], [0i32; 2]);
    // SAFETY: pipe(2) fills the arrays.
    unsafe {
        assert_eq!(libc::pipe(a.as_mut_ptr()), 0);
        assert_eq!(libc::pipe(b.as_mut_ptr()), 0);
    }
    let (rx, tx) = (a[0], b[1]);
    let serve = move || loop {
        let mut byte = 0u8;
        // SAFETY: one byte into a local, one byte out of it.
        unsafe {
            if libc::read(rx, (&mut byte as *mut u8).cast(), 1) != 1 {
                libc::_exit(0);
            }
            libc::write(tx, (&byte as *const u8).cast(), 1);
        }
    };
    if kind == "process" {
        // SAFETY: the child only closes, reads and writes pipes, then exits (at EOF: when
        // the parent exits).
        if unsafe { libc::fork() } == 0 {
            unsafe {
                libc::close(a[1]);
                libc::close(b[0]);
            }
            serve();
        }
        // SAFETY: the child's ends, closed here once.
        unsafe {
            libc::close(a[0]);
            libc::close(b[1]);
        }
    } else {
        std::thread::spawn(serve);
    }
    (a[1], b[0])
}

fn round_trip(to: i32, from: i32) {
    let mut byte = 1u8;
    // SAFETY: one byte out of and into a local.
    unsafe {
        libc::write(to, (&byte as *const u8).cast(), 1);
        libc::read(from, (&mut byte as *mut u8).cast(), 1);
    }
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t filled by CPU_SET, passed by pointer with its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}

/// `files` files in one directory, made by two threads pinned to `cpus` in turn.
fn alternate(image: &str, files: usize, cpus: &[usize]) -> oleo::Result<()> {
    let fs = Filesystem::open_rw(image, OpenOptions::default())?;
    let dir = fs.mkdir(fs.root(), b"alt", &NewInode::dir(0o755))?.id;
    let turn = std::sync::Mutex::new(0usize);
    let cv = std::sync::Condvar::new();
    let spent: Vec<std::time::Duration> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|k| {
                let (fs, turn, cv) = (&fs, &turn, &cv);
                let cpu = cpus[k % cpus.len()];
                s.spawn(move || {
                    pin(cpu);
                    let mut spent = std::time::Duration::ZERO;
                    let mut i = k;
                    while i < files {
                        let mut t = turn.lock().expect("turn");
                        while *t % 2 != k {
                            t = cv.wait(t).expect("turn");
                        }
                        let name = format!("file-{i:08}");
                        let c = Instant::now();
                        let _ = fs.lookup(dir, name.as_bytes());
                        fs.mknod(dir, name.as_bytes(), &NewInode::file(0o644))
                            .expect("mknod");
                        spent += c.elapsed();
                        *t += 1;
                        drop(t);
                        cv.notify_all();
                        i += 2;
                    }
                    spent
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .collect()
    });
    let total: std::time::Duration = spent.iter().sum();
    println!(
        "alternating on CPUs {cpus:?}: {:.2} us per lookup and create",
        total.as_secs_f64() * 1e6 / files as f64
    );
    fs.close()
}
