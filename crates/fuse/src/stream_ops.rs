//! Serving `subvol_ioctl::SEND` and `RECEIVE`: `btrfs send` and `btrfs receive` on a mount.
//! The image is this server's alone, so the stream is made or applied here, by the same
//! code the command uses on an unmounted image: a [`StreamHandler`] the command registers
//! (this crate cannot call it directly). The stream itself flows through a FIFO the
//! caller made and owns; the answer carries the lines to print and the error.

use crate::subvol_ioctl as cmd;
use crate::transport::{Errno, Request};
use crate::OleoFuse;
use oleo::{Filesystem, InodeId};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::sync::OnceLock;

/// What SEND asks for: subvolumes by id.
#[derive(Clone, Debug)]
pub struct SendJob {
    /// The read-only snapshots to send.
    pub snapshots: Vec<u64>,
    /// `-p`.
    pub parent: Option<u64>,
    /// `-c`.
    pub clone_sources: Vec<u64>,
    /// Protocol version.
    pub proto: u32,
    /// `--compressed-data`.
    pub compressed: bool,
}

/// What RECEIVE asks for.
#[derive(Clone, Debug)]
pub struct ReceiveJob {
    /// The directory the received subvolumes go in.
    pub dest: InodeId,
    /// `-e`: stop after the first END.
    pub honor_end: bool,
    /// `-q`.
    pub quiet: bool,
    /// How errors name the input ("FILE: ", or empty).
    pub name: String,
}

/// What a receive tells as it goes.
#[derive(Clone, Debug)]
pub enum Note {
    /// A line for the caller's standard output.
    Stdout(String),
    /// A line for the caller's standard error.
    Stderr(String),
    /// Subvolume `id` was made as `name` in the destination.
    Made {
        /// Its id.
        id: u64,
        /// Its name.
        name: Vec<u8>,
    },
}

/// The send and receive code, registered by the program that serves the mount.
pub trait StreamHandler: Send + Sync {
    /// Writes the stream of `job` to `out`.
    fn send(&self, fs: &Filesystem, job: &SendJob, out: &mut dyn Write) -> Result<(), String>;
    /// Applies the stream read from `input`; says what it does through `note`.
    fn receive(
        &self,
        fs: &Filesystem,
        job: &ReceiveJob,
        input: &mut dyn Read,
        note: &mut dyn FnMut(Note),
    ) -> Result<(), String>;
}

static HANDLER: OnceLock<Box<dyn StreamHandler>> = OnceLock::new();

/// Registers the send and receive code of this process's mounts (the first one stays).
pub fn set_stream_handler(h: Box<dyn StreamHandler>) {
    let _ = HANDLER.set(h);
}

/// Subvolumes being sent: the kernel refuses to delete them or make them writable
/// meanwhile, and so does this server.
static SENDING: parking_lot::Mutex<Vec<u64>> = parking_lot::Mutex::new(Vec::new());

/// True while subvolume `id` is being sent.
pub(crate) fn is_sending(id: u64) -> bool {
    SENDING.lock().contains(&id)
}

/// Marks subvolumes as being sent until dropped.
struct Sending(Vec<u64>);

impl Sending {
    fn start(ids: Vec<u64>) -> Sending {
        SENDING.lock().extend_from_slice(&ids);
        Sending(ids)
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        let mut all = SENDING.lock();
        for id in &self.0 {
            if let Some(i) = all.iter().position(|s| s == id) {
                all.swap_remove(i);
            }
        }
    }
}

fn failed(error: String) -> Vec<u8> {
    cmd::StreamReply {
        ok: false,
        lines: Vec::new(),
        error: error.into_bytes(),
    }
    .to_bytes()
}

/// Opens the caller's FIFO at `path`: only a FIFO the caller owns (this server may run as
/// root for everyone), never following a symlink, and without waiting: the caller holds
/// its other end open before it asks.
fn open_fifo(path: &[u8], uid: u32, write: bool) -> Result<std::fs::File, String> {
    use std::os::unix::ffi::OsStrExt;
    let shown = String::from_utf8_lossy(path).into_owned();
    let p = std::path::Path::new(std::ffi::OsStr::from_bytes(path));
    let handle = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
        .open(p)
        .map_err(|e| format!("the server cannot open the FIFO {shown}: {e}"))?;
    let m = handle
        .metadata()
        .map_err(|e| format!("the server cannot stat the FIFO {shown}: {e}"))?;
    if m.mode() & libc::S_IFMT != libc::S_IFIFO {
        return Err(format!("{shown} is not a FIFO"));
    }
    if uid != 0 && m.uid() != uid {
        return Err(format!("the FIFO {shown} is not the caller's"));
    }
    let f = std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(libc::O_NONBLOCK)
        .open(format!("/proc/self/fd/{}", handle.as_raw_fd()))
        .map_err(|e| format!("the server cannot open the FIFO {shown}: {e}"))?;
    // SAFETY: fcntl on a descriptor we own.
    let blocking = unsafe {
        let fl = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        fl >= 0 && libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK) == 0
    };
    if !blocking {
        return Err(format!(
            "the FIFO {shown}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(f)
}

impl OleoFuse {
    /// True for SEND and RECEIVE.
    pub(crate) fn is_stream_ioctl(c: u32) -> bool {
        c == cmd::SEND || c == cmd::RECEIVE
    }

    /// Runs SEND or RECEIVE for `req` on `node`; the answer is always a `StreamReply`.
    pub(crate) fn stream_ioctl(
        &self,
        req: &Request,
        node: u64,
        c: u32,
        data: &[u8],
    ) -> Result<Vec<u8>, Errno> {
        let id = self.id(node)?;
        // A stream holds every byte of a subvolume, and a received one sets any owner and
        // mode: root's, or the mounting user's, as btrfs wants CAP_SYS_ADMIN.
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        let Some(caller) = crate::caller::Caller::of(req) else {
            return Ok(failed(
                "the caller of send or receive cannot be told".into(),
            ));
        };
        if caller.uid != 0 && caller.uid != me {
            return Ok(failed(
                "send and receive on a mount need root or the user who mounted it".into(),
            ));
        }
        let Some(h) = HANDLER.get() else {
            return Ok(failed("this oleo server cannot send or receive".into()));
        };
        Ok(if c == cmd::SEND {
            self.serve_send(h.as_ref(), caller.uid, data)
        } else {
            self.serve_receive(h.as_ref(), caller.uid, node, id, data)
        })
    }

    fn serve_send(&self, h: &dyn StreamHandler, uid: u32, data: &[u8]) -> Vec<u8> {
        let Some(a) = cmd::SendRequest::parse(data) else {
            return failed("bad send request".into());
        };
        let job = SendJob {
            snapshots: a.snapshots,
            parent: (a.parent != 0).then_some(a.parent),
            clone_sources: a.clone_sources,
            proto: a.proto,
            compressed: a.flags & cmd::SEND_COMPRESSED != 0,
        };
        let mut out = match open_fifo(&a.fifo, uid, true) {
            Ok(f) => f,
            Err(e) => return failed(e),
        };
        let _busy = Sending::start(job.snapshots.clone());
        let r = h.send(&self.fs, &job, &mut out);
        drop(out);
        cmd::StreamReply {
            ok: r.is_ok(),
            lines: Vec::new(),
            error: r.err().unwrap_or_default().into_bytes(),
        }
        .to_bytes()
    }

    fn serve_receive(
        &self,
        h: &dyn StreamHandler,
        uid: u32,
        node: u64,
        dest: InodeId,
        data: &[u8],
    ) -> Vec<u8> {
        if !self.settings.writable {
            return failed("the mount is read-only".into());
        }
        let a = cmd::ReceiveRequest::parse(data);
        let job = ReceiveJob {
            dest,
            honor_end: a.flags & cmd::RECEIVE_END != 0,
            quiet: a.flags & cmd::RECEIVE_QUIET != 0,
            name: String::from_utf8_lossy(&a.name).into_owned(),
        };
        let mut input = match open_fifo(&a.fifo, uid, false) {
            Ok(f) => f,
            Err(e) => return failed(e),
        };
        let mut lines = Vec::new();
        let mut made = Vec::new();
        let r = h.receive(&self.fs, &job, &mut input, &mut |n| match n {
            Note::Stdout(s) => lines.push((cmd::STDOUT, s.into_bytes())),
            Note::Stderr(s) => lines.push((cmd::STDERR, s.into_bytes())),
            Note::Made { id, name } => made.push((id, name)),
        });
        drop(input);
        // What was received is committed either way, as the kernel's receive commits at
        // each subvolume's end.
        let committed = self.fs.sync().map(drop).map_err(|e| format!("commit: {e}"));
        for (id, name) in &made {
            self.entry_changed(node, name);
            self.subvolume_changed(*id);
        }
        let r = match (r, committed) {
            (Err(a), Err(b)) => Err(format!("{a}\n{b}")),
            (r, c) => r.and(c),
        };
        cmd::StreamReply {
            ok: r.is_ok(),
            lines,
            error: r.err().unwrap_or_default().into_bytes(),
        }
        .to_bytes()
    }

    /// The kernel may hold inodes of subvolume `id` that a receive has changed since it
    /// looked (someone listed it midway): their attributes and pages go.
    fn subvolume_changed(&self, id: u64) {
        let Some(n) = self.notifier() else {
            return;
        };
        let known: Vec<u64> = self.lookups.lock().keys().copied().collect();
        for node in known {
            if self.id(node).is_ok_and(|i| i.subvol == id) {
                if let Err(e) = n.inval_inode(node, 0, 0) {
                    if e.raw_os_error() != Some(libc::ENOENT) {
                        log::warn!("cannot tell the kernel that inode {node} changed: {e}");
                    }
                }
            }
        }
    }
}
