//! The fetch tasks behind a [`FileReader`]: blocks from the disk cache where it has them,
//! each run of the rest with one streamed GET into pooled buffers, every block handed to
//! its waiters as soon as its last byte arrives, then queued for the disk cache.

use super::*;

/// A block's waiter: resolved with the block when it is complete.
pub(super) type Tx = oneshot::Sender<Result<Bytes, FsError>>;

/// What a fetch task needs of its reader.
pub(super) struct Source {
    pub(super) store: Arc<dyn Store>,
    pub(super) cache: Arc<ReadCache>,
    pub(super) key: Arc<str>,
    pub(super) identity: Arc<str>,
    pub(super) etag: Option<String>,
    pub(super) size: u64,
    /// A prefetch's reader: its blocks are filled at most [`AHEAD`] blocks ahead of it.
    pub(super) pace: Option<Arc<Pace>>,
    /// The pace's epoch when the fetch started (see [`Pace::drop_fetches`]).
    pub(super) epoch: u64,
}

impl Source {
    fn len(&self, b: u64) -> usize {
        block_len(self.size, b) as usize
    }

    /// Wait until block `b` may be filled (see [`AHEAD`]); `false`: the reader is gone.
    async fn near(&self, b: u64) -> bool {
        match &self.pace {
            Some(p) => p.near(b, self.epoch).await,
            None => true,
        }
    }

    fn abandoned(&self) -> bool {
        self.pace.as_ref().is_some_and(|p| p.gone(self.epoch))
    }

    /// Fetch consecutive blocks: those in the disk cache from there, each run of the rest
    /// with one streamed GET.
    pub(super) async fn fetch_blocks(self, mut blocks: VecDeque<(u64, Tx)>) {
        if let Some(disk) = self.cache.disk.clone() {
            let mut missing = VecDeque::new();
            for (b, tx) in blocks {
                if !self.near(b).await {
                    return;
                }
                let (disk, k, id, pool) =
                    (disk.clone(), self.key.clone(), self.identity.clone(), self.cache.pool.clone());
                let hit = crate::sync::blocking(move || disk.get(&k, &id, b, &pool)).await.flatten();
                match hit.filter(|d| d.len() == self.len(b)) {
                    // Not into the memory cache: it is on disk (see `complete`).
                    Some(data) => drop(tx.send(Ok(data))),
                    None => missing.push_back((b, tx)),
                }
            }
            blocks = missing;
        }
        let mut runs: Vec<VecDeque<(u64, Tx)>> = Vec::new();
        for (b, tx) in blocks {
            match runs.last_mut() {
                Some(run) if run.back().is_some_and(|(last, _)| *last + 1 == b) => run.push_back((b, tx)),
                _ => runs.push(VecDeque::from([(b, tx)])),
            }
        }
        futures::future::join_all(runs.into_iter().map(|run| self.fetch_run(run))).await;
    }

    /// One streamed GET for a run of consecutive blocks. A run cut off early (an error or
    /// a short body) refetches its unfinished blocks, each with its own GET, as if they had
    /// never been grouped; a changed object fails them all.
    async fn fetch_run(&self, run: VecDeque<(u64, Tx)>) {
        let grouped = run.len() > 1;
        let (left, partial, res) = self.stream_run(run).await;
        if left.is_empty() {
            return;
        }
        if !grouped || matches!(res, Err(FsError::Stale(_))) || self.abandoned() {
            return Self::settle(left, partial, res);
        }
        let one = |x| async move {
            let (left, partial, res) = self.stream_run(VecDeque::from([x])).await;
            Self::settle(left, partial, res);
        };
        futures::future::join_all(left.into_iter().map(one)).await;
    }

    /// Resolve the blocks a fetch did not complete: with its error, or (the stream ended
    /// early: the object is shorter than opened) with the bytes that arrived.
    fn settle(left: VecDeque<(u64, Tx)>, mut partial: Option<Bytes>, res: Result<(), FsError>) {
        for (_, tx) in left {
            let _ = tx.send(res.clone().map(|()| partial.take().unwrap_or_default()));
        }
    }

    /// Stream the run's bytes into one pooled buffer per block, and resolve each block as
    /// soon as its last byte arrives (so its reader does not wait for the whole run). Returns
    /// the blocks not completed, the bytes of the first of them that arrived, and how the
    /// stream ended.
    async fn stream_run(
        &self,
        mut run: VecDeque<(u64, Tx)>,
    ) -> (VecDeque<(u64, Tx)>, Option<Bytes>, Result<(), FsError>) {
        let (Some(&(first, _)), Some(&(last, _))) = (run.front(), run.back()) else {
            return (run, None, Ok(()));
        };
        let range = first * BLOCK..((last + 1) * BLOCK).min(self.size);
        let (mut buf, mut n) = (None, 0usize);
        // The CRC32C the disk cache stores, computed on each piece just after it is copied
        // (still in the CPU's cache), instead of reading the whole block again later.
        let (checksum, mut crc) = (self.cache.disk.is_some(), 0u32);
        let res = async {
            let mut body = self
                .store
                .get(&self.key, range, GetOpts { if_match: self.etag.as_deref() })
                .await
                .map_err(store_err)?;
            while let Some(mut chunk) = body.try_next().await.map_err(store_err)? {
                while !chunk.is_empty() {
                    let Some(&(b, _)) = run.front() else {
                        return Err(FsError::Stale(format!("{}: the store sent more bytes than asked for", self.key)));
                    };
                    let want = self.len(b);
                    if buf.is_none() && !self.near(b).await {
                        return Err(FsError::Local("the reader is gone".into()));
                    }
                    let space: &mut BlockBuf = buf.get_or_insert_with(|| self.cache.pool.take());
                    let k = chunk.len().min(want - n);
                    let piece = &mut space.space()[n..n + k];
                    piece.copy_from_slice(&chunk[..k]);
                    if checksum {
                        crc = crc32c::crc32c_append(crc, piece);
                    }
                    chunk.advance(k);
                    n += k;
                    if n == want {
                        let (b, tx) = run.pop_front().expect("a block being filled");
                        self.complete(b, tx, buf.take().expect("a buffer being filled"), n, crc).await;
                        (n, crc) = (0, 0);
                    }
                }
            }
            Ok(())
        }
        .await;
        let partial = buf.map(|mut b| {
            b.space()[n..round_up(n)].fill(0);
            b.into_bytes(round_up(n)).slice(..n)
        });
        (run, partial, res)
    }

    /// A whole block arrived (its CRC32C is `crc`): zero-pad it to a page, hand it to its
    /// waiters, then queue it for the disk cache, or (no disk cache, or its queue is full)
    /// keep it in the memory cache. A sequential reader's blocks stay in memory only while
    /// it is near them (its fetches in flight); after that the kernel's page cache and the
    /// disk cache hold them, and a third copy in memory would only push out the blocks of
    /// random readers, and cost a streaming reader the memory cache's size in RSS.
    async fn complete(&self, b: u64, tx: Tx, mut buf: BlockBuf, n: usize, crc: u32) {
        buf.space()[n..round_up(n)].fill(0);
        let padded = buf.into_bytes(round_up(n));
        let data = padded.slice(..n);
        let _ = tx.send(Ok(data.clone()));
        let (key, identity, size) = (self.key.clone(), self.identity.clone(), self.size);
        let put = DiskPut { key, identity, size, block: b, padded, len: n, crc: Some(crc) };
        if !self.cache.to_disk(put, DISK_WAIT).await {
            self.cache.insert((self.key.clone(), self.identity.clone(), b), data);
        }
    }
}
