//! Compressing new data (the kernel's compression.c and the choice in inode.c's
//! inode_need_compress / compress_file_range): which writes are compressed and how, the
//! incompressible-data heuristic, and cutting a write into compressed extents of at most
//! 128 KiB, on all cores and with no filesystem lock held.

use crate::error::{Error, Result};
use crate::inode::props::{property_type, PROPERTY};
use crate::transaction::fs::{FsCore, InodeId};
use oleo_format::compression::{compress, effective_level, MAX_UNCOMPRESSED};
use oleo_format::items::{
    Compression, INODE_FLAG_COMPRESS, INODE_FLAG_NOCOMPRESS, INODE_FLAG_NODATACOW,
    INODE_FLAG_NODATASUM,
};
use rayon::prelude::*;

/// How the data of one write is to be compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Policy {
    pub kind: Compression,
    pub level: i32,
    /// Ask the heuristic first (not under compress-force).
    pub heuristic: bool,
    /// Data that does not shrink marks the file NOCOMPRESS (neither compress-force nor a
    /// property).
    pub mark: bool,
}

impl Policy {
    /// Both would compress the same data the same way.
    pub(crate) fn same(&self, other: &Policy) -> bool {
        (self.kind, self.level, self.heuristic) == (other.kind, other.level, other.heuristic)
    }
}

impl FsCore {
    /// inode_need_compress with the algorithm compress_file_range picks: None when the
    /// file's data is written as it is.
    pub(crate) fn compress_policy(&self, id: InodeId, flags: u64) -> Result<Option<Policy>> {
        if flags & (INODE_FLAG_NODATACOW | INODE_FLAG_NODATASUM) != 0 {
            return Ok(None);
        }
        let mount = self.compress;
        let force = mount.is_some_and(|m| m.force);
        if !force && flags & INODE_FLAG_NOCOMPRESS != 0 {
            return Ok(None);
        }
        // The kernel sets COMPRESS whenever it applies a property, so only such files (and
        // a compressing mount, for the algorithm) need the xattr looked up.
        let prop = if flags & INODE_FLAG_COMPRESS != 0 || mount.is_some() {
            match self.getxattr(id, PROPERTY) {
                Ok(v) => property_type(&v),
                Err(Error::NoXattr) => None,
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        if mount.is_none() && flags & INODE_FLAG_COMPRESS == 0 && prop.is_none() {
            return Ok(None);
        }
        let kind = prop.or(mount.map(|m| m.kind)).unwrap_or(Compression::Zlib);
        let level = effective_level(kind, mount.map_or(0, |m| m.level));
        Ok(Some(Policy {
            kind,
            level,
            heuristic: !force,
            mark: !force && prop.is_none(),
        }))
    }
}

/// One piece of a write: `len` bytes of file data, compressed into `stream` (padded to
/// whole sectors) or stored as they are.
pub(crate) struct Chunk {
    pub len: u64,
    pub stream: Option<Vec<u8>>,
}

/// What became of a write's data.
pub(crate) struct Compressed {
    pub chunks: Vec<Chunk>,
    /// Some chunk passed the heuristic but did not shrink: the file turns NOCOMPRESS.
    pub incompressible: bool,
}

/// The threads that compress the pieces of a write, one per core; None if none could be
/// started (pieces then compress in turn).
pub(crate) fn workers() -> Option<&'static rayon::ThreadPool> {
    static WORKERS: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    WORKERS.get_or_init(build_workers).as_ref()
}

fn build_workers() -> Option<rayon::ThreadPool> {
    // A new thread inherits its creator's CPUs, and rayon counts them: the first writer to
    // compress may be a FUSE ring thread pinned to one CPU, which would leave one thread.
    let cpus = process_cpus();
    rayon::ThreadPoolBuilder::new()
        .num_threads(cpus.map_or(0, |(_, n)| n))
        .thread_name(|i| format!("oleo-compress-{i}"))
        .start_handler(move |_| {
            if let Some((set, _)) = cpus {
                // SAFETY: sched_setaffinity reads exactly the set's size. Failing leaves
                // the thread where it was: slower, never wrong.
                unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
            }
        })
        .build()
        .map_err(|e| log::warn!("no compression threads ({e}): one core compresses"))
        .ok()
}

/// The CPUs the process (its main thread) may run on, and how many.
fn process_cpus() -> Option<(libc::cpu_set_t, usize)> {
    // SAFETY: a zeroed cpu_set_t is valid; the calls read or write at most its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let size = std::mem::size_of_val(&set);
        let got = libc::sched_getaffinity(libc::getpid(), size, &mut set) == 0;
        got.then(|| (set, libc::CPU_COUNT(&set) as usize))
    }
}

/// Cuts `data` (sector-aligned length) into extents of at most 128 KiB and compresses
/// each that is worth it, in parallel. A compressed extent must free at least one sector
/// (compress_file_range's rule); a piece of one sector never can.
pub(crate) fn compress_chunks(policy: &Policy, data: &[u8], sectorsize: usize) -> Compressed {
    let one = |piece: &[u8]| -> (Chunk, bool) {
        let plain = Chunk {
            len: piece.len() as u64,
            stream: None,
        };
        if piece.len() <= sectorsize || (policy.heuristic && !worth_trying(piece)) {
            return (plain, false);
        }
        match compress(policy.kind, policy.level, piece, sectorsize) {
            Ok(mut z) if z.len().next_multiple_of(sectorsize) + sectorsize <= piece.len() => {
                z.resize(z.len().next_multiple_of(sectorsize), 0);
                (
                    Chunk {
                        len: piece.len() as u64,
                        stream: Some(z),
                    },
                    false,
                )
            }
            _ => (plain, true),
        }
    };
    let results: Vec<(Chunk, bool)> = match workers() {
        Some(pool) if data.len() > MAX_UNCOMPRESSED => {
            pool.install(|| data.par_chunks(MAX_UNCOMPRESSED).map(one).collect())
        }
        _ => data.chunks(MAX_UNCOMPRESSED).map(one).collect(),
    };
    let incompressible = policy.mark && results.iter().any(|r| r.1);
    Compressed {
        chunks: results.into_iter().map(|r| r.0).collect(),
        incompressible,
    }
}

/// The compressed inline extent of a whole small file (at most a sector), when `content`
/// compresses below a sector and `max_inline`. As in the kernel, zlib and zstd give up on
/// output no smaller than the input, LZO only past two sectors (so it may store a tiny
/// file inflated). Unlike the kernel, a failure here never marks the file NOCOMPRESS: the
/// kernel tries at writeback, when later appends have usually joined the first bytes;
/// oleo tries at each write (FUSE writes back at every close), and one short first write
/// must not turn compression off for what is appended to it.
pub(crate) fn compress_inline(
    policy: &Policy,
    content: &[u8],
    sectorsize: usize,
    max_inline: u64,
) -> Option<Vec<u8>> {
    if policy.heuristic && !worth_trying(content) {
        return None;
    }
    let z = compress(policy.kind, policy.level, content, sectorsize).ok()?;
    let shrank = z.len() < content.len() || policy.kind == Compression::Lzo;
    (shrank && z.len() < sectorsize && z.len() as u64 <= max_inline).then_some(z)
}

/// Bytes read from each sampling position, and the distance between positions.
const SAMPLE_READ: usize = 16;
const SAMPLE_EVERY: usize = 256;
/// Fewer distinct bytes than this: text-like, compress.
const BYTE_SET_SMALL: usize = 64;
/// How many of the most frequent bytes make up 90% of the sample: this few compress, this
/// many are noise.
const CORE_SET_LOW: usize = 64;
const CORE_SET_HIGH: usize = 200;
/// Entropy in percent of 8 bits per byte: at most this compresses (the kernel also lets
/// anything under 80 through).
const ENTROPY_HIGH: f64 = 80.0;

/// The kernel's btrfs_compress_heuristic on the first 128 KiB of `data`: sample 16 bytes
/// every 256, then compress when the sample repeats itself, uses few distinct bytes, has a
/// small core of frequent bytes, or has low byte entropy.
pub(crate) fn worth_trying(data: &[u8]) -> bool {
    let data = &data[..data.len().min(MAX_UNCOMPRESSED)];
    let mut sample = Vec::with_capacity(data.len() / SAMPLE_EVERY * SAMPLE_READ + SAMPLE_READ);
    let mut at = 0;
    while at + SAMPLE_READ <= data.len() {
        sample.extend_from_slice(&data[at..at + SAMPLE_READ]);
        at += SAMPLE_EVERY;
    }
    if sample.is_empty() {
        return true;
    }
    let half = sample.len() / 2;
    if sample[..half] == sample[half..2 * half] {
        return true;
    }
    // Four tables: a run of one byte value (zeros) would otherwise wait on one counter.
    let mut lanes = [[0u32; 256]; 4];
    let mut quads = sample.chunks_exact(4);
    for q in &mut quads {
        for (lane, &b) in lanes.iter_mut().zip(q) {
            lane[b as usize] += 1;
        }
    }
    for &b in quads.remainder() {
        lanes[0][b as usize] += 1;
    }
    let counts: [u32; 256] = std::array::from_fn(|i| lanes.iter().map(|l| l[i]).sum());
    if counts.iter().filter(|&&c| c > 0).count() < BYTE_SET_SMALL {
        return true;
    }
    let mut sorted = counts;
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    // How many of the most frequent bytes make up 90% (counted as the kernel does: the
    // first 64 at once, then one by one up to 200).
    let threshold = sample.len() as u64 * 90 / 100;
    let mut sum: u64 = sorted[..CORE_SET_LOW].iter().map(|&c| u64::from(c)).sum();
    let mut core = CORE_SET_LOW;
    if sum <= threshold {
        while core < CORE_SET_HIGH && sorted[core] > 0 {
            sum += u64::from(sorted[core]);
            if sum > threshold {
                break;
            }
            core += 1;
        }
    }
    if core <= CORE_SET_LOW {
        return true;
    }
    if core >= CORE_SET_HIGH {
        return false;
    }
    let n = sample.len() as f64;
    let entropy: f64 = counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = f64::from(c) / n;
            -p * p.log2()
        })
        .sum();
    entropy * 100.0 / 8.0 < ENTROPY_HIGH
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(len: usize, seed: u64) -> Vec<u8> {
        oleo_testkit::ops::pattern(seed, len)
    }

    /// CPUs `pid`'s thread may run on (0: this thread).
    fn cpus_of(pid: libc::pid_t) -> usize {
        // SAFETY: a zeroed cpu_set_t is valid; the call writes exactly its size.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(
                libc::sched_getaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
                0
            );
            libc::CPU_COUNT(&set) as usize
        }
    }

    #[test]
    fn compression_threads_use_every_cpu_even_when_built_by_a_pinned_thread() {
        // SAFETY: getpid has no preconditions.
        let all = cpus_of(unsafe { libc::getpid() });
        let seen = std::thread::spawn(|| {
            // SAFETY: as above; CPU_SET stays inside the set.
            unsafe {
                let mut one: libc::cpu_set_t = std::mem::zeroed();
                let size = std::mem::size_of::<libc::cpu_set_t>();
                assert_eq!(libc::sched_getaffinity(0, size, &mut one), 0);
                let first = (0..libc::CPU_SETSIZE as usize)
                    .find(|&c| libc::CPU_ISSET(c, &one))
                    .unwrap();
                libc::CPU_ZERO(&mut one);
                libc::CPU_SET(first, &mut one);
                assert_eq!(libc::sched_setaffinity(0, size, &one), 0);
            }
            assert_eq!(cpus_of(0), 1);
            let pool = build_workers().expect("compression threads");
            pool.broadcast(|_| cpus_of(0))
        })
        .join()
        .unwrap();
        assert_eq!(seen.len(), all, "one thread per CPU");
        assert!(seen.iter().all(|&n| n == all), "{seen:?} of {all} CPUs");
    }

    #[test]
    fn heuristic_tells_noise_from_text_and_zeros() {
        assert!(!worth_trying(&noise(131072, 7)));
        assert!(worth_trying(&vec![0u8; 131072]));
        let text: Vec<u8> = b"the quick brown fox jumps over the lazy dog; "
            .iter()
            .cycle()
            .take(131072)
            .copied()
            .collect();
        assert!(worth_trying(&text));
    }

    #[test]
    fn chunks_of_128k_compressed_only_when_a_sector_is_saved() {
        let policy = Policy {
            kind: Compression::Zstd,
            level: 0,
            heuristic: true,
            mark: true,
        };
        let mut data = vec![0u8; 300 << 10];
        data[131072..262144].copy_from_slice(&noise(131072, 3));
        let c = compress_chunks(&policy, &data, 4096);
        let lens: Vec<u64> = c.chunks.iter().map(|c| c.len).collect();
        assert_eq!(lens, [131072, 131072, 45056]);
        assert!(c.chunks[0].stream.as_ref().is_some_and(|s| s.len() == 4096));
        assert!(c.chunks[1].stream.is_none());
        assert!(c.chunks[2].stream.is_some());
        // The heuristic turned the noise away before trying: no mark.
        assert!(!c.incompressible);
        let forced = Policy {
            heuristic: false,
            mark: false,
            ..policy
        };
        let c = compress_chunks(&forced, &data, 4096);
        assert!(c.chunks[1].stream.is_none() && !c.incompressible);
    }
}
