//! The copy of one file from the mirror: hashing while the bytes arrive, resuming a partial
//! copy with a Range request after a broken or stalled connection, checking that each answer is
//! the file (and range) asked for, and copying again from scratch after a sha256 mismatch.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use reqwest::StatusCode;
use sha2::{Digest, Sha256};
use url::Url;

use super::progress::Progress;
use super::verify::{is_out_of_space, part_path, place};
use super::{Limits, Plan, PullError, Wanted};
use crate::mirror::fetch::resume_from;
use crate::mirror::store::free_space;
use crate::units::human_bytes;

/// Resumes without progress before a file gives up.
const STALLS: u32 = 5;
/// Bytes of an error answer read to quote in a message; the rest is never read.
const QUOTED: usize = 4096;

/// An interrupted request: retry (resuming), or give up with this error.
enum Step {
    Retry(String),
    Fatal(PullError),
}

/// The copy of one file.
pub(super) struct Job<'a> {
    plan: &'a Plan,
    f: &'a Wanted,
    pub target: PathBuf,
    part: PathBuf,
    url: Url,
    limits: Limits,
}

/// Where one copy stands: the hash and length of what `DIR/PATH.part` holds.
struct Held {
    hasher: Sha256,
    have: u64,
    progress: Progress,
}

impl Held {
    fn restart(&mut self) {
        self.hasher = Sha256::new();
        self.have = 0;
        self.progress.fetched = 0;
    }
}

impl<'a> Job<'a> {
    pub fn new(plan: &'a Plan, f: &'a Wanted, limits: Limits) -> Job<'a> {
        let target = plan.dest.join(&f.path);
        Job {
            plan,
            f,
            part: part_path(&target),
            target,
            url: plan.url(&f.path),
            limits,
        }
    }

    pub fn disk(&self, source: std::io::Error) -> PullError {
        PullError::Disk {
            path: self.f.path.clone(),
            dest: self.plan.dest.display().to_string(),
            source,
        }
    }

    /// The error for a volume that filled up after `written` bytes.
    fn full(&self, written: u64) -> PullError {
        PullError::DiskFull {
            path: self.f.path.clone(),
            dest: self.plan.dest.display().to_string(),
            written: human_bytes(written),
            size: human_bytes(self.f.size),
            free: free_space(&self.plan.dest)
                .map(human_bytes)
                .unwrap_or_else(|e| format!("unknown ({e})")),
        }
    }

    /// An I/O error while writing: a full volume frees what this copy took, so nothing else on
    /// it starves, and says so.
    fn write_error(&self, e: std::io::Error, written: u64) -> PullError {
        if is_out_of_space(&e) {
            let _ = std::fs::remove_file(&self.part);
            self.full(written)
        } else {
            self.disk(e)
        }
    }

    /// Copies the file into place, verified, or says why not.
    pub async fn run(&self, http: &reqwest::Client, out: &mut impl Write) -> Result<(), PullError> {
        let f = self.f;
        let mut attempt = 0;
        loop {
            attempt += 1;
            // Hashing what an earlier run left reads up to the whole file: off the async threads.
            let (p, size) = (self.part.clone(), f.size);
            let (hasher, have) = tokio::task::spawn_blocking(move || resume_from(&p, size))
                .await
                .map_err(|e| self.disk(std::io::Error::other(e)))?
                .map_err(|e| self.disk(e))?;
            let free = free_space(&self.plan.dest).map_err(|e| self.disk(e))?;
            let needed = f.size.saturating_sub(have);
            if free < needed {
                return Err(PullError::NoSpace {
                    path: f.path.clone(),
                    dest: self.plan.dest.display().to_string(),
                    needed: human_bytes(needed),
                    free: human_bytes(free),
                });
            }
            if have > 0 {
                let _ = writeln!(
                    out,
                    "{}: resuming at {} of {}",
                    f.path,
                    human_bytes(have),
                    human_bytes(f.size)
                );
            } else {
                let _ = writeln!(out, "{}: pulling {}", f.path, human_bytes(f.size));
            }
            let mut held = Held {
                hasher,
                have,
                progress: Progress::new(f),
            };
            let mut stalls = 0;
            while held.have < f.size {
                let before = held.have;
                match self.stream(http, &mut held, out).await {
                    Ok(()) => {}
                    Err(Step::Fatal(e)) => return Err(e),
                    Err(Step::Retry(cause)) => {
                        stalls = if held.have > before { 0 } else { stalls + 1 };
                        if stalls >= STALLS {
                            return Err(PullError::Unreachable {
                                path: f.path.clone(),
                                cause,
                                tries: stalls,
                            });
                        }
                        tracing::debug!(path = %f.path, have = held.have, %cause, "copy interrupted");
                        let _ = writeln!(
                            out,
                            "{}: {cause}; resuming at {}",
                            f.path,
                            human_bytes(held.have)
                        );
                        tokio::time::sleep(self.limits.backoff.delay(stalls.max(1))).await;
                    }
                }
            }
            let got = hex::encode(held.hasher.finalize());
            if got == f.sha256 {
                let (p, t) = (self.part.clone(), self.target.clone());
                tokio::task::spawn_blocking(move || place(&p, &t))
                    .await
                    .map_err(|e| self.disk(std::io::Error::other(e)))?
                    .map_err(|e| self.write_error(e, f.size))?;
                let _ = writeln!(
                    out,
                    "{}: {} verified (sha256 {}) in {:.1}s",
                    f.path,
                    human_bytes(f.size),
                    got.get(..16).unwrap_or(&got),
                    held.progress.started.elapsed().as_secs_f64()
                );
                return Ok(());
            }
            // Wrong bytes are never kept: copy again from scratch, give up after the last attempt.
            let _ = std::fs::remove_file(&self.part);
            if attempt >= self.limits.attempts {
                return Err(PullError::Mismatch {
                    path: f.path.clone(),
                    got,
                    want: f.sha256.clone(),
                    attempts: attempt,
                });
            }
            tracing::warn!(path = %f.path, %got, want = %f.sha256, attempt, "sha256 mismatch; copying again");
            tokio::time::sleep(self.limits.backoff.delay(attempt)).await;
        }
    }

    /// One request: from `held.have` to the end, or until the connection breaks.
    async fn stream(
        &self,
        http: &reqwest::Client,
        held: &mut Held,
        out: &mut impl Write,
    ) -> Result<(), Step> {
        let f = self.f;
        let stall = self.limits.stall;
        let mut req = http
            .get(self.url.clone())
            .header(reqwest::header::ACCEPT_ENCODING, "identity")
            .header(
                reqwest::header::USER_AGENT,
                concat!("modelserve-pull/", env!("CARGO_PKG_VERSION")),
            );
        if held.have > 0 {
            req = req.header(reqwest::header::RANGE, format!("bytes={}-", held.have));
        }
        if let Some(token) = self.plan.token().map_err(Step::Fatal)? {
            req = req.bearer_auth(token);
        }
        let mut resp = match tokio::time::timeout(stall, req.send()).await {
            Err(_) => {
                return Err(Step::Retry(format!(
                    "the mirror sent no answer in {}s",
                    stall.as_secs()
                )));
            }
            Ok(Err(e)) => return Err(Step::Retry(describe(&e))),
            Ok(Ok(resp)) => resp,
        };
        let wrong_size = |got| {
            Step::Fatal(PullError::WrongSize {
                path: f.path.clone(),
                got,
                want: f.size,
            })
        };
        match resp.status() {
            StatusCode::OK => {
                if let Some(len) = resp.content_length().filter(|&n| n != f.size) {
                    return Err(wrong_size(len));
                }
                if held.have > 0 {
                    // The server ignored the Range: the whole file comes, so start over.
                    tracing::info!(path = %f.path, have = held.have, "the mirror answered a Range with the whole file; starting over");
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(&self.part)
                        .and_then(|p| p.set_len(0))
                        .map_err(|e| Step::Fatal(self.disk(e)))?;
                    held.restart();
                }
            }
            StatusCode::PARTIAL_CONTENT => match content_range(resp.headers()) {
                Some(cr) if cr.total != f.size => return Err(wrong_size(cr.total)),
                // A shorter range than asked for is fine: the next request continues after it.
                Some(cr) if cr.start == held.have && cr.end < f.size => {}
                other => {
                    return Err(Step::Retry(format!(
                        "the mirror answered a Range from byte {} to the end with {}",
                        held.have,
                        other.map_or("no usable Content-Range".to_string(), |cr| format!(
                            "bytes {}-{}",
                            cr.start, cr.end
                        ))
                    )));
                }
            },
            StatusCode::NOT_FOUND => {
                return Err(Step::Fatal(PullError::NotOnMirror {
                    path: f.path.clone(),
                    url: self.url.to_string(),
                }));
            }
            StatusCode::RANGE_NOT_SATISFIABLE => {
                // The mirror's file is shorter than the partial copy: that cannot be its start.
                let _ = std::fs::remove_file(&self.part);
                held.restart();
                return Err(Step::Retry(
                    "the mirror cannot continue the partial copy; starting over".into(),
                ));
            }
            s if s.is_server_error() || s == StatusCode::TOO_MANY_REQUESTS => {
                return Err(Step::Retry(format!(
                    "the mirror answered HTTP {}",
                    s.as_u16()
                )));
            }
            s => {
                return Err(Step::Fatal(PullError::Refused {
                    path: f.path.clone(),
                    status: s.as_u16(),
                    body: quoted_body(resp, stall).await,
                }));
            }
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.part)
            .map_err(|e| Step::Fatal(self.write_error(e, held.have)))?;
        loop {
            let chunk = match tokio::time::timeout(stall, resp.chunk()).await {
                Err(_) => {
                    return Err(Step::Retry(format!(
                        "the mirror sent nothing for {}s at byte {}",
                        stall.as_secs(),
                        held.have
                    )));
                }
                Ok(Err(e)) => {
                    return Err(Step::Retry(format!(
                        "the connection broke at byte {}: {}",
                        held.have,
                        describe(&e)
                    )));
                }
                Ok(Ok(None)) => break,
                Ok(Ok(Some(c))) => c,
            };
            let n = chunk.len() as u64;
            let after = held.have.saturating_add(n);
            if after > f.size {
                drop(file);
                let _ = std::fs::remove_file(&self.part);
                return Err(wrong_size(after));
            }
            if let Err(e) = file.write_all(&chunk) {
                drop(file);
                return Err(Step::Fatal(self.write_error(e, held.have)));
            }
            held.hasher.update(&chunk);
            held.have = after;
            held.progress.tick(held.have, n, out);
        }
        if held.have < f.size {
            return Err(Step::Retry(format!(
                "the body ended at byte {} of {}",
                held.have, f.size
            )));
        }
        Ok(())
    }
}

/// At most [`QUOTED`] bytes of an error answer, as at most 200 characters of text; the rest of
/// the body is never read.
async fn quoted_body(mut resp: reqwest::Response, stall: Duration) -> String {
    let mut buf = Vec::new();
    while buf.len() < QUOTED {
        match tokio::time::timeout(stall, resp.chunk()).await {
            Ok(Ok(Some(c))) => {
                let room = QUOTED - buf.len();
                buf.extend_from_slice(c.get(..room).unwrap_or(&c));
            }
            _ => break,
        }
    }
    // The mirror's refusals are JSON whose "error" says why, in a sentence worth reading whole;
    // anything else is quoted short.
    let (text, most) = match serde_json::from_slice::<serde_json::Value>(&buf)
        .ok()
        .and_then(|v| v.get("error")?.as_str().map(str::to_string))
    {
        Some(error) => (error, 600),
        None => (String::from_utf8_lossy(&buf).into_owned(), 200),
    };
    text.chars().take(most).collect::<String>().trim().into()
}

/// A `Content-Range: bytes START-END/TOTAL` header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ContentRange {
    start: u64,
    end: u64,
    total: u64,
}

/// The Content-Range of a 206; None when missing, malformed, or with END before START.
fn content_range(h: &reqwest::header::HeaderMap) -> Option<ContentRange> {
    let v = h.get(reqwest::header::CONTENT_RANGE)?.to_str().ok()?;
    let (range, total) = v.trim().strip_prefix("bytes ")?.split_once('/')?;
    let (start, end) = range.split_once('-')?;
    let cr = ContentRange {
        start: start.trim().parse().ok()?,
        end: end.trim().parse().ok()?,
        total: total.trim().parse().ok()?,
    };
    (cr.start <= cr.end).then_some(cr)
}

/// One line for a failed request, with the innermost cause (reqwest's own text says little).
fn describe(e: &reqwest::Error) -> String {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg = format!("{msg}: {s}");
        src = s.source();
    }
    if e.is_connect() {
        format!("cannot connect to the mirror: {msg}")
    } else if e.is_timeout() {
        format!("the mirror stalled: {msg}")
    } else {
        msg
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{CONTENT_RANGE, HeaderMap, HeaderValue};

    fn cr(v: &str) -> Option<ContentRange> {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_RANGE, HeaderValue::from_str(v).unwrap());
        content_range(&h)
    }

    #[test]
    fn content_ranges_that_are_not_one_range_of_a_known_file_are_refused() {
        assert_eq!(
            cr("bytes 10-99/100"),
            Some(ContentRange {
                start: 10,
                end: 99,
                total: 100
            })
        );
        for bad in [
            "bytes 10-99/*",
            "bytes 99-10/100",
            "bytes 10/100",
            "bytes=10-99/100",
            "bytes a-b/c",
            "",
        ] {
            assert_eq!(cr(bad), None, "{bad}");
        }
    }
}
