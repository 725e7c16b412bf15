//! Test doubles (feature `testing`): [`MemStore`], an in-memory store with latency and
//! throughput knobs, and [`FailStore`], a wrapper that fails the Nth call of an operation.

mod fail;
mod mem;

pub use fail::{FailStore, Op};
pub use mem::MemStore;
