//! Unit tests of the inode table (inode.rs and its parts).
use super::*;

fn meta(name: &str, kind: Kind) -> ChildMeta {
    ChildMeta {
        name: name.into(),
        kind,
        size: 3,
        mtime: SystemTime::UNIX_EPOCH,
        etag: None,
        attrs: None,
        size_unknown: false,
        asked: 0,
    }
}

#[test]
fn upsert_reuses_inode_and_replaces_on_kind_change() {
    let mut t = InodeTable::new(SystemTime::UNIX_EPOCH);
    let a = t.upsert(ROOT_INO, &meta("a", Kind::File));
    assert_eq!(t.upsert(ROOT_INO, &meta("a", Kind::File)), a);
    assert_eq!(t.get(a).unwrap().key, "a");
    let d = t.upsert(ROOT_INO, &meta("a", Kind::Dir));
    assert_ne!(d, a);
    assert_eq!(t.get(d).unwrap().key, "a/");
    let f = t.upsert(d, &meta("x", Kind::File));
    assert_eq!(t.get(f).unwrap().key, "a/x");
    t.check_invariants();
    t.relocate(d, ROOT_INO, "b");
    assert_eq!(t.get(f).unwrap().key, "b/x", "a move rewrites the keys below");
    t.check_invariants();
}

#[test]
fn a_listing_of_a_directory_fetched_before_it_moved_is_not_trusted() {
    let mut t = InodeTable::new(SystemTime::UNIX_EPOCH);
    let d = t.upsert(ROOT_INO, &meta("a", Kind::Dir));
    t.upsert(d, &meta("x", Kind::File));
    // A lister asks the store for "a/" (old objects, old identities)...
    let since = t.change_seq();
    // ...while the directory moves to "b/" (every object copied: new identities).
    t.relocate(d, ROOT_INO, "b");
    t.expire_below("b/", t.now());
    t.set_listing_since(d, listing_of(&t, &["x"]), since);
    assert!(!t.listing_fresh(d), "the old keys' listing must not answer for the moved directory");
    assert!(t.listing(d).unwrap().overtaken);
}

/// An `rm -rf` of more names than the old cap (4,096): every removal is still known to
/// an overtaken listing (it failed open past the cap), until a listing sent after the
/// removals is recorded.
#[test]
fn removals_last_until_a_listing_sent_after_them() {
    let mut t = InodeTable::new(SystemTime::UNIX_EPOCH);
    let d = t.upsert(ROOT_INO, &meta("d", Kind::Dir));
    let names: Vec<String> = (0..5000).map(|i| format!("f{i:04}")).collect();
    for n in &names {
        t.upsert(d, &meta(n, Kind::File));
    }
    let before = t.change_seq(); // a listing sent before the rm
    for n in &names {
        t.listing_remove(d, n);
    }
    assert!(names.iter().all(|n| t.removed_here(d, n)), "every removal is remembered");
    t.set_listing_since(d, listing_of(&t, &[]), before);
    assert!(t.removed_here(d, "f0000"), "a listing sent before the removals does not clear them");
    t.set_listing_since(d, listing_of(&t, &[]), t.change_seq());
    assert!(!t.removed_here(d, "f0000") && !t.removed_here(d, "f4999"), "a listing sent after does");
    t.check_invariants();
}

/// A listing sent before a removal, landing after a newer listing cleared the removal's
/// record and was itself dropped (trimmed, or the kernel forgot the directory), does
/// not bring the name back (review of the order rule: it held only while the newer
/// listing did).
#[test]
fn a_listing_older_than_one_dropped_does_not_bring_back_a_removed_name() {
    for forgotten in [false, true] {
        let mut t = InodeTable::new(SystemTime::UNIX_EPOCH);
        let d = t.upsert(ROOT_INO, &meta("d", Kind::Dir));
        t.upsert(d, &meta("x", Kind::File));
        let old = t.change_seq(); // a listing sent now, answered late, shows x
        t.listing_remove(d, "x");
        t.set_listing_since(d, listing_of(&t, &[]), t.change_seq());
        assert!(!t.removed_here(d, "x"), "a listing sent after the removal clears its record");
        if forgotten {
            t.remember(d);
            t.forget(d, 1);
        } else {
            t.evict_dir(d);
        }
        t.set_listing_since(d, listing_of(&t, &["x"]), old);
        assert!(t.listing(d).is_none_or(|l| !l.children.contains_key("x")), "x came back (forgotten: {forgotten})");
        t.check_invariants();
    }
}

#[test]
fn forget_drops_node_at_zero() {
    let mut t = InodeTable::new(SystemTime::UNIX_EPOCH);
    let a = t.upsert(ROOT_INO, &meta("a", Kind::File));
    t.remember(a);
    t.remember(a);
    t.forget(a, 1);
    assert!(t.get(a).is_some());
    t.forget(a, 1);
    assert!(t.get(a).is_none());
    // chmod'ed nodes outlive the kernel's references: the mode must survive eviction.
    let b = t.upsert(ROOT_INO, &meta("b", Kind::File));
    t.remember(b);
    let n = t.get_mut(b).unwrap();
    (n.perm, n.attrs_here) = (Some(0o600), true);
    t.forget(b, 1);
    assert_eq!(t.child(ROOT_INO, "b").map(|n| n.ino), Some(b));
    assert!(t.child(ROOT_INO, "a").is_none());
    t.forget(ROOT_INO, 5);
    assert!(t.get(ROOT_INO).is_some());
    t.check_invariants();
}

fn listing_of(t: &InodeTable, names: &[&str]) -> Listing {
    Listing {
        at: t.now(),
        valid_for: std::time::Duration::from_secs(60),
        children: names.iter().map(|n| (n.to_string(), meta(n, Kind::File))).collect(),
        subtree: false,
        overtaken: false,
    }
}

/// A busy directory (a build writing into it): a listing sent before some of its names
/// changed here takes the mount's state for those and stands for the rest, instead of
/// being distrusted whole; a change of the directory as a whole still distrusts it.
#[test]
fn a_listing_overtaken_by_changes_of_some_names_stands_for_the_rest() {
    let mut t = InodeTable::new(SystemTime::UNIX_EPOCH);
    let d = t.upsert(ROOT_INO, &meta("d", Kind::Dir));
    for n in ["x", "y", "w"] {
        t.upsert(d, &meta(n, Kind::File));
    }
    let store_view = listing_of(&t, &["x", "y", "w"]);
    let since = t.change_seq(); // the listing is sent
    t.listing_remove(d, "y"); // removed here meanwhile
    let z = t.upsert(d, &meta("z", Kind::File)); // made here meanwhile
    t.get_mut(z).unwrap().size = 42;
    t.relist(z);
    let w = t.child(d, "w").unwrap().ino;
    t.get_mut(w).unwrap().size = 7; // uploaded anew here meanwhile
    t.relist(w);
    t.set_listing_since(d, store_view, since);
    let l = t.listing(d).unwrap();
    assert!(!l.overtaken && t.listing_fresh(d), "it answers lookups");
    let mut names: Vec<&str> = l.children.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(names, ["w", "x", "z"]);
    assert_eq!((l.children["z"].size, l.children["w"].size), (42, 7), "the mount's own versions");
    // The directory moving meanwhile: its objects' answer is distrusted whole.
    let since = t.change_seq();
    t.relocate(d, ROOT_INO, "e");
    t.expire_below("e/", t.now());
    t.set_listing_since(d, listing_of(&t, &["x"]), since);
    assert!(t.listing(d).unwrap().overtaken && !t.listing_fresh(d));
    t.check_invariants();
}

/// A store answer sent before the mount made a name anew (`rm -rf current && ln -s r42
/// current`, or `mkdir x` over a removed file) does not replace what the mount made: the
/// answer describes the old name. Before, a recursive page or an overtaken listing
/// landing after it turned the new symlink into the old directory (or the new directory
/// into the deleted file) until the TTL.
#[test]
fn an_answer_sent_before_a_name_was_made_here_leaves_it() {
    let mut t = InodeTable::new(SystemTime::UNIX_EPOCH);
    let old = t.upsert(ROOT_INO, &meta("current", Kind::Dir));
    let asked = t.ask(); // a listing or a recursive page is sent
    t.listing_remove(ROOT_INO, "current"); // rm -rf current
    let link = t.upsert(ROOT_INO, &meta("current", Kind::Symlink)); // ln -s r42 current
    t.listing_insert(ROOT_INO, meta("current", Kind::Symlink));
    assert_ne!(link, old);
    // The answer lands: it still shows the old directory.
    let stale = ChildMeta { asked, ..meta("current", Kind::Dir) };
    assert_eq!(t.upsert(ROOT_INO, &stale), link, "the old directory replaced the new link");
    assert_eq!(t.child(ROOT_INO, "current").unwrap().kind, Kind::Symlink);
    // An answer sent after the change is the store's word again.
    let fresh = ChildMeta { asked: t.ask(), ..meta("current", Kind::Dir) };
    assert_ne!(t.upsert(ROOT_INO, &fresh), link);
    assert_eq!(t.child(ROOT_INO, "current").unwrap().kind, Kind::Dir);
    t.check_invariants();
}

/// A file renamed here (its cached entry untagged: the copy's ETag not known yet), then
/// opened (a HEAD learns the ETag), then listed from the cache: the chmod kept here stays.
/// Before, the untagged entry told the node it was replaced, dropping the mode.
#[test]
fn a_head_teaches_the_cached_entry_so_a_listing_keeps_the_mode() {
    let mut t = InodeTable::new(SystemTime::UNIX_EPOCH);
    let f = t.upsert(ROOT_INO, &meta("run.sh", Kind::File));
    t.put_listing(ROOT_INO, listing_of(&t, &["run.sh"]));
    t.get_mut(f).unwrap().perm = Some(0o755);
    t.get_mut(f).unwrap().version = Version::Unknown; // moved here: the copy's tag not known
    t.relist(f);
    let asked = t.ask();
    let head = ChildMeta { asked, etag: Some("\"t\"".into()), ..meta("run.sh", Kind::File) };
    t.record_head(f, &head, &Default::default());
    let entry = t.listing(ROOT_INO).unwrap().children["run.sh"].clone();
    assert_eq!(entry.etag.as_deref(), Some("\"t\""), "the cached entry did not learn the ETag");
    assert_eq!(t.upsert(ROOT_INO, &entry), f);
    assert_eq!(t.get(f).unwrap().perm, Some(0o755), "the mode kept here was dropped");
    t.check_invariants();
}

/// A rename in a busy directory: a listing taken while the rename moves `a` to `b` in the
/// store (which already shows `b`, and `a` gone) stands for the directory's other names,
/// and shows `a` and `b` as the mount holds them until the move is recorded; one sent
/// before the move is recorded and answered after shows them as recorded. (A window of
/// the whole directory distrusted every such listing.)
#[test]
fn a_listing_taken_during_a_rename_stands_for_the_other_names() {
    let names = |t: &InodeTable, d: u64| {
        let mut n: Vec<String> = t.listing(d).unwrap().children.keys().cloned().collect();
        n.sort();
        n
    };
    let mut t = InodeTable::new(SystemTime::UNIX_EPOCH);
    let d = t.upsert(ROOT_INO, &meta("d", Kind::Dir));
    let a = t.upsert(d, &meta("a", Kind::File));
    t.upsert(d, &meta("x", Kind::File));
    let id = t.begin_move((d, "a"), (d, "b"), vec!["d/a".into(), "d/b".into()]);
    let since = t.change_seq(); // sent mid-move; `y` made by another client
    t.set_listing_since(d, listing_of(&t, &["b", "x", "y"]), since);
    assert!(!t.listing(d).unwrap().overtaken && t.listing_fresh(d), "it answers lookups");
    assert_eq!(names(&t, d), ["a", "x", "y"], "the moving names as the mount holds them");
    let before_end = t.change_seq();
    t.listing_move_out(d, "a"); // the move recorded
    t.relocate(a, d, "b");
    t.relist(a);
    t.end_move(id, true);
    t.set_listing_since(d, listing_of(&t, &["a", "x", "y"]), before_end);
    assert!(t.listing_fresh(d));
    assert_eq!(names(&t, d), ["b", "x", "y"], "the move as recorded");
    t.check_invariants();
}

/// A rename that failed half-way (a copy made, the source's delete refused) may leave the
/// store in a state the table does not hold: a listing taken meanwhile is not trusted.
/// On Google Drive a listing taken while any rename in the directory runs is not either
/// (it may show the moving name twice, the second as `stem~ID8`).
#[test]
fn a_listing_taken_during_a_failed_rename_or_one_on_drive_is_not_trusted() {
    for (alias, done) in [(false, false), (true, true), (true, false)] {
        let mut t = InodeTable::new(SystemTime::UNIX_EPOCH);
        t.names_alias = alias;
        let d = t.upsert(ROOT_INO, &meta("d", Kind::Dir));
        for n in ["f1", "f5"] {
            t.upsert(d, &meta(n, Kind::File));
        }
        let id = t.begin_move((d, "f5"), (d, "f1"), vec!["d/f5".into(), "d/f1".into()]);
        let since = t.change_seq(); // sent mid-move
        if alias {
            t.set_listing_since(d, listing_of(&t, &["f1", "f1~abcdefgh"]), since);
            assert!(!t.listing_fresh(d), "Drive, mid-move: trusted");
        }
        t.end_move(id, done);
        t.set_listing_since(d, listing_of(&t, &["f1", "f1~abcdefgh"]), since);
        assert!(!t.listing_fresh(d), "alias {alias}, done {done}: trusted");
        t.check_invariants();
    }
}

/// On Google Drive (`names_alias`) a change of one name distrusts the whole listing: sent
/// while a rename replaced `f1` (Drive holds both items until the old is trashed), it shows
/// the repeated-name form `f1~ID8`, a name the mount never changed (model test, gdrive:
/// a worker's own listing showed it).
#[test]
fn on_drive_a_listing_overtaken_by_a_rename_is_distrusted_whole() {
    for alias in [false, true] {
        let mut t = InodeTable::new(SystemTime::UNIX_EPOCH);
        t.names_alias = alias;
        let d = t.upsert(ROOT_INO, &meta("d", Kind::Dir));
        for n in ["f1", "f5"] {
            t.upsert(d, &meta(n, Kind::File));
        }
        let since = t.change_seq(); // the listing is sent
        let f5 = t.child(d, "f5").unwrap().ino;
        t.listing_remove(d, "f1"); // `mv f5 f1`: the old f1 goes, f5 takes its name
        t.relocate(f5, d, "f1");
        t.set_listing_since(d, listing_of(&t, &["f1", "f1~abcdefgh"]), since);
        let shown = t.listing(d).unwrap().children.contains_key("f1~abcdefgh") && t.listing_fresh(d);
        assert_eq!(shown, !alias, "alias {alias}: the repeated-name form answers lookups");
    }
}

/// A name changed here whose node the kernel forgot before the listing landed: the
/// mount's state of it is not held, so the listing is not taken as right about it (it was
/// taken as removed: a file made here answered ENOENT from the merged listing).
#[test]
fn a_changed_name_no_longer_held_distrusts_the_listing() {
    let mut t = InodeTable::new(SystemTime::UNIX_EPOCH);
    let d = t.upsert(ROOT_INO, &meta("d", Kind::Dir));
    t.upsert(d, &meta("x", Kind::File));
    let since = t.change_seq();
    let z = t.upsert(d, &meta("z", Kind::File)); // made (and uploaded) here meanwhile
    t.relist(z);
    t.remember(z);
    t.forget(z, 1); // the kernel forgets it
    assert!(t.child(d, "z").is_none(), "the node went");
    t.set_listing_since(d, listing_of(&t, &["x"]), since);
    assert!(!t.listing_fresh(d), "a listing without z must not answer that z is absent");
    t.check_invariants();
}

/// A changed name that cannot be told (its node forgotten) no longer stops the merge: the
/// names after it are still the mount's, and it is as the listing held shows it. The
/// overtaken listing answers the readdir that asked for it: `rename(wa, wb)` then a
/// listing without `wb` (tester X, with `--metadata-ttl 0` and renames in the directory).
#[test]
fn every_name_told_is_merged_even_when_one_cannot_be() {
    let mut t = InodeTable::new(SystemTime::UNIX_EPOCH);
    let d = t.upsert(ROOT_INO, &meta("d", Kind::Dir));
    t.set_listing(d, listing_of(&t, &["x"]));
    let since = t.change_seq(); // a listing is sent
    let a = t.upsert(d, &meta("a", Kind::File)); // made here meanwhile, then forgotten
    t.relist(a);
    t.remember(a);
    t.forget(a, 1);
    let b = t.upsert(d, &meta("b", Kind::File)); // made here meanwhile (a rename's target)
    t.relist(b);
    t.set_listing_since(d, listing_of(&t, &["x"]), since);
    let l = t.listing(d).unwrap();
    let mut names: Vec<&str> = l.children.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(names, ["a", "b", "x"], "b after the name that could not be told, a as held");
    assert!(!t.listing_fresh(d), "still distrusted for lookups");
    t.check_invariants();
}

/// Another client's change told by a store event between a listing's send and its
/// arrival: the listing may predate it, so it is distrusted whole, even when names changed
/// here meanwhile could be merged (it brought a name deleted elsewhere back).
#[test]
fn a_store_event_after_a_listing_was_sent_distrusts_it() {
    let ttl = std::time::Duration::from_secs(1);
    for (events, how) in [(false, "removal"), (true, "removal, own change recent"), (false, "expired")] {
        let mut t = InodeTable::new(SystemTime::UNIX_EPOCH);
        if events {
            t.set_events_since(Some(t.now()));
        }
        let d = t.upsert(ROOT_INO, &meta("d", Kind::Dir));
        t.upsert(d, &meta("b", Kind::File));
        let since = t.change_seq();
        let a = t.upsert(d, &meta("a", Kind::File)); // a change here, mergeable
        t.relist(a);
        if how == "expired" {
            t.expire_event("d/b", ttl);
        } else {
            t.apply_event("d/b", None, ttl); // another client deleted b
        }
        t.set_listing_since(d, listing_of(&t, &["b"]), since);
        let shows_b = t.listing(d).is_some_and(|l| l.children.contains_key("b"));
        assert!(!t.listing_fresh(d) || !shows_b, "{how}: b came back as fresh");
        t.check_invariants();
    }
}

/// A HEAD's answer (the name gone) recorded after a listing was sent: the listing may be
/// newer than the HEAD (another client made the name again), so it is not merged with
/// the HEAD's answer as if that were the mount's own change: it lands overtaken.
#[test]
fn a_store_answer_recorded_after_a_listing_was_sent_does_not_merge_into_it() {
    let mut t = InodeTable::new(SystemTime::UNIX_EPOCH);
    let d = t.upsert(ROOT_INO, &meta("d", Kind::Dir));
    t.upsert(d, &meta("x", Kind::File));
    let since = t.change_seq(); // the listing is sent, after the HEAD
    t.unlink(d, "x"); // the HEAD said NotFound
    t.note_store_answer(d);
    t.set_listing_since(d, listing_of(&t, &["x"]), since);
    assert!(!t.listing_fresh(d), "x may be there again: the listing is not trusted without it");
    t.check_invariants();
}

/// The store events of a directory's own rename (each old key deleted, each new one put)
/// arrive while it runs: they change nothing. Applied, the moved directory's listing lost
/// a name per event, and readers mid-move saw 220 files shrink to 6 (`--notify minio`).
#[test]
fn events_of_a_rename_in_progress_leave_the_moved_directory_as_it_is() {
    let mut t = InodeTable::new(SystemTime::UNIX_EPOCH);
    let d = t.upsert(ROOT_INO, &meta("d", Kind::Dir));
    t.set_listing(d, listing_of(&t, &["f1", "f2"]));
    let ttl = std::time::Duration::from_secs(1);
    let id = t.begin_move((ROOT_INO, "d"), (ROOT_INO, "e"), vec!["d/".into(), "e/".into()]);
    assert_eq!(t.apply_event("d/f1", None, ttl), EventApplied::Nothing);
    assert_eq!(t.apply_event("e/f1", Some(meta("f1", Kind::File)), ttl), EventApplied::Nothing);
    assert_eq!(t.expire_event("d/f2", ttl), EventApplied::Nothing);
    let mut names: Vec<String> = t.listing(d).unwrap().children.keys().cloned().collect();
    names.sort();
    assert_eq!(names, ["f1", "f2"], "the names stay while they move");
    assert!(t.child(ROOT_INO, "e").is_none(), "nor does the new name show before the move ends");
    t.end_move(id, true);
    // Another client's removal after the move is applied as before.
    assert_ne!(t.apply_event("d/f1", None, ttl), EventApplied::Nothing);
    t.check_invariants();
}
