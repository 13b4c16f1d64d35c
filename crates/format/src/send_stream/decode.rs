//! Reading a send stream one command at a time, every byte checked.

use super::command::{
    attr, attribute_name, cmd, command_name, crc32c_raw, max_attribute, max_command, Command,
    Timespec, CMD_HEADER_SIZE, MAX_COMMAND_LEN, MAX_VERSION, STREAM_HEADER_SIZE, STREAM_MAGIC,
    TIMESPEC_SIZE,
};
use std::fmt;
use std::io::{self, Read};

/// The command an error is in: its number (possibly not a known one) and where it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommandRef {
    /// The command number from its header.
    pub number: u16,
    /// Byte offset of its header in the stream.
    pub offset: u64,
}

/// What is wrong with a stream, at [`StreamError::offset`].
#[derive(Debug, thiserror::Error)]
pub enum StreamErrorKind {
    /// The underlying reader failed.
    #[error("read error: {0}")]
    Io(#[from] io::Error),
    /// Not a single byte: no stream header.
    #[error("empty stream (no header)")]
    Empty,
    /// The first 13 bytes are not `btrfs-stream\0`.
    #[error("not a send stream (bad magic)")]
    BadMagic,
    /// A version other than 1, 2 or 3.
    #[error("unsupported stream version {0} (1 to {MAX_VERSION} are known)")]
    UnsupportedVersion(u32),
    /// The stream ends inside a header or a command.
    #[error("stream ends inside {what}: {have} of {need} bytes")]
    Truncated {
        /// "the stream header", "a command header" or "a command's payload".
        what: &'static str,
        /// Bytes it needs.
        need: u64,
        /// Bytes there were.
        have: u64,
    },
    /// The stream ends between commands, before an END command.
    #[error("stream ends without an END command")]
    MissingEnd,
    /// A command length beyond [`MAX_COMMAND_LEN`].
    #[error("command length {0} is more than the {MAX_COMMAND_LEN} bytes allowed")]
    TooLong(u32),
    /// The command's crc32c does not match its bytes.
    #[error("bad CRC: stored {stored:#010x}, computed {computed:#010x}")]
    BadCrc {
        /// From the header.
        stored: u32,
        /// Over the header (crc zeroed) and payload.
        computed: u32,
    },
    /// A command number no protocol has.
    #[error("unknown command")]
    UnknownCommand,
    /// A command newer than the stream's version.
    #[error("command not in protocol version {0}")]
    CommandNotInVersion(u32),
    /// An attribute number no protocol has.
    #[error("unknown attribute {0}")]
    UnknownAttribute(u16),
    /// An attribute newer than the stream's version.
    #[error("attribute {} not in protocol version {version}", label(*attr))]
    AttributeNotInVersion {
        /// The attribute.
        attr: u16,
        /// The stream's version.
        version: u32,
    },
    /// The command ends inside an attribute's header.
    #[error("attribute header cut by the end of the command")]
    ShortAttributeHeader,
    /// An attribute's length runs past the end of its command.
    #[error("attribute {} of {len} bytes runs past the end of the command ({left} bytes left)", label(*attr))]
    AttributeOverrun {
        /// The attribute.
        attr: u16,
        /// Its length field.
        len: u64,
        /// What was left of the command.
        left: u64,
    },
    /// An attribute this command does not have.
    #[error("unexpected attribute {}", label(*attr))]
    UnexpectedAttribute {
        /// The attribute.
        attr: u16,
    },
    /// An attribute given twice.
    #[error("duplicated attribute {}", label(*attr))]
    DuplicateAttribute {
        /// The attribute.
        attr: u16,
    },
    /// A required attribute is absent.
    #[error("missing attribute {}", label(*attr))]
    MissingAttribute {
        /// The attribute.
        attr: u16,
    },
    /// A fixed-size attribute of the wrong size.
    #[error("attribute {} has {got} bytes, expected {expected}", label(*attr))]
    AttributeSize {
        /// The attribute.
        attr: u16,
        /// Its type's size.
        expected: usize,
        /// Its length.
        got: usize,
    },
    /// A path (or name) that must not be received.
    #[error("attribute {} is not a valid path: {reason}", label(*attr))]
    BadPath {
        /// The attribute.
        attr: u16,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// A call after an earlier error: the stream position is lost.
    #[error("the reader stopped at an earlier error")]
    AfterError,
}

fn label(a: u16) -> String {
    format!("{a} ({})", attribute_name(a).unwrap_or("unknown"))
}

/// A damaged or hostile stream: what is wrong, at which byte, in which command.
#[derive(Debug)]
pub struct StreamError {
    /// Byte offset in the stream of the wrong thing (a header, an attribute).
    pub offset: u64,
    /// The command it is in, when its header was read.
    pub command: Option<CommandRef>,
    /// What is wrong.
    pub kind: StreamErrorKind,
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "send stream, byte {}", self.offset)?;
        if let Some(c) = self.command {
            let name = command_name(c.number).unwrap_or("unknown");
            write!(f, ", command {} ({name})", c.number)?;
            if c.offset != self.offset {
                write!(f, " at byte {}", c.offset)?;
            }
        }
        write!(f, ": {}", self.kind)
    }
}

impl std::error::Error for StreamError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            StreamErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// Whether `p` may be received as a path relative to the subvolume: relative, no NUL, no
/// empty, `.` or `..` component (so it cannot leave the subvolume, and names one entry
/// only one way). Empty means the subvolume's root, allowed where `allow_empty`.
pub fn check_path(p: &[u8], allow_empty: bool) -> Result<(), &'static str> {
    if p.is_empty() {
        return if allow_empty { Ok(()) } else { Err("empty") };
    }
    if p.contains(&0) {
        return Err("contains a NUL byte");
    }
    if p[0] == b'/' {
        return Err("absolute");
    }
    for c in p.split(|&b| b == b'/') {
        match c {
            b"" => return Err("empty component (// or a trailing /)"),
            b"." => return Err("'.' component"),
            b".." => return Err("'..' component"),
            _ => {}
        }
    }
    Ok(())
}

#[derive(PartialEq)]
enum State {
    Running,
    Ended,
    Failed,
}

/// Reads a send stream from any [`Read`], one [`Command`] at a time, in memory bounded by
/// the largest command ([`MAX_COMMAND_LEN`]).
pub struct StreamReader<R> {
    inner: R,
    version: u32,
    pos: u64,
    buf: Vec<u8>,
    state: State,
}

/// Reads until `buf` is full or EOF; how many bytes it got.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> (usize, Option<io::Error>) {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return (n, Some(e)),
        }
    }
    (n, None)
}

fn err(offset: u64, command: Option<CommandRef>, kind: StreamErrorKind) -> StreamError {
    StreamError {
        offset,
        command,
        kind,
    }
}

impl<R: Read> StreamReader<R> {
    /// Reads and checks the stream header (magic, version 1 to 3).
    pub fn new(mut inner: R) -> Result<Self, StreamError> {
        let mut h = [0u8; STREAM_HEADER_SIZE];
        let (n, e) = read_full(&mut inner, &mut h);
        if let Some(e) = e {
            return Err(err(n as u64, None, e.into()));
        }
        if n == 0 {
            return Err(err(0, None, StreamErrorKind::Empty));
        }
        if n < STREAM_HEADER_SIZE {
            let kind = StreamErrorKind::Truncated {
                what: "the stream header",
                need: STREAM_HEADER_SIZE as u64,
                have: n as u64,
            };
            return Err(err(n as u64, None, kind));
        }
        if &h[..13] != STREAM_MAGIC {
            return Err(err(0, None, StreamErrorKind::BadMagic));
        }
        let version = u32::from_le_bytes(h[13..17].try_into().unwrap());
        if !(1..=MAX_VERSION).contains(&version) {
            return Err(err(13, None, StreamErrorKind::UnsupportedVersion(version)));
        }
        Ok(StreamReader {
            inner,
            version,
            pos: STREAM_HEADER_SIZE as u64,
            buf: Vec::new(),
            state: State::Running,
        })
    }

    /// The stream's protocol version.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Bytes consumed so far: the offset of the next command.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// The underlying reader (positioned after the END command, if one was read).
    pub fn into_inner(self) -> R {
        self.inner
    }

    /// The next command; `Ok(None)` after END. A stream that ends without END is an error.
    /// After an error every call fails.
    pub fn next_command(&mut self) -> Result<Option<Command>, StreamError> {
        match self.state {
            State::Ended => return Ok(None),
            State::Failed => return Err(err(self.pos, None, StreamErrorKind::AfterError)),
            State::Running => {}
        }
        let r = self.read_command();
        match &r {
            Ok(Command::End) => self.state = State::Ended,
            Ok(_) => {}
            Err(_) => self.state = State::Failed,
        }
        r.map(Some)
    }

    fn read_command(&mut self) -> Result<Command, StreamError> {
        let start = self.pos;
        let mut hdr = [0u8; CMD_HEADER_SIZE];
        let (n, e) = read_full(&mut self.inner, &mut hdr);
        // The command number is known once its bytes are in.
        let known = (n >= 6).then(|| CommandRef {
            number: u16::from_le_bytes([hdr[4], hdr[5]]),
            offset: start,
        });
        if let Some(e) = e {
            return Err(err(start + n as u64, known, e.into()));
        }
        if n == 0 {
            return Err(err(start, None, StreamErrorKind::MissingEnd));
        }
        if n < CMD_HEADER_SIZE {
            let kind = StreamErrorKind::Truncated {
                what: "a command header",
                need: CMD_HEADER_SIZE as u64,
                have: n as u64,
            };
            return Err(err(start + n as u64, known, kind));
        }
        let len = u32::from_le_bytes(hdr[0..4].try_into().unwrap());
        let number = u16::from_le_bytes([hdr[4], hdr[5]]);
        let stored = u32::from_le_bytes(hdr[6..10].try_into().unwrap());
        let at = Some(CommandRef {
            number,
            offset: start,
        });
        if len > MAX_COMMAND_LEN {
            return Err(err(start, at, StreamErrorKind::TooLong(len)));
        }
        self.buf.clear();
        self.buf.reserve((len as usize).min(256 << 10));
        let got = (&mut self.inner)
            .take(u64::from(len))
            .read_to_end(&mut self.buf);
        let payload = start + CMD_HEADER_SIZE as u64;
        if let Err(e) = got {
            return Err(err(payload + self.buf.len() as u64, at, e.into()));
        }
        if self.buf.len() < len as usize {
            let kind = StreamErrorKind::Truncated {
                what: "a command's payload",
                need: u64::from(len),
                have: self.buf.len() as u64,
            };
            return Err(err(payload + self.buf.len() as u64, at, kind));
        }
        // The kernel's crc32c: seed 0, no final inversion, crc field zeroed.
        hdr[6..10].fill(0);
        let computed = crc32c_raw(crc32c_raw(0, &hdr), &self.buf);
        if computed != stored {
            return Err(err(start, at, StreamErrorKind::BadCrc { stored, computed }));
        }
        if number == cmd::UNSPEC || usize::from(number) > usize::from(cmd::MAX_V3) {
            return Err(err(start, at, StreamErrorKind::UnknownCommand));
        }
        if number > max_command(self.version) {
            let kind = StreamErrorKind::CommandNotInVersion(self.version);
            return Err(err(start, at, kind));
        }
        self.pos = payload + u64::from(len);
        let mut attrs = Attrs::parse(&self.buf, self.version, payload, at)?;
        let c = decode(number, &mut attrs)?;
        attrs.finish()?;
        Ok(c)
    }
}

impl<R: Read> Iterator for StreamReader<R> {
    type Item = Result<Command, StreamError>;

    /// Ends after the first error, so a loop over the reader stops.
    fn next(&mut self) -> Option<Self::Item> {
        if self.state == State::Failed {
            return None;
        }
        self.next_command().transpose()
    }
}

#[derive(Clone, Copy)]
struct Slot {
    /// Offset of the attribute's header in the payload.
    at: usize,
    start: usize,
    len: usize,
}

const NATTR: usize = attr::MAX_V3 as usize + 1;

/// A command's attributes, each at most once, and which of them the decoder took.
struct Attrs<'a> {
    buf: &'a [u8],
    slots: [Option<Slot>; NATTR],
    taken: [bool; NATTR],
    base: u64,
    cmd: Option<CommandRef>,
}

impl<'a> Attrs<'a> {
    fn parse(
        buf: &'a [u8],
        version: u32,
        base: u64,
        cmd: Option<CommandRef>,
    ) -> Result<Self, StreamError> {
        let mut a = Attrs {
            buf,
            slots: [None; NATTR],
            taken: [false; NATTR],
            base,
            cmd,
        };
        let mut p = 0usize;
        while p < buf.len() {
            let at = p;
            if buf.len() - p < 2 {
                return Err(a.err(at, StreamErrorKind::ShortAttributeHeader));
            }
            let t = u16::from_le_bytes([buf[p], buf[p + 1]]);
            if t == attr::UNSPEC || usize::from(t) >= NATTR {
                return Err(a.err(at, StreamErrorKind::UnknownAttribute(t)));
            }
            if t > max_attribute(version) {
                let kind = StreamErrorKind::AttributeNotInVersion { attr: t, version };
                return Err(a.err(at, kind));
            }
            p += 2;
            // v2+: DATA has no length field and takes the rest of the command.
            let len = if version >= 2 && t == attr::DATA {
                buf.len() - p
            } else {
                if buf.len() - p < 2 {
                    return Err(a.err(at, StreamErrorKind::ShortAttributeHeader));
                }
                let l = u16::from_le_bytes([buf[p], buf[p + 1]]);
                p += 2;
                usize::from(l)
            };
            if len > buf.len() - p {
                let kind = StreamErrorKind::AttributeOverrun {
                    attr: t,
                    len: len as u64,
                    left: (buf.len() - p) as u64,
                };
                return Err(a.err(at, kind));
            }
            if a.slots[usize::from(t)].is_some() {
                return Err(a.err(at, StreamErrorKind::DuplicateAttribute { attr: t }));
            }
            a.slots[usize::from(t)] = Some(Slot { at, start: p, len });
            p += len;
        }
        Ok(a)
    }

    fn err(&self, at: usize, kind: StreamErrorKind) -> StreamError {
        err(self.base + at as u64, self.cmd, kind)
    }

    fn missing(&self, t: u16) -> StreamError {
        let off = self.cmd.map_or(self.base, |c| c.offset);
        err(off, self.cmd, StreamErrorKind::MissingAttribute { attr: t })
    }

    fn opt_raw(&mut self, t: u16) -> Option<(Slot, &'a [u8])> {
        let s = self.slots[usize::from(t)]?;
        self.taken[usize::from(t)] = true;
        Some((s, &self.buf[s.start..s.start + s.len]))
    }

    fn raw(&mut self, t: u16) -> Result<(Slot, &'a [u8]), StreamError> {
        self.opt_raw(t).ok_or_else(|| self.missing(t))
    }

    fn opt_fixed<const N: usize>(&mut self, t: u16) -> Result<Option<[u8; N]>, StreamError> {
        let Some((s, b)) = self.opt_raw(t) else {
            return Ok(None);
        };
        let arr: [u8; N] = b.try_into().map_err(|_| {
            let kind = StreamErrorKind::AttributeSize {
                attr: t,
                expected: N,
                got: b.len(),
            };
            self.err(s.at, kind)
        })?;
        Ok(Some(arr))
    }

    fn fixed<const N: usize>(&mut self, t: u16) -> Result<[u8; N], StreamError> {
        self.opt_fixed(t)?.ok_or_else(|| self.missing(t))
    }

    fn u64(&mut self, t: u16) -> Result<u64, StreamError> {
        self.fixed(t).map(u64::from_le_bytes)
    }

    fn opt_u64(&mut self, t: u16) -> Result<Option<u64>, StreamError> {
        Ok(self.opt_fixed(t)?.map(u64::from_le_bytes))
    }

    fn u32(&mut self, t: u16) -> Result<u32, StreamError> {
        self.fixed(t).map(u32::from_le_bytes)
    }

    fn uuid(&mut self, t: u16) -> Result<[u8; 16], StreamError> {
        self.fixed(t)
    }

    fn opt_timespec(&mut self, t: u16) -> Result<Option<Timespec>, StreamError> {
        Ok(self.opt_fixed::<TIMESPEC_SIZE>(t)?.map(|b| Timespec {
            sec: u64::from_le_bytes(b[..8].try_into().unwrap()),
            nsec: u32::from_le_bytes(b[8..].try_into().unwrap()),
        }))
    }

    fn timespec(&mut self, t: u16) -> Result<Timespec, StreamError> {
        self.opt_timespec(t)?.ok_or_else(|| self.missing(t))
    }

    fn data(&mut self, t: u16) -> Result<Vec<u8>, StreamError> {
        Ok(self.raw(t)?.1.to_vec())
    }

    fn checked(
        &mut self,
        t: u16,
        rule: fn(&[u8]) -> Result<(), &'static str>,
    ) -> Result<Vec<u8>, StreamError> {
        let (s, b) = self.raw(t)?;
        rule(b).map_err(|reason| self.err(s.at, StreamErrorKind::BadPath { attr: t, reason }))?;
        Ok(b.to_vec())
    }

    /// A path that must name an entry below the subvolume's root.
    fn path(&mut self, t: u16) -> Result<Vec<u8>, StreamError> {
        self.checked(t, |b| check_path(b, false))
    }

    /// A path that may be empty: the subvolume's root.
    fn path_or_root(&mut self, t: u16) -> Result<Vec<u8>, StreamError> {
        self.checked(t, |b| check_path(b, true))
    }

    /// A symlink target or xattr name: any bytes but NUL, not empty.
    fn name(&mut self, t: u16) -> Result<Vec<u8>, StreamError> {
        self.checked(t, |b| match b {
            [] => Err("empty"),
            _ if b.contains(&0) => Err("contains a NUL byte"),
            _ => Ok(()),
        })
    }

    /// Every attribute present was taken by the command.
    fn finish(&self) -> Result<(), StreamError> {
        for (t, s) in self.slots.iter().enumerate() {
            if let (Some(s), false) = (s, self.taken[t]) {
                let kind = StreamErrorKind::UnexpectedAttribute { attr: t as u16 };
                return Err(self.err(s.at, kind));
            }
        }
        Ok(())
    }
}

fn decode(number: u16, a: &mut Attrs<'_>) -> Result<Command, StreamError> {
    use attr as A;
    Ok(match number {
        cmd::SUBVOL => Command::Subvol {
            path: a.path(A::PATH)?,
            uuid: a.uuid(A::UUID)?,
            ctransid: a.u64(A::CTRANSID)?,
        },
        cmd::SNAPSHOT => Command::Snapshot {
            path: a.path(A::PATH)?,
            uuid: a.uuid(A::UUID)?,
            ctransid: a.u64(A::CTRANSID)?,
            clone_uuid: a.uuid(A::CLONE_UUID)?,
            clone_ctransid: a.u64(A::CLONE_CTRANSID)?,
        },
        cmd::MKFILE => Command::Mkfile {
            path: a.path(A::PATH)?,
            ino: a.u64(A::INO)?,
        },
        cmd::MKDIR => Command::Mkdir {
            path: a.path(A::PATH)?,
            ino: a.u64(A::INO)?,
        },
        cmd::MKNOD => Command::Mknod {
            path: a.path(A::PATH)?,
            ino: a.u64(A::INO)?,
            mode: a.u64(A::MODE)?,
            rdev: a.u64(A::RDEV)?,
        },
        cmd::MKFIFO => Command::Mkfifo {
            path: a.path(A::PATH)?,
            ino: a.u64(A::INO)?,
            mode: a.opt_u64(A::MODE)?,
            rdev: a.opt_u64(A::RDEV)?,
        },
        cmd::MKSOCK => Command::Mksock {
            path: a.path(A::PATH)?,
            ino: a.u64(A::INO)?,
            mode: a.opt_u64(A::MODE)?,
            rdev: a.opt_u64(A::RDEV)?,
        },
        cmd::SYMLINK => Command::Symlink {
            path: a.path(A::PATH)?,
            ino: a.u64(A::INO)?,
            target: a.name(A::PATH_LINK)?,
        },
        cmd::RENAME => Command::Rename {
            from: a.path(A::PATH)?,
            to: a.path(A::PATH_TO)?,
        },
        cmd::LINK => Command::Link {
            path: a.path(A::PATH)?,
            link: a.path(A::PATH_LINK)?,
        },
        cmd::UNLINK => Command::Unlink {
            path: a.path(A::PATH)?,
        },
        cmd::RMDIR => Command::Rmdir {
            path: a.path(A::PATH)?,
        },
        cmd::SET_XATTR => Command::SetXattr {
            path: a.path_or_root(A::PATH)?,
            name: a.name(A::XATTR_NAME)?,
            data: a.data(A::XATTR_DATA)?,
        },
        cmd::REMOVE_XATTR => Command::RemoveXattr {
            path: a.path_or_root(A::PATH)?,
            name: a.name(A::XATTR_NAME)?,
        },
        cmd::WRITE => Command::Write {
            path: a.path(A::PATH)?,
            offset: a.u64(A::FILE_OFFSET)?,
            data: a.data(A::DATA)?,
        },
        cmd::CLONE => Command::Clone {
            path: a.path(A::PATH)?,
            offset: a.u64(A::FILE_OFFSET)?,
            len: a.u64(A::CLONE_LEN)?,
            clone_uuid: a.uuid(A::CLONE_UUID)?,
            clone_ctransid: a.u64(A::CLONE_CTRANSID)?,
            clone_path: a.path(A::CLONE_PATH)?,
            clone_offset: a.u64(A::CLONE_OFFSET)?,
        },
        cmd::TRUNCATE => Command::Truncate {
            path: a.path(A::PATH)?,
            size: a.u64(A::SIZE)?,
        },
        cmd::CHMOD => Command::Chmod {
            path: a.path_or_root(A::PATH)?,
            mode: a.u64(A::MODE)?,
        },
        cmd::CHOWN => Command::Chown {
            path: a.path_or_root(A::PATH)?,
            uid: a.u64(A::UID)?,
            gid: a.u64(A::GID)?,
        },
        cmd::UTIMES => Command::Utimes {
            path: a.path_or_root(A::PATH)?,
            atime: a.timespec(A::ATIME)?,
            mtime: a.timespec(A::MTIME)?,
            ctime: a.timespec(A::CTIME)?,
            otime: a.opt_timespec(A::OTIME)?,
        },
        cmd::END => Command::End,
        cmd::UPDATE_EXTENT => Command::UpdateExtent {
            path: a.path(A::PATH)?,
            offset: a.u64(A::FILE_OFFSET)?,
            len: a.u64(A::SIZE)?,
        },
        cmd::FALLOCATE => Command::Fallocate {
            path: a.path(A::PATH)?,
            mode: a.u32(A::FALLOCATE_MODE)?,
            offset: a.u64(A::FILE_OFFSET)?,
            len: a.u64(A::SIZE)?,
        },
        cmd::FILEATTR => Command::Fileattr {
            path: a.path_or_root(A::PATH)?,
            attr: a.u64(A::FILEATTR)?,
        },
        cmd::ENCODED_WRITE => Command::EncodedWrite {
            path: a.path(A::PATH)?,
            offset: a.u64(A::FILE_OFFSET)?,
            unencoded_file_len: a.u64(A::UNENCODED_FILE_LEN)?,
            unencoded_len: a.u64(A::UNENCODED_LEN)?,
            unencoded_offset: a.u64(A::UNENCODED_OFFSET)?,
            compression: a.opt_fixed(A::COMPRESSION)?.map(u32::from_le_bytes),
            encryption: a.opt_fixed(A::ENCRYPTION)?.map(u32::from_le_bytes),
            data: a.data(A::DATA)?,
        },
        cmd::ENABLE_VERITY => Command::EnableVerity {
            path: a.path(A::PATH)?,
            algorithm: a.fixed::<1>(A::VERITY_ALGORITHM)?[0],
            block_size: a.u32(A::VERITY_BLOCK_SIZE)?,
            salt: a.data(A::VERITY_SALT_DATA)?,
            sig: a.data(A::VERITY_SIG_DATA)?,
        },
        _ => {
            let off = a.cmd.map_or(a.base, |c| c.offset);
            return Err(err(off, a.cmd, StreamErrorKind::UnknownCommand));
        }
    })
}
