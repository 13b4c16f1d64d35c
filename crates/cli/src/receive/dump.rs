//! `oleo receive --dump`: print a send stream's commands one per line, byte for byte as
//! btrfs-progs 6.2's `btrfs receive --dump` does (its quirks included), after checking every
//! command (crc, attributes, paths).

use oleo_format::send_stream::{Command, StreamReader, Timespec};
use std::io::{BufWriter, Read, Write};

/// Prints the stream read from `input` (`name` prefixes errors, "" for standard input).
pub fn run(input: Box<dyn Read>, name: &str) -> Result<(), String> {
    let out = BufWriter::with_capacity(64 << 10, std::io::stdout().lock());
    let mut d = Dump {
        out,
        subvol: b".".to_vec(),
    };
    let r = dump(input, &mut d).map_err(|e| format!("{name}{e}"));
    // What was printed before an error stays printed, as with btrfs.
    let flushed = d.out.flush().map_err(|e| format!("stdout: {e}"));
    r.and(flushed)
}

fn dump(input: Box<dyn Read>, d: &mut Dump<impl Write>) -> Result<(), String> {
    let mut r = StreamReader::new(std::io::BufReader::with_capacity(256 << 10, input))
        .map_err(|e| e.to_string())?;
    while let Some(c) = r.next_command().map_err(|e| e.to_string())? {
        if c == Command::End {
            // btrfs stops at the first END and ignores what follows.
            break;
        }
        let line = d.line(&c)?;
        d.out.write_all(&line).map_err(|e| format!("stdout: {e}"))?;
    }
    Ok(())
}

/// The dump's state: the current subvolume's path ("." until SUBVOL or SNAPSHOT).
struct Dump<W> {
    out: W,
    subvol: Vec<u8>,
}

/// btrfs-progs' PATH_MAX check in `path_cat_out`.
const PATH_MAX: usize = 4096;

/// `a/b` with one trailing '/' dropped from each (as btrfs-progs' `path_cat_out`).
fn cat(title: &str, a: &[u8], b: &[u8]) -> Result<Vec<u8>, String> {
    if a.len() + b.len() + 2 >= PATH_MAX {
        return Err(format!(
            "{title}: path invalid: {}",
            String::from_utf8_lossy(b)
        ));
    }
    let a = a.strip_suffix(b"/").unwrap_or(a);
    let b = b.strip_suffix(b"/").unwrap_or(b);
    Ok([a, b"/", b].concat())
}

/// Up to the first NUL: btrfs-progs handles these as C strings.
fn c_str(b: &[u8]) -> &[u8] {
    b.iter().position(|&c| c == 0).map_or(b, |n| &b[..n])
}

/// C-style escapes for what would break a line, octal for other unprintable bytes (the C
/// locale's isprint: 0x20 to 0x7e). Returns the bytes written.
fn escape(out: &mut Vec<u8>, p: &[u8]) -> usize {
    let start = out.len();
    for &c in c_str(p) {
        let esc = match c {
            0x07 => Some(b'a'),
            0x08 => Some(b'b'),
            0x1b => Some(b'e'),
            0x0c => Some(b'f'),
            b'\n' => Some(b'n'),
            b'\r' => Some(b'r'),
            b'\t' => Some(b't'),
            0x0b => Some(b'v'),
            b' ' | b'\\' => Some(c),
            _ => None,
        };
        match esc {
            Some(e) => out.extend_from_slice(&[b'\\', e]),
            None if (0x20..=0x7e).contains(&c) => out.push(c),
            None => out.extend_from_slice(&[
                b'\\',
                b'0' + (c >> 6),
                b'0' + ((c >> 3) & 7),
                b'0' + (c & 7),
            ]),
        }
    }
    out.len() - start
}

/// `%FT%T%z` in local time, as btrfs-progs prints times.
fn local_time(t: &Timespec) -> Result<String, String> {
    let sec = t.sec as libc::time_t;
    // SAFETY: localtime_r and strftime write only into the buffers given, of the sizes
    // given; tm is plain data.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&sec, &mut tm).is_null() {
            return Err(format!(
                "failed to convert time {}.{:09} to local time",
                sec, t.nsec
            ));
        }
        let mut buf = [0u8; 64];
        let n = libc::strftime(
            buf.as_mut_ptr().cast(),
            buf.len() - 1,
            c"%FT%T%z".as_ptr(),
            &tm,
        );
        if n == 0 {
            return Err(format!(
                "time {sec}.{} is too long to convert into readable string",
                t.nsec
            ));
        }
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    }
}

fn uuid(u: &[u8; 16]) -> String {
    oleo_format::bytes::uuid_string(u)
}

impl<W: Write> Dump<W> {
    /// A full line: the title in 16 columns, the escaped path, then (if any) the rest after
    /// padding the path to 32 columns, at least one space.
    fn head(&self, title: &str, full: &[u8], rest: Option<&[u8]>) -> Vec<u8> {
        let mut l = format!("{title:<16}").into_bytes();
        let n = escape(&mut l, full);
        if let Some(rest) = rest {
            l.resize(l.len() + 32usize.saturating_sub(n).max(1), b' ');
            l.extend_from_slice(rest);
        }
        l.push(b'\n');
        l
    }

    fn at(&self, title: &str, path: &[u8], rest: Option<String>) -> Result<Vec<u8>, String> {
        let full = cat(title, &self.subvol, path)?;
        Ok(self.head(title, &full, rest.as_deref().map(str::as_bytes)))
    }

    /// Lines whose rest is `dest=` and an escaped path.
    fn dest(&self, title: &str, path: &[u8], dest: &[u8]) -> Result<Vec<u8>, String> {
        let full = cat(title, &self.subvol, path)?;
        let mut rest = b"dest=".to_vec();
        escape(&mut rest, dest);
        Ok(self.head(title, &full, Some(&rest)))
    }

    fn line(&mut self, c: &Command) -> Result<Vec<u8>, String> {
        match c {
            Command::Subvol {
                path,
                uuid: u,
                ctransid,
            } => {
                self.subvol = cat("subvol", b".", path)?;
                let rest = format!("uuid={} transid={ctransid}", uuid(u));
                Ok(self.head("subvol", &self.subvol, Some(rest.as_bytes())))
            }
            Command::Snapshot {
                path,
                uuid: u,
                ctransid,
                clone_uuid,
                clone_ctransid,
            } => {
                self.subvol = cat("snapshot", b".", path)?;
                let rest = format!(
                    "uuid={} transid={ctransid} parent_uuid={} parent_transid={clone_ctransid}",
                    uuid(u),
                    uuid(clone_uuid)
                );
                Ok(self.head("snapshot", &self.subvol, Some(rest.as_bytes())))
            }
            Command::Mkfile { path, .. } => self.at("mkfile", path, None),
            Command::Mkdir { path, .. } => self.at("mkdir", path, None),
            Command::Mknod {
                path, mode, rdev, ..
            } => self.at("mknod", path, Some(format!("mode={mode:o} dev={rdev:#x}"))),
            Command::Mkfifo { path, .. } => self.at("mkfifo", path, None),
            Command::Mksock { path, .. } => self.at("mksock", path, None),
            Command::Symlink { path, target, .. } => self.dest("symlink", path, target),
            Command::Rename { from, to } => {
                let to = cat("rename", &self.subvol, to)?;
                self.dest("rename", from, &to)
            }
            // btrfs prints a link's existing path as it is, not under the subvolume.
            Command::Link { path, link } => self.dest("link", path, link),
            Command::Unlink { path } => self.at("unlink", path, None),
            Command::Rmdir { path } => self.at("rmdir", path, None),
            Command::Write { path, offset, data } => self.at(
                "write",
                path,
                Some(format!("offset={offset} len={}", data.len())),
            ),
            Command::Clone {
                path,
                offset,
                len,
                clone_path,
                clone_offset,
                ..
            } => {
                let from = cat("clone", &self.subvol, clone_path)?;
                // btrfs-progs 6.2 reads CLONE_LEN into an int.
                let len = *len as i32 as i64 as u64;
                let mut rest = format!("offset={offset} len={len} from=").into_bytes();
                rest.extend_from_slice(c_str(&from));
                rest.extend_from_slice(format!(" clone_offset={clone_offset}").as_bytes());
                let full = cat("clone", &self.subvol, path)?;
                Ok(self.head("clone", &full, Some(&rest)))
            }
            Command::SetXattr { path, name, data } => {
                // The name and the value, raw, each up to a NUL (printf's %s and %.*s).
                let mut rest = b"name=".to_vec();
                rest.extend_from_slice(c_str(name));
                rest.extend_from_slice(b" data=");
                rest.extend_from_slice(c_str(data));
                rest.extend_from_slice(format!(" len={}", data.len() as i32).as_bytes());
                let full = cat("set_xattr", &self.subvol, path)?;
                Ok(self.head("set_xattr", &full, Some(&rest)))
            }
            Command::RemoveXattr { path, name } => {
                let mut rest = b"name=".to_vec();
                rest.extend_from_slice(c_str(name));
                let full = cat("remove_xattr", &self.subvol, path)?;
                Ok(self.head("remove_xattr", &full, Some(&rest)))
            }
            Command::Truncate { path, size } => {
                self.at("truncate", path, Some(format!("size={size}")))
            }
            Command::Chmod { path, mode } => self.at("chmod", path, Some(format!("mode={mode:o}"))),
            Command::Chown { path, uid, gid } => {
                self.at("chown", path, Some(format!("gid={gid} uid={uid}")))
            }
            Command::Utimes {
                path,
                atime,
                mtime,
                ctime,
                ..
            } => {
                let rest = format!(
                    "atime={} mtime={} ctime={}",
                    local_time(atime)?,
                    local_time(mtime)?,
                    local_time(ctime)?
                );
                self.at("utimes", path, Some(rest))
            }
            Command::End => Ok(Vec::new()),
            Command::UpdateExtent { path, offset, len } => self.at(
                "update_extent",
                path,
                Some(format!("offset={offset} len={len}")),
            ),
            Command::Fallocate {
                path,
                mode,
                offset,
                len,
            } => self.at(
                "fallocate",
                path,
                Some(format!("mode={} offset={offset} len={len}", *mode as i32)),
            ),
            // "0x" and a decimal number: what btrfs-progs 6.2 prints.
            Command::Fileattr { path, attr } => {
                self.at("fileattr", path, Some(format!("fileattr=0x{attr}")))
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
            } => self.at(
                "encoded_write",
                path,
                Some(format!(
                    "offset={offset} len={}, unencoded_file_len={unencoded_file_len}, \
                     unencoded_len={unencoded_len}, unencoded_offset={unencoded_offset}, \
                     compression={compression}, encryption={encryption}",
                    data.len(),
                    compression = compression.unwrap_or(0),
                    encryption = encryption.unwrap_or(0),
                )),
            ),
            Command::EnableVerity {
                path,
                algorithm,
                block_size,
                salt,
                sig,
            } => self.at(
                "enable_verity",
                path,
                Some(format!(
                    "algorithm={algorithm} block_size={block_size} salt_len={} sig_len={}",
                    salt.len(),
                    sig.len()
                )),
            ),
        }
    }
}
