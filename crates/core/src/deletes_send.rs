//! Sending the pending changes of [`DeferredDeletes`]: one attempt at a key's change, its
//! outcome (retried with backoff while the store is out, dropped with an error if refused),
//! and the drains that make a request wait for the pending changes it could see.

use super::*;

/// Attempts of a change that failed with an error of no known kind (an HTTP 500 past
/// OpenDAL's own retries: a brownout, as uploads take it) before it counts as refused for
/// good: about 7 minutes at `retry_backoff`.
const UNKNOWN_ERROR_ATTEMPTS: u32 = 12;

/// Whether a deferred change that failed with `err` after `attempts` earlier failures is
/// tried again (else it is refused for good: dropped, logged and named by `bucketfs sync`).
fn transient(err: &StoreError, attempts: u32) -> bool {
    match err.kind {
        StoreErrorKind::Unavailable | StoreErrorKind::RateLimited => true,
        StoreErrorKind::Other => attempts + 1 < UNKNOWN_ERROR_ATTEMPTS,
        _ => false,
    }
}

impl DeferredDeletes {
    /// Up to `room` changes due now, marked in flight, and when the next is due.
    pub(super) fn take_due(&self, room: usize) -> (Vec<String>, Option<Instant>) {
        self.pending.lock().unwrap().take_due(room, Instant::now())
    }

    /// `op` on `key`, in `store` (a delete restricted to objects of `only`; a link with
    /// content `target`).
    pub(super) async fn apply(
        store: &dyn Store,
        key: &str,
        op: Op,
        only: Option<&[[u8; 16]]>,
        target: Option<&str>,
    ) -> Result<(), StoreError> {
        match op {
            Op::Delete => delete_if_ours(store, key, only).await,
            Op::Marker => store.create_dir(key).await,
            Op::Link => {
                let body = Bytes::copy_from_slice(target.unwrap_or_default().as_bytes());
                store.put(key, body, PutOpts::default()).await.map(|_| ())
            }
            Op::Move => unreachable!("sent by `send`, with its source"),
        }
    }

    /// `op` on `key` now, unjournaled: after what is pending on the key (a move to it would
    /// bring it back), and for a link after the markers above it too, as a PUT would wait.
    pub(super) async fn apply_now(
        &self,
        key: &str,
        op: Op,
        only: Option<Vec<[u8; 16]>>,
        target: Option<String>,
    ) -> Result<(), StoreError> {
        match op {
            Op::Link => self.drain_under(key).await?,
            _ => self.drain_key(key).await?,
        }
        Self::apply(self.inner.as_ref(), key, op, only.as_deref(), target.as_deref()).await
    }

    /// The delete of an unlinked file's object sent late (after an outage, or by the next
    /// mount): only while it holds version `tag`, the one unlinked. Another client wrote
    /// the object since: theirs stays (sent at once, the request races such a write as any
    /// client's does; sent minutes later, it deleted their file).
    async fn delete_late(&self, key: &str, tag: String) -> Result<(), StoreError> {
        let seen = ObjectMeta { key: key.to_string(), etag: Some(tag), ..ObjectMeta::default() };
        match self.once.delete_version(key, &seen).await {
            Err(e) if e.kind == StoreErrorKind::Changed => {
                tracing::warn!(%key, "an unlinked file's delete, sent late, left the object another client wrote there since");
                Ok(())
            }
            r => r,
        }
    }

    /// [`Op::Move`]: copy `from` to `to`, then delete `from` while it holds the version
    /// copied (`moves::settle`: another client's write meanwhile is not lost). Idempotent:
    /// a source already gone was copied before (a crash after the delete), or deleted by
    /// another client.
    pub(super) async fn apply_move(&self, from: &str, to: &str) -> Result<(), StoreError> {
        crate::moves::settle(self.once.as_ref(), from, to, None, false).await.map(|_| ())
    }

    /// [`Op::Move`] of `from` to `to`; `was`: what `to` held at the rename, for a move sent
    /// late (after an outage, or by the next mount). Such a move first asks whether `to`
    /// still holds that (or the copy of an attempt cut off): if another client wrote there
    /// since, no copy goes over theirs. The file then stays under its old name, or a rename
    /// of it pending after this one (`mv a b; mv b c`) moves it from there.
    ///
    /// `renamed`: the tag of the version the rename moved, where the mount knew it. A
    /// source that no longer holds it was replaced or removed by another client after the
    /// rename: moving it would move their object (and delete it from its name), so nothing
    /// is moved, and the change is named as not made (tester V: the renamed bytes lost and
    /// the other client's object moved, with `sync` and `unmount` saying all was well).
    async fn send_move(
        &self,
        from: &str,
        to: &str,
        was: Option<Held>,
        renamed: Option<&str>,
    ) -> Result<(), StoreError> {
        if let Some(tag) = renamed {
            let now = match self.once.head(from, HeadOpts::default()).await {
                Err(e) if e.kind == StoreErrorKind::NotFound => None,
                r => Some(r?.meta.etag),
            };
            if now.as_ref().is_none_or(|etag| etag.as_deref() != Some(tag)) {
                let what = if now.is_none() { "removed" } else { "replaced" };
                tracing::error!(%from, %to, "a rename sent late found its source {what} by another client since: nothing is moved (the renamed version is no longer in the bucket), and the other client's object stays");
                self.refuse(to, format!("rename from {from} not made: another client {what} {from} after the rename"));
                return Ok(());
            }
        }
        if let Some(was) = was {
            if self.written_since(from, to, &was).await? {
                self.keep_both(from, to, renamed);
                return Ok(());
            }
        }
        self.apply_move(from, to).await
    }

    /// Whether `to` holds an object written since the rename that found `was` there: not
    /// that, and not a copy of `from` (an attempt that landed, its answer cut off). A
    /// source gone was moved already.
    async fn written_since(&self, from: &str, to: &str, was: &Held) -> Result<bool, StoreError> {
        let head = |key| self.once.head(key, HeadOpts { digests: true, ..Default::default() });
        let now = match head(to).await {
            Err(e) if e.kind == StoreErrorKind::NotFound => return Ok(false),
            r => r?,
        };
        if matches!(was, Held::Version(tag) if now.meta.etag.as_deref() == Some(tag.as_str())) {
            return Ok(false);
        }
        let src = match head(from).await {
            Err(e) if e.kind == StoreErrorKind::NotFound => return Ok(false),
            r => r?,
        };
        // A copy that kept its source's tag tells by it; else the MD5 the store tells does.
        // Told neither, the object stays (and the file under its old name: nothing lost).
        let md5 = |h: &ObjectHead| h.md5.or_else(|| h.content_md5());
        let same_tag = now.meta.etag.is_some() && now.meta.etag == src.meta.etag;
        Ok(!same_tag && (md5(&now).is_none() || md5(&now) != md5(&src)))
    }

    /// The move of `from` to `to` is not made (see [`DeferredDeletes::send_move`]): the
    /// file's next rename, pending after it, moves it from `from` now (journaled so first).
    fn keep_both(&self, from: &str, to: &str, renamed: Option<&str>) {
        let next: Vec<(String, PathBuf, Option<Held>)> = {
            let p = self.pending.lock().unwrap();
            let after_this = |e: &Pending| e.op == Op::Move && e.after && e.source.as_deref() == Some(to);
            p.iter()
                .filter(|(_, e)| after_this(e))
                .map(|(k, e)| (k.clone(), e.journal.clone(), e.target_was.clone()))
                .collect()
        };
        if next.is_empty() {
            tracing::warn!(%from, %to, "a rename sent late found another client's object written at the new name since: it stays, and so does the renamed file, under its old name");
        }
        for (key, journal, was) in next {
            tracing::warn!(%from, %to, next = %key, "a rename sent late found another client's object written at the new name since: it stays, and the file's next rename moves it from its old name");
            let entry = move_entry(false, &key, from, was.as_ref(), renamed);
            if let Err(e) = crate::recycle::write(&journal, entry.as_bytes()) {
                tracing::error!(%key, %from, "journaling where a rename moves from failed: {e}");
            }
            if let Some(e) = self.pending.lock().unwrap().get_mut(&key) {
                (e.source, e.after, e.renamed) = (Some(from.to_string()), false, renamed.map(str::to_owned));
            }
        }
    }

    /// One attempt at `key`'s pending change (marked in flight by the caller). Boxed: it
    /// may wait for a rename from the key, whose send it spawns (a type holding itself).
    pub(super) fn send(&self, key: String) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(self.send_now(key))
    }

    pub(super) async fn send_now(&self, key: String) {
        let Some((op, gen, only, source, after, target, late)) = self.pending.lock().unwrap().get(&key).map(|e| {
            // A delete sent late takes only the version unlinked (`Pending::version`); a
            // move, only while its target holds what it held (`Pending::target_was`).
            let late = e.late.then(|| (e.version.clone(), e.target_was.clone()));
            // The version renamed (asked of a move sent late alone: one sent at once costs
            // no HEAD more).
            let renamed = e.renamed.clone().filter(|_| e.late);
            (e.op, e.gen, e.only.clone(), e.source.clone(), e.after, e.target.clone(), (late, renamed))
        }) else {
            return;
        };
        // A rename pending from this key goes first: a change of the key before it would
        // delete or replace the file being moved. Unless it is the file's next rename
        // (`after`): that one waits for this move instead. A link or a move goes after the
        // markers above it, as a write would (a store with real folders would make its
        // folder twice; and a directory made here is renamed with no request only while
        // nothing below it can be in the store, `markers_only_below`).
        let above = |k: &str| k != key && k.ends_with('/') && key.starts_with(k);
        let wait = {
            // With no move pending, only markers above can be in the way, found by key.
            let p = self.pending.lock().unwrap();
            p.any_move() || matches!(op, Op::Link | Op::Move) && p.marker_above(&key)
        };
        let first = match wait {
            false => Ok(()),
            true => {
                self.drain_where(|k, e| {
                    // (The earlier move of the file itself only: once it is done, `after`
                    // read at the start is stale, and a later change of that key, the delete
                    // `rm` of this file journals, waits for this attempt instead.)
                    e.moves_from(&key)
                        || after && source.as_deref() == Some(k) && e.op == Op::Move
                        || matches!(op, Op::Link | Op::Move) && above(k)
                })
                .await
            }
        };
        // A later change may have taken this one's place while it waited (`mv a d/b` waiting
        // for `d/`'s marker, then `rm d/b`): only that one goes. Sent anyway, the stale move
        // copied `a` and deleted it, by then a new file of that name uploaded meanwhile.
        let replaced = first.is_ok() && self.pending.lock().unwrap().get(&key).is_none_or(|e| e.gen != gen);
        // The file's earlier move, waited for, may have been left undone (`keep_both`):
        // this one then moves it from where it still is.
        let source = match after {
            true => self.pending.lock().unwrap().get(&key).and_then(|e| e.source.clone()).or(source),
            false => source,
        };
        let (late, renamed) = late;
        let (late_tag, late_was) = late.unwrap_or_default();
        let r = match (first, source) {
            (Err(e), _) => Err(e),
            (Ok(()), _) if replaced => Ok(()),
            (Ok(()), Some(from)) => self.send_move(&from, &key, late_was, renamed.as_deref()).await,
            (Ok(()), None) => match late_tag {
                Some(tag) if op == Op::Delete => self.delete_late(&key, tag).await,
                _ => Self::apply(self.once.as_ref(), &key, op, only.as_deref(), target.as_deref()).await,
            },
        };
        let mut p = self.pending.lock().unwrap();
        let Some(e) = p.get_mut(&key) else { return };
        if e.gen != gen {
            // A later change took this one's place while it was sent: that one goes next,
            // and the old key of the move this was is no longer in play. A delete of this
            // put goes twice if the put failed: cut off, it may still land.
            let was = e.moving();
            e.flying = None;
            e.again |= std::mem::take(&mut e.after_put_in_flight) && r.is_err();
            let is = e.moving();
            e.in_flight = false;
            let at = e.next_try;
            p.hint(at, &key);
            p.recount(was, is);
            drop(p);
            self.changed.notify_waiters();
            self.work.notify_one();
            return;
        }
        match r {
            Err(err) if transient(&err, e.attempts) => {
                // Cut off (no answer: a timeout or a broken connection), the request may
                // be held by the store and land after a file made again under the name.
                // So once deleted, the key stays pending `LANDING_GRACE` more and is
                // deleted once more, as for an upload cut off (`defer_landing`); writes
                // to it wait till then.
                e.again |= op == Op::Delete && err.kind == StoreErrorKind::Unavailable;
                e.late = true;
                e.attempts += 1;
                tracing::warn!(%key, ?op, attempts = e.attempts, "deferred change failed, retrying in {:?}: {err}", retry_backoff(e.attempts));
                let now = Instant::now();
                e.next_try = now + retry_backoff(e.attempts);
                e.failed = Some((now, err));
                e.in_flight = false;
                let at = e.next_try;
                p.hint(at, &key);
            }
            Ok(()) | Err(StoreError { kind: StoreErrorKind::NotFound, .. }) if e.again && op == Op::Delete => {
                // Deleted; an upload that timed out may still land after it: once more soon.
                let at = Instant::now() + LANDING_GRACE;
                (e.again, e.in_flight, e.attempts, e.failed) = (false, false, 0, None);
                (e.next_try, e.not_before) = (at, Some(at));
                p.hint(at, &key);
            }
            r => {
                match (r.as_ref(), op) {
                    (Err(err), Op::Delete) if err.kind != StoreErrorKind::NotFound => {
                        tracing::error!(%key, "the store refused the delete of an unlinked file; the file is back in the bucket: {err}");
                        self.refuse(&key, format!("delete refused: {err}"));
                    }
                    (Err(err), Op::Marker) => {
                        tracing::error!(%key, "the store refused the marker of a directory made here; the directory is not in the bucket: {err}");
                        self.refuse(&key, format!("directory marker refused: {err}"));
                    }
                    (Err(err), Op::Link) => {
                        tracing::error!(%key, "the store refused the object of a symbolic link made here; the link is not in the bucket: {err}");
                        self.refuse(&key, format!("symbolic link refused: {err}"));
                    }
                    (Err(err), Op::Move) => {
                        let from = e.source.as_deref().unwrap_or_default();
                        tracing::error!(%key, %from, "the store refused the move of a file renamed here; the bucket keeps the old name: {err}");
                        self.refuse(&key, format!("rename from {from} refused: {err}"));
                    }
                    _ => {}
                }
                if let Some(e) = p.remove(&key) {
                    e.forget_journal();
                }
                settle_after(&mut p, &key);
            }
        }
        drop(p);
        self.changed.notify_waiters();
        self.work.notify_one();
    }

    /// Wait until no pending delete's key satisfies `hit`, sending due ones now. An outage
    /// that keeps one pending gives its error (once an attempt made since has failed).
    pub(super) async fn drain(&self, hit: impl Fn(&str) -> bool) -> Result<(), StoreError> {
        self.drain_where(|k, e| e.seen(k, &hit)).await
    }

    /// [`DeferredDeletes::drain`] of the entries `hit` takes (key, entry): those pending
    /// when it starts (one look at every entry; a change journaled later is not waited
    /// for). Then each wake looks at the first `PARALLEL` still pending, in key order, and
    /// sends those not in flight (the background sends the rest), so waiting for many
    /// changes costs a look at each once, not at all of them at every change.
    pub(super) async fn drain_where(&self, hit: impl Fn(&str, &Pending) -> bool) -> Result<(), StoreError> {
        self.drain_where_since(Instant::now(), hit).await
    }

    /// [`DeferredDeletes::drain_where`] that gives the error of an attempt that failed
    /// since `started` (not only since the call) without sending that entry again.
    pub(super) async fn drain_where_since(
        &self,
        started: Instant,
        hit: impl Fn(&str, &Pending) -> bool,
    ) -> Result<(), StoreError> {
        let matching = |p: &Table| -> std::collections::VecDeque<String> {
            p.iter().filter(|(k, e)| hit(k, e)).map(|(k, _)| k.clone()).collect()
        };
        let mut keys = matching(&self.pending.lock().unwrap());
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let mut send = Vec::new();
            let mut wake: Option<Instant> = None;
            {
                let mut p = self.pending.lock().unwrap();
                while keys.front().is_some_and(|k| p.get(k).is_none_or(|e| !hit(k, e))) {
                    keys.pop_front();
                }
                if keys.is_empty() {
                    // One look at every entry before returning: a change made while this
                    // waited may have taken over a duty it waited for (`mv a b; rm b` turns
                    // the move into a delete of `a`, a new entry, while a HEAD of `a` waits).
                    keys = matching(&p);
                    if keys.is_empty() {
                        return Ok(());
                    }
                    continue;
                }
                let window = || keys.iter().take(PARALLEL);
                // The error first, before any entry is marked in flight: one marked and then
                // not sent would stay in flight for good (its key never deleted, every
                // listing over it waiting). Also when the background is sending it again:
                // waiting for that try too cost an unmount one more timeout.
                for e in window().filter_map(|k| p.get(k)) {
                    if let Some((_, err)) = e.failed.as_ref().filter(|(at, _)| *at >= started) {
                        return Err(err.clone());
                    }
                }
                let now = Instant::now();
                for k in window() {
                    let Some(e) = p.get_mut(k) else { continue };
                    match e.not_before.filter(|t| *t > now) {
                        _ if !hit(k, e) || e.in_flight => {}
                        // Its second send is due later: woken then (the background may not
                        // run yet: a mount's recovery drains before it starts).
                        Some(t) => wake = Some(wake.map_or(t, |w: Instant| w.min(t))),
                        None => {
                            e.in_flight = true;
                            send.push(k.clone());
                        }
                    }
                }
            }
            // Sent by tasks of their own, which `changed` reports on: a caller dropped while
            // waiting (an upload cancelled by a rename or an unlink) cannot leave an entry
            // marked in flight and never sent, which would hold every later drain for good.
            match self.me.upgrade() {
                Some(me) => {
                    for k in send {
                        let me = me.clone();
                        crate::sync::spawn(async move { me.send(k).await });
                    }
                }
                None => {
                    futures::future::join_all(send.into_iter().map(|k| self.send(k))).await;
                }
            }
            match wake {
                Some(at) => drop(tokio::time::timeout_at(at.into(), changed).await),
                None => changed.await,
            }
        }
    }

    /// Keys that could be `key` or below it (`key` itself, `key/…`), and the markers of the
    /// directories above it: a write goes after them. (Not `key1` beside `key`: a file's
    /// recovery waited on an unrelated landing delete.)
    pub(super) async fn drain_under(&self, key: &str) -> Result<(), StoreError> {
        let k = key.trim_end_matches('/');
        {
            let p = self.pending.lock().unwrap();
            let below = p.range(k.to_string()..).next().is_some_and(|(p, _)| p.starts_with(k));
            if !p.any_move() && !below && !p.marker_above(k) {
                return Ok(()); // as `drain_key`
            }
        }
        let below =
            |p: &str| p.strip_prefix(k).is_some_and(|rest| k.is_empty() || rest.is_empty() || rest.starts_with('/'));
        self.drain(|p| below(p) || (p.ends_with('/') && k.starts_with(p))).await
    }

    pub(super) async fn drain_key(&self, key: &str) -> Result<(), StoreError> {
        {
            let p = self.pending.lock().unwrap();
            if !p.any_move() && !p.contains_key(key) {
                return Ok(()); // nothing to wait for, found without a look at every entry
            }
        }
        self.drain(|p| p == key).await
    }
}
