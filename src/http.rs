//! Reading HTTP answers from peers that may send anything: bodies read into memory stop at a cap.

use futures::StreamExt;

/// Why a body could not be read whole.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the answer is larger than {cap} bytes, the most read into memory")]
    TooLarge { cap: usize },
    #[error("{0}")]
    Broken(String),
}

/// Reads `resp`'s body, failing as soon as it passes `cap` bytes (a declared length above the
/// cap fails before any byte is read).
pub async fn read_capped(resp: reqwest::Response, cap: usize) -> Result<Vec<u8>, BodyError> {
    if resp
        .content_length()
        .is_some_and(|n| n > u64::try_from(cap).unwrap_or(u64::MAX))
    {
        return Err(BodyError::TooLarge { cap });
    }
    let mut body = Vec::new();
    let mut chunks = resp.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| BodyError::Broken(e.to_string()))?;
        if body.len().saturating_add(chunk.len()) > cap {
            return Err(BodyError::TooLarge { cap });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
