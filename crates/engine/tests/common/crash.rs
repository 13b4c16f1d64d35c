//! Crash states from a recorded write/flush stream, shared by the crash tests.

use oleo::device::IoEvent;
use oleo_testkit::ops::Rng;
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Copies only the allocated ranges (the base image is mostly holes).
pub fn sparse_copy(from: &Path, to: &Path) {
    let src = std::fs::File::open(from).unwrap();
    let len = src.metadata().unwrap().len();
    let dst = std::fs::File::create(to).unwrap();
    dst.set_len(len).unwrap();
    let fd = {
        use std::os::fd::AsRawFd;
        src.as_raw_fd()
    };
    let mut at: i64 = 0;
    let mut buf = vec![0u8; 1 << 20];
    while (at as u64) < len {
        let data = unsafe { libc::lseek(fd, at, libc::SEEK_DATA) };
        if data < 0 {
            break;
        }
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        let mut pos = data as u64;
        while pos < hole as u64 {
            let n = ((hole as u64 - pos) as usize).min(buf.len());
            src.read_exact_at(&mut buf[..n], pos).unwrap();
            dst.write_all_at(&buf[..n], pos).unwrap();
            pos += n as u64;
        }
        at = hole;
    }
    let _ = (&src).seek(SeekFrom::Start(0));
}

/// Rebuilds the image as a crash after `events[..n]`, dropping each write issued after the
/// last flush of the prefix with probability one half.
pub fn crash_image(base: &Path, out: &Path, events: &[IoEvent], n: usize, rng: &mut Rng) -> usize {
    sparse_copy(base, out);
    let last_flush = events[..n]
        .iter()
        .rposition(|e| *e == IoEvent::Flush)
        .map_or(0, |i| i + 1);
    let f = std::fs::OpenOptions::new().write(true).open(out).unwrap();
    let mut dropped = 0;
    for (i, e) in events[..n].iter().enumerate() {
        if let IoEvent::Write { offset, data } = e {
            if i >= last_flush && rng.below(2) == 0 {
                dropped += 1;
                continue;
            }
            f.write_all_at(data, *offset).unwrap();
        }
    }
    dropped
}
