//! Tells the embedding program that the calling thread is about to wait for long: for a
//! commit's device IO, for a commit to become durable, or for a lock another thread holds.
//! A server that keeps few threads ready (the FUSE worker pool) uses it to wake another
//! worker, so the requests behind this one are served meanwhile.

use std::sync::OnceLock;

static HOOK: OnceLock<fn()> = OnceLock::new();

/// Sets the function called before a thread waits (once per process; later calls are
/// ignored). It runs on the waiting thread and must not block.
pub fn set_hook(hook: fn()) {
    let _ = HOOK.set(hook);
}

/// The calling thread is about to wait.
pub(crate) fn will_wait() {
    if let Some(hook) = HOOK.get() {
        hook();
    }
}
