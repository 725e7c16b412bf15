//! Requests bucketfs sends again itself, where OpenDAL's `RetryLayer` does not or must not:
//!
//! - a GCS `compose`: the layer passes compose requests through untouched (its `Composer`
//!   is the inner one), so one cut connection failed a whole upload or append;
//! - a GCS create-only upload ([`crate::opendal_store`]'s `put`): OpenDAL sends it as a
//!   resumable session, and the layer retries the session's close by asking its status
//!   (`Content-Range: bytes */N`, no body). fake-gcs-server takes that for the end of the
//!   upload and stores what it holds (nothing, after a cut): a 0-byte object under the key,
//!   then "writer got too much data". Here each try is a whole new session instead.
//!
//! The backoff is the layer's ([`crate::location`]): from 200 ms, doubling, at most 4 s,
//! jittered ([`backoff`], which the Drive client's retries use too); at most `retries`
//! tries after the first, and only for temporary errors.

use std::future::Future;
use std::time::Duration;

/// `attempt(n)` for n = 0, 1, ... until it succeeds, fails for good, or `retries` more
/// tries failed. `what` and `key` name it in the log.
pub(crate) async fn again<T, F, Fut>(retries: usize, what: &str, key: &str, attempt: F) -> opendal::Result<T>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = opendal::Result<T>>,
{
    again_after(|n| backoff(n, 4_000), retries, what, key, attempt).await
}

/// The wait before retry `attempt` (from 0): 200 ms doubling, plus up to half again of
/// jitter, at most `cap_ms`.
pub(crate) fn backoff(attempt: usize, cap_ms: u64) -> Duration {
    let base = 200u64 << attempt.min(8);
    let jitter = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos()
        as u64
        % (base / 2 + 1);
    Duration::from_millis((base + jitter).min(cap_ms))
}

/// [`again`], waiting `wait(n)` before retry `n` (from 0).
async fn again_after<T, F, Fut>(
    wait: impl Fn(usize) -> Duration,
    retries: usize,
    what: &str,
    key: &str,
    mut attempt: F,
) -> opendal::Result<T>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = opendal::Result<T>>,
{
    let mut n = 0;
    loop {
        match attempt(n).await {
            Err(e) if e.is_temporary() && n < retries => {
                let wait = wait(n);
                n += 1;
                let after_ms = wait.as_millis() as u64;
                tracing::warn!(
                    op = what,
                    key,
                    attempt = n,
                    after_ms,
                    "store request failed, retrying: {}",
                    crate::redact_urls(&e.to_string())
                );
                tokio::time::sleep(wait).await;
            }
            r => return r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opendal::{Error, ErrorKind};

    #[tokio::test]
    async fn only_temporary_errors_are_tried_again_and_at_most_retries_times() {
        const D: Duration = Duration::from_millis(1);
        let mut tries = 0;
        let r: opendal::Result<()> = again_after(
            |_| D,
            3,
            "t",
            "k",
            |_| {
                tries += 1;
                async { Err(Error::new(ErrorKind::Unexpected, "cut").set_temporary()) }
            },
        )
        .await;
        assert!(r.is_err());
        assert_eq!(tries, 4, "the first try and 3 more");
        let mut tries = 0;
        let r: opendal::Result<()> = again_after(
            |_| D,
            3,
            "t",
            "k",
            |_| {
                tries += 1;
                async { Err(Error::new(ErrorKind::ConditionNotMatch, "412")) }
            },
        )
        .await;
        assert_eq!(r.unwrap_err().kind(), ErrorKind::ConditionNotMatch);
        assert_eq!(tries, 1, "a refusal is never sent again");
        let r = again_after(
            |_| D,
            3,
            "t",
            "k",
            |n| async move {
                if n < 2 {
                    Err(Error::new(ErrorKind::Unexpected, "cut").set_temporary())
                } else {
                    Ok(n)
                }
            },
        )
        .await;
        assert_eq!(r.unwrap(), 2);
    }
}
