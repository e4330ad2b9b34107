//! The HTTP side of the registry client: the process's shared `reqwest` clients, the time and
//! size bounds of every call, capped body reads, and the headers the Hub paginates and
//! rate-limits with.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use reqwest::header::{HeaderMap, LINK, RETRY_AFTER};
use url::Url;

use super::HubError;
use crate::retry::Backoff;

/// Redirects one request may follow (the Hub's resolve answers one, to its CDN).
pub const MAX_REDIRECTS: usize = 10;
/// Largest CA bundle read, so a wrong path (a device, a huge file) fails fast.
const MAX_CA_BUNDLE_BYTES: u64 = 4 << 20;
/// Distinct client settings kept; past this the cache starts over (clients in use live on).
const MAX_CACHED: usize = 64;

/// Retry and time settings of one registry call.
#[derive(Clone, Copy, Debug)]
pub struct Retry {
    pub attempts: u32,
    /// First step and cap of the backoff between attempts ([`Backoff`], with jitter).
    pub base: Duration,
    pub max_delay: Duration,
    /// A rate limit that resets within this long is waited out inside the call.
    pub max_rate_limit_wait: Duration,
    /// Limit of one request, headers and body (downloads have none).
    pub request_timeout: Duration,
    /// Longest silence while waiting for bytes: a stalled connection fails after this.
    pub read_timeout: Duration,
    /// Longest wait for a connection (TCP and TLS) to the registry or its CDN.
    pub connect_timeout: Duration,
    /// Longest one call may take, every attempt and wait included; a download's body, which
    /// the caller reads, is not part of it.
    pub deadline: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            attempts: 4,
            base: Duration::from_millis(500),
            max_delay: Duration::from_secs(8),
            max_rate_limit_wait: Duration::from_secs(30),
            request_timeout: Duration::from_secs(60),
            read_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            deadline: Duration::from_secs(90),
        }
    }
}

impl Retry {
    /// The wait before attempt `failures + 1`.
    pub(super) fn delay(&self, failures: u32) -> Duration {
        Backoff {
            first: self.base,
            cap: self.max_delay,
        }
        .delay(failures)
    }
}

/// How much of the registry's answers one call reads into memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of a model info answer (it lists every file of the repository).
    pub info_bytes: usize,
    /// Bytes of one tree page.
    pub page_bytes: usize,
    /// Bytes of an error answer read to quote it.
    pub error_bytes: usize,
    /// Pages of one tree listing.
    pub tree_pages: usize,
    /// Files of one tree listing.
    pub tree_files: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            info_bytes: 16 << 20,
            page_bytes: 16 << 20,
            error_bytes: 4 << 10,
            tree_pages: 500,
            tree_files: 200_000,
        }
    }
}

/// What makes two clients different; everything else is per request.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct ClientKey {
    /// scheme://host:port of the endpoint.
    pub origin: String,
    pub ca_bundle: Option<PathBuf>,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
}

/// The clients of one [`ClientKey`]: one following redirects, one stopping at the registry.
#[derive(Clone, Debug)]
pub(super) struct Clients {
    pub follow: reqwest::Client,
    pub probe: reqwest::Client,
    /// Which build these are, so tests can see that a second `Hub` reuses the first's.
    #[cfg_attr(not(test), allow(dead_code, reason = "only tests compare builds"))]
    pub id: u64,
}

/// The clients for `key`, built on first use and then shared by every `Hub` of the process
/// (one connection pool per registry instead of one per reconcile).
pub(super) fn clients(key: &ClientKey) -> Result<Clients, HubError> {
    static CACHE: OnceLock<Mutex<HashMap<ClientKey, Clients>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Mutex::default);
    if let Some(c) = cache
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(key)
    {
        return Ok(c.clone());
    }
    // Built outside the lock: reading the CA bundle is file I/O.
    let built = build(key)?;
    let mut map = cache.lock().unwrap_or_else(PoisonError::into_inner);
    if map.len() >= MAX_CACHED && !map.contains_key(key) {
        map.clear();
    }
    Ok(map.entry(key.clone()).or_insert(built).clone())
}

fn build(key: &ClientKey) -> Result<Clients, HubError> {
    static BUILDS: AtomicU64 = AtomicU64::new(0);
    let roots = match &key.ca_bundle {
        Some(path) => ca_bundle(path)?,
        None => vec![],
    };
    // Proxies come from HTTPS_PROXY / HTTP_PROXY / NO_PROXY, as reqwest reads them. Redirects
    // to another host or port lose the Authorization header (reqwest drops it), so the token
    // is never sent anywhere but the configured endpoint.
    let client = |policy| {
        let mut b = reqwest::Client::builder()
            .connect_timeout(key.connect_timeout)
            .read_timeout(key.read_timeout)
            .redirect(policy);
        for cert in &roots {
            b = b.add_root_certificate(cert.clone());
        }
        b.build().map_err(|e| match &key.ca_bundle {
            Some(path) => HubError::CaBundle {
                path: path.display().to_string(),
                why: format!("the HTTP client refused it: {e}"),
            },
            None => HubError::Malformed {
                what: format!("HTTP client: {e}"),
            },
        })
    };
    Ok(Clients {
        follow: client(reqwest::redirect::Policy::limited(MAX_REDIRECTS))?,
        probe: client(reqwest::redirect::Policy::none())?,
        id: BUILDS.fetch_add(1, Ordering::Relaxed),
    })
}

/// The certificates of a PEM bundle, added to the built-in roots.
fn ca_bundle(path: &Path) -> Result<Vec<reqwest::Certificate>, HubError> {
    use std::io::Read;
    let fail = |why: String| HubError::CaBundle {
        path: path.display().to_string(),
        why,
    };
    let mut pem = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CA_BUNDLE_BYTES + 1).read_to_end(&mut pem))
        .map_err(|e| fail(format!("cannot read it: {e}")))?;
    if pem.len() as u64 > MAX_CA_BUNDLE_BYTES {
        return Err(fail(format!(
            "it is larger than {} MiB",
            MAX_CA_BUNDLE_BYTES >> 20
        )));
    }
    let certs =
        reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| fail(format!("not PEM: {e}")))?;
    if certs.is_empty() {
        return Err(fail("it holds no certificate".into()));
    }
    Ok(certs)
}

/// Why a capped read stopped.
pub(super) enum ReadError {
    /// The body is longer than the cap.
    TooLarge,
    Transport(reqwest::Error),
}

/// The whole body, or `TooLarge` as soon as it is known to pass `cap` bytes (from its
/// Content-Length, or while reading): never more than `cap` bytes are held.
pub(super) async fn read_capped(resp: reqwest::Response, cap: usize) -> Result<Vec<u8>, ReadError> {
    let announced = resp.content_length().unwrap_or(0);
    if announced > cap as u64 {
        return Err(ReadError::TooLarge);
    }
    let mut out = Vec::with_capacity((announced as usize).min(cap).min(1 << 20));
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(ReadError::Transport)?;
        if chunk.len() > cap.saturating_sub(out.len()) {
            return Err(ReadError::TooLarge);
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// At most `cap` bytes of the body, and whether there was more (the rest is not read).
pub(super) async fn read_prefix(resp: reqwest::Response, cap: usize) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut body = resp.bytes_stream();
    while let Some(Ok(chunk)) = body.next().await {
        let room = cap.saturating_sub(out.len());
        if chunk.len() > room {
            out.extend_from_slice(chunk.get(..room).unwrap_or_default());
            return (out, true);
        }
        out.extend_from_slice(&chunk);
    }
    (out, false)
}

/// A transport error in a few words.
pub(super) fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connect() {
        "connection failed".into()
    } else {
        format!("request failed: {e}")
    }
}

/// Seconds until the rate limit resets: `RateLimit: "api";r=0;t=N`, else `Retry-After: N`.
pub fn rate_limit_reset(h: &HeaderMap) -> Option<Duration> {
    let from_ratelimit = h
        .get("ratelimit")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.split(';').find_map(|p| {
                p.trim()
                    .strip_prefix("t=")
                    .and_then(|n| n.trim().parse::<u64>().ok())
            })
        });
    let from_retry_after = || {
        h.get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    from_ratelimit
        .or_else(from_retry_after)
        .map(|s| Duration::from_secs(s.min(3600)))
}

/// The tree's next page from its `Link` header; a page on another origin is refused.
pub(super) fn next_link(h: &HeaderMap, endpoint: &Url) -> Result<Option<Url>, HubError> {
    let Some(link) = h.get(LINK).and_then(|v| v.to_str().ok()) else {
        return Ok(None);
    };
    for part in link.split(',') {
        let Some((target, params)) = part.split_once(';') else {
            continue;
        };
        if !params
            .split(';')
            .any(|p| matches!(p.trim(), "rel=\"next\"" | "rel=next"))
        {
            continue;
        }
        let target = target.trim().trim_start_matches('<').trim_end_matches('>');
        let url = endpoint.join(target).map_err(|e| HubError::Malformed {
            what: format!("Link header: {e}"),
        })?;
        // The token goes with every page, so a page elsewhere is never followed.
        if url.origin() != endpoint.origin() {
            return Err(HubError::Malformed {
                what: format!(
                    "the tree's next page points at another host ({})",
                    url.origin().ascii_serialization()
                ),
            });
        }
        return Ok(Some(url));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn rate_limit_reset_prefers_the_ratelimit_header() {
        let mut h = HeaderMap::new();
        h.insert("ratelimit", HeaderValue::from_static("\"api\";r=0;t=7"));
        h.insert(RETRY_AFTER, HeaderValue::from_static("30"));
        assert_eq!(rate_limit_reset(&h), Some(Duration::from_secs(7)));
        h.remove("ratelimit");
        assert_eq!(rate_limit_reset(&h), Some(Duration::from_secs(30)));
        h.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(rate_limit_reset(&h), None);
    }

    #[test]
    fn next_page_must_stay_on_the_endpoint() {
        let ep = Url::parse("http://127.0.0.1:5000/").unwrap();
        let mut h = HeaderMap::new();
        h.insert(
            LINK,
            HeaderValue::from_static(
                "<http://127.0.0.1:5000/api/models/o/r/tree/c?cursor=abc>; rel=\"next\"",
            ),
        );
        assert_eq!(
            next_link(&h, &ep).unwrap().unwrap().query(),
            Some("cursor=abc")
        );
        h.insert(
            LINK,
            HeaderValue::from_static("<http://evil.example/x>; rel=\"next\""),
        );
        assert!(next_link(&h, &ep).is_err());
        h.insert(
            LINK,
            HeaderValue::from_static("<http://127.0.0.1:5000/x>; rel=\"prev\""),
        );
        assert_eq!(next_link(&h, &ep).unwrap(), None);
    }

    #[test]
    fn the_retry_delay_is_the_crate_backoff() {
        let r = Retry::default();
        for n in [1, 2, 3, 30] {
            let b = Backoff {
                first: r.base,
                cap: r.max_delay,
            };
            let d = r.delay(n);
            assert!(d >= b.base(n) && d <= r.max_delay, "{n}: {d:?}");
        }
        assert!(r.delay(1) >= Duration::from_millis(500));
        assert!(r.delay(30) <= Duration::from_secs(8));
    }

    #[test]
    fn clients_are_built_once_per_key() {
        let key = ClientKey {
            origin: "http://clients-once.test:1".into(),
            ca_bundle: None,
            connect_timeout: Duration::from_secs(1),
            read_timeout: Duration::from_secs(2),
        };
        let a = clients(&key).unwrap();
        assert_eq!(clients(&key).unwrap().id, a.id);
        let other = ClientKey {
            read_timeout: Duration::from_secs(3),
            ..key.clone()
        };
        assert_ne!(clients(&other).unwrap().id, a.id);
    }

    #[test]
    fn a_ca_bundle_must_be_a_readable_pem_with_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let key = |p: &Path| ClientKey {
            origin: "https://ca.test:443".into(),
            ca_bundle: Some(p.to_path_buf()),
            connect_timeout: Duration::from_secs(1),
            read_timeout: Duration::from_secs(1),
        };
        let missing = dir.path().join("missing.pem");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "no certificates here\n").unwrap();
        let garbled = dir.path().join("garbled.pem");
        std::fs::write(
            &garbled,
            "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        for (path, says) in [
            (&missing, "cannot read it"),
            (&empty, "holds no certificate"),
            (&garbled, "cannot be used"),
        ] {
            let e = clients(&key(path)).unwrap_err();
            assert_eq!(e.reason(), "InvalidCaBundle", "{e}");
            assert!(e.to_string().contains(says), "{e}");
            assert!(e.to_string().contains(&path.display().to_string()), "{e}");
            assert!(!e.is_transient());
        }
    }
}
