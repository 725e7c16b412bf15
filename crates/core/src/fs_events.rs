//! Following the store's change events (`--notify`): each applied to the inode table, then
//! the kernel told. How events are trusted: [`crate::events`].

use crate::events::{EventStats, InvalidateEntry, Notice, KERNEL_TTL_CAP, NOTICES_QUEUED};
use crate::fs::Fs;
use crate::inode::{ChildMeta, EventApplied, Kind};
use bucketfs_store::events::{Event, Feed};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;

impl Fs {
    /// Events flow since `since` (`None`: they do not): the table trusts listings fetched
    /// since past their TTL, and so do attributes (`EventState::vouches_for`).
    fn set_events_since(&self, since: Option<std::time::Instant>) {
        let mut t = self.table.lock().unwrap();
        t.set_events_since(since);
        *self.events.since.lock().unwrap() = since;
    }

    /// Follow `feed` for the life of the mount.
    pub fn follow_events(&self, mut feed: mpsc::Receiver<Feed>) {
        self.events.configured.store(true, Relaxed);
        *self.events.down.lock().unwrap() = Some((SystemTime::now(), "not connected yet".into()));
        let me = self.me.clone();
        crate::sync::spawn(async move {
            while let Some(item) = feed.recv().await {
                let Some(fs) = me.upgrade() else { return };
                fs.on_feed(item);
            }
        });
    }

    /// Tell the kernel about changed names (the FUSE adapter's notifier).
    pub fn on_entry_change(&self, f: InvalidateEntry) {
        let _ = self.events.entries.set(f);
    }

    /// The kernel's entry and attribute timeout.
    pub fn ttl(&self) -> Duration {
        match self.events.configured.load(Relaxed) {
            true => self.cfg.metadata_ttl.min(KERNEL_TTL_CAP),
            false => self.cfg.metadata_ttl,
        }
    }

    pub fn event_stats(&self) -> EventStats {
        let e = &self.events;
        let down = e.down.lock().unwrap().clone();
        EventStats {
            configured: e.configured.load(Relaxed),
            up: e.up.load(Relaxed),
            applied: e.applied.load(Relaxed),
            expired: e.expired.load(Relaxed),
            gaps: e.gaps.load(Relaxed),
            downs: e.downs.load(Relaxed),
            down_since: down.as_ref().map(|d| d.0),
            down_reason: down.map(|d| d.1),
            notices_dropped: e.notices_dropped.load(Relaxed),
        }
    }

    pub(crate) fn on_feed(&self, item: Feed) {
        match item {
            Feed::Up => {
                self.set_events_since(Some(self.cfg.clock.now()));
                self.events.up.store(true, Relaxed);
                if let Some((since, why)) = self.events.down.lock().unwrap().take() {
                    let for_s = since.elapsed().unwrap_or_default().as_secs_f64();
                    tracing::info!(
                        "store events flowing (were down {for_s:.1} s: {why}): listings trusted past the TTL"
                    );
                }
            }
            Feed::Gap => {
                // Events were lost: only what is fetched from now on is vouched for.
                self.set_events_since(Some(self.cfg.clock.now()));
                self.events.gaps.fetch_add(1, Relaxed);
                tracing::warn!("store events were lost (more than the mount could take): listings back on the TTL");
            }
            Feed::Down(why) => {
                self.set_events_since(None);
                if self.events.up.swap(false, Relaxed) {
                    self.events.downs.fetch_add(1, Relaxed);
                    tracing::warn!("store events stopped ({why}): freshness falls back to the TTL until they resume");
                }
                let mut down = self.events.down.lock().unwrap();
                let since = down.as_ref().map_or_else(SystemTime::now, |d| d.0);
                *down = Some((since, why));
            }
            Feed::Event(ev) => self.apply_event(ev),
        }
    }

    fn apply_event(&self, ev: Event) {
        let addressable = self.store.capabilities().addressable(ev.key());
        if let Event::Put { key, size, .. } = &ev {
            let mut t = self.table.lock().unwrap();
            if !(addressable && crate::names::shown_below("", key)) {
                // The directories above a key not shown hold it: `rmdir` asks the store there.
                for dir in crate::names::ancestors("", key) {
                    t.note_hidden(&dir, true);
                }
            }
            if key.ends_with('/') && *size > 0 {
                // A marker another client put bytes in: no name shows them either.
                t.note_hidden(key, true);
            }
        }
        if !addressable {
            // Never shown (a listing skips it too): `dup ` would read and write `dup`.
            tracing::debug!(key = ?ev.key(), "store event for a key this store cannot address; ignored");
            return;
        }
        let mut key = ev.key().to_string();
        let mut last = key.trim_end_matches('/').rsplit('/').next().unwrap_or_default().to_string();
        // A link's object `x.rclonelink` is the name `x` (links.rs): checked under that name.
        let link = crate::links::link_name(&last).map(str::to_string);
        if let Some(name) = &link {
            key = format!("{}{name}", &key[..key.len() - last.len()]);
            last = name.clone();
        }
        // A marker or a link object never maps to one plain entry: checked instead. A removed
        // link may uncover nothing or a file, so it is checked too, as a link.
        let kind = match (key.ends_with('/'), link.is_some()) {
            (true, _) => Kind::Dir,
            (false, true) => Kind::Symlink,
            (false, false) => Kind::File,
        };
        let (present, size, etag, mtime) = match ev {
            Event::Removed { .. } => (link.is_some(), 0, None, None),
            Event::Put { size, etag, mtime, .. } => (true, size, etag, mtime),
            Event::Changed { .. } => {
                let applied = self.table.lock().unwrap().expire_event(&key, self.cfg.metadata_ttl);
                return self.tell_applied(&key, applied);
            }
        };
        let meta = present.then(|| ChildMeta {
            name: last.clone(),
            kind,
            size,
            mtime: mtime.unwrap_or_else(SystemTime::now),
            etag,
            attrs: None,
            size_unknown: false,
            asked: 0,
        });
        let (applied, emptied) = {
            let mut table = self.table.lock().unwrap();
            let removal = meta.is_none();
            let applied = table.apply_event(&key, meta, self.cfg.metadata_ttl);
            let emptied = match &applied {
                EventApplied::Changed { dir, .. } if removal => table.expire_if_emptied(*dir, self.cfg.metadata_ttl),
                _ => None,
            };
            (applied, emptied)
        };
        self.tell_applied(&key, applied);
        if let Some(e) = emptied {
            self.tell_applied(&key, e); // an implied directory may be gone with its last key
        }
    }

    /// Count what an event changed in the table and tell the kernel.
    fn tell_applied(&self, key: &str, applied: EventApplied) {
        let (dir, name, ino) = match applied {
            EventApplied::Nothing => return,
            EventApplied::Changed { dir, name, ino } => {
                self.events.applied.fetch_add(1, Relaxed);
                (dir, name, ino)
            }
            EventApplied::Expired { dir, name, ino } => {
                self.events.expired.fetch_add(1, Relaxed);
                (dir, name, ino)
            }
        };
        tracing::debug!(key, dir, name, "store event applied");
        self.dir_cache.forget_snapshot(dir);
        let (entries, inodes) = (self.events.entries.get().cloned(), self.invalidate_hook_of());
        if entries.is_some() || inodes.is_some() {
            // (None: no kernel, as in tests.)
            self.notify_kernel(Notice { dir, name, ino, entries, inodes });
        }
    }

    /// Queue `n` for the kernel. One thread sends the notices, off the async threads (the
    /// kernel may be waiting on one of our replies while it takes a notification), in
    /// order, with a bounded queue: a flood of events costs neither a thread nor memory per
    /// event.
    fn notify_kernel(&self, n: Notice) {
        let queue = self.events.notices.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Notice>(NOTICES_QUEUED);
            let spawned = std::thread::Builder::new().name("bucketfs-notices".into()).spawn(move || {
                for Notice { dir, name, ino, entries, inodes } in rx {
                    if let Some(f) = &inodes {
                        f(dir); // its cached entries
                    }
                    if let Some(f) = &entries {
                        f(dir, &name); // the name's dentry, positive or negative
                    }
                    if let (Some(ino), Some(f)) = (ino, &inodes) {
                        f(ino); // its attributes and cached pages are the old version's
                    }
                }
            });
            if let Err(e) = spawned {
                tracing::warn!("no thread for kernel notices ({e}): the kernel's caches expire on their own");
            }
            tx
        });
        if queue.try_send(n).is_err() && self.events.notices_dropped.fetch_add(1, Relaxed).is_multiple_of(10_000) {
            tracing::warn!(
                "store events come faster than the kernel takes notices: some dropped (the kernel's \
                 cached entries then expire within {} s)",
                KERNEL_TTL_CAP.as_secs()
            );
        }
    }
}

#[cfg(test)]
#[path = "events_tests.rs"]
mod tests;
