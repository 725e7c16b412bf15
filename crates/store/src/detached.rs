//! An OpenDAL writer driven from a task of its own, so that an upload cancelled mid-way
//! (its future dropped: a rename or an unlink of the file) is aborted, not left in the
//! bucket: a multipart upload's parts stay there, unseen, until aborted.
//!
//! A writer whose call was dropped before it answered cannot be aborted afterwards
//! (OpenDAL's retry layer: "retry layer is in bad state"). Here each call is a message to
//! the task, which finishes the call in flight whatever the caller does; when the caller
//! lets go before the upload ended (closed or aborted), the task aborts it, and the store's
//! [`Background`] holds that until it is done (`settle` waits for it). An abort never
//! deletes an object: one whose completion was sent stays. The completion (`close`) is the
//! exception: let go, it goes on for a moment only (see `drive`).

use bytes::Bytes;
use opendal::{Metadata, Writer};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};

use crate::background::Background;

type Reply<T> = oneshot::Sender<opendal::Result<T>>;

/// How long a completion goes on once its caller let go (see `drive`).
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

enum Call {
    Write(Bytes, Reply<()>),
    /// `UploadPartCopy` of a range of `path` (see `patch`).
    Copy(String, Box<opendal::options::ReadOptions>, Reply<()>),
    Close(Reply<Metadata>),
    Abort(Reply<()>),
}

/// See the module doc.
pub struct DetachedWriter {
    calls: Option<mpsc::Sender<Call>>,
    task: Option<tokio::task::JoinHandle<()>>,
    background: Background,
    rt: Handle,
}

impl DetachedWriter {
    /// Drive `w` (an upload of `key`) from a task on the current runtime.
    pub fn new(w: Writer, key: &str, background: &Background) -> Self {
        let (tx, rx) = mpsc::channel(1);
        let rt = Handle::current();
        let task = rt.spawn(drive(w, key.to_string(), rx));
        Self { calls: Some(tx), task: Some(task), background: background.clone(), rt }
    }

    async fn call<T>(&mut self, make: impl FnOnce(Reply<T>) -> Call) -> opendal::Result<T> {
        let gone = || opendal::Error::new(opendal::ErrorKind::Unexpected, "the upload already ended");
        let calls = self.calls.as_ref().ok_or_else(gone)?;
        let (tx, rx) = oneshot::channel();
        calls.send(make(tx)).await.map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    pub async fn write(&mut self, data: Bytes) -> opendal::Result<()> {
        self.call(|r| Call::Write(data, r)).await
    }

    pub async fn copy_from(&mut self, path: &str, opts: opendal::options::ReadOptions) -> opendal::Result<()> {
        self.call(|r| Call::Copy(path.to_string(), Box::new(opts), r)).await
    }

    pub async fn close(&mut self) -> opendal::Result<Metadata> {
        self.call(Call::Close).await
    }

    pub async fn abort(&mut self) -> opendal::Result<()> {
        self.call(Call::Abort).await
    }
}

impl Drop for DetachedWriter {
    /// The task aborts an upload not ended once its call in flight answers; the store's
    /// background work waits for it (never this drop).
    fn drop(&mut self) {
        self.calls = None;
        if let Some(task) = self.task.take() {
            self.background.spawn_on(
                async move {
                    let _ = task.await;
                },
                &self.rt,
            );
        }
    }
}

async fn drive(mut w: Writer, key: String, mut rx: mpsc::Receiver<Call>) {
    let mut ended = false;
    while let Some(call) = rx.recv().await {
        // A caller that let go gets no answer (the send fails); the call ran to its end.
        match call {
            Call::Write(data, r) => drop(r.send(w.write(data).await)),
            Call::Copy(path, opts, r) => drop(r.send(w.copy_from_options(&path, *opts).await)),
            Call::Close(mut r) => {
                // The one call that makes the object visible. A caller that lets go of it (a
                // rename or an unlink cancelled the upload) gives it `CLOSE_GRACE` more, then
                // cuts it off: it may land within the grace the mount allows a cut-off upload
                // (`LANDING_GRACE`), never minutes later under a name removed since. One cut
                // off cannot be aborted (its parts stay, as for a kill).
                let mut close = std::pin::pin!(w.close());
                let m = tokio::select! {
                    m = &mut close => Some(m),
                    _ = r.closed() => tokio::time::timeout(CLOSE_GRACE, &mut close).await.ok(),
                };
                let Some(m) = m else {
                    tracing::debug!(%key, "a cancelled upload's completion cut off");
                    return;
                };
                ended = m.is_ok();
                drop(r.send(m));
            }
            Call::Abort(r) => {
                ended = true;
                drop(r.send(w.abort().await));
            }
        }
    }
    if !ended {
        match w.abort().await {
            Ok(()) => tracing::debug!(%key, "a cancelled upload aborted"),
            Err(e) => tracing::warn!(%key, "a cancelled upload could not be aborted: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// OpenDAL's fs writer with an atomic-write folder keeps the bytes in a temporary file
    /// there until closed: dropped mid-way, the upload is aborted (the file removed) once
    /// settled, and a closed one is left as it is.
    #[tokio::test]
    async fn a_writer_dropped_mid_way_is_aborted_once_settled() {
        let base = std::env::temp_dir().join(format!("bucketfs-detached-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (root, tmp) = (base.join("root"), base.join("tmp"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&tmp).unwrap();
        let fs =
            opendal::services::Fs::default().root(&root.to_string_lossy()).atomic_write_dir(&tmp.to_string_lossy());
        let op = opendal::Operator::new(fs).unwrap();
        let bg = Background::default();
        let files = |d: &std::path::Path| std::fs::read_dir(d).unwrap().count();
        let mut w = DetachedWriter::new(op.writer("a").await.unwrap(), "a", &bg);
        w.write(Bytes::from_static(b"abc")).await.unwrap();
        assert_eq!(files(&tmp), 1);
        // Cancelled in the middle of a call: the call ends, then the upload is aborted.
        let write = w.write(Bytes::from_static(b"def"));
        let _ = tokio::time::timeout(std::time::Duration::ZERO, write).await;
        drop(w);
        assert!(bg.settle(std::time::Duration::from_secs(10)).await);
        assert_eq!((files(&tmp), files(&root)), (0, 0), "a temporary file left");
        let mut w = DetachedWriter::new(op.writer("b").await.unwrap(), "b", &bg);
        w.write(Bytes::from_static(b"abc")).await.unwrap();
        assert_eq!(w.close().await.unwrap().content_length(), 3);
        drop(w);
        assert!(bg.settle(std::time::Duration::from_secs(10)).await);
        assert_eq!(std::fs::read(root.join("b")).unwrap(), b"abc");
        std::fs::remove_dir_all(&base).unwrap();
    }
}
