//! How one registry call is made: attempts under the call's deadline with the crate's backoff
//! between them, each request bounded by its timeouts, bodies read under their cap, and the
//! answer mapped to a result or to the cause of the failure.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderMap, USER_AGENT};
use reqwest::{Method, StatusCode};
use url::Url;

use super::HubError;
use super::client::Hub;
use super::error::{Ctx, from_status, quote};
use super::transport::{
    ClientKey, MAX_REDIRECTS, ReadError, Retry, describe, rate_limit_reset, read_capped,
    read_prefix,
};

/// Why one attempt failed.
pub(super) enum Failure {
    /// Not worth another attempt in this call.
    Final(HubError),
    /// Worth another attempt.
    Again(Cause),
}

pub(super) enum Cause {
    /// 429, with the reset the registry advertised.
    RateLimited(Option<Duration>),
    TimedOut,
    Other(String),
}

impl Hub {
    /// A GET whose body is read into memory, at most `cap` bytes, retried as a whole.
    pub(super) async fn get(
        &self,
        url: Url,
        ctx: &Ctx<'_>,
        cap: usize,
    ) -> Result<(HeaderMap, Vec<u8>), HubError> {
        let (follow, url) = (&self.clients.follow, &url);
        self.retrying(ctx, |left| async move {
            let resp = self
                .attempt(follow, Method::GET, url, ctx, None, Some(left))
                .await?;
            let headers = resp.headers().clone();
            match read_capped(resp, cap).await {
                Ok(body) => Ok((headers, body)),
                Err(ReadError::TooLarge) => Err(Failure::Final(HubError::TooLarge {
                    endpoint: self.endpoint.to_string(),
                    what: ctx.what(),
                    cap,
                })),
                Err(ReadError::Transport(e)) => Err(transport_failure(&e, self, ctx)),
            }
        })
        .await
    }

    /// The body as `T`, or an error naming the endpoint, the request and what was expected.
    pub(super) fn json<T: serde::de::DeserializeOwned>(
        &self,
        body: &[u8],
        ctx: &Ctx<'_>,
        expected: &'static str,
    ) -> Result<T, HubError> {
        serde_json::from_slice(body).map_err(|e| HubError::MalformedJson {
            endpoint: self.endpoint.to_string(),
            what: ctx.what(),
            expected,
            error: e.to_string(),
            begins: quote(body.get(..80).unwrap_or(body), body.len() > 80),
        })
    }

    /// Runs `once` until it succeeds, fails for good, runs out of attempts, or the call's
    /// deadline passes. `once` gets the time left.
    pub(super) async fn retrying<T, F, Fut>(
        &self,
        ctx: &Ctx<'_>,
        mut once: F,
    ) -> Result<T, HubError>
    where
        F: FnMut(Duration) -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        let started = tokio::time::Instant::now();
        let left = || self.retry.deadline.saturating_sub(started.elapsed());
        let attempts = self.retry.attempts.max(1);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let cause = match tokio::time::timeout(left(), once(left())).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(Failure::Final(e))) => return Err(e),
                Ok(Err(Failure::Again(cause))) => cause,
                Err(_) => Cause::TimedOut,
            };
            let wait = match &cause {
                Cause::RateLimited(Some(reset)) => *reset,
                _ => self.retry.delay(attempt),
            };
            let last = attempt >= attempts || wait >= left();
            let (description, wait) = match cause {
                Cause::RateLimited(_) if last || wait > self.retry.max_rate_limit_wait => {
                    return Err(HubError::RateLimited { retry_after: wait });
                }
                Cause::RateLimited(_) => ("429 Too Many Requests".to_string(), wait),
                Cause::TimedOut if last => {
                    return Err(HubError::NoAnswer {
                        endpoint: self.endpoint.to_string(),
                        what: ctx.what(),
                        waited: started.elapsed(),
                        attempts: attempt,
                    });
                }
                Cause::TimedOut => ("timed out".to_string(), wait),
                Cause::Other(cause) if last => {
                    return Err(HubError::Unavailable {
                        cause: format!("{cause}, from {}", self.endpoint),
                        attempts: attempt,
                    });
                }
                Cause::Other(cause) => (cause, wait),
            };
            tracing::debug!(cause = %description, ?wait, attempt, "registry request failed; retrying");
            tokio::time::sleep(wait).await;
        }
    }

    /// One request: an answer to use (2xx, or 3xx where redirects are not followed), or why not.
    pub(super) async fn attempt(
        &self,
        http: &reqwest::Client,
        method: Method,
        url: &Url,
        ctx: &Ctx<'_>,
        range: Option<&str>,
        total: Option<Duration>,
    ) -> Result<reqwest::Response, Failure> {
        let mut req = http.request(method, url.clone()).header(
            USER_AGENT,
            concat!("modelserve/", env!("CARGO_PKG_VERSION")),
        );
        if let Some(total) = total {
            req = req.timeout(total.min(self.retry.request_timeout));
        }
        if let Some(t) = &self.token {
            req = req.header(AUTHORIZATION, format!("Bearer {}", t.expose()));
        }
        if let Some(r) = range {
            req = req
                .header(reqwest::header::RANGE, r)
                .header(reqwest::header::ACCEPT_ENCODING, "identity");
        }
        let resp = req
            .send()
            .await
            .map_err(|e| transport_failure(&e, self, ctx))?;
        let status = resp.status();
        if status.is_success() || status.is_redirection() {
            return Ok(resp);
        }
        if status == StatusCode::TOO_MANY_REQUESTS {
            return Err(Failure::Again(Cause::RateLimited(rate_limit_reset(
                resp.headers(),
            ))));
        }
        if status == StatusCode::REQUEST_TIMEOUT || status.is_server_error() {
            return Err(Failure::Again(Cause::Other(format!(
                "HTTP {}",
                status.as_u16()
            ))));
        }
        let headers = resp.headers().clone();
        let (body, cut) = read_prefix(resp, self.limits.error_bytes).await;
        let repo_url = self
            .endpoint
            .join(ctx.repo)
            .map(|u| u.to_string())
            .unwrap_or_else(|_| ctx.repo.to_string());
        Err(Failure::Final(from_status(
            status.as_u16(),
            &headers,
            &body,
            cut,
            ctx,
            repo_url,
            self.token.is_some(),
        )))
    }
}

pub(super) fn key(endpoint: &Url, ca_bundle: Option<PathBuf>, retry: &Retry) -> ClientKey {
    ClientKey {
        origin: endpoint.origin().ascii_serialization(),
        ca_bundle,
        connect_timeout: retry.connect_timeout,
        read_timeout: retry.read_timeout,
    }
}

/// A transport error: redirect loops are final, everything else is worth another attempt.
fn transport_failure(e: &reqwest::Error, hub: &Hub, ctx: &Ctx<'_>) -> Failure {
    if e.is_redirect() {
        Failure::Final(HubError::TooManyRedirects {
            endpoint: hub.endpoint.to_string(),
            what: ctx.what(),
            max: MAX_REDIRECTS,
        })
    } else if e.is_timeout() {
        Failure::Again(Cause::TimedOut)
    } else {
        Failure::Again(Cause::Other(describe(e)))
    }
}
