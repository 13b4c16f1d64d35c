//! What several verbs share, as btrfs-progs' common/: logging, progress meters on a
//! terminal, size units as progs prints them, and the ioctls that reach a mounted oleo.

pub mod host_tree;
pub mod into_image;
pub mod logging;
pub mod on_mount;
pub mod progress;
pub mod read_ahead;
pub mod units;
