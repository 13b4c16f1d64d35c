//! Device writes done by a thread of their own, in the order they were given: for a
//! filesystem filled by one thread (`oleo cp`, `oleo tar -x` into an image), whose writes of
//! file data into the image (the host's page-cache copy, a sixth of such a run) then run
//! beside the tree work instead of inside it. `OpenOptions::write_behind` turns it on.
//!
//! Nothing reads past it: `DeviceSet` waits for every queued write before any read of a
//! device, flush, superblock write or discard (`drain`), so what a read or a commit sees is
//! what was written, in order. A write that fails is counted and logged, and from then on
//! every `drain` returns it: a read that drains first cannot consume it, so every later
//! flush, and with it every commit, fails, and nothing claims the data durable.

use crate::error::{Error, Result};
use crate::io::device::{Device, IoBuf};
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// Bytes queued and not yet written, at most: a writer that gets ahead waits.
const QUEUED_MAX: usize = 64 << 20;
/// An idle writer thread is woken once this much is queued (or by a drain): a wakeup per
/// small file cost the filling thread a tenth of its time (a futex wake, an idle vCPU).
const WAKE_AT: usize = 8 << 20;

/// One write: `data` at `physical` of device `devid`.
struct Job {
    devid: u64,
    physical: u64,
    data: IoBuf,
    uncached: bool,
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    /// Bytes in `jobs` and in the write running now.
    bytes: usize,
    /// A write is running (taken off `jobs`, not done).
    busy: bool,
    /// The first failed write, for good: what every drain from then on returns.
    failed: Option<String>,
    /// Devids whose writes failed since the last `drain`, for their error counters.
    failed_devids: Vec<u64>,
    closing: bool,
    /// The writer thread waits for work.
    idle: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when a job is queued or closing starts (the writer waits on it).
    queued: Condvar,
    /// Signalled when a job is done (waiters for room and for the queue to empty).
    done: Condvar,
}

/// The queue and its writer thread.
pub(crate) struct WriteBehind {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl WriteBehind {
    /// Starts the writer for these devices.
    pub(crate) fn start(devices: BTreeMap<u64, Arc<Device>>) -> Result<WriteBehind> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            queued: Condvar::new(),
            done: Condvar::new(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("oleo-write-behind".into())
            .spawn(move || writer(&s, &devices))
            .map_err(Error::Io)?;
        Ok(WriteBehind {
            shared,
            thread: Some(thread),
        })
    }

    /// Queues a copy of `buf` for `physical` of `devid`; waits while the queue is full.
    pub(crate) fn write(&self, devid: u64, buf: &[u8], physical: u64, uncached: bool) {
        let data = IoBuf::copy_of(buf);
        let mut st = self.shared.state.lock();
        while st.bytes > 0 && st.bytes + buf.len() > QUEUED_MAX {
            if st.idle {
                st.idle = false;
                self.shared.queued.notify_one();
            }
            self.shared.done.wait(&mut st);
        }
        st.bytes += buf.len();
        st.jobs.push_back(Job {
            devid,
            physical,
            data,
            uncached,
        });
        if st.idle && st.bytes >= WAKE_AT {
            st.idle = false;
            self.shared.queued.notify_one();
        }
    }

    /// Waits until every queued write is done. Returns the first write that ever failed,
    /// if any (and the devids of failures since the last drain, to count).
    pub(crate) fn drain(&self) -> (Result<()>, Vec<u64>) {
        let mut st = self.shared.state.lock();
        if st.idle && !st.jobs.is_empty() {
            st.idle = false;
            self.shared.queued.notify_one();
        }
        while !st.jobs.is_empty() || st.busy {
            self.shared.done.wait(&mut st);
        }
        let devids = std::mem::take(&mut st.failed_devids);
        match &st.failed {
            None => (Ok(()), devids),
            Some(what) => (Err(Error::Io(std::io::Error::other(what.clone()))), devids),
        }
    }
}

impl Drop for WriteBehind {
    fn drop(&mut self) {
        let (r, _) = self.drain();
        if let Err(e) = r {
            log::error!("{e}");
        }
        self.shared.state.lock().closing = true;
        self.shared.queued.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn writer(shared: &Shared, devices: &BTreeMap<u64, Arc<Device>>) {
    loop {
        let job = {
            let mut st = shared.state.lock();
            loop {
                if let Some(job) = st.jobs.pop_front() {
                    st.busy = true;
                    break job;
                }
                if st.closing {
                    return;
                }
                st.idle = true;
                shared.queued.wait(&mut st);
                st.idle = false;
            }
        };
        let r = match devices.get(&job.devid) {
            Some(dev) => dev.write_all_at_mode(&job.data, job.physical, job.uncached),
            None => Err(Error::Io(std::io::Error::other("no such device"))),
        };
        let mut st = shared.state.lock();
        st.busy = false;
        st.bytes = st.bytes.saturating_sub(job.data.len());
        if let Err(e) = r {
            log::error!(
                "device {}: write error at physical {}: {e}",
                job.devid,
                job.physical
            );
            st.failed_devids.push(job.devid);
            if st.failed.is_none() {
                st.failed = Some(format!(
                    "device {}: write at physical {} failed: {e}",
                    job.devid, job.physical
                ));
            }
        }
        drop(st);
        shared.done.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_land_in_order_and_a_failure_stays_until_reopened() {
        let path = std::env::temp_dir().join(format!("oleo-write-behind-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 1 << 20]).expect("scratch file");
        let dev = Arc::new(Device::open_rw(&path).expect("open"));
        let wb = WriteBehind::start([(1, Arc::clone(&dev))].into_iter().collect()).expect("start");
        // Two writes to the same place: the second one is what stays.
        wb.write(1, &[1u8; 4096], 8192, false);
        wb.write(1, &[2u8; 4096], 8192, false);
        assert!(wb.drain().0.is_ok());
        let mut back = vec![0u8; 4096];
        dev.read_exact_at(&mut back, 8192).expect("read");
        assert!(back.iter().all(|&b| b == 2), "writes landed out of order");
        // A failed write, then the device works again: every drain still says so, and the
        // failure is counted once.
        dev.fail_writes_after(0);
        wb.write(1, &[3u8; 4096], 0, false);
        let (first, devids) = wb.drain();
        assert!(first.is_err() && devids == [1], "{first:?} {devids:?}");
        dev.fail_writes_after(u64::MAX);
        wb.write(1, &[4u8; 4096], 4096, false);
        let (again, devids) = wb.drain();
        assert!(again.is_err(), "a later drain forgot the failed write");
        assert!(devids.is_empty());
        drop(wb);
        let _ = std::fs::remove_file(&path);
    }
}
