//! oleo-testkit: proves that oleo shows exactly what the Linux kernel shows.
//!
//! The recipe, used by `crates/cli/tests/kernel_compare.rs`:
//! 1. [`build_image`] an image from an [`ImageSpec`]: mkfs.btrfs, then the kernel driver
//!    writes a seeded mix of everything btrfs can store ([`PopulateSpec`]);
//! 2. mount it with the kernel ([`KernelMount`], `ro,noatime`) and [`Manifest::capture`];
//! 3. mount it with oleo ([`OleoMount`]) and capture again;
//! 4. [`Manifest::diff`] under [`CompareRules`]: every line is a difference.
//!
//! Nothing here hard-codes an expected result: the kernel is the reference.
//! Tests needing root call [`require_root`] / [`require_fuse`] first (skip locally,
//! fail under `CI=true`).

pub mod aio;
pub mod check;
pub mod cmd;
pub mod damage;
pub mod env;
pub mod image;
pub mod manifest;
pub mod mount;
pub mod multi_device;
pub mod ops;
pub mod populate;
pub mod syscalls;
pub mod tempdir;

pub use check::{assert_btrfs_check, btrfs_check};
pub use env::{
    is_ci, open_descriptors, require_fuse, require_fuse_mount, require_mkfs_features, require_root,
    seed,
};
pub use image::{
    build_image, build_image_with_log, build_image_with_pending_log, empty_image, image_stats,
    superblock_generation, superblock_log_root, ImageSpec, ImageStats,
};
pub use manifest::{CompareRules, DirEntry, Entry, InodeNumbers, Kind, Manifest, StatFs, Time};
pub use mount::{
    is_mounted, mount_at, oleo_mkfs, subvolume_id, KernelMount, LoopDevice, OleoMount, Watchdog,
};
pub use populate::PopulateSpec;
pub use tempdir::TempDir;
