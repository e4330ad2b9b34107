//! The mirror's HTTP API: `POST /v1/fetch` (a bounded JSON body, every field checked before the
//! mirror acts), `PUT /v1/live`, `GET /v1/files/...` (see [`super::serve`]), `/metrics` and
//! `/healthz`. Every refusal of input is JSON `{"error", "field", "valid"}` naming what was wrong
//! and what would be valid; [`super::auth`] refuses callers with `{"error", "reason"}`.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRef, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use super::auth::Gate;
use super::jobs::{Mirror, RequestError};
use super::request::{self, Invalid, MAX_BODY};

/// What the handlers share: the mirror and its gate.
#[derive(Clone)]
pub struct Served {
    pub mirror: Arc<Mirror>,
    pub gate: Gate,
}

impl FromRef<Served> for Arc<Mirror> {
    fn from_ref(s: &Served) -> Arc<Mirror> {
        s.mirror.clone()
    }
}

impl FromRef<Served> for Gate {
    fn from_ref(s: &Served) -> Gate {
        s.gate.clone()
    }
}

/// The mirror's HTTP API with no gate: anyone who reaches it may do anything.
pub fn router(mirror: Arc<Mirror>) -> Router {
    router_with(mirror, Gate::Open)
}

/// The mirror's HTTP API behind `gate`.
pub fn router_with(mirror: Arc<Mirror>, gate: Gate) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/metrics",
            get(|State(m): State<Arc<Mirror>>| async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    m.metrics.encode(),
                )
            }),
        )
        .route(
            "/v1/fetch",
            post(fetch_files).layer(DefaultBodyLimit::max(MAX_BODY)),
        )
        .route(
            "/v1/live",
            axum::routing::put(put_live).layer(DefaultBodyLimit::max(MAX_LIVE_BODY)),
        )
        .route(
            "/v1/files/{owner}/{name}/{commit}/{*path}",
            get(super::serve::serve_file),
        )
        .with_state(Served { mirror, gate })
}

/// The gate's answer for a caller asking to `what`, counted.
async fn operator_only(
    m: &Mirror,
    gate: &Gate,
    headers: &HeaderMap,
    what: &str,
) -> Result<(), Response> {
    match gate.may_fetch(headers, what).await {
        Ok(()) => Ok(()),
        Err(r) => {
            m.metrics.refused(r.result());
            tracing::info!(status = r.status.as_u16(), why = %r.message, "refused a caller");
            Err(r.into_response())
        }
    }
}

/// A refusal: `status` with the JSON of `e`.
pub(super) fn reject(status: StatusCode, e: &Invalid) -> Response {
    (status, Json(e.to_json())).into_response()
}

/// The body, or why one over `limit` bytes or unreadable is refused.
fn bounded(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<Bytes, (StatusCode, Invalid)> {
    body.map_err(|e| {
        let why = format!(
            "the body must be at most {limit} bytes of JSON ({})",
            e.body_text()
        );
        (e.status(), Invalid::new("body", None, why))
    })
}

async fn fetch_files(
    State(m): State<Arc<Mirror>>,
    State(gate): State<Gate>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    if let Err(r) = operator_only(&m, &gate, &headers, "ask the mirror for downloads").await {
        return r;
    }
    let body = match bounded(body, MAX_BODY) {
        Ok(b) => b,
        Err((status, e)) => return reject(status, &e),
    };
    let req = match request::parse(&body) {
        Ok(r) => r,
        Err(e) => return reject(StatusCode::BAD_REQUEST, &e),
    };
    match m.request(&req) {
        Ok(s) => (StatusCode::ACCEPTED, Json(s)).into_response(),
        Err(RequestError::Invalid(e)) => reject(StatusCode::BAD_REQUEST, &e),
        Err(e @ RequestError::Busy { .. }) => {
            let mut r = (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(serde_json::json!({ "error": e.to_string() })),
            )
                .into_response();
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("30"));
            r
        }
        // 507 Insufficient Storage: nothing of the set was fetched.
        Err(RequestError::NoRoom(n)) => (
            StatusCode::INSUFFICIENT_STORAGE,
            Json(serde_json::json!({
                "error": n.to_string(),
                "reason": "InsufficientCapacity",
                "neededBytes": n.needed,
                "availableBytes": n.available,
                "reservedBytes": n.reserved,
                "reclaimableBytes": n.reclaimable,
            })),
        )
            .into_response(),
        Err(e @ RequestError::Disk(_)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(serde_json::json!({ "error": e.to_string() })),
        )
            .into_response(),
    }
}

/// The most sha256 values one live set may name.
pub const MAX_LIVE: usize = 200_000;
/// The largest live-set body: MAX_LIVE quoted digests and their commas.
const MAX_LIVE_BODY: usize = MAX_LIVE * 68 + 64;

/// `PUT /v1/live` `{"sha256": [...]}`: the operator's word on every blob some ModelServe's
/// resolved set holds. It replaces the last one; blobs outside it may be collected.
async fn put_live(
    State(m): State<Arc<Mirror>>,
    State(gate): State<Gate>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    if let Err(r) = operator_only(&m, &gate, &headers, "tell the mirror the live set").await {
        return r;
    }
    let body = match bounded(body, MAX_LIVE_BODY) {
        Ok(b) => b,
        Err((status, e)) => return reject(status, &e),
    };
    match request::parse_live(&body, MAX_LIVE) {
        Ok(live) => {
            let n = live.len();
            m.tell_live(live);
            // A pass at once, so a volume over its watermark is relieved without waiting.
            let pass = m.clone();
            tokio::task::spawn_blocking(move || {
                if let Err(e) = pass.collect_once() {
                    tracing::warn!(error = %e, "garbage collection could not read or delete in the store");
                }
            });
            (StatusCode::OK, Json(serde_json::json!({ "live": n }))).into_response()
        }
        Err(e) => reject(StatusCode::BAD_REQUEST, &e),
    }
}
