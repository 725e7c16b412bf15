//! Requests a store sends without its caller waiting for them (the deletes of an append's
//! temporary objects, after the append is done), and [`crate::Store::settle`], which waits
//! for them at unmount and `bucketfs sync`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinSet;

/// The background requests of one store (clones share them).
#[derive(Clone, Default)]
pub struct Background(Arc<Mutex<JoinSet<()>>>);

impl Background {
    /// Run `work` on the current runtime; the ones already done are reaped first, so the
    /// set holds only what is in flight.
    pub fn spawn(&self, work: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut set = self.0.lock().unwrap();
        while set.try_join_next().is_some() {}
        set.spawn(work);
    }

    /// Wait for everything begun so far, for `within` at most (a store that hangs must not
    /// hang an unmount): what is left then runs on untracked (not waited for again), and
    /// false is returned.
    pub async fn settle(&self, within: Duration) -> bool {
        let mut set = std::mem::take(&mut *self.0.lock().unwrap());
        let done = tokio::time::timeout(within, async { while set.join_next().await.is_some() {} }).await.is_ok();
        set.detach_all();
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn settle_waits_for_work_begun_and_gives_up_on_a_hang() {
        let bg = Background::default();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let d = done.clone();
        bg.spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            d.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        assert!(bg.settle(Duration::from_secs(10)).await);
        assert!(done.load(std::sync::atomic::Ordering::SeqCst), "settled before the work ended");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let d = done.clone();
        bg.spawn(async move {
            let _ = rx.await; // hangs until told
            d.store(false, std::sync::atomic::Ordering::SeqCst);
        });
        assert!(!bg.settle(Duration::from_millis(50)).await, "a hang is reported");
        assert!(bg.settle(Duration::from_millis(50)).await, "and not waited for again");
        tx.send(()).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!done.load(std::sync::atomic::Ordering::SeqCst), "what was left ran on, not cancelled");
    }
}
