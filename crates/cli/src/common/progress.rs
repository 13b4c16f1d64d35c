//! A one-line progress meter for `oleo send`, `receive`, `cp` and `tar` on a terminal: bytes of
//! stream so far, rate and elapsed time, redrawn at most four times a second over itself
//! with \r, cleared at the end. Nothing at all unless stderr is a terminal (scripts and
//! tests see the plain output btrfs-progs gives).

use std::io::{IsTerminal, Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const EVERY: Duration = Duration::from_millis(250);

struct State {
    start: Instant,
    last: Instant,
    bytes: u64,
    /// A line is on the screen.
    shown: bool,
}

impl State {
    fn draw(&mut self) {
        let secs = self.start.elapsed().as_secs_f64();
        let rate = if secs > 0.0 {
            (self.bytes as f64 / secs) as u64
        } else {
            0
        };
        let t = secs as u64;
        let line = format!(
            "\r{} {}/s {}:{:02}:{:02}\x1b[K",
            size(self.bytes),
            size(rate),
            t / 3600,
            t / 60 % 60,
            t % 60
        );
        let mut e = std::io::stderr().lock();
        let _ = e.write_all(line.as_bytes()).and_then(|()| e.flush());
        self.shown = true;
    }

    fn clear(&mut self) {
        if self.shown {
            let mut e = std::io::stderr().lock();
            let _ = e.write_all(b"\r\x1b[K").and_then(|()| e.flush());
            self.shown = false;
        }
    }
}

impl Drop for State {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Binary units with two decimals, as `btrfs` prints sizes.
fn size(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n}B")
    } else {
        format!("{v:.2}{}", UNITS[u])
    }
}

/// The meter of one stream; clones share it. The line goes when the last clone does.
#[derive(Clone)]
pub struct Meter(Option<Arc<Mutex<State>>>);

impl Meter {
    /// A meter that shows only if stderr is a terminal and not `quiet`.
    pub fn new(quiet: bool) -> Meter {
        Meter::shown(!quiet && std::io::stderr().is_terminal())
    }

    fn shown(on: bool) -> Meter {
        let now = Instant::now();
        Meter(on.then(|| {
            Arc::new(Mutex::new(State {
                start: now,
                last: now,
                bytes: 0,
                shown: false,
            }))
        }))
    }

    /// Counts `n` more bytes; redraws if the last drawing is old enough.
    pub fn add(&self, n: usize) {
        let Some(s) = &self.0 else { return };
        let Ok(mut s) = s.lock() else { return };
        s.bytes += n as u64;
        if s.last.elapsed() >= EVERY {
            s.last = Instant::now();
            s.draw();
        }
    }

    /// Takes the line away so that other text can be printed; the next count draws it
    /// again.
    pub fn clear(&self) {
        if let Some(Ok(mut s)) = self.0.as_ref().map(|s| s.lock()) {
            s.clear();
        }
    }

    /// `r`, counted.
    pub fn reader<R: Read>(&self, r: R) -> Counted<R> {
        Counted {
            inner: r,
            meter: self.clone(),
        }
    }

    /// `w`, counted.
    pub fn writer<W: Write>(&self, w: W) -> Counted<W> {
        Counted {
            inner: w,
            meter: self.clone(),
        }
    }
}

/// A reader or writer whose bytes the meter counts.
pub struct Counted<T> {
    inner: T,
    meter: Meter,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.meter.add(n);
        Ok(n)
    }
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.meter.add(n);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_btrfs_prints_them() {
        assert_eq!(size(0), "0B");
        assert_eq!(size(1023), "1023B");
        assert_eq!(size(1536), "1.50KiB");
        assert_eq!(size(3 << 30), "3.00GiB");
    }

    #[test]
    fn counts_pass_data_through_unchanged() {
        let m = Meter::shown(false);
        let mut r = m.reader(&b"stream bytes"[..]);
        let mut got = Vec::new();
        r.read_to_end(&mut got).unwrap();
        let mut w = m.writer(Vec::new());
        w.write_all(&got).unwrap();
        assert_eq!(w.inner, b"stream bytes");
    }
}
