//! Writing a send stream: header, then commands with their lengths and crc32c.

use super::command::{
    attr, crc32c_raw, Command, Timespec, CMD_HEADER_SIZE, MAX_COMMAND_LEN, MAX_VERSION,
    STREAM_MAGIC,
};
use std::io::{self, Write};

/// Writes a send stream of one protocol version to any [`Write`]. Attributes go in the
/// order the kernel emits them, so a kernel stream decoded and written again is the same
/// bytes. Paths are written as given: checking them is the reader's job.
pub struct StreamWriter<W> {
    inner: W,
    version: u32,
    /// The attributes of the command being written, reused.
    buf: Vec<u8>,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

impl<W: Write> StreamWriter<W> {
    /// Writes the stream header for `version` (1 to 3).
    pub fn new(mut inner: W, version: u32) -> io::Result<Self> {
        if !(1..=MAX_VERSION).contains(&version) {
            return Err(invalid(format!(
                "send stream version {version} is not 1 to 3"
            )));
        }
        inner.write_all(STREAM_MAGIC)?;
        inner.write_all(&version.to_le_bytes())?;
        Ok(StreamWriter {
            inner,
            version,
            buf: Vec::new(),
        })
    }

    /// The protocol version.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The underlying writer.
    pub fn into_inner(self) -> W {
        self.inner
    }

    /// Writes one command. `InvalidInput` if the stream's version lacks the command, an
    /// attribute is too long for its u16 length, or the command exceeds
    /// [`MAX_COMMAND_LEN`].
    pub fn write_command(&mut self, c: &Command) -> io::Result<()> {
        if c.min_version() > self.version {
            return Err(invalid(format!(
                "{} needs send stream version {}, this stream is version {}",
                c.name(),
                c.min_version(),
                self.version
            )));
        }
        self.buf.clear();
        let tail = self.put_attributes(c)?;
        let len = self.buf.len() + tail.len();
        if len > MAX_COMMAND_LEN as usize {
            return Err(invalid(format!(
                "{} of {len} bytes is more than {MAX_COMMAND_LEN}",
                c.name()
            )));
        }
        let mut hdr = [0u8; CMD_HEADER_SIZE];
        hdr[0..4].copy_from_slice(&(len as u32).to_le_bytes());
        hdr[4..6].copy_from_slice(&c.number().to_le_bytes());
        let crc = crc32c_raw(crc32c_raw(crc32c_raw(0, &hdr), &self.buf), tail);
        hdr[6..10].copy_from_slice(&crc.to_le_bytes());
        self.inner.write_all(&hdr)?;
        self.inner.write_all(&self.buf)?;
        self.inner.write_all(tail)
    }

    /// Flushes the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }

    fn tlv(&mut self, t: u16, v: &[u8]) -> io::Result<()> {
        let len = u16::try_from(v.len()).map_err(|_| {
            invalid(format!(
                "send stream attribute {t} of {} bytes is longer than 65535",
                v.len()
            ))
        })?;
        self.buf.extend_from_slice(&t.to_le_bytes());
        self.buf.extend_from_slice(&len.to_le_bytes());
        self.buf.extend_from_slice(v);
        Ok(())
    }

    fn u64(&mut self, t: u16, v: u64) -> io::Result<()> {
        self.tlv(t, &v.to_le_bytes())
    }

    fn u32(&mut self, t: u16, v: u32) -> io::Result<()> {
        self.tlv(t, &v.to_le_bytes())
    }

    fn time(&mut self, t: u16, v: Timespec) -> io::Result<()> {
        self.tlv(t, &v.to_bytes())
    }

    /// DATA: a plain attribute in v1; in v2+ a bare type whose bytes (returned, written
    /// after the buffer without a copy) run to the end of the command.
    fn data<'c>(&mut self, v: &'c [u8]) -> io::Result<&'c [u8]> {
        if self.version == 1 {
            self.tlv(attr::DATA, v)?;
            return Ok(&[]);
        }
        self.buf.extend_from_slice(&attr::DATA.to_le_bytes());
        Ok(v)
    }

    /// Appends `c`'s attributes to the buffer; returns the v2+ DATA bytes that follow.
    fn put_attributes<'c>(&mut self, c: &'c Command) -> io::Result<&'c [u8]> {
        use attr as A;
        match c {
            Command::Subvol {
                path,
                uuid,
                ctransid,
            } => {
                self.tlv(A::PATH, path)?;
                self.tlv(A::UUID, uuid)?;
                self.u64(A::CTRANSID, *ctransid)?;
            }
            Command::Snapshot {
                path,
                uuid,
                ctransid,
                clone_uuid,
                clone_ctransid,
            } => {
                self.tlv(A::PATH, path)?;
                self.tlv(A::UUID, uuid)?;
                self.u64(A::CTRANSID, *ctransid)?;
                self.tlv(A::CLONE_UUID, clone_uuid)?;
                self.u64(A::CLONE_CTRANSID, *clone_ctransid)?;
            }
            Command::Mkfile { path, ino } | Command::Mkdir { path, ino } => {
                self.tlv(A::PATH, path)?;
                self.u64(A::INO, *ino)?;
            }
            Command::Mknod {
                path,
                ino,
                mode,
                rdev,
            } => {
                self.tlv(A::PATH, path)?;
                self.u64(A::INO, *ino)?;
                self.u64(A::RDEV, *rdev)?;
                self.u64(A::MODE, *mode)?;
            }
            Command::Mkfifo {
                path,
                ino,
                mode,
                rdev,
            }
            | Command::Mksock {
                path,
                ino,
                mode,
                rdev,
            } => {
                self.tlv(A::PATH, path)?;
                self.u64(A::INO, *ino)?;
                if let Some(r) = rdev {
                    self.u64(A::RDEV, *r)?;
                }
                if let Some(m) = mode {
                    self.u64(A::MODE, *m)?;
                }
            }
            Command::Symlink { path, ino, target } => {
                self.tlv(A::PATH, path)?;
                self.u64(A::INO, *ino)?;
                self.tlv(A::PATH_LINK, target)?;
            }
            Command::Rename { from, to } => {
                self.tlv(A::PATH, from)?;
                self.tlv(A::PATH_TO, to)?;
            }
            Command::Link { path, link } => {
                self.tlv(A::PATH, path)?;
                self.tlv(A::PATH_LINK, link)?;
            }
            Command::Unlink { path } | Command::Rmdir { path } => self.tlv(A::PATH, path)?,
            Command::SetXattr { path, name, data } => {
                self.tlv(A::PATH, path)?;
                self.tlv(A::XATTR_NAME, name)?;
                self.tlv(A::XATTR_DATA, data)?;
            }
            Command::RemoveXattr { path, name } => {
                self.tlv(A::PATH, path)?;
                self.tlv(A::XATTR_NAME, name)?;
            }
            Command::Write { path, offset, data } => {
                self.tlv(A::PATH, path)?;
                self.u64(A::FILE_OFFSET, *offset)?;
                return self.data(data);
            }
            Command::Clone {
                path,
                offset,
                len,
                clone_uuid,
                clone_ctransid,
                clone_path,
                clone_offset,
            } => {
                // The kernel's order: the range before the path.
                self.u64(A::FILE_OFFSET, *offset)?;
                self.u64(A::CLONE_LEN, *len)?;
                self.tlv(A::PATH, path)?;
                self.tlv(A::CLONE_UUID, clone_uuid)?;
                self.u64(A::CLONE_CTRANSID, *clone_ctransid)?;
                self.tlv(A::CLONE_PATH, clone_path)?;
                self.u64(A::CLONE_OFFSET, *clone_offset)?;
            }
            Command::Truncate { path, size } => {
                self.tlv(A::PATH, path)?;
                self.u64(A::SIZE, *size)?;
            }
            Command::Chmod { path, mode } => {
                self.tlv(A::PATH, path)?;
                self.u64(A::MODE, *mode)?;
            }
            Command::Chown { path, uid, gid } => {
                self.tlv(A::PATH, path)?;
                self.u64(A::UID, *uid)?;
                self.u64(A::GID, *gid)?;
            }
            Command::Utimes {
                path,
                atime,
                mtime,
                ctime,
                otime,
            } => {
                self.tlv(A::PATH, path)?;
                self.time(A::ATIME, *atime)?;
                self.time(A::MTIME, *mtime)?;
                self.time(A::CTIME, *ctime)?;
                if let Some(o) = otime {
                    self.time(A::OTIME, *o)?;
                }
            }
            Command::End => {}
            Command::UpdateExtent { path, offset, len } => {
                self.tlv(A::PATH, path)?;
                self.u64(A::FILE_OFFSET, *offset)?;
                self.u64(A::SIZE, *len)?;
            }
            Command::Fallocate {
                path,
                mode,
                offset,
                len,
            } => {
                self.tlv(A::PATH, path)?;
                self.u32(A::FALLOCATE_MODE, *mode)?;
                self.u64(A::FILE_OFFSET, *offset)?;
                self.u64(A::SIZE, *len)?;
            }
            Command::Fileattr { path, attr } => {
                self.tlv(A::PATH, path)?;
                self.u64(A::FILEATTR, *attr)?;
            }
            Command::EncodedWrite {
                path,
                offset,
                unencoded_file_len,
                unencoded_len,
                unencoded_offset,
                compression,
                encryption,
                data,
            } => {
                self.tlv(A::PATH, path)?;
                self.u64(A::FILE_OFFSET, *offset)?;
                self.u64(A::UNENCODED_FILE_LEN, *unencoded_file_len)?;
                self.u64(A::UNENCODED_LEN, *unencoded_len)?;
                self.u64(A::UNENCODED_OFFSET, *unencoded_offset)?;
                if let Some(c) = compression {
                    self.u32(A::COMPRESSION, *c)?;
                }
                if let Some(e) = encryption {
                    self.u32(A::ENCRYPTION, *e)?;
                }
                return self.data(data);
            }
            Command::EnableVerity {
                path,
                algorithm,
                block_size,
                salt,
                sig,
            } => {
                self.tlv(A::PATH, path)?;
                self.tlv(A::VERITY_ALGORITHM, &[*algorithm])?;
                self.u32(A::VERITY_BLOCK_SIZE, *block_size)?;
                self.tlv(A::VERITY_SALT_DATA, salt)?;
                self.tlv(A::VERITY_SIG_DATA, sig)?;
            }
        }
        Ok(&[])
    }
}
