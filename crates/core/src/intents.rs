//! Intents: work that changes keys in the store declares the keys it covers, and waits
//! only for work whose keys overlap (docs/ARCHITECTURE.md, "Locking").
//!
//! An upload declares its key, shared (uploads of one key never run at once anyway: each
//! holds its staged file's mutex); an unlink declares the key it removes, a rename the
//! source and the target (a directory's as every key below it), exclusively. So a cancel or
//! redirect never races an upload of the same key in flight (an unlinked file is never
//! uploaded, a renamed one goes up under its new name), while an `rm` of one file no
//! longer waits for the upload of another, and renames of unrelated names run at once.
//!
//! The key a caller declares is read before it waits; a rename may have moved it
//! meanwhile, so callers check the key again once they hold the intent and declare anew
//! if it moved ([`crate::fs::Fs::upload_intent`]).

use crate::sync::Mutex;

/// What an intent covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scope {
    /// One key (a file's object, a link's, a directory's marker alone).
    Key(String),
    /// A directory: its marker `p` (ending in `/`) and every key below it.
    Below(String),
}

impl Scope {
    fn overlaps(&self, other: &Scope) -> bool {
        match (self, other) {
            (Scope::Key(a), Scope::Key(b)) => a == b,
            (Scope::Key(k), Scope::Below(p)) | (Scope::Below(p), Scope::Key(k)) => k.starts_with(p.as_str()),
            (Scope::Below(a), Scope::Below(b)) => a.starts_with(b.as_str()) || b.starts_with(a.as_str()),
        }
    }
}

struct Held {
    id: u64,
    scopes: Vec<Scope>,
    exclusive: bool,
}

/// The intents held now. Lock level 5 (a leaf): never held across an await.
#[derive(Default)]
pub(crate) struct Intents {
    held: Mutex<(u64, Vec<Held>)>,
    /// An intent was released: waiters look again.
    released: tokio::sync::Notify,
}

/// A held intent; released when dropped.
pub(crate) struct Intent<'a> {
    owner: &'a Intents,
    id: u64,
}

impl Intents {
    /// Wait until no intent overlapping `scopes` conflicts (either side exclusive), then
    /// hold it. Held across awaits (lock level 1, the outermost).
    pub(crate) async fn acquire(&self, scopes: Vec<Scope>, exclusive: bool) -> Intent<'_> {
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if let Some(id) = self.try_take(&scopes, exclusive) {
                return Intent { owner: self, id };
            }
            released.await;
        }
    }

    /// [`Intents::acquire`] without waiting: `None` if a conflicting intent is held.
    pub(crate) fn try_acquire(&self, scopes: Vec<Scope>, exclusive: bool) -> Option<Intent<'_>> {
        self.try_take(&scopes, exclusive).map(|id| Intent { owner: self, id })
    }

    fn try_take(&self, scopes: &[Scope], exclusive: bool) -> Option<u64> {
        let mut h = self.held.lock().unwrap();
        let conflict =
            h.1.iter()
                .any(|o| (exclusive || o.exclusive) && o.scopes.iter().any(|a| scopes.iter().any(|b| a.overlaps(b))));
        if conflict {
            return None;
        }
        h.0 += 1;
        let id = h.0;
        h.1.push(Held { id, scopes: scopes.to_vec(), exclusive });
        Some(id)
    }

    /// How many intents are held (for tests).
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.held.lock().unwrap().1.len()
    }
}

impl Drop for Intent<'_> {
    fn drop(&mut self) {
        self.owner.held.lock().unwrap().1.retain(|h| h.id != self.id);
        self.owner.released.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn key(k: &str) -> Vec<Scope> {
        vec![Scope::Key(k.into())]
    }

    #[tokio::test]
    async fn only_overlapping_intents_wait() {
        let i = Intents::default();
        let upload = i.acquire(key("big"), false).await;
        // Another key, exclusively (an `rm` of another file): at once.
        assert!(i.try_acquire(key("small"), true).is_some());
        // Another upload of the same key: shared with the first.
        assert!(i.try_acquire(key("big"), false).is_some());
        // A delete of the uploading key, or a move of its directory, waits.
        assert!(i.try_acquire(key("big"), true).is_none());
        let dir = i.acquire(vec![Scope::Below("d/".into())], false).await;
        assert!(i.try_acquire(key("d/x"), true).is_none());
        assert!(i.try_acquire(vec![Scope::Below("d/e/".into())], true).is_none());
        assert!(i.try_acquire(vec![Scope::Below("dd/".into())], true).is_some());
        drop(dir);
        let waiter = async {
            let _g = i.acquire(key("big"), true).await;
        };
        let release = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(upload);
        };
        tokio::time::timeout(Duration::from_secs(5), async { tokio::join!(waiter, release) })
            .await
            .expect("the waiter gets the intent once the upload's is released");
        assert_eq!(i.held(), 0);
    }
}
