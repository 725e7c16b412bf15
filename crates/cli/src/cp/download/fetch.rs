//! Ranged reads with retries, whole ([`fetch`]) or as the chunks they arrived in
//! ([`fetch_chunks`]): for stdout and for store-to-store copies, which consume a slice at
//! a time (a download to a file streams into its buffers instead, see `receive`).

use bytes::Bytes;
use futures::StreamExt;

use super::super::endpoint::Remote;
use super::super::{retry, CpError, Ctx};
use bucketfs_store::{GetOpts, StoreError, StoreErrorKind, StoreExt};

/// One ranged read with retries; a short read counts as a (retried) failure.
pub(in crate::cp) async fn fetch(
    ctx: &Ctx,
    src: &Remote,
    range: std::ops::Range<u64>,
    if_match: Option<&str>,
) -> Result<Bytes, CpError> {
    let want = (range.end - range.start) as usize;
    retry(ctx, "read", &src.key, || {
        let range = range.clone();
        async move {
            let data = src.store.get_range(&src.key, range.clone(), GetOpts { if_match }).await?;
            if data.len() != want {
                return Err(StoreError::new(
                    StoreErrorKind::Other,
                    format!("short read at {range:?}: {} bytes", data.len()),
                ));
            }
            Ok(data)
        }
    })
    .await
}

/// [`fetch`] as the chunks the response arrived in (one streamed request): no copy into
/// one contiguous buffer, for readers that consume the bytes piece by piece.
pub(in crate::cp) async fn fetch_chunks(
    ctx: &Ctx,
    src: &Remote,
    range: std::ops::Range<u64>,
    if_match: Option<&str>,
) -> Result<Vec<Bytes>, CpError> {
    let want = range.end - range.start;
    retry(ctx, "read", &src.key, || {
        let range = range.clone();
        async move {
            let mut body = src.store.get(&src.key, range.clone(), GetOpts { if_match }).await?;
            let (mut chunks, mut got) = (Vec::new(), 0u64);
            while let Some(c) = body.next().await {
                let c = c?;
                got += c.len() as u64;
                if got > want {
                    break;
                }
                chunks.push(c);
            }
            if got != want {
                return Err(StoreError::new(StoreErrorKind::Other, format!("short read at {range:?}: {got} bytes")));
            }
            Ok(chunks)
        }
    })
    .await
}
