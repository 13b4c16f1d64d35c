//! The kernel's own filesystem-wide ioctls that reach a FUSE server as they are (fixed-size
//! arguments, properly encoded): FITRIM (`fstrim`) and the label's get and set (`btrfs
//! filesystem label`). Decoded here, done by the engine.

use crate::transport::{Errno, Request};
use crate::OleoFuse;

/// `_IOWR('X', 121, struct fstrim_range)`: discard free space.
pub(crate) const FITRIM: u32 = 0xC018_5879;
/// `_IOR(0x94, 49, char[256])`: the label, NUL-terminated.
pub(crate) const FS_IOC_GETFSLABEL: u32 = 0x8100_9431;
/// `_IOW(0x94, 50, char[256])`: set the label.
pub(crate) const FS_IOC_SETFSLABEL: u32 = 0x4100_9432;
/// BTRFS_LABEL_SIZE: the label buffer, its NUL included.
const LABEL_SIZE: usize = 256;

/// True for the commands of this module.
pub(crate) fn is_fs_ioctl(c: u32) -> bool {
    [FITRIM, FS_IOC_GETFSLABEL, FS_IOC_SETFSLABEL].contains(&c)
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_ne_bytes)
}

impl OleoFuse {
    /// Runs command `c` with the input `data`; the output bytes. Root only where the
    /// kernel asks for CAP_SYS_ADMIN (trim, setting the label): the request carries the
    /// caller's uid, not its capabilities.
    pub(crate) fn fs_ioctl(&self, req: &Request, c: u32, data: &[u8]) -> Result<Vec<u8>, Errno> {
        match c {
            FITRIM => {
                if !crate::caller::Caller::is_root(req) {
                    return Err(Errno(libc::EPERM));
                }
                let (Some(start), Some(len), Some(minlen)) =
                    (u64_at(data, 0), u64_at(data, 8), u64_at(data, 16))
                else {
                    return Err(Errno(libc::EINVAL));
                };
                // A read-only mount never writes the image (the kernel trims on one).
                let trimmed = self.mutate(|fs| fs.trim(start, len, minlen))?;
                log::info!("trim of {start}+{len} (extents from {minlen}): {trimmed} bytes");
                Ok([start, trimmed, minlen]
                    .iter()
                    .flat_map(|v| v.to_ne_bytes())
                    .collect())
            }
            FS_IOC_GETFSLABEL => {
                let mut out = self.fs.label();
                out.resize(LABEL_SIZE, 0);
                Ok(out)
            }
            FS_IOC_SETFSLABEL => {
                if !crate::caller::Caller::is_root(req) {
                    return Err(Errno(libc::EPERM));
                }
                let buf = data.get(..LABEL_SIZE).unwrap_or(data);
                let Some(n) = buf.iter().position(|&b| b == 0) else {
                    return Err(Errno(libc::EINVAL));
                };
                let label = &buf[..n];
                self.mutate(|fs| fs.set_label(label))?;
                Ok(Vec::new())
            }
            _ => Err(Errno::ENOTTY),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers as asm-generic/ioctl.h encodes them from their definitions.
    #[test]
    fn numbers_are_the_kernels() {
        let ioc =
            |dir: u32, ty: u32, nr: u32, size: u32| (dir << 30) | (size << 16) | (ty << 8) | nr;
        assert_eq!(FITRIM, ioc(3, b'X' as u32, 121, 24));
        assert_eq!(FS_IOC_GETFSLABEL, ioc(2, 0x94, 49, 256));
        assert_eq!(FS_IOC_SETFSLABEL, ioc(1, 0x94, 50, 256));
    }
}
