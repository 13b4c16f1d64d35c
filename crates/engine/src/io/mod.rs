//! Layer 1, IO: the device and what a block read or write needs to be trusted. Uses only
//! the crate's base modules (`error`, `sync`, `blocking`) and `oleo_format`.
//!
//! - `device`: the image or block device, buffered or direct, with an io_uring queue
//!   (`device_uring`) for batches; records writes and flushes for crash tests.
//! - `claim`: the exclusive claim on the device (no second writer, no kernel mount, no
//!   loop device over it) and its re-checks while mounted.
//! - `devices`: the filesystem's devices, matched by fsid and devid; missing ones.
//! - `volumes`: the chunk map from logical to physical addresses (the kernel's volumes.c).
//! - `disk_io`: verified tree block reads (checksum, bytenr, generation, owner), the block
//!   cache, and the in-flight blocks of commits still being written.
//! - `rescue`: the `rescue=` options and the log of what a rescue open went around.
//! - `write_behind`: device writes on a thread of their own, for one-thread bulk loads.

pub mod claim;
pub mod device;
pub(crate) mod device_uring;
pub(crate) mod devices;
pub mod disk_io;
pub mod rescue;
pub mod volumes;
pub(crate) mod write_behind;
