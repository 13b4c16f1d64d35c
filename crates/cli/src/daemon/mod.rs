//! The serving side of `oleo mount`, the process that stays behind: attaching the FUSE
//! connection (`fuse_mount`) with the kernel's VFS flags (`vfs_flags`), the guard that keeps
//! other writers off the image (`guard`), stopping on a signal (`stop`), and the send and
//! receive streams it serves through the mount (`streams`), and a second mount of an image
//! already mounted, a bind mount of the first (`twice`). The verbs themselves are
//! `crate::mount` and `crate::umount`.

pub mod fuse_mount;
pub mod guard;
pub mod stop;
pub mod streams;
pub mod twice;
pub mod vfs_flags;
