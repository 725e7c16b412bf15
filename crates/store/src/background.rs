//! Requests a store sends without its caller waiting for them (the deletes of an append's
//! temporary objects, after the append is done; the clean-up of an upload cancelled
//! mid-way, [`Guard`]), and [`crate::Store::settle`], which waits for them at unmount and
//! `bucketfs sync`.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::runtime::Handle;
use tokio::task::JoinSet;

/// The background requests of one store (clones share them).
#[derive(Clone, Default)]
pub struct Background(Arc<Mutex<JoinSet<()>>>);

impl Background {
    /// Run `work` on the current runtime; the ones already done are reaped first, so the
    /// set holds only what is in flight.
    pub fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
        self.spawn_on(work, &Handle::current());
    }

    /// [`Background::spawn`] on `rt` (from a `Drop`, which may run outside the runtime).
    pub fn spawn_on(&self, work: impl Future<Output = ()> + Send + 'static, rt: &Handle) {
        let mut set = self.0.lock().unwrap();
        while set.try_join_next().is_some() {}
        set.spawn_on(work, rt);
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

/// What an upload began that only its end cleans up (a temporary object, a multipart
/// upload): held while the upload runs. An upload cancelled mid-way (its future dropped:
/// a rename or an unlink of the file) never reaches its end, so the guard's drop hands the
/// clean-up to the store's [`Background`], which `settle` waits for; nothing blocks in the
/// drop. The paths that clean up themselves [`Guard::disarm`] it.
pub struct Guard<T: Send + 'static> {
    value: Option<T>,
    cleanup: Option<Cleanup<T>>,
    background: Background,
    /// The runtime the upload runs on (a drop may happen outside it).
    rt: Option<Handle>,
}

type Cleanup<T> = Box<dyn FnOnce(T) -> BoxFuture<'static, ()> + Send + Sync>;

impl<T: Send + 'static> Guard<T> {
    /// Guard `value` (what the clean-up needs: the writer, the key); made on the runtime.
    pub fn new<F, Fut>(value: T, background: &Background, cleanup: F) -> Self
    where
        F: FnOnce(T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let cleanup: Cleanup<T> = Box::new(move |v| Box::pin(cleanup(v)));
        Self {
            value: Some(value),
            cleanup: Some(cleanup),
            background: background.clone(),
            rt: Handle::try_current().ok(),
        }
    }

    /// The guarded value, while the upload runs.
    pub fn get_mut(&mut self) -> &mut T {
        self.value.as_mut().expect("a guard holds its value until disarmed")
    }

    /// The upload ended by a path that cleans up itself (or needs no clean-up): the value
    /// back, and nothing runs at the drop.
    pub fn disarm(mut self) -> T {
        self.cleanup = None;
        self.value.take().expect("a guard holds its value until disarmed")
    }
}

impl<T: Send + 'static> Drop for Guard<T> {
    fn drop(&mut self) {
        let (Some(value), Some(cleanup)) = (self.value.take(), self.cleanup.take()) else { return };
        // No runtime at all (the process is ending): the next mount's clean-up is left.
        if let Some(rt) = self.rt.clone().or_else(|| Handle::try_current().ok()) {
            self.background.spawn_on(cleanup(value), &rt);
        }
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_guard_dropped_armed_cleans_up_in_the_background_and_settle_waits() {
        use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
        let bg = Background::default();
        let cleaned = Arc::new(AtomicU32::new(0));
        let guard = |n: u32| {
            Guard::new((n, cleaned.clone()), &bg, |(n, c): (u32, Arc<AtomicU32>)| async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                c.fetch_add(n, SeqCst);
            })
        };
        // The upload ended by its own path: nothing runs.
        let mut g = guard(1);
        assert_eq!(g.get_mut().0, 1);
        assert_eq!(g.disarm().0, 1);
        // Cancelled: a future holding the guard dropped mid-way, here and off the runtime.
        let g = guard(10);
        let cancelled = tokio::time::timeout(Duration::from_millis(10), async move {
            let _g = g;
            std::future::pending::<()>().await
        });
        assert!(cancelled.await.is_err());
        let g = guard(100);
        std::thread::spawn(move || drop(g)).join().unwrap();
        assert!(bg.settle(Duration::from_secs(10)).await);
        assert_eq!(cleaned.load(SeqCst), 110, "settle waited for both clean-ups, and only those");
    }
}
