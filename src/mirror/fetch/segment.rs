//! One connection of a download: it takes segments in file order, asks the registry for what
//! each still misses, checks that the answer is the range asked for, and writes the bytes in
//! place. A broken or refused request is resumed after a backoff; a registry that disagrees
//! with what it published fails the file.

use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_RANGE, HeaderMap};

use super::ledger::Partial;
use super::{FetchError, Policy, Progress};
use crate::hub::Hub;
use crate::mirror::metrics::Metrics;
use crate::mirror::store::FileRef;
use crate::units::human_bytes;

/// How one request of a connection ended, when not with the segment in place.
pub(super) enum Step {
    Retry(String),
    /// The registry answered a Range request with the whole file.
    NoRanges,
    Fatal(Box<FetchError>),
}

impl Step {
    /// A failure that ends the file's download.
    fn fatal(e: FetchError) -> Step {
        Step::Fatal(Box::new(e))
    }
}

/// One connection: takes segments in file order until none is left.
pub(super) async fn worker(
    hub: &Hub,
    f: &FileRef,
    job: &Partial,
    p: &Progress,
    policy: Policy,
    metrics: &Metrics,
) -> Result<(), Step> {
    let fail = |e: Step| {
        job.stop.store(true, Ordering::Release);
        e
    };
    let backoff = policy.retry_backoff();
    while let Some(i) = job.claim() {
        let mut stalls = 0;
        loop {
            if job.stop.load(Ordering::Acquire) {
                return Ok(());
            }
            let r = job.range(i);
            let before = job.done(i);
            if before >= r.end - r.start {
                break;
            }
            match segment(hub, f, job, p, i, metrics).await {
                Ok(()) => {}
                Err(Step::Retry(cause)) => {
                    let now = job.done(i);
                    stalls = if now > before { 0 } else { stalls + 1 };
                    if stalls >= policy.stalls {
                        return Err(fail(Step::fatal(FetchError::Stalled {
                            path: f.path.clone(),
                            cause,
                            stalls,
                        })));
                    }
                    tracing::info!(path = %f.path, at = r.start + now, %cause, "download interrupted; resuming");
                    tokio::time::sleep(backoff.delay(stalls.max(1))).await;
                }
                Err(e) => return Err(fail(e)),
            }
        }
    }
    Ok(())
}

/// Streams what segment `i` still misses into place.
async fn segment(
    hub: &Hub,
    f: &FileRef,
    job: &Partial,
    p: &Progress,
    i: usize,
    metrics: &Metrics,
) -> Result<(), Step> {
    let r = job.range(i);
    let from = r.start + job.done(i);
    let resp = hub
        .download(&f.repo, &f.commit, &f.path, from..r.end)
        .await
        .map_err(|e| {
            if e.is_transient() {
                Step::Retry(e.to_string())
            } else {
                Step::fatal(FetchError::Registry(e, f.path.clone()))
            }
        })?;
    let whole = r.start == 0 && r.end == f.size;
    let limit = check_answer(resp.status(), resp.headers(), from..r.end, whole, f)?;
    let disk = |source: std::io::Error| {
        if source.kind() == std::io::ErrorKind::StorageFull {
            let free = crate::mirror::store::free_space(&job.dir).unwrap_or(0);
            Step::fatal(FetchError::NoSpace {
                path: f.path.clone(),
                needed: human_bytes(f.size.saturating_sub(job.done_total())),
                free: human_bytes(free),
            })
        } else {
            Step::fatal(FetchError::Disk {
                path: f.path.clone(),
                source,
            })
        }
    };
    let mut at = from;
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        if job.stop.load(Ordering::Acquire) {
            return Ok(());
        }
        let chunk =
            chunk.map_err(|e| Step::Retry(format!("the connection broke at byte {at}: {e}")))?;
        let n = chunk.len() as u64;
        if at.saturating_add(n) > limit {
            job.record(i);
            return Err(Step::fatal(FetchError::TooLong {
                path: f.path.clone(),
                from,
                expected: limit - from,
            }));
        }
        job.file.write_all_at(&chunk, at).map_err(disk)?;
        at += n;
        job.advance(i, at - r.start);
        p.bytes_done.fetch_add(n, Ordering::Relaxed);
        p.fetched.fetch_add(n, Ordering::Relaxed);
        metrics.bytes.inc_by(n);
        job.wake.notify_one();
    }
    job.record(i);
    if at < r.end {
        return Err(Step::Retry(format!(
            "the body ended at byte {at} of {}",
            f.size
        )));
    }
    Ok(())
}

/// Checks the registry's answer to a request for `asked` before its body is read, and says
/// where the body must end: a 206 must be the range asked for (its Content-Range and
/// Content-Length agreeing), a 200 is the whole file (fine only when the whole file was asked
/// for), and either must name the size the registry published.
pub(super) fn check_answer(
    status: StatusCode,
    headers: &HeaderMap,
    asked: Range<u64>,
    whole: bool,
    f: &FileRef,
) -> Result<u64, Step> {
    let length = headers
        .get(reqwest::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let disagrees = |served| {
        Step::fatal(FetchError::SizeDisagrees {
            path: f.path.clone(),
            published: f.size,
            served,
        })
    };
    match status {
        StatusCode::PARTIAL_CONTENT => {
            let last = asked.end.saturating_sub(1);
            let Some(cr) = content_range(headers) else {
                let got = headers
                    .get(CONTENT_RANGE)
                    .map(|v| {
                        String::from_utf8_lossy(v.as_bytes())
                            .chars()
                            .take(80)
                            .collect()
                    })
                    .unwrap_or_else(|| "none".to_string());
                return Err(Step::Retry(format!(
                    "the registry answered bytes {}-{last} with 206 but no usable Content-Range (got {got:?})",
                    asked.start
                )));
            };
            if let Some(total) = cr.total.filter(|&t| t != f.size) {
                return Err(disagrees(total));
            }
            if cr.start != asked.start || cr.end > last {
                return Err(Step::Retry(format!(
                    "asked for bytes {}-{last}, the registry sent {}-{}",
                    asked.start, cr.start, cr.end
                )));
            }
            let len = cr.end - cr.start + 1;
            if let Some(l) = length.filter(|&l| l != len) {
                return Err(Step::Retry(format!(
                    "the registry's Content-Length {l} disagrees with its Content-Range {}-{}",
                    cr.start, cr.end
                )));
            }
            Ok(cr.end + 1)
        }
        // The whole file: fine for a download from byte 0 of the whole file, else Range is ignored.
        StatusCode::OK if whole && asked.start == 0 => match length {
            Some(len) if len != f.size => Err(disagrees(len)),
            _ => Ok(f.size),
        },
        StatusCode::OK => Err(Step::NoRanges),
        s => Err(Step::Retry(format!("unexpected HTTP {}", s.as_u16()))),
    }
}

/// A `Content-Range: bytes START-END/TOTAL` header (TOTAL None for `*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ContentRange {
    pub start: u64,
    pub end: u64,
    pub total: Option<u64>,
}

/// The Content-Range of a 206; None when missing, malformed, or with END before START.
pub(super) fn content_range(h: &HeaderMap) -> Option<ContentRange> {
    let v = h.get(CONTENT_RANGE)?.to_str().ok()?;
    let (range, total) = v.trim().strip_prefix("bytes ")?.split_once('/')?;
    let (start, end) = range.split_once('-')?;
    let (start, end) = (start.trim().parse().ok()?, end.trim().parse().ok()?);
    let total = match total.trim() {
        "*" => None,
        t => Some(t.parse().ok()?),
    };
    (start <= end).then_some(ContentRange { start, end, total })
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{CONTENT_LENGTH, HeaderValue};

    fn file(size: u64) -> FileRef {
        FileRef {
            repo: "o/r".into(),
            commit: "a".repeat(40),
            path: "m.gguf".into(),
            sha256: "b".repeat(64),
            size,
        }
    }

    fn headers(range: Option<&str>, length: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(r) = range {
            h.insert(CONTENT_RANGE, HeaderValue::from_str(r).unwrap());
        }
        if let Some(l) = length {
            h.insert(CONTENT_LENGTH, HeaderValue::from_str(l).unwrap());
        }
        h
    }

    fn answer(status: u16, range: Option<&str>, length: Option<&str>) -> Result<u64, String> {
        let s = StatusCode::from_u16(status).unwrap();
        check_answer(s, &headers(range, length), 100..200, false, &file(1000)).map_err(
            |e| match e {
                Step::Retry(m) => format!("retry: {m}"),
                Step::NoRanges => "no ranges".into(),
                Step::Fatal(e) => format!("fatal: {e}"),
            },
        )
    }

    #[test]
    fn the_range_asked_for_is_accepted_with_where_its_body_ends() {
        assert_eq!(
            answer(206, Some("bytes 100-199/1000"), Some("100")),
            Ok(200)
        );
        assert_eq!(
            answer(206, Some("bytes 100-149/*"), None),
            Ok(150),
            "a shorter answer resumes"
        );
    }

    #[test]
    fn a_content_range_that_lies_is_retried_or_fails_with_both_sizes() {
        for (range, want) in [
            (
                Some("bytes 0-99/1000"),
                "retry: asked for bytes 100-199, the registry sent 0-99",
            ),
            (
                Some("bytes 100-299/1000"),
                "retry: asked for bytes 100-199, the registry sent 100-299",
            ),
            (
                Some("bytes 150-100/1000"),
                "retry: the registry answered bytes 100-199 with 206 but no usable Content-Range (got \"bytes 150-100/1000\")",
            ),
            (
                Some("items 1-2/3"),
                "retry: the registry answered bytes 100-199 with 206 but no usable Content-Range",
            ),
            (
                None,
                "retry: the registry answered bytes 100-199 with 206 but no usable Content-Range (got \"none\")",
            ),
            (
                Some("bytes 100-199/5000"),
                "fatal: m.gguf: the registry published 1000 bytes but its download says 5000",
            ),
        ] {
            let got = answer(206, range, None).unwrap_err();
            assert!(got.starts_with(want), "{range:?}: {got}");
        }
    }

    #[test]
    fn a_content_length_that_disagrees_with_the_range_is_retried() {
        let got = answer(206, Some("bytes 100-199/1000"), Some("5000")).unwrap_err();
        assert_eq!(
            got,
            "retry: the registry's Content-Length 5000 disagrees with its Content-Range 100-199"
        );
    }

    #[test]
    fn a_whole_file_answer_is_fine_only_for_the_whole_file() {
        assert_eq!(answer(200, None, Some("1000")), Err("no ranges".into()));
        let whole = |len: &str| {
            check_answer(
                StatusCode::OK,
                &headers(None, Some(len)),
                0..1000,
                true,
                &file(1000),
            )
        };
        assert!(matches!(whole("1000"), Ok(1000)));
        assert!(matches!(
            whole("999"),
            Err(Step::Fatal(e)) if matches!(*e, FetchError::SizeDisagrees { served: 999, .. })
        ));
        assert!(
            answer(503, None, None)
                .unwrap_err()
                .starts_with("retry: unexpected HTTP 503")
        );
    }
}
