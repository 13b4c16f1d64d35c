//! Reading ahead on a thread of its own: what `oleo tar -x` extracts is read (and
//! decompressed) beside the extraction, which holds the filesystem's one writer, so the
//! two use two CPUs instead of taking turns on one.

use std::io::{self, Read};
use std::sync::mpsc::{sync_channel, Receiver};

/// A reader fed by a thread that reads `inner` in chunks, up to `depth` chunks ahead.
/// An error of `inner` reaches the consumer where it happened in the stream; dropping
/// the reader stops the thread at its next chunk.
pub struct ReadAhead {
    rx: Receiver<io::Result<Vec<u8>>>,
    cur: Vec<u8>,
    pos: usize,
    /// The stream ended (or failed, and the failure was handed out).
    done: bool,
}

impl ReadAhead {
    /// Starts the thread (an error if the system has none to give).
    pub fn spawn(
        mut inner: Box<dyn Read + Send>,
        chunk: usize,
        depth: usize,
    ) -> io::Result<ReadAhead> {
        let (tx, rx) = sync_channel(depth.max(1));
        let chunk = chunk.max(1);
        std::thread::Builder::new()
            .name("read-ahead".into())
            .spawn(move || loop {
                let mut buf = vec![0u8; chunk];
                let mut len = 0;
                let r = loop {
                    match inner.read(&mut buf[len..]) {
                        Ok(0) => break Ok(()),
                        Ok(n) => {
                            len += n;
                            if len == buf.len() {
                                break Ok(());
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => break Err(e),
                    }
                };
                buf.truncate(len);
                let last = len < chunk || r.is_err();
                if len > 0 && tx.send(Ok(buf)).is_err() {
                    return;
                }
                if let Err(e) = r {
                    let _ = tx.send(Err(e));
                }
                if last {
                    return;
                }
            })?;
        Ok(ReadAhead {
            rx,
            cur: Vec::new(),
            pos: 0,
            done: false,
        })
    }
}

impl Read for ReadAhead {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.cur.len() {
            if self.done || out.is_empty() {
                return Ok(0);
            }
            match self.rx.recv() {
                Ok(Ok(buf)) => {
                    self.cur = buf;
                    self.pos = 0;
                }
                Ok(Err(e)) => {
                    self.done = true;
                    return Err(e);
                }
                // The thread is done: the stream ended.
                Err(_) => {
                    self.done = true;
                    return Ok(0);
                }
            }
        }
        let n = out.len().min(self.cur.len() - self.pos);
        out[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands out its bytes a few at a time, then fails once if told to.
    struct Trickle {
        data: Vec<u8>,
        at: usize,
        fail_at_end: bool,
    }

    impl Read for Trickle {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            if self.at == self.data.len() {
                if std::mem::take(&mut self.fail_at_end) {
                    return Err(io::Error::other("the device went away"));
                }
                return Ok(0);
            }
            let n = out.len().min(7).min(self.data.len() - self.at);
            out[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 % 251) as u8).collect()
    }

    #[test]
    fn hands_out_the_stream_unchanged_whatever_the_chunk_size() {
        for (len, chunk) in [
            (0, 4),
            (1, 4),
            (4, 4),
            (1000, 4),
            (1000, 64),
            (1000, 1000),
            (1000, 4096),
        ] {
            let want = data(len);
            let t = Trickle {
                data: want.clone(),
                at: 0,
                fail_at_end: false,
            };
            let mut got = Vec::new();
            ReadAhead::spawn(Box::new(t), chunk, 2)
                .unwrap()
                .read_to_end(&mut got)
                .unwrap();
            assert_eq!(got, want, "len {len} chunk {chunk}");
        }
    }

    #[test]
    fn an_error_comes_after_the_bytes_before_it() {
        let want = data(100);
        let t = Trickle {
            data: want.clone(),
            at: 0,
            fail_at_end: true,
        };
        let mut r = ReadAhead::spawn(Box::new(t), 16, 2).unwrap();
        let mut got = vec![0u8; 100];
        r.read_exact(&mut got).unwrap();
        assert_eq!(got, want);
        let e = r.read(&mut [0u8; 8]).unwrap_err();
        assert_eq!(e.to_string(), "the device went away");
        assert_eq!(r.read(&mut [0u8; 8]).unwrap(), 0, "nothing after the error");
    }

    #[test]
    fn dropping_the_reader_stops_the_thread() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        // An endless source that says when the thread lets go of it.
        struct Endless(Arc<AtomicBool>);
        impl Read for Endless {
            fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
                out.fill(1);
                Ok(out.len())
            }
        }
        impl Drop for Endless {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let gone = Arc::new(AtomicBool::new(false));
        let mut r = ReadAhead::spawn(Box::new(Endless(Arc::clone(&gone))), 1024, 2).unwrap();
        let mut b = [0u8; 10];
        r.read_exact(&mut b).unwrap();
        assert!(!gone.load(Ordering::SeqCst));
        drop(r);
        let t0 = std::time::Instant::now();
        while !gone.load(Ordering::SeqCst) {
            assert!(t0.elapsed().as_secs() < 10, "the thread still reads");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}
