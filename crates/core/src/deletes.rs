//! Deferred deletes (write-back mode): `unlink` of a file in the bucket returns once the
//! delete is journaled on local disk; the DELETE goes out in the background, several at
//! once, so `rm -rf` of many files costs local time, not one round trip per file.
//!
//! The mount's own namespace forgets the name at once. What keeps the store's view right
//! is this [`Store`] wrapper, which every request of the mount goes through: no request
//! may see or write a key with a delete still pending. A listing of a prefix, a HEAD or
//! GET of a key, and every write (upload, copy, marker, move) first wait for the pending
//! deletes it could see or collide with (sending them now if the background has not yet).
//! So a listing never brings an unlinked file back, and a file created again under the
//! name goes up after the delete, never before.
//!
//! A pending delete is a small file in `.<staging dir name>.deletes/` beside the staging
//! directory, holding the key; it goes when the DELETE succeeds. A mount that starts finds
//! what a crashed one left there and sends those deletes before any request can see the
//! keys. A store that is unreachable keeps them pending (retried with backoff; a request
//! waiting for one gets the outage's error, as if it had asked the store itself); a delete
//! the store refuses for good is dropped with an error logged (the file is back in the
//! bucket: nothing is lost).
//!
//! `mkdir` goes the same way: the directory's marker object is journaled and created in
//! the background ([`DeferredDeletes::defer_marker`]), and the same rule holds: a listing
//! of its prefix or a HEAD of the key waits for it, and so does every write below it (a
//! store with real folders, Drive, must not make the folder twice). A marker's journal
//! entry is `m`, NUL, the key; a delete's is the key alone (no key holds a NUL), or `l`,
//! NUL, the key for a key an upload may still land on (sent twice: [`DeferredDeletes::defer_landing`]),
//! then, if only an object with given MD5s is to go, NUL and those MD5s in hex, comma-separated. One key
//! has at most one pending change: a later one takes the place of one not yet sent, or
//! goes out after the one in flight. A delete of a marker or a link whose request was
//! sent (it may have been cut off, and land later) is sent twice, as `l`; so is a delete
//! whose own attempt was cut off (no answer), `LANDING_GRACE` after one succeeds.
//!
//! `symlink` too ([`DeferredDeletes::defer_link`]): the link object (`<name>.rclonelink`,
//! its content the target) is journaled as `s`, NUL, the key, NUL, the target, and put in
//! the background, after the markers of the directories above it; until then
//! [`DeferredDeletes::pending_link`] answers `readlink`. (In the kernel a `symlink` holds
//! its directory locked: one waiting for a store that hangs stalled every lookup there.)
//!
//! A rename of a file in the bucket goes the same way ([`DeferredDeletes::defer_move`]):
//! pending under its new key, it copies the old key's object there and then deletes the
//! old key, after the markers of the directories above the new key (as an upload there
//! would), and every request that could see either key waits for it. Its entry is `v`,
//! NUL, the new key, NUL, the old key: one entry, so a crash can never leave the delete
//! without the copy before it. A rename of a file whose own move is still pending
//! (`mv a b; mv b c`) is journaled as `w` instead of `v`: it goes after that move, and
//! until it is sent any other change of the key between (`b`) waits for it. Then, if the
//! mount knew, NUL and what the new key held at the rename ([`Held`]): a move sent late
//! (after an outage, or by the next mount) copies over the new key only while it still
//! holds that. Another client wrote there since: theirs stays, and so does the file under
//! its old name, with a warning; nothing is lost (sent minutes late, the copy replaced
//! their file).

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;

use bucketfs_store::{
    ByteStream, Capabilities, GetOpts, HeadOpts, ListStream, ObjectHead, ObjectMeta, ObjectWriter, PutOpts, Store,
    StoreError, StoreErrorKind, WriteOptions,
};

use crate::clock::retry_backoff;
use crate::sync::{Arc, AtomicU64, Mutex, Ordering};

/// Delete `key`, or with `only`, only an object there whose MD5 is one of these: what a
/// create-only upload of ours that was cut off sent. Such an upload lands only where no
/// object was, so an object with other bytes is another client's, made first, and stays
/// (told apart by [`crate::late::which_of`]).
pub(crate) async fn delete_if_ours(store: &dyn Store, key: &str, only: Option<&[[u8; 16]]>) -> Result<(), StoreError> {
    if let Some(only) = only {
        let head = match store.head(key, HeadOpts { digests: true, ..Default::default() }).await {
            Err(e) if e.kind == StoreErrorKind::NotFound => return Ok(()),
            r => r?,
        };
        if crate::late::which_of(store, key, &head, only).await?.is_none() {
            tracing::info!(%key, "left another client's object, made before our cut-off create-only upload");
            return Ok(());
        }
    }
    store.delete(key).await
}

/// Whether the move of `from` to `to` can be journaled beside what is `pending`, and if
/// so whether it goes after a pending move to `from` (`Some(true)`: the file's next rename,
/// `mv a b; mv b c`). `None` where a pending change of either key must be sent first (the
/// caller moves now): any change of `to` or a move from it (so no chain closes a cycle),
/// any but a move of `from` itself, and a move from `from`.
fn move_order(pending: &BTreeMap<String, Pending>, from: &str, to: &str) -> Option<bool> {
    let mut after = false;
    for (k, e) in pending {
        let from_here = |key: &str| e.source.as_deref() == Some(key) || e.flying.as_deref() == Some(key);
        if k == to || from_here(to) || k != from && from_here(from) {
            return None;
        }
        if k == from {
            if e.op != Op::Move {
                return None;
            }
            after = true;
        }
    }
    Some(after)
}

/// A move's journal entry: `v` (or `w`, for one that goes `after` a move to `from`), the new
/// key, the old key, and what the new key held at the rename if known ([`Held::journaled`]).
fn move_entry(after: bool, to: &str, from: &str, was: Option<&Held>, renamed: Option<&str>) -> String {
    let tag = if after { 'w' } else { 'v' };
    let was = was.map(Held::journaled).unwrap_or_default();
    match renamed {
        // The version renamed: a move the next mount sends checks its source still holds it.
        Some(renamed) => format!("{tag}\0{to}\0{from}\0{was}\0{renamed}"),
        None if was.is_empty() => format!("{tag}\0{to}\0{from}"),
        None => format!("{tag}\0{to}\0{from}\0{was}"),
    }
}

/// The pending change of `key` is done: a move that went after it ([`Pending::after`])
/// is a plain move from `key` now, which any later change of the key waits for.
fn settle_after(pending: &mut Table, key: &str) {
    if !pending.any_move() {
        return;
    }
    for e in pending.values_mut().filter(|e| e.after && e.source.as_deref() == Some(key)) {
        e.after = false;
    }
}

/// DELETEs in flight at once, in the background.
const PARALLEL: usize = 16;

/// After a key whose upload may still land is deleted, how long until it is deleted once
/// more: a server that hung processes the request it had received (its body already in
/// the socket) within moments of resuming, possibly after our DELETE.
const LANDING_GRACE: Duration = Duration::from_secs(3);

/// The store seen by the mount in write-back mode; see the module doc.
pub struct DeferredDeletes {
    me: std::sync::Weak<Self>,
    inner: Arc<dyn Store>,
    /// `inner` sending each request once ([`Store::sending_once`]): the pending changes go
    /// through it, retried here, so a change whose try failed goes late, on its condition.
    once: Arc<dyn Store>,
    journal_dir: Option<PathBuf>,
    /// Lock level: a leaf, never held across an await.
    pending: Mutex<Table>,
    /// Every change of `pending` (a delete done or failed), for waiters.
    changed: tokio::sync::Notify,
    /// A new delete to send, for the background task.
    work: Arc<tokio::sync::Notify>,
    /// Deletes the store refused for good since the last [`DeferredDeletes::drain_all`]
    /// (key, why): dropped, the file back in the bucket; `bucketfs sync` names them once.
    /// Lock level: a leaf.
    refused: Mutex<Vec<(String, String)>>,
    /// Changes the store refused for good since mount (`bucketfs status`).
    refused_total: AtomicU64,
    seq: AtomicU64,
    /// When this process started journaling (nanoseconds since the epoch): part of names.
    started: u128,
}

/// The version of a file a pending move carries, named as this mount's read caches hold it
/// (its old key and identity): see [`DeferredDeletes::moving_version`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedVersion {
    pub key: String,
    pub identity: String,
    /// The store's tag of that version, if it has one: a read of a block no cache holds is
    /// pinned to it.
    pub tag: Option<String>,
    pub size: u64,
}

/// The directory where deletes journaled by a mount staging in `staging` are kept.
pub fn journal_dir_for(staging: &Path) -> Option<PathBuf> {
    let name = staging.file_name()?.to_string_lossy();
    Some(staging.with_file_name(format!(".{name}.deletes")))
}

/// Whether an earlier mount (in write-back mode) left deletes journaled beside `staging`:
/// a mount without write-back sends them too, before anything reads or writes their keys.
pub fn journal_left(staging: &Path) -> bool {
    journal_dir_for(staging).and_then(|d| std::fs::read_dir(d).ok()).is_some_and(|mut e| e.next().is_some())
}

impl DeferredDeletes {
    /// Wrap `inner`, journaling beside `staging`; deletes a crashed mount left pending are
    /// pending again (before any request can see their keys).
    pub fn new(inner: Arc<dyn Store>, staging: &Path) -> Arc<Self> {
        let journal_dir = journal_dir_for(staging).filter(|d| match std::fs::create_dir_all(d) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(dir = %d.display(), "no journal for deferred deletes ({e}): unlink waits for its DELETE");
                false
            }
        });
        let me = Self {
            me: std::sync::Weak::new(),
            once: inner.sending_once().unwrap_or_else(|| inner.clone()),
            inner,
            journal_dir,
            pending: Mutex::new(Table::default()),
            changed: tokio::sync::Notify::new(),
            work: Default::default(),
            refused: Mutex::new(Vec::new()),
            refused_total: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            started: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()),
        };
        me.adopt_journal();
        Arc::new_cyclic(|weak| Self { me: weak.clone(), ..me })
    }

    fn adopt_journal(&self) {
        let Some(dir) = &self.journal_dir else { return };
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        let mut p = self.pending.lock().unwrap();
        for path in entries.flatten().map(|e| e.path()) {
            let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
            if name.ends_with(".tmp") {
                let _ = std::fs::remove_file(&path); // a journal entry never completed
                continue;
            }
            match std::fs::read(&path).map(String::from_utf8) {
                Ok(Ok(text)) if !text.is_empty() => {
                    // `second`: a move's source key, a link's target.
                    let (mut after, mut version, mut target_was, mut renamed) = (false, None, None, None);
                    let (op, again, key, only, second) = match text.split_once('\0') {
                        Some(("m", key)) => (Op::Marker, false, key.to_string(), None, None),
                        Some(("d", rest)) => {
                            let (key, tag) = rest.split_once('\0').unwrap_or((rest, ""));
                            version = Some(tag.to_string()).filter(|t| !t.is_empty());
                            (Op::Delete, false, key.to_string(), None, None)
                        }
                        Some(("s", rest)) => match rest.split_once('\0') {
                            Some((key, target)) if !target.is_empty() => {
                                (Op::Link, false, key.to_string(), None, Some(target.to_string()))
                            }
                            _ => {
                                let _ = std::fs::remove_file(&path); // never written so
                                continue;
                            }
                        },
                        Some(("l", rest)) => match rest.split_once('\0') {
                            Some((key, md5s)) => (Op::Delete, true, key.to_string(), parse_md5s(md5s), None),
                            None => (Op::Delete, true, rest.to_string(), None, None),
                        },
                        Some((tag @ ("v" | "w"), rest)) => match rest.split_once('\0') {
                            Some((to, from)) => {
                                after = tag == "w";
                                let (from, was) = from.split_once('\0').unwrap_or((from, ""));
                                let (was, tag) = was.split_once('\0').unwrap_or((was, ""));
                                target_was = Held::parse(was);
                                renamed = Some(tag.to_string()).filter(|t| !t.is_empty());
                                (Op::Move, false, to.to_string(), None, Some(from.to_string()))
                            }
                            None => {
                                let _ = std::fs::remove_file(&path); // never written so
                                continue;
                            }
                        },
                        _ => (Op::Delete, false, text, None, None),
                    };
                    tracing::info!(%key, ?op, "change left pending by an earlier mount: sending it");
                    let (source, target) = if op == Op::Link { (None, second) } else { (second, None) };
                    let late = true;
                    p.insert(
                        key,
                        Pending {
                            op,
                            again,
                            only,
                            source,
                            after,
                            target,
                            version,
                            late,
                            target_was,
                            renamed,
                            ..Pending::new(path)
                        },
                    );
                }
                _ => {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        // A `w` move whose earlier move was done before the crash is a plain one now (its
        // entry says `w` still: `settle_after` changes only the one in memory). A change
        // of the key since, not a move (none can be journaled onto a pending move's old
        // key), waits for it, as it did in the mount that journaled it.
        let done: Vec<String> = p
            .values()
            .filter(|e| e.after)
            .filter_map(|e| e.source.clone())
            .filter(|s| p.get(s).is_none_or(|e| e.op != Op::Move))
            .collect();
        for source in done {
            settle_after(&mut p, &source);
        }
    }

    /// Send the pending deletes in the background until `me` is dropped.
    pub fn start(me: &Arc<Self>) {
        let weak = Arc::downgrade(me);
        let notify = me.work.clone();
        // Sends this task started that have not ended (a drain's own sends aside).
        let busy = Arc::new(AtomicU64::new(0));
        crate::sync::spawn(async move {
            loop {
                let work = notify.notified();
                tokio::pin!(work);
                work.as_mut().enable();
                let Some(me) = weak.upgrade() else { return };
                let room = PARALLEL.saturating_sub(busy.load(Ordering::SeqCst) as usize);
                let (due, next) = me.take_due(room);
                for key in due {
                    let (me, busy) = (me.clone(), busy.clone());
                    busy.fetch_add(1, Ordering::SeqCst);
                    crate::sync::spawn(async move {
                        me.send(key).await;
                        busy.fetch_sub(1, Ordering::SeqCst);
                    });
                }
                let wait = next.map_or(Duration::from_secs(3600), |t| t.saturating_duration_since(Instant::now()));
                drop(me);
                let _ = tokio::time::timeout(wait.max(Duration::from_millis(5)), work).await;
            }
        });
    }

    /// Journal a delete of `key` and return; it is sent in the background. Without a
    /// journal (or if writing it fails) the DELETE is sent now instead.
    pub async fn defer(&self, key: &str) -> Result<(), StoreError> {
        self.defer_version(key, None).await
    }

    /// [`DeferredDeletes::defer`] of an unlinked file's object, which held `version` (its
    /// tag) when unlinked: should the delete go late (the store out at first, or the
    /// mount dead before sending it), only that version goes (`Pending::version`).
    pub async fn defer_version(&self, key: &str, version: Option<String>) -> Result<(), StoreError> {
        self.send_next_moves(key).await?;
        self.defer_change(key, Op::Delete, false, None, None, version).await
    }

    /// [`DeferredDeletes::defer`] of a key an upload that failed (a timeout) may still
    /// write: after the delete succeeds, it is sent once more `LANDING_GRACE` (3 s) later, and
    /// `bucketfs sync` waits for that one too. `only`: each of the two deletes only takes
    /// an object with one of these MD5s (`delete_if_ours`).
    pub async fn defer_landing(&self, key: &str, only: Option<Vec<[u8; 16]>>) -> Result<(), StoreError> {
        self.send_next_moves(key).await?;
        self.defer_op(key, Op::Delete, true, only).await
    }

    /// Journal the creation of directory marker `key` (`mkdir`) and return; it is created
    /// in the background. Without a journal it is created now.
    pub async fn defer_marker(&self, key: &str) -> Result<(), StoreError> {
        self.defer_op(key, Op::Marker, false, None).await
    }

    /// Journal the making of link object `key` with content `target` (`symlink`) and
    /// return; it is put in the background. Without a journal it is put now.
    pub async fn defer_link(&self, key: &str, target: &str) -> Result<(), StoreError> {
        self.send_next_moves(key).await?;
        self.defer_change(key, Op::Link, false, None, Some(target.to_string()), None).await
    }

    /// A change of `key` that another file's pending move still needs as its way through
    /// (`mv a b; mv b c`, then a new `b` unlinked or made a link): that move goes first,
    /// with the one into `key` before it. (The deletes of an unlinked file's earlier keys,
    /// `defer_change`'s own, take its moves' places instead.)
    async fn send_next_moves(&self, key: &str) -> Result<(), StoreError> {
        if !self.pending.lock().unwrap().any_move() {
            return Ok(());
        }
        self.drain_where(|_, e| e.after && e.source.as_deref() == Some(key)).await
    }

    /// The directory markers pending at and below `dir`, if `dir`'s own is one of them and
    /// nothing else is pending there but deletes: a directory made here that no request
    /// has written below yet (every write below waits for its marker), which a rename may
    /// move by journaling its markers anew ([`DeferredDeletes::withdraw_marker`]).
    pub fn markers_only_below(&self, dir: &str) -> Option<Vec<String>> {
        let p = self.pending.lock().unwrap();
        let from_below =
            |e: &Pending| [&e.source, &e.flying].iter().any(|s| s.as_deref().is_some_and(|s| s.starts_with(dir)));
        if p.get(dir)?.op != Op::Marker || p.values().any(from_below) {
            return None;
        }
        let mut markers = Vec::new();
        for (k, e) in p.range(dir.to_string()..).take_while(|(k, _)| k.starts_with(dir)) {
            match e.op {
                Op::Marker => markers.push(k.clone()),
                Op::Delete => {}
                Op::Move | Op::Link => return None,
            }
        }
        Some(markers)
    }

    /// Whether directory `dir`'s marker is pending here: made by this mount and not
    /// confirmed in the store, so nothing this mount wrote below it is there either (every
    /// write below waits for it).
    pub fn marker_pending(&self, dir: &str) -> bool {
        self.pending.lock().unwrap().get(dir).is_some_and(|e| e.op == Op::Marker)
    }

    /// Withdraw the pending marker `key` (its directory was renamed before it went up):
    /// forgotten if it was never sent, else deleted after the attempt that may have made it.
    pub async fn withdraw_marker(&self, key: &str) -> Result<(), StoreError> {
        let unsent = {
            let mut p = self.pending.lock().unwrap();
            match p.get(key) {
                Some(e) if e.op == Op::Marker && !e.in_flight && e.attempts == 0 => p.remove(key),
                _ => None,
            }
        };
        match unsent {
            Some(e) => {
                e.forget_journal();
                self.changed.notify_waiters();
                Ok(())
            }
            None => self.defer(key).await,
        }
    }

    /// The version a move to `to` not done yet carries (`defer_move`): until it is done, an
    /// open of `to` may read that version from the caches, where the store might not answer
    /// for minutes (the move's copy waits for it too).
    pub fn moving_version(&self, to: &str) -> Option<MovedVersion> {
        let p = self.pending.lock().unwrap();
        p.get(to).filter(|e| e.op == Op::Move).and_then(|e| e.carries.clone())
    }

    /// Whether a move to `to` is pending (not done yet): the name is this mount's own.
    pub fn move_pending(&self, to: &str) -> bool {
        self.pending.lock().unwrap().get(to).is_some_and(|e| e.op == Op::Move)
    }

    /// The target of link `key` if its object is still to be made (`defer_link`).
    pub fn pending_link(&self, key: &str) -> Option<String> {
        let p = self.pending.lock().unwrap();
        p.get(key).filter(|e| e.op == Op::Link).and_then(|e| e.target.clone())
    }

    /// Journal the rename of file `from` to `to` and return `true`; the copy and the delete
    /// go in the background (see the module doc). `false`, with nothing done, where it
    /// cannot wait: no journal, or a change of either key pending that must go first
    /// (`move_order`; the caller moves the object itself, which sends that change first).
    /// `carries`: the version moved, as this mount's caches hold it ([`DeferredDeletes::moving_version`]);
    /// `was`: what `to` held, where the mount knew (see the module doc).
    pub async fn defer_move(
        &self,
        from: &str,
        to: &str,
        carries: Option<MovedVersion>,
        was: Option<Held>,
    ) -> Result<bool, StoreError> {
        let Some(dir) = &self.journal_dir else { return Ok(false) };
        let Some(after) = move_order(&self.pending.lock().unwrap(), from, to) else { return Ok(false) };
        let path = self.new_entry(dir);
        // The tag of the version renamed, where the mount knew it under the key it moves from.
        let renamed = carries.as_ref().filter(|c| c.key == from).and_then(|c| c.tag.clone());
        if let Err(e) =
            crate::recycle::write(&path, move_entry(after, to, from, was.as_ref(), renamed.as_deref()).as_bytes())
        {
            tracing::warn!(%from, %to, "journaling a rename failed ({e}): moving the object now");
            return Ok(false);
        }
        let mut p = self.pending.lock().unwrap();
        if move_order(&p, from, to) != Some(after) {
            // A change of either key was journaled meanwhile: the caller's move sends it first.
            drop(p);
            let _ = crate::recycle::remove(&path);
            return Ok(false);
        }
        let source = Some(from.to_string());
        let entry = Pending { op: Op::Move, source, after, carries, target_was: was, renamed, ..Pending::new(path) };
        p.insert(to.to_string(), entry);
        drop(p);
        self.work.notify_one();
        Ok(true)
    }

    /// A name for a new journal entry in `dir`, unique across processes: a mount started
    /// after a crash may get the same pid, and must not write over an entry it adopted.
    fn new_entry(&self, dir: &Path) -> PathBuf {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        dir.join(format!("{:x}-{:x}-{:x}", std::process::id(), self.started, seq))
    }

    async fn defer_op(&self, key: &str, op: Op, again: bool, only: Option<Vec<[u8; 16]>>) -> Result<(), StoreError> {
        self.defer_change(key, op, again, only, None, None).await
    }

    /// Journal `op` on `key` (see the fields of `Pending` for `again`, `only`, `target`
    /// and `version`).
    async fn defer_change(
        &self,
        key: &str,
        op: Op,
        again: bool,
        only: Option<Vec<[u8; 16]>>,
        target: Option<String>,
        version: Option<String>,
    ) -> Result<(), StoreError> {
        let Some(dir) = &self.journal_dir else { return self.apply_now(key, op, only, target).await };
        // What is pending for the key now: a delete of a file renamed here whose move is still
        // pending takes its old key too (journaled first, so a crash in between leaves both
        // deletes or the move); a delete of a link or a marker whose request was sent (and
        // may have been cut off, to land later) is sent twice, as for a file's upload that
        // may still land.
        // A put in flight now decides when it ends (`send_now`): only a failed one may land
        // later. The journal says twice meanwhile, for a crash before that end.
        let (moved_from, sent, in_flight) = match self.pending.lock().unwrap().get(key) {
            Some(e) => {
                let put = matches!(e.op, Op::Link | Op::Marker);
                (e.source.clone(), put && e.attempts > 0, put && e.in_flight)
            }
            None => (None, false, false),
        };
        let again = again || op == Op::Delete && sent;
        let after_put_in_flight = op == Op::Delete && in_flight && !again;
        // Not where a later change of the old key is pending, which decides what it holds: a
        // link made there since (`ln -s t b; mv b a; ln -s t2 b; rm a`) was replaced by the
        // delete, and lost.
        // (A move pending there is the file's own earlier one, `mv a b; mv b c; rm c`: no
        // other move into a key a pending move leaves is journaled, `move_order`.)
        let taken = |from: &str| self.pending.lock().unwrap().get(from).is_some_and(|e| e.op == Op::Link);
        if let Some(from) = moved_from.filter(|f| op == Op::Delete && !taken(f)) {
            Box::pin(self.defer_op(&from, Op::Delete, false, None)).await?;
        }
        let text = match (op, &only) {
            (Op::Delete, Some(md5s)) if again || after_put_in_flight => format!("l\0{key}\0{}", hex_md5s(md5s)),
            (Op::Delete, _) if again || after_put_in_flight => format!("l\0{key}"),
            (Op::Delete, _) => match &version {
                Some(tag) => format!("d\0{key}\0{tag}"),
                None => key.to_string(),
            },
            (Op::Marker, _) => format!("m\0{key}"),
            (Op::Link, _) => format!("s\0{key}\0{}", target.as_deref().unwrap_or_default()),
            (Op::Move, _) => unreachable!("a move is journaled by `defer_move`"),
        };
        // A change already pending for the key keeps its journal entry, rewritten in one
        // step (a crash leaves the old change or the new one, never both). Its generation
        // moves on first: a send of it in flight now ends leaving the entry (and the file
        // being rewritten) in place, instead of forgetting the new change's journal.
        let existing = self.pending.lock().unwrap().get_mut(key).map(|e| {
            e.gen += 1;
            e.journal.clone()
        });
        let path = existing.unwrap_or_else(|| self.new_entry(dir));
        if let Err(e) = crate::recycle::write(&path, text.as_bytes()) {
            tracing::warn!(%key, ?op, "journaling a change failed ({e}): sending it now");
            return self.apply_now(key, op, only, target).await;
        }
        let mut p = self.pending.lock().unwrap();
        match p.get_mut(key) {
            // The later change takes the place of the pending one; one in flight ends first
            // (its end sees the new generation and leaves this pending).
            Some(e) if e.journal == path => {
                let was = e.moving();
                if e.in_flight && e.flying.is_none() && !e.after {
                    // A move being sent may still copy its old key and delete it: seen there
                    // until that attempt ends (`send_now`). Not one that goes after the
                    // change of its old key (`Pending::after`): its attempt still waits for
                    // that change, then finds itself replaced and sends nothing; that key's
                    // next change waiting for it instead would wait for good.
                    e.flying = e.source.clone();
                }
                (e.op, e.again, e.only, e.gen, e.source, e.target) = (op, again, only, e.gen + 1, None, target);
                (e.version, e.late) = (version, false);
                (e.after, e.after_put_in_flight) = (false, after_put_in_flight);
                (e.carries, e.target_was) = (None, None); // a move's, and this is none
                (e.attempts, e.failed, e.not_before, e.next_try) = (0, None, None, Instant::now());
                let is = e.moving();
                p.hint(Instant::now(), key);
                p.recount(was, is);
            }
            _ => {
                let entry = Pending { op, again, only, target, version, ..Pending::new(path) };
                if let Some(old) = p.insert(key.to_string(), entry) {
                    old.forget_journal(); // sent and ended between the two locks
                }
            }
        }
        drop(p);
        self.work.notify_one();
        Ok(())
    }

    /// The changes still pending, one line each (the key and what), for the unmount's note.
    pub fn pending_changes(&self) -> Vec<String> {
        let p = self.pending.lock().unwrap();
        let mut out: Vec<String> = p
            .iter()
            .map(|(k, e)| match e.op {
                Op::Move => format!("{k} (rename from {})", e.source.as_deref().unwrap_or_default()),
                Op::Link => format!("{k} (symbolic link)"),
                Op::Marker => format!("{k} (directory)"),
                _ => format!("{k} (delete)"),
            })
            .collect();
        out.sort();
        out
    }

    /// Deletes pending now.
    pub fn pending(&self) -> usize {
        self.pending.lock().unwrap().len()
    }

    /// Changes the store refused for good since mount (each logged as an error).
    pub fn refused_since_mount(&self) -> u64 {
        self.refused_total.load(Ordering::Relaxed)
    }

    /// Record `key`'s change as refused for good (`why`): dropped, never retried.
    pub(super) fn refuse(&self, key: &str, why: String) {
        self.refused_total.fetch_add(1, Ordering::Relaxed);
        self.refused.lock().unwrap().push((key.to_string(), why));
    }

    /// Wait until every delete pending now is done; the keys of those the store refused.
    pub async fn drain_all(&self) -> Vec<(String, String)> {
        self.drain_all_since(Instant::now()).await
    }

    /// [`DeferredDeletes::drain_all`] for a sync that began at `started`: a change whose
    /// attempt failed since then (an upload waiting for its directory's marker sent it) is
    /// named, not tried again. Against a store that hangs each try is a timeout: an unmount
    /// waited for two of them.
    pub async fn drain_all_since(&self, started: Instant) -> Vec<(String, String)> {
        let mut failed = match self.drain_where_since(started, |_, _| true).await {
            Ok(()) => Vec::new(),
            // Each key with its own last error, or the drain's without the key it names (it
            // named one key for all of them).
            Err(e) => {
                let p = self.pending.lock().unwrap();
                let why = |f: &Option<(Instant, StoreError)>| {
                    let text = f.as_ref().map_or(e.to_string(), |(_, err)| err.to_string());
                    text.split_once(": ").map_or(text.clone(), |(_, why)| why.to_string())
                };
                let what = |e: &Pending| match e.op {
                    Op::Move => format!("rename from {} not done yet", e.source.as_deref().unwrap_or_default()),
                    Op::Link => "symbolic link not made yet".to_string(),
                    Op::Marker => "directory marker not made yet".to_string(),
                    _ => "delete not done yet".to_string(),
                };
                p.iter().map(|(k, entry)| (k.clone(), format!("{}: {}", what(entry), why(&entry.failed)))).collect()
            }
        };
        failed.append(&mut self.refused.lock().unwrap());
        failed
    }
}

#[path = "deletes_send.rs"]
mod send;
#[path = "deletes_store.rs"]
mod store;
#[path = "deletes_table.rs"]
mod table;
pub use table::Held;
use table::{hex_md5s, parse_md5s, Op, Pending, Table};

#[cfg(test)]
#[path = "deletes_replace_tests.rs"]
mod replace_tests;
#[cfg(test)]
#[path = "deletes_tests.rs"]
mod tests;
