//! Uploads cut off that may still land, watched for a while after.
//!
//! An upload cut off (a timeout, or cancelled for a writer, a rename or an unlink) may still
//! be completed by the store: what sat in a socket or a proxy when it was cut off reaches
//! the server later. A server that hung completes it within moments of resuming, which the
//! second upload or delete `LANDING_GRACE` (3 s) later covers (fs_write_back.rs,
//! deletes.rs). Over a slow link the bytes trickle on for as long as they take: on the GCS
//! emulator behind a 100 KB/s link, a 2 MB upload cancelled by a rewrite landed 13-19 s
//! later, over the newer version, and an unlinked or renamed name came back, for good
//! (tester B). The same goes for a try the store itself sent again after a timeout
//! ([`bucketfs_store::Store::put_tried`]), on a durable mount too: on GCS behind 45 s of
//! latency, a close's first try landed after the next close, or after an `rm` (tester G).
//!
//! So a key such an upload may still land on is watched for [`WATCH_FOR`] after its cut-off
//! upload is followed by a newer upload or a delete (or after the upload the store sent
//! twice), with the MD5 of each cut-off upload's
//! bytes: checked (one HEAD) at [`FIRST_CHECK`], then at doubling intervals, and once more
//! at the end. An object there with one of those MD5s is ours, landed late: the file now
//! under the name goes up again, or, if none is, the object is deleted (only those bytes:
//! another client's object stays). `bucketfs sync` checks every watched key at once before
//! it answers. Only single-request uploads' MD5s are known (files up to one part,
//! `--part-size-mib`); a multipart upload lands only through its last, small request.
//!
//! The table is here; the checks and what they undo are `Fs`'s (fs_late.rs).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bucketfs_store::{HeadOpts, ObjectHead, Store, StoreError, StoreErrorKind, StoreExt};

use crate::sync::Mutex;

/// How long after its cut-off upload was followed by another upload or a delete a key is
/// watched: far longer than a request sent whole takes to trickle through a slow link.
pub(crate) const WATCH_FOR: Duration = Duration::from_secs(300);
/// The first check; each later one waits twice as long as the one before.
pub(crate) const FIRST_CHECK: Duration = Duration::from_secs(5);

/// One watched key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Watch {
    /// What the cut-off uploads sent.
    pub md5s: Vec<[u8; 16]>,
    /// The file whose version the key holds now (its last upload there), or `None` after
    /// a delete of the key: the key is to hold no object.
    pub holder: Option<u64>,
    /// A late landing was found that could not be undone yet: the holder was open and
    /// changed by a writer (its last closed version is not in the bucket until the
    /// writer's close), or no longer staged. `bucketfs sync` names the key meanwhile.
    pub stuck: bool,
    next: Instant,
    step: Duration,
    until: Instant,
}

/// The keys watched; see the module doc.
#[derive(Default)]
pub(crate) struct LateLandings {
    /// Lock level: a leaf.
    table: Mutex<BTreeMap<String, Watch>>,
}

impl LateLandings {
    /// Watch `key` for uploads sending `md5s` (merged with those watched already), from
    /// `now` on; it now holds `holder`'s version (or nothing).
    pub fn watch(&self, key: &str, md5s: &[[u8; 16]], holder: Option<u64>, now: Instant) {
        if md5s.is_empty() {
            return self.now_holds(key, holder);
        }
        let mut t = self.table.lock().unwrap();
        let w = t.entry(key.to_string()).or_insert_with(|| Watch {
            md5s: Vec::new(),
            holder,
            stuck: false,
            next: now + FIRST_CHECK,
            step: FIRST_CHECK,
            until: now,
        });
        for m in md5s {
            if !w.md5s.contains(m) {
                w.md5s.push(*m);
            }
        }
        (w.holder, w.stuck) = (holder, false);
        w.until = now + WATCH_FOR;
        if w.next > now + FIRST_CHECK {
            (w.next, w.step) = (now + FIRST_CHECK, FIRST_CHECK);
        }
    }

    /// `key`, if watched, now holds `holder`'s version (an upload of it succeeded), or
    /// nothing (`None`: deleted).
    pub fn now_holds(&self, key: &str, holder: Option<u64>) {
        if let Some(w) = self.table.lock().unwrap().get_mut(key) {
            (w.holder, w.stuck) = (holder, false);
        }
    }

    /// A late landing on `key` could not be undone now ([`Watch::stuck`]).
    pub fn stuck(&self, key: &str) {
        if let Some(w) = self.table.lock().unwrap().get_mut(key) {
            w.stuck = true;
        }
    }

    /// The keys a late landing holds that could not be undone yet, for `bucketfs sync`.
    pub fn stuck_keys(&self) -> Vec<String> {
        self.table.lock().unwrap().iter().filter(|(_, w)| w.stuck).map(|(k, _)| k.clone()).collect()
    }

    /// What the cut-off uploads that may land on `key` sent (none if it is not watched).
    pub fn md5s(&self, key: &str) -> Vec<[u8; 16]> {
        self.table.lock().unwrap().get(key).map(|w| w.md5s.clone()).unwrap_or_default()
    }

    /// Whether `key` is watched.
    pub fn watches(&self, key: &str) -> bool {
        self.table.lock().unwrap().contains_key(key)
    }

    /// Whether `ino`'s version is what a watched key is to hold: its staged file stays, to
    /// go up again if an older upload lands over it.
    pub fn pins(&self, ino: u64) -> bool {
        self.table.lock().unwrap().values().any(|w| w.holder == Some(ino))
    }

    /// The keys due for a check at `now`, each with whether it is its last (the watch then
    /// ended); the next check of each is scheduled.
    pub fn due(&self, now: Instant) -> Vec<(String, Watch, bool)> {
        let mut t = self.table.lock().unwrap();
        let mut out = Vec::new();
        t.retain(|key, w| {
            if w.next > now {
                return true;
            }
            let last = w.next >= w.until;
            out.push((key.clone(), w.clone(), last));
            w.step *= 2;
            w.next = (now + w.step).min(w.until);
            !last
        });
        out
    }

    /// Every key watched now (for `bucketfs sync`, which checks them all).
    pub fn all(&self) -> Vec<(String, Watch)> {
        self.table.lock().unwrap().iter().map(|(k, w)| (k.clone(), w.clone())).collect()
    }
}

/// Which of `md5s` the object under `key` has, if one: an upload of ours cut off landed
/// there. `ours` is the tag of the version the mount put there last: an object still with
/// it needs no closer look; nor does one without the metadata our uploads carry.
pub(crate) async fn landed(
    store: &dyn Store,
    key: &str,
    md5s: &[[u8; 16]],
    ours: Option<&str>,
) -> Result<Option<[u8; 16]>, StoreError> {
    let head = match store.head(key, HeadOpts { digests: true, ..Default::default() }).await {
        Err(e) if e.kind == StoreErrorKind::NotFound => return Ok(None),
        r => r?,
    };
    if ours.is_some() && head.meta.etag.as_deref() == ours {
        return Ok(None);
    }
    if store.capabilities().keeps_attrs && head.attrs.mtime.is_none() {
        // Every upload of ours carries the file's mtime: an object without it is another
        // client's, even with the same bytes (one restored or copied again), and stays.
        return Ok(None);
    }
    which_of(store, key, &head, md5s).await
}

/// Which of `md5s` the object `head` (of `key`, asked with digests) has. The MD5 the store
/// keeps decides (GCS, Drive); an S3 ETag only where it matches (with SSE-KMS it is no
/// MD5). Otherwise (no MD5 told) the object is read and hashed here if it is small enough
/// to be one of ours ([`crate::write::LANDING_MD5_MAX`]).
pub(crate) async fn which_of(
    store: &dyn Store,
    key: &str,
    head: &ObjectHead,
    md5s: &[[u8; 16]],
) -> Result<Option<[u8; 16]>, StoreError> {
    let md5 = match (head.md5, head.content_md5()) {
        (Some(md5), _) => md5,
        (None, Some(md5)) if md5s.contains(&md5) => md5,
        _ if head.meta.size > crate::write::LANDING_MD5_MAX => return Ok(None),
        _ => match store.get_range(key, 0..head.meta.size, Default::default()).await {
            Err(e) if e.kind == StoreErrorKind::NotFound => return Ok(None),
            r => <md5::Md5 as md5::Digest>::digest(&r?[..]).into(),
        },
    };
    Ok(md5s.contains(&md5).then_some(md5))
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 16] = [1; 16];
    const B: [u8; 16] = [2; 16];

    #[test]
    fn a_watched_key_is_checked_at_doubling_intervals_then_once_at_the_end() {
        let l = LateLandings::default();
        let t0 = Instant::now();
        l.watch("k", &[A], Some(7), t0);
        assert!(l.due(t0 + Duration::from_secs(4)).is_empty());
        let mut at = Vec::new();
        let mut now = t0;
        while now < t0 + WATCH_FOR + Duration::from_secs(10) {
            for (key, w, last) in l.due(now) {
                assert_eq!((key.as_str(), w.md5s.as_slice(), w.holder), ("k", &[A][..], Some(7)));
                at.push(((now - t0).as_secs(), last));
            }
            now += Duration::from_secs(1);
        }
        assert_eq!(at, [(5, false), (15, false), (35, false), (75, false), (155, false), (300, true)]);
        assert!(l.all().is_empty() && !l.pins(7));
    }

    #[test]
    fn a_later_cut_off_merges_its_md5_and_watches_longer() {
        let l = LateLandings::default();
        let t0 = Instant::now();
        l.watch("k", &[A], None, t0);
        let t1 = t0 + Duration::from_secs(200);
        for s in 0..200 {
            l.due(t0 + Duration::from_secs(s)); // checked at 5, 15, 35, 75, 155 s; next at 300 s
        }
        l.watch("k", &[B, A], Some(3), t1);
        let (_, w) = l.all().pop().unwrap();
        assert_eq!((w.md5s, w.holder), (vec![A, B], Some(3)));
        assert!(l.due(t1 + FIRST_CHECK - Duration::from_secs(1)).is_empty(), "checked again soon after");
        assert_eq!(l.due(t1 + FIRST_CHECK).len(), 1);
        assert_eq!(l.due(t1 + WATCH_FOR - Duration::from_secs(1)).len(), 1);
        assert!(!l.all().is_empty(), "still watched: its end is WATCH_FOR after the later cut-off");
    }

    #[test]
    fn the_holder_follows_uploads_and_deletes_of_the_key_and_is_pinned() {
        let l = LateLandings::default();
        let t0 = Instant::now();
        l.now_holds("k", Some(1)); // not watched: nothing kept
        assert!(l.all().is_empty());
        l.watch("k", &[A], Some(1), t0);
        assert!(l.pins(1));
        l.now_holds("k", None);
        assert!(!l.pins(1));
        l.now_holds("k", Some(2));
        assert!(l.pins(2) && !l.pins(1));
        l.watch("j", &[], Some(5), t0); // nothing to tell a late upload by: not watched
        assert_eq!(l.all().len(), 1);
    }
}

#[cfg(test)]
#[path = "late_tests.rs"]
mod fs_tests;
