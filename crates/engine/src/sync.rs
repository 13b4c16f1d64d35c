//! The locks the commit protocol and in-place writes are built on: std's, or shuttle's
//! when the crate is built for the model checker (feature `model-check`, see the tests of
//! `commit_pipe`, `nocow` and `prealloc_fill`).

#[cfg(feature = "model-check")]
pub(crate) use shuttle::sync::{
    Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
};
#[cfg(not(feature = "model-check"))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
