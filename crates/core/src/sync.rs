//! The one place the core takes its locks, atomics and task spawns from.
//!
//! Normally these are `std::sync`'s and tokio's. Built with the `shuttle` feature they are
//! [shuttle](https://docs.rs/shuttle)'s instead: every lock, atomic access and spawn is then
//! a point where shuttle's scheduler may switch tasks, so a shuttle test explores the
//! orders in which concurrent requests interleave between (not only at) their awaits, and
//! reports a lock-order cycle as a deadlock. The lock order is written once, in
//! docs/ARCHITECTURE.md ("Locking"), and at each lock's field.
//!
//! What shuttle does not model, kept as it is:
//! - tokio's async locks and semaphores (`write::SharedStaged`, the intents' `Notify`, the
//!   listing flights, the prefetch and part budgets, `tokio::sync::Notify`, `oneshot`).
//!   They are waker-based, so they run under shuttle's executor, but which waiter gets a
//!   contended one is tokio's choice (first come, first served), not explored.
//! - `moka`'s caches (their own internal locks, never held across our code).
//! - `OnceLock` (set once at start-up) and `block_pool`'s free list (a leaf).
//! - tokio timers (`tokio::time`): code that sleeps or times out needs a tokio runtime and is
//!   not run under shuttle (the write-back scheduler, the readdir-cache timer, and the
//!   passthrough tasks that tick: feeding a watched staged file, lingering, settling).
//!
//! With the feature on, the core's locks work only inside a shuttle test: the feature is for
//! `cargo test -p bucketfs-core --features shuttle --test shuttle` (and `--test model`), never
//! for a build of the binary.

#[cfg(not(feature = "shuttle"))]
pub(crate) use std::sync::{
    atomic::{AtomicBool, AtomicU64, Ordering},
    Arc, Mutex, Weak,
};

#[cfg(feature = "shuttle")]
pub(crate) use shuttle::sync::{
    atomic::{AtomicBool, AtomicU64, Ordering},
    Arc, Mutex, Weak,
};

/// Start a task (`tokio::spawn`; shuttle's under the feature). Needs a runtime.
#[cfg(not(feature = "shuttle"))]
pub(crate) fn spawn<F>(fut: F)
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(fut);
}

#[cfg(feature = "shuttle")]
pub(crate) fn spawn<F>(fut: F)
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    shuttle::future::spawn(fut);
}

/// Run `fut` in a task of its own and wait for it at most `patience`: `None` if it is still
/// running then (it goes on, detached, and its end is not awaited) or panicked.
#[cfg(not(feature = "shuttle"))]
pub(crate) async fn within<F>(patience: std::time::Duration, fut: F) -> Option<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::time::timeout(patience, tokio::spawn(fut)).await.ok()?.ok()
}

/// Under shuttle (no timer): the task is awaited.
#[cfg(feature = "shuttle")]
pub(crate) async fn within<F>(_patience: std::time::Duration, fut: F) -> Option<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    shuttle::future::spawn(fut).await.ok()
}

/// Run blocking work (disk I/O) off the async threads; `None` if it panicked.
#[cfg(not(feature = "shuttle"))]
pub(crate) async fn blocking<F, T>(f: F) -> Option<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f).await.ok()
}

/// Under shuttle: a task of its own, so other tasks may run while it is pending.
#[cfg(feature = "shuttle")]
pub(crate) async fn blocking<F, T>(f: F) -> Option<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    shuttle::future::spawn(async move { f() }).await.ok()
}

/// Start blocking work and do not wait for it.
pub(crate) fn blocking_detached<F>(f: F)
where
    F: FnOnce() + Send + 'static,
{
    #[cfg(not(feature = "shuttle"))]
    tokio::task::spawn_blocking(f);
    #[cfg(feature = "shuttle")]
    shuttle::future::spawn(async move { f() });
}
