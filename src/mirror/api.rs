//! The mirror's HTTP API: `POST /v1/fetch` (a bounded JSON body, every field checked before the
//! mirror acts), `GET /v1/files/...` (see [`super::serve`]), `/metrics` and `/healthz`. Every
//! refusal is JSON `{"error", "field", "valid"}` naming what was wrong and what would be valid.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use super::jobs::{Mirror, RequestError};
use super::request::{self, Invalid, MAX_BODY};

/// The mirror's HTTP API.
pub fn router(mirror: Arc<Mirror>) -> Router {
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
            "/v1/files/{owner}/{name}/{commit}/{*path}",
            get(super::serve::serve_file),
        )
        .with_state(mirror)
}

/// A refusal: `status` with the JSON of `e`.
pub(super) fn reject(status: StatusCode, e: &Invalid) -> Response {
    (status, Json(e.to_json())).into_response()
}

async fn fetch_files(
    State(m): State<Arc<Mirror>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(e) => {
            let why = format!(
                "the body must be at most {MAX_BODY} bytes of JSON ({})",
                e.body_text()
            );
            return reject(e.status(), &Invalid::new("body", None, why));
        }
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
    }
}
