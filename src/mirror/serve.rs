//! `GET /v1/files/OWNER/NAME/COMMIT/PATH`: a present file for the replicas' init container, whole
//! or one byte range, to a caller the [`Gate`] lets read it. A malformed path or Range is a 400
//! naming it, a range beyond the end a 416, a file that is not present a 404; nothing a client
//! sends reaches the disk unchecked.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::Mirror;
use super::api::reject;
use super::auth::Gate;
use super::request::{Invalid, check_location};

const RANGE_VALID: &str =
    "it must be one byte range: bytes=START-END, bytes=START- or bytes=-LENGTH (decimal numbers)";

/// Why a Range header cannot be served.
#[derive(Debug, PartialEq, Eq)]
pub enum RangeError {
    /// Not a single byte range this server reads: 400.
    Malformed(Invalid),
    /// A range that starts beyond the end, or ends before it starts: 416.
    Unsatisfiable,
}

/// The first and last byte a Range header asks for in a file of `size` bytes (the last clamped
/// to the end); None when there is no Range header.
pub fn parse_range(v: Option<&HeaderValue>, size: u64) -> Result<Option<(u64, u64)>, RangeError> {
    let Some(v) = v else {
        return Ok(None);
    };
    let malformed =
        |shown: &str| RangeError::Malformed(Invalid::new("Range", Some(shown), RANGE_VALID));
    let text = v
        .to_str()
        .map_err(|_| malformed(&String::from_utf8_lossy(v.as_bytes())))?;
    let spec = text
        .trim()
        .split_once('=')
        .filter(|(unit, _)| unit.trim().eq_ignore_ascii_case("bytes"))
        .map(|(_, spec)| spec.trim())
        .ok_or_else(|| malformed(text))?;
    let (first, last) = spec
        .split_once('-')
        .filter(|_| !spec.contains(','))
        .ok_or_else(|| malformed(text))?;
    let number = |s: &str| -> Result<Option<u64>, RangeError> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(None);
        }
        if !s.bytes().all(|c| c.is_ascii_digit()) {
            return Err(malformed(text));
        }
        // Too many digits for a u64 is a position no file reaches.
        Ok(Some(s.parse().unwrap_or(u64::MAX)))
    };
    let (first, last) = (number(first)?, number(last)?);
    let end = size.checked_sub(1).ok_or(RangeError::Unsatisfiable)?;
    let (start, stop) = match (first, last) {
        (Some(s), Some(e)) => (s, e),
        (Some(s), None) => (s, end),
        // The last LENGTH bytes.
        (None, Some(0)) => return Err(RangeError::Unsatisfiable),
        (None, Some(n)) => (size.saturating_sub(n), end),
        (None, None) => return Err(malformed(text)),
    };
    if start > end || stop < start {
        return Err(RangeError::Unsatisfiable);
    }
    Ok(Some((start, stop.min(end))))
}

/// Serves a present file, with Range.
pub(super) async fn serve_file(
    State(m): State<Arc<Mirror>>,
    State(gate): State<Gate>,
    path: Result<Path<(String, String, String, String)>, PathRejection>,
    headers: HeaderMap,
) -> Response {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let Ok(Path((owner, name, commit, path))) = path else {
        let e = Invalid::new(
            "path",
            None,
            "it must be /v1/files/OWNER/NAME/COMMIT/PATH, percent-encoded UTF-8",
        );
        return reject(StatusCode::BAD_REQUEST, &e);
    };
    let repo = format!("{owner}/{name}");
    if let Err(e) = check_location(&repo, &commit, &path) {
        return reject(StatusCode::BAD_REQUEST, &e);
    }
    match gate.may_read(&headers, &repo, &commit, &path).await {
        Ok(Some(caller)) => {
            tracing::debug!(%caller, %repo, %commit, %path, "serving a file");
        }
        Ok(None) => {}
        Err(r) => {
            m.metrics.refused(r.result());
            tracing::info!(status = r.status.as_u16(), why = %r.message, "refused a caller");
            return r.into_response();
        }
    }
    let not_present = || {
        let e = Invalid::new(
            "path",
            Some(&path),
            format!(
                "it is not present on the mirror for {repo} at {commit}; POST /v1/fetch puts it there"
            ),
        );
        reject(StatusCode::NOT_FOUND, &e)
    };
    let snapshot = m.store.snapshot_of(&repo, &commit, &path);
    let Ok(mut file) = tokio::fs::File::open(&snapshot).await else {
        return not_present();
    };
    let size = match file.metadata().await {
        Ok(meta) if meta.is_file() => meta.len(),
        Ok(_) => return not_present(),
        Err(_) => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    };
    let (status, start, len) = match parse_range(headers.get(header::RANGE), size) {
        Ok(Some((s, e))) => (StatusCode::PARTIAL_CONTENT, s, e - s + 1),
        Ok(None) => (StatusCode::OK, 0, size),
        Err(RangeError::Malformed(e)) => return reject(StatusCode::BAD_REQUEST, &e),
        Err(RangeError::Unsatisfiable) => {
            let e = Invalid::new(
                "Range",
                headers.get(header::RANGE).and_then(|v| v.to_str().ok()),
                format!(
                    "the file has {size} bytes: a range must start before byte {size} and end after it starts"
                ),
            );
            let mut r = reject(StatusCode::RANGE_NOT_SATISFIABLE, &e);
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
                r.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return r;
        }
    };
    if file.seek(std::io::SeekFrom::Start(start)).await.is_err() {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    let stream = tokio_util::io::ReaderStream::new(file.take(len));
    let mut resp = Response::builder()
        .status(status)
        .header(header::ACCEPT_RANGES, "bytes")
        .header(header::CONTENT_LENGTH, len.to_string());
    if status == StatusCode::PARTIAL_CONTENT {
        resp = resp.header(
            header::CONTENT_RANGE,
            format!("bytes {start}-{}/{size}", start + len - 1),
        );
    }
    resp.body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(v: &[u8], size: u64) -> Result<Option<(u64, u64)>, &'static str> {
        parse_range(Some(&HeaderValue::from_bytes(v).unwrap()), size).map_err(|e| match e {
            RangeError::Malformed(_) => "400",
            RangeError::Unsatisfiable => "416",
        })
    }

    #[test]
    fn the_three_forms_of_one_byte_range_are_served() {
        assert_eq!(parse_range(None, 10), Ok(None));
        assert_eq!(range(b"bytes=2-5", 10), Ok(Some((2, 5))));
        assert_eq!(range(b"bytes=2-", 10), Ok(Some((2, 9))));
        assert_eq!(range(b"bytes=-3", 10), Ok(Some((7, 9))));
        assert_eq!(
            range(b"bytes=-30", 10),
            Ok(Some((0, 9))),
            "a suffix longer than the file"
        );
        assert_eq!(
            range(b"bytes=2-500", 10),
            Ok(Some((2, 9))),
            "an end past the file is clamped"
        );
        assert_eq!(range(b"Bytes = 0-0", 10), Ok(Some((0, 0))));
        assert_eq!(
            range(b"bytes=0-99999999999999999999999", 10),
            Ok(Some((0, 9)))
        );
    }

    #[test]
    fn a_garbage_range_is_a_bad_request() {
        for v in [
            &b"bytes"[..],
            b"bytes=",
            b"bytes=-",
            b"bytes=a-b",
            b"bytes=+1-2",
            b"bytes=1-2,4-5",
            b"items=0-1",
            b"0-1",
            b"bytes=1--2",
            b"bytes=\xff-1",
        ] {
            assert_eq!(range(v, 10), Err("400"), "{}", String::from_utf8_lossy(v));
        }
    }

    #[test]
    fn an_inverted_range_or_one_beyond_the_end_is_not_satisfiable() {
        for v in [
            &b"bytes=5-2"[..],
            b"bytes=10-",
            b"bytes=10-20",
            b"bytes=-0",
            b"bytes=99999999999999999999999-",
        ] {
            assert_eq!(range(v, 10), Err("416"), "{}", String::from_utf8_lossy(v));
        }
        assert_eq!(
            range(b"bytes=0-", 0),
            Err("416"),
            "an empty file has no byte to serve"
        );
    }
}
