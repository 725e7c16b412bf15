//! rename of a directory: every key below it moves (one request where the store moves
//! folders, else copy then delete), with the staged files and handles below it.

use futures::TryStreamExt;

use super::name_staged;
use crate::fs::{Fs, Kind};
use crate::FsError;

impl Fs {
    /// Move every key below `src` to `new_key`: in one request where the store moves
    /// folders; else copies first, then deletes, so a failure midway loses nothing (the
    /// source is complete until every copy succeeded). `true`: made here and nothing below
    /// it in the store yet (write-back), so moved with no request, and the listings held
    /// below it are still whole.
    pub(super) async fn move_dir(&self, src: &crate::inode::Node, new_key: &str) -> Result<bool, FsError> {
        let below: Vec<u64> = {
            let t = self.table.lock().unwrap();
            t.nodes().filter(|n| n.key.starts_with(&src.key) && n.kind == Kind::File).map(|n| n.ino).collect()
        };
        if !self.write_back() {
            // Staged files below the directory go up under their current keys first.
            for ino in below.iter().copied() {
                self.upload_pub(ino).await?;
            }
        }
        // One request moves the folder (Drive).
        let moves = self.store.capabilities().moves;
        // Made here and not in the store yet (write-back): nothing to list or copy.
        let here = self.made_here_below(src).await;
        let (keys, seen): (Vec<String>, _) = match &here {
            // Its markers below it, to be made under the new name and withdrawn under the
            // old one should a crash cut what follows short.
            Some(markers) => (markers.iter().filter(|k| **k != src.key).cloned().collect(), Default::default()),
            None if moves => Default::default(),
            None => {
                // Each object goes only while it holds the version listed here (moves::settle).
                let listed = self.keys_to_move(src).await?;
                (
                    listed.iter().map(|m| m.key.clone()).collect(),
                    listed.into_iter().map(|m| (m.key.clone(), m)).collect(),
                )
            }
        };
        self.check_moved_lengths(src, new_key, &keys)?;
        // Journaled before anything changes, here or in the store: a crash from now on is
        // finished by the next mount, store keys and staged files alike (moves.rs).
        let _journal = crate::moves::Entry::begin(&self.cfg.staging_dir, &src.key, new_key, &keys);
        if let (Some(d), Some(markers)) = (&self.deletes, &here) {
            for k in markers {
                d.defer_marker(&format!("{new_key}{}", &k[src.key.len()..])).await?;
            }
            crate::pause::point(&self.cfg.staging_dir, "move_dir: new markers journaled").await;
        }
        // Staged files are named under the new directory before anything moves, so a crash
        // from now on never recovers one under the old name. Write-back: files not uploaded
        // yet go up there from the queue, with no request (their older objects, and the last
        // closed version of a file still being written, move with the directory). Else
        // uploaded above, they move with it, but a file still open keeps its sidecar (a
        // crash re-sends it): under the old name, after the move, it came back.
        self.rekey_staged_moving(&below, &src.key, new_key).await;
        if here.is_some() {
            self.never_stored(&below).await;
        }
        let moved = match (&self.deletes, &here) {
            // Its markers were journaled anew above: the old ones are not made, or go.
            (Some(d), Some(markers)) => {
                futures::future::try_join_all(markers.iter().map(|k| d.withdraw_marker(k))).await.map(|_| ())
            }
            _ if moves => self.store.rename(&src.key, new_key).await,
            _ => crate::moves::run(self.store.as_ref(), &src.key, new_key, &keys, &seen, false, None).await,
        };
        if moved.is_err() {
            self.rekey_staged_moving(&below, new_key, &src.key).await; // as they were
        }
        moved?;
        if self.write_back() {
            // An upload to an old key that was cancelled or timed out may still land there
            // after the listing above (a store that hung): deleted, and once more later.
            for ino in below {
                let Some(s) = self.staging.get(ino) else { continue };
                let mut st = s.lock().await;
                if st.maybe_landed && st.key().is_some_and(|k| k.starts_with(new_key)) {
                    let old = format!("{}{}", src.key, &st.key().unwrap_or_default()[new_key.len()..]);
                    self.delete_removed(&old, st.landing()).await?;
                    st.landing_settled();
                    if st.create_only() {
                        // What landed before the listing above moved here with the rest: not
                        // another writer's, so the upload may replace it (a rename's target
                        // is replaced), and until it does an unlink or a rename deletes it.
                        st.set_create_only(false);
                        st.replaces = true;
                    }
                }
            }
        }
        Ok(here.is_some())
    }

    /// `ENAMETOOLONG` before anything moves if a key below directory `src` (in the store,
    /// `keys`, or known here: staged files, markers, links) would be longer under `new_key`
    /// than the store holds (S3, GCS: 1,024 bytes): the store would refuse it, or keep a key
    /// no lookup can reach.
    fn check_moved_lengths(&self, src: &crate::inode::Node, new_key: &str, keys: &[String]) -> Result<(), FsError> {
        let Some(max) = self.store.capabilities().max_key_len else { return Ok(()) };
        let longest = {
            let t = self.table.lock().unwrap();
            let known = t.nodes().filter(|n| n.key.starts_with(&src.key)).map(|n| n.key.len()).max();
            keys.iter().filter(|k| k.starts_with(&src.key)).map(|k| k.len()).max().max(known)
        };
        match longest {
            Some(len) if new_key.len() + (len - src.key.len()) > max => {
                tracing::warn!(from = %src.key, to = %new_key, "cannot rename the directory: a key below it would be longer than the store holds ({max} bytes)");
                Err(FsError::NameTooLong)
            }
            _ => Ok(()),
        }
    }

    /// Write-back: the pending markers at and below directory `src`, if it was made here and
    /// nothing below it can be in the store yet (the checkpoint pattern: `mkdir tmp`, write,
    /// `mv tmp ckpt`): its marker not made yet (every write below waits for it, so no
    /// upload below has reached the store), every directory below one made here too, every
    /// file below a staged one.
    /// Such a directory moves with no request, which a store that hangs would hold.
    async fn made_here_below(&self, src: &crate::inode::Node) -> Option<Vec<String>> {
        let d = self.deletes.as_ref().filter(|_| self.write_back())?;
        let markers = d.markers_only_below(&src.key)?;
        let nodes: Vec<crate::inode::Node> = {
            let t = self.table.lock().unwrap();
            t.nodes().filter(|n| n.linked && n.ino != src.ino && n.key.starts_with(&src.key)).cloned().collect()
        };
        for n in nodes {
            match n.kind {
                Kind::Dir if markers.contains(&n.key) => {}
                // (Staged ones only. One whose upload was cut off, by this rename too, is not
                // in the store: that upload waited for the marker.)
                Kind::File if self.staging.contains(n.ino) => {}
                _ => return None,
            }
        }
        Some(markers)
    }

    /// The staged files among `inos` are known never to have reached the store (below a
    /// marker not made yet, see [`Fs::made_here_below`]): an upload cut off left nothing.
    async fn never_stored(&self, inos: &[u64]) {
        for &ino in inos {
            if let Some(s) = self.staging.get(ino) {
                let mut st = s.lock().await;
                (st.in_store, st.replaces) = (false, false);
                st.landing_settled();
            }
        }
    }

    /// Name the pending staged files among `inos` whose keys are below `from` as they will
    /// be below `to` (crash recovery reads the name from the sidecar).
    async fn rekey_staged_moving(&self, inos: &[u64], from: &str, to: &str) {
        for &ino in inos {
            let Some(s) = self.staging.get(ino) else { continue };
            let mut st = s.lock().await;
            let Some(key) = st.key().filter(|k| k.starts_with(from)).map(str::to_string) else { continue };
            let _ = self.observe(ino, &mut st); // a failed check keeps what is known
            if !st.unlinked {
                // Clean ones too: a sidecar naming the old key would be uploaded there.
                name_staged(&mut st, &format!("{to}{}", &key[from.len()..]));
            }
        }
    }

    /// Every key below directory `src` in the store, as listed, for a move: at most
    /// `max_rename_keys` (EXDEV beyond), and each one a name shown here.
    async fn keys_to_move(&self, src: &crate::inode::Node) -> Result<Vec<bucketfs_store::ObjectMeta>, FsError> {
        let mut keys = Vec::new();
        let mut stream = self.store.list(&src.key, true);
        while let Some(m) = stream.try_next().await? {
            // A marker's bytes would be lost: `moves::run` makes each marker anew, empty.
            if self.marker_holds_bytes(&m).await? {
                return Err(FsError::CrossDevice(format!("marker {:?} holds bytes no file name shows", m.key)));
            }
            if m.key == src.key {
                continue; // its own marker, listed because it might have held bytes
            }
            keys.push(m);
            if keys.len() > self.cfg.max_rename_keys {
                return Err(FsError::CrossDevice(format!(
                    "{} holds over {} keys; renaming it would copy each (mv copies instead)",
                    src.key, self.cfg.max_rename_keys
                )));
            }
        }
        // A key the mount does not show (not a valid file name, or one the store cannot
        // address byte for byte, such as `a ` that OpenDAL trims) cannot be copied: refuse
        // before anything is copied. `mv` then moves what it sees and leaves the directory.
        if let Some(k) = keys.iter().map(|m| &m.key).find(|k| !self.shown_below(&src.key, k)) {
            tracing::warn!(dir = %src.key, key = %k, "cannot rename a directory that holds a key with no file name here (not shown); move or delete that key with another client");
            return Err(FsError::CrossDevice(format!("{} holds {k:?}, which has no file name here", src.key)));
        }
        Ok(keys)
    }
}
