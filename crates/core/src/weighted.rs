//! A moka cache whose weighted size stays exact when threads write one key at once.
//!
//! moka applies an insert's weight change later, from a queue, as "old weight to new
//! weight", and the first change it applies to an entry counts the new weight whole. Two
//! inserts of one key racing can reach that queue in the other order than the map saw
//! them, so the older one's change is applied last and its weight counted twice: the
//! cache's total drifts for good (measured with moka 0.12: 4 threads writing each key once
//! counted 335,942 for 335,340). The total is what bounds the disk and memory caches, so
//! writes here go one at a time; reads go straight to the cache.
//!
//! Lock order: the writers' lock is taken before anything an eviction listener takes
//! (moka may run a listener inside an insert); never write while holding such a lock.

use std::hash::Hash;
use std::sync::Mutex;

/// A [`moka::sync::Cache`] written through [`WeightedCache::insert`] and
/// [`WeightedCache::invalidate`]; everything else derefs to the cache.
pub(crate) struct WeightedCache<K, V> {
    cache: moka::sync::Cache<K, V>,
    writes: Mutex<()>,
}

impl<K, V> WeightedCache<K, V>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    pub(crate) fn new(cache: moka::sync::Cache<K, V>) -> Self {
        Self { cache, writes: Mutex::new(()) }
    }

    pub(crate) fn insert(&self, key: K, value: V) {
        let _one_writer = self.writes.lock().unwrap_or_else(|e| e.into_inner());
        self.cache.insert(key, value);
    }

    pub(crate) fn invalidate<Q>(&self, key: &Q)
    where
        Q: moka::Equivalent<K> + Hash + ?Sized,
    {
        let _one_writer = self.writes.lock().unwrap_or_else(|e| e.into_inner());
        self.cache.invalidate(key);
    }
}

impl<K, V> std::ops::Deref for WeightedCache<K, V> {
    type Target = moka::sync::Cache<K, V>;
    fn deref(&self) -> &Self::Target {
        &self.cache
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    /// Four threads write every key once each, with different weights, starting together:
    /// the total is the sum of the weights the keys end with.
    #[test]
    fn racing_writers_of_one_key_leave_the_total_exact() {
        let cache = moka::sync::Cache::builder().weigher(|_k: &u32, v: &u32| *v).max_capacity(1 << 40).build();
        let c = Arc::new(WeightedCache::new(cache));
        let (threads, keys) = (4u32, 20_000u32);
        let start = Arc::new(Barrier::new(threads as usize));
        let writers: Vec<_> = (0..threads)
            .map(|t| {
                let (c, start) = (c.clone(), start.clone());
                std::thread::spawn(move || {
                    for k in 0..keys {
                        if k % 64 == 0 {
                            start.wait(); // keep the threads on the same keys
                        }
                        c.insert(k, 1 + t * 10);
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        c.run_pending_tasks();
        let held: u64 = (0..keys).map(|k| u64::from(c.get(&k).unwrap())).sum();
        assert_eq!(c.weighted_size(), held);
    }
}
