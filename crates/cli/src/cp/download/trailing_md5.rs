//! The whole-file MD5 of a download, computed while the slices land.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use md5::{Digest, Md5};

use super::super::CpError;

/// The MD5 of the file while it is being written: slices land out of order, and a thread
/// hashes the contiguous prefix (read back from the page cache) as it grows, so the digest
/// is ready moments after the last slice instead of after a second pass.
pub(super) struct TrailingMd5 {
    tx: Option<std::sync::mpsc::Sender<std::ops::Range<u64>>>,
    handle: std::thread::JoinHandle<std::io::Result<[u8; 16]>>,
}

impl TrailingMd5 {
    pub(super) fn start(file: Arc<File>, size: u64) -> Self {
        let (tx, rx) = std::sync::mpsc::channel::<std::ops::Range<u64>>();
        let handle = std::thread::spawn(move || {
            let mut h = Md5::new();
            let mut next = 0u64;
            let mut landed = std::collections::BTreeMap::new();
            let mut buf = vec![0u8; 1 << 20]; // 1 MiB reads from the page cache
            for r in rx {
                landed.insert(r.start, r.end);
                while let Some(end) = landed.remove(&next) {
                    while next < end {
                        let n = ((end - next) as usize).min(buf.len());
                        file.read_exact_at(&mut buf[..n], next)?;
                        h.update(&buf[..n]);
                        next += n as u64;
                    }
                }
            }
            if next != size {
                return Err(std::io::Error::other(format!("only {next} of {size} bytes were hashed")));
            }
            Ok(h.finalize().into())
        });
        Self { tx: Some(tx), handle }
    }

    pub(super) fn landed(&self, r: std::ops::Range<u64>) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(r);
        }
    }

    pub(super) async fn finish(mut self) -> Result<[u8; 16], CpError> {
        self.tx = None; // ends the thread's loop
        let handle = self.handle;
        tokio::task::spawn_blocking(move || handle.join())
            .await
            .map_err(|e| e.to_string())?
            .map_err(|_| "the hashing thread panicked".to_string())?
            .map_err(|e| CpError::io("hashing the local copy", &e))
    }
}
