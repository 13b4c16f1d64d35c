//! The locks the commit protocol is built on: std's, or shuttle's when the crate is built
//! for the model checker (feature `model-check`, see `commit_pipe`'s tests).

#[cfg(feature = "model-check")]
pub(crate) use shuttle::sync::{Condvar, Mutex};
#[cfg(not(feature = "model-check"))]
pub(crate) use std::sync::{Condvar, Mutex};
