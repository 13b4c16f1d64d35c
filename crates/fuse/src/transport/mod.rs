//! oleo's own FUSE transport: the kernel protocol spoken over /dev/fuse, with worker
//! threads on cloned descriptors (`session`), or over io_uring commands with per-CPU
//! queues where the kernel offers it (`uring`). Ours rather than a crate's because the
//! crates lack what oleo needs (FUSE_TMPFILE for O_TMPFILE, FUSE over io_uring). It knows nothing of
//! btrfs: the adapter in `lib.rs` turns requests into engine calls.

pub mod abi;
pub mod counts;
mod reply;
mod request;
mod session;
mod uring;

pub use counts::RequestCounts;
pub use reply::{DirBuf, Errno, Notifier, Reply};
pub use request::{Op, Request};
pub use session::{will_block, Access, Handler, InitConfig, Session};
