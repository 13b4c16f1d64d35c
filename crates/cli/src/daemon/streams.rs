//! `oleo send MNT/SNAPSHOT` and `oleo receive MNT/DIR` on a mounted oleo filesystem. The
//! image is the mount's server's alone, so the server sends or receives, with the very code
//! the `--image` forms run (`Hook`, registered when a mount starts). This side makes a
//! FIFO in a private directory, asks the server through an ioctl on a file of the mount
//! (`subvol_ioctl::SEND`, `RECEIVE`), and copies the stream between the FIFO and its own
//! input or output meanwhile; the ioctl's answer brings the lines to print and the error.

use crate::common::on_mount;
use crate::common::progress::Meter;
use oleo_fuse::subvol_ioctl as cmd;
use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A FIFO in a fresh 0700 directory, both gone when dropped.
struct Fifo {
    dir: PathBuf,
    path: PathBuf,
}

impl Fifo {
    fn new() -> Result<Fifo, String> {
        let template = std::env::temp_dir().join("oleo-stream-XXXXXX");
        let mut t = CString::new(template.as_os_str().as_bytes())
            .map_err(|_| "a NUL byte in the temporary directory's path".to_string())?
            .into_bytes_with_nul();
        // SAFETY: t is a writable NUL-terminated template, as mkdtemp wants.
        if unsafe { libc::mkdtemp(t.as_mut_ptr().cast()) }.is_null() {
            let e = std::io::Error::last_os_error();
            return Err(format!(
                "cannot make a directory in {}: {e}",
                template.display()
            ));
        }
        t.pop();
        let dir = PathBuf::from(std::ffi::OsString::from_vec(t));
        let path = dir.join("stream");
        let fifo = Fifo { dir, path };
        let c = CString::new(fifo.path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
        clean_up_on_signals(&fifo.path, &fifo.dir);
        // SAFETY: c is a NUL-terminated path.
        if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(format!("cannot make a FIFO in {}: {e}", fifo.dir.display()));
        }
        Ok(fifo)
    }
}

/// Opens the FIFO at `path` (`nonblock`: reads that find it empty return at once).
fn open_fifo(path: &Path, read: bool, write: bool, nonblock: bool) -> Result<File, String> {
    std::fs::OpenOptions::new()
        .read(read)
        .write(write)
        .custom_flags(if nonblock { libc::O_NONBLOCK } else { 0 })
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Gives the calling thread a descriptor table of its own, so that the FIFO's ends it opens
/// are not the whole process's. A killed command cannot end while a thread waits on the
/// server (FUSE waits out a request the server has taken), and the server may be waiting on
/// the FIFO: this thread's exit closes its ends, which ends the server's wait.
fn own_descriptors() -> Result<(), String> {
    // SAFETY: unshare with a valid flag.
    if unsafe { libc::unshare(libc::CLONE_FILES) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!("unshare(CLONE_FILES): {e}"));
    }
    Ok(())
}

/// Takes the FIFO and its directory away when Ctrl-C, a closed terminal or kill ends the
/// command (destructors do not run then); the signal then does what it would have. A handler
/// would not do: a thread waiting on the server (the ioctl) runs none until the server
/// answers, so the signals are blocked in every thread and taken by one with sigwait. Call
/// it before any other thread is started.
fn clean_up_on_signals(fifo: &Path, dir: &Path) {
    crate::daemon::stop::block();
    // SAFETY: sigemptyset initializes the set; sigaddset takes valid signal numbers.
    let set = unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        set
    };
    let (fifo, dir) = (fifo.to_path_buf(), dir.to_path_buf());
    std::thread::spawn(move || {
        let mut sig = 0;
        // SAFETY: a valid set; sig is written by the call.
        if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
            return;
        }
        let _ = std::fs::remove_file(&fifo);
        let _ = std::fs::remove_dir(&dir);
        // SAFETY: the default action of a signal we took, raised again in this thread.
        unsafe {
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    });
}

impl Drop for Fifo {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Asks the server of the mount `path` is on for `c` with `arg`; its answer.
fn ask(path: &Path, c: u32, mut arg: Vec<u8>) -> Result<cmd::StreamReply, String> {
    let f = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    match on_mount::raw_ioctl(&f, c, &mut arg) {
        Ok(()) => cmd::StreamReply::parse(&arg)
            .ok_or_else(|| format!("{}: the server gave no answer", path.display())),
        Err(e) if e.raw_os_error() == Some(libc::ENOTTY) => Err(format!(
            "the oleo serving {} cannot send or receive on a mount (it is older than this \
             command: remount with this oleo, or use --image on the unmounted image)",
            path.display()
        )),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Prints the server's lines where they belong (the meter's line out of the way first).
fn print_lines(reply: &cmd::StreamReply, meter: &Meter) {
    for (fd, text) in &reply.lines {
        meter.clear();
        let text = String::from_utf8_lossy(text);
        if *fd == cmd::STDOUT {
            println!("{text}");
        } else {
            eprintln!("{text}");
        }
    }
}

fn reply_error(reply: &cmd::StreamReply) -> String {
    String::from_utf8_lossy(&reply.error).into_owned()
}

/// `oleo send [-p PARENT] [-c SRC]... [-f FILE] SNAPSHOT` with SNAPSHOT on a mount.
pub fn send(
    snapshot: &Path,
    parent: Option<&Path>,
    clone_sources: &[PathBuf],
    proto: u32,
    compressed: bool,
    file: Option<&Path>,
    quiet: bool,
) -> Result<(), String> {
    let snap = on_mount::subvolume_root(snapshot)?;
    if snap.flags & cmd::RO == 0 {
        return Err(format!("subvolume {} is not read-only", snapshot.display()));
    }
    let dev = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.dev())
            .map_err(|e| format!("{}: {e}", p.display()))
    };
    let here = dev(snapshot)?;
    let on_same = |p: &Path| -> Result<u64, String> {
        let s = on_mount::subvolume_root(p)?;
        if dev(p)? != here {
            return Err(format!(
                "{} is not on the filesystem of {}",
                p.display(),
                snapshot.display()
            ));
        }
        Ok(s.id)
    };
    let parent = parent.map(on_same).transpose()?.unwrap_or(0);
    let clone_sources = clone_sources
        .iter()
        .map(|p| on_same(p))
        .collect::<Result<Vec<_>, _>>()?;
    let fifo = Fifo::new()?;
    let arg = cmd::SendRequest {
        snapshots: vec![snap.id],
        parent,
        clone_sources,
        proto,
        flags: if compressed { cmd::SEND_COMPRESSED } else { 0 },
        fifo: fifo.path.as_os_str().as_bytes().to_vec(),
    }
    .to_bytes()
    .ok_or("too many clone sources, or too long a temporary directory path")?;
    let meter = Meter::new(quiet);
    // Wakes the copier once the server has answered (and closed its end).
    let (wake, woken) = std::os::unix::net::UnixStream::pair().map_err(|e| e.to_string())?;
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let copier = {
        let (meter, file, path) = (
            meter.clone(),
            file.map(Path::to_path_buf),
            fifo.path.clone(),
        );
        std::thread::spawn(move || {
            let opened = own_descriptors().and_then(|()| open_fifo(&path, true, false, true));
            let reader = match opened {
                Ok(r) => r,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.clone()));
                    return Err(e);
                }
            };
            let _ = ready_tx.send(Ok(()));
            copy_out(reader, &woken, file.as_deref(), &meter)
        })
    };
    // The server opens its end without waiting: ours must be open first.
    ready
        .recv()
        .map_err(|_| "the copying thread ended".to_string())??;
    let reply = ask(snapshot, cmd::SEND, arg);
    let _ = (&wake).write_all(&[1]);
    let copied = copier
        .join()
        .unwrap_or_else(|_| Err("the copying thread panicked".into()));
    meter.clear();
    let sent = match (reply, copied) {
        (Ok(r), Ok(())) if r.ok => Ok(()),
        // The copy's own error says more than the server's broken pipe.
        (_, Err(e)) => Err(e),
        (Ok(r), Ok(())) => Err(reply_error(&r)),
        (Err(e), Ok(())) => Err(e),
    };
    if let (Err(_), Some(f)) = (&sent, file) {
        // Nobody should receive half a stream.
        let _ = std::fs::remove_file(f);
    }
    sent
}

/// Copies the stream from the FIFO to FILE (made at its first byte, so that a send
/// refused at once leaves none) or standard output, until the server closes its end, or
/// has answered (`woken`) without ever opening it.
fn copy_out(
    mut reader: File,
    woken: &std::os::unix::net::UnixStream,
    file: Option<&Path>,
    meter: &Meter,
) -> Result<(), String> {
    let mut buf = vec![0u8; 1 << 20];
    let mut out: Option<Box<dyn Write>> = None;
    let name = file.map_or("standard output".into(), |f| f.display().to_string());
    let mut answered = false;
    loop {
        if !answered {
            // A FIFO no writer has opened yet polls as nothing to read, not as its end.
            let mut fds = [reader.as_raw_fd(), woken.as_raw_fd()].map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
            // SAFETY: two valid pollfds.
            if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
                continue; // EINTR
            }
            answered = fds[1].revents != 0;
        }
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && answered => break,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(e) => return Err(format!("reading the stream: {e}")),
        };
        let w = match &mut out {
            Some(w) => w,
            None => out.insert(match file {
                Some(f) => Box::new(meter.writer(
                    File::create(f).map_err(|e| format!("cannot create {}: {e}", f.display()))?,
                )),
                None => Box::new(meter.writer(std::io::stdout())),
            }),
        };
        w.write_all(&buf[..n])
            .map_err(|e| format!("writing the stream to {name}: {e}"))?;
    }
    if let Some(mut w) = out {
        w.flush()
            .map_err(|e| format!("writing the stream to {name}: {e}"))?;
    }
    Ok(())
}

/// `oleo receive [-f FILE] [-e] DIR` with DIR on a mount; `name` starts errors about the
/// input.
pub fn receive(
    dir: &Path,
    input: Box<dyn Read + Send>,
    name: &str,
    honor_end: bool,
    quiet: bool,
) -> Result<(), String> {
    on_mount::subvol_of(dir)?;
    let m = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !m.is_dir() {
        return Err(format!("{}: not a directory", dir.display()));
    }
    if read_only(dir)? {
        return Err(format!(
            "cannot receive into {}: the mount is read-only",
            dir.display()
        ));
    }
    let fifo = Fifo::new()?;
    let mut flags = 0;
    if honor_end {
        flags |= cmd::RECEIVE_END;
    }
    if quiet {
        flags |= cmd::RECEIVE_QUIET;
    }
    let arg = cmd::ReceiveRequest {
        flags,
        fifo: fifo.path.as_os_str().as_bytes().to_vec(),
        name: name.as_bytes().to_vec(),
    }
    .to_bytes()
    .ok_or("the temporary directory's path is too long")?;
    let meter = Meter::new(quiet);
    let (done_tx, done) = std::sync::mpsc::channel();
    let (ready_tx, ready) = std::sync::mpsc::channel();
    {
        let (meter, path) = (meter.clone(), fifo.path.clone());
        // Not joined: once the server stops reading (an error, or -e) it may wait forever
        // on a full FIFO, and it goes with the process.
        std::thread::spawn(move || {
            // Read and write: opening it needs no reader yet, and holds the server's reads
            // until the stream is in (it ends when this closes).
            let opened = own_descriptors().and_then(|()| open_fifo(&path, true, true, false));
            let writer = match opened {
                Ok(w) => w,
                Err(e) => return drop(ready_tx.send(Err(e))),
            };
            let _ = ready_tx.send(Ok(()));
            let r = copy_in(meter.reader(input), &writer);
            // Told before the server sees the stream end, so that an input error is known
            // by the time it answers.
            let _ = done_tx.send(r);
            // A FIFO whose every end is closed drops what it holds: the server may not have
            // opened it yet (a short stream fits its buffer), so close only once it is read.
            wait_drained(&writer);
            drop(writer);
        });
    }
    ready
        .recv()
        .map_err(|_| "the copying thread ended".to_string())??;
    let reply = ask(dir, cmd::RECEIVE, arg);
    meter.clear();
    // Had the input failed, the server saw the stream end early: the input's error says why.
    if let Ok(Err(e)) = done.try_recv() {
        if let Ok(r) = &reply {
            print_lines(r, &meter);
        }
        return Err(e);
    }
    let reply = reply?;
    print_lines(&reply, &meter);
    if reply.ok {
        Ok(())
    } else {
        Err(reply_error(&reply))
    }
}

/// Waits until nothing is left in the FIFO (the server has read it all). Not bounded: a
/// server that stops reading answers, and the process ends with this thread.
fn wait_drained(fifo: &File) {
    loop {
        let mut queued: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int.
        let r = unsafe { libc::ioctl(fifo.as_raw_fd(), libc::FIONREAD, &mut queued) };
        if r != 0 || queued == 0 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

fn copy_in(mut input: impl Read, mut writer: &File) -> Result<(), String> {
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("reading the stream: {e}")),
        };
        // A server that stopped reading: what it says is the story.
        if writer.write_all(&buf[..n]).is_err() {
            return Ok(());
        }
    }
}

/// Whether `dir` is on a read-only mount.
fn read_only(dir: &Path) -> Result<bool, String> {
    let c = CString::new(dir.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: c is a NUL-terminated path and st a buffer statvfs fills.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!("{}: {e}", dir.display()));
    }
    Ok(st.f_flag & libc::ST_RDONLY != 0)
}

/// The server's side: the `--image` forms' code run on the mounted filesystem.
struct Hook;

/// Lets this process's mounts send and receive (`subvol_ioctl::SEND`, `RECEIVE`).
pub fn register() {
    oleo_fuse::set_stream_handler(Box::new(Hook));
}

/// Subvolume `id`'s path from the mounted subvolume, as the send code resolves paths
/// (from the filesystem's root, the mounted subvolume).
fn path_from_root(fs: &oleo::Filesystem, id: u64) -> Result<String, String> {
    let all = fs.list_subvolumes().map_err(|e| e.to_string())?;
    let path_of = |id: u64| -> Result<Vec<u8>, String> {
        if id == oleo::format::key::objectid::FS_TREE {
            return Ok(Vec::new());
        }
        all.iter()
            .find(|s| s.id == id)
            .and_then(|s| s.path.clone())
            .ok_or_else(|| format!("subvolume {id} cannot be reached from the top level"))
    };
    let (path, root) = (path_of(id)?, path_of(fs.root().subvol)?);
    let rel = if root.is_empty() {
        &path[..]
    } else if path == root {
        &[][..]
    } else {
        path.strip_prefix(&root[..])
            .and_then(|p| p.strip_prefix(b"/"))
            .ok_or_else(|| format!("subvolume {id} is not inside the mounted subvolume"))?
    };
    String::from_utf8(rel.to_vec()).map_err(|_| {
        format!(
            "the path of subvolume {id} is not UTF-8: {}",
            rel.escape_ascii()
        )
    })
}

impl oleo_fuse::StreamHandler for Hook {
    fn send(
        &self,
        fs: &oleo::Filesystem,
        job: &oleo_fuse::SendJob,
        out: &mut dyn Write,
    ) -> Result<(), String> {
        let paths = |ids: &[u64]| -> Result<Vec<String>, String> {
            ids.iter().map(|&id| path_from_root(fs, id)).collect()
        };
        let o = crate::send::StreamOptions {
            snapshots: paths(&job.snapshots)?,
            parent: job.parent.map(|p| path_from_root(fs, p)).transpose()?,
            clone_sources: paths(&job.clone_sources)?,
            proto: job.proto,
            compressed: job.compressed,
        };
        crate::send::stream(fs, &o, out)
    }

    fn receive(
        &self,
        fs: &oleo::Filesystem,
        job: &oleo_fuse::ReceiveJob,
        input: &mut dyn Read,
        note: &mut dyn FnMut(oleo_fuse::Note),
    ) -> Result<(), String> {
        let opts = crate::receive::Options {
            honor_end: job.honor_end,
            quiet: job.quiet,
        };
        crate::receive::receive_into(fs, job.dest, input, &job.name, &opts, note)
    }
}
