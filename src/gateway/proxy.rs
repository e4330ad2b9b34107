//! The OpenAI-compatible routes and the forwarding of one request: authenticate, find the
//! model, take (or load) a replica, send the body with the model's engine key, and stream the
//! answer back chunk by chunk as the replica writes it. Nothing is buffered on the way back: an
//! SSE chunk reaches the client as soon as the replica sends it, and a client that hangs up
//! drops the upstream connection, which cancels the replica's work.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use serde::Deserialize;

use super::keys::Scope;
use super::metrics::{CodeLabel, ModelLabel};
use super::openai::ApiError;
use super::routes::Model;
use super::{AuthMode, Gateway, activate, idle};

/// The largest request body accepted.
pub const MAX_BODY: usize = 32 << 20;
/// The longest `model` accepted.
const MAX_MODEL: usize = 320;
/// The longest a client may take to send its request body.
const BODY_READ: std::time::Duration = std::time::Duration::from_secs(60);
/// The pause before a request whose replica refused the connection tries again.
const REFUSED_PAUSE: std::time::Duration = std::time::Duration::from_millis(200);

/// The gateway's routes.
pub fn router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route(
            "/v1/chat/completions",
            post(async |s: State<Arc<Gateway>>, h: HeaderMap, b| {
                handle(s, h, b, "/v1/chat/completions").await
            }),
        )
        .route(
            "/v1/completions",
            post(async |s: State<Arc<Gateway>>, h: HeaderMap, b| {
                handle(s, h, b, "/v1/completions").await
            }),
        )
        .route(
            "/v1/embeddings",
            post(async |s: State<Arc<Gateway>>, h: HeaderMap, b| {
                handle(s, h, b, "/v1/embeddings").await
            }),
        )
        .route("/v1/models", get(models))
        .fallback(async || {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_url",
                "the gateway serves POST /v1/chat/completions, /v1/completions, /v1/embeddings and GET /v1/models",
            )
        })
        .with_state(gw)
}

impl Gateway {
    fn authenticate(&self, headers: &HeaderMap) -> Result<Scope, ApiError> {
        match self.config.auth {
            AuthMode::None => Ok(Scope::everything()),
            AuthMode::Keys => self.views.keys.get().authenticate(headers),
        }
    }

    /// Counts the answer's status for `model` (None: no model was found).
    fn count(&self, model: Option<&Model>, status: StatusCode) {
        let (namespace, name) = model.map_or((String::new(), String::new()), |m| {
            (m.namespace.clone(), m.name.clone())
        });
        self.metrics
            .requests
            .get_or_create(&CodeLabel {
                namespace,
                model: name,
                code: status.as_u16().to_string(),
            })
            .inc();
    }

    fn refuse(&self, model: Option<&Model>, e: ApiError) -> Response {
        self.count(model, e.status);
        if e.status.is_server_error() {
            tracing::info!(status = e.status.as_u16(), message = %e.message, "request not served");
        }
        e.into_response()
    }
}

/// The fields the gateway reads of a request body; the rest goes to the replica untouched.
#[derive(Deserialize)]
struct Head {
    model: String,
}

async fn handle(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Body,
    path: &'static str,
) -> Response {
    let started = Instant::now();
    // The key before the body: a caller without one never gets the gateway to buffer anything.
    let scope = match gw.authenticate(&headers) {
        Ok(s) => s,
        Err(e) => return gw.refuse(None, e),
    };
    let body = match tokio::time::timeout(BODY_READ, axum::body::to_bytes(body, MAX_BODY)).await {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => {
            return gw.refuse(
                None,
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "invalid_body",
                    format!(
                        "the request body cannot be read ({e}); at most {MAX_BODY} bytes of JSON"
                    ),
                ),
            );
        }
        Err(_) => {
            return gw.refuse(
                None,
                ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "invalid_body",
                    format!(
                        "the request body did not arrive within {}s",
                        BODY_READ.as_secs()
                    ),
                ),
            );
        }
    };
    let head: Head = match serde_json::from_slice(&body) {
        Ok(h) => h,
        Err(e) => {
            return gw.refuse(
                None,
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_body",
                    format!("the body must be a JSON object with a \"model\" string: {e}"),
                ),
            );
        }
    };
    if head.model.is_empty() || head.model.len() > MAX_MODEL {
        return gw.refuse(
            None,
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_model",
                format!("\"model\" must name a model in 1 to {MAX_MODEL} characters; GET /v1/models lists them"),
            ),
        );
    }
    let model = match gw.views.models.get().find(&head.model, &scope) {
        Ok(m) => m,
        Err(e) => return gw.refuse(None, e),
    };
    let asking = gw.demand.begin(model.key());
    idle::touch(&gw, &model);
    let key_name = model.engine_key_secret();
    let Some(engine_key) = gw.views.engine_keys.get().get(key_name).cloned() else {
        return gw.refuse(
            Some(&model),
            ApiError::unavailable(
                "model_not_ready",
                format!(
                    "{} ({}) has no engine key yet (Secret {key_name}); its Catalog stage creates it",
                    model.served(),
                    model.key()
                ),
                5,
            ),
        );
    };
    // A replica that refuses the connection is not listening yet (or any more), and one that
    // answers 503 before anything else is still loading the model (llama-server's "Loading
    // model"), whatever its pod says: it did nothing with the request, so the request waits for
    // it or another, within the same deadline as a load.
    let deadline = started + gw.config.activation_timeout;
    let mut refused: Vec<String> = Vec::new();
    loop {
        // A replica that refused is tried again only when every replica has.
        let skip: Vec<&str> = refused.iter().map(String::as_str).collect();
        let other = gw
            .balancer
            .pick(gw.views.replicas.get().of(model.key()), &skip);
        let (replica, in_flight) = match other {
            Some(r) => r,
            None => match activate::replica(&gw, &model, started).await {
                Ok(r) => r,
                Err(e) => return gw.refuse(Some(&model), e),
            },
        };
        let sent = gw
            .http
            .post(format!("http://{}{path}", replica.addr))
            .header(header::CONTENT_TYPE, "application/json")
            .bearer_auth(&engine_key)
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(upstream)
                if upstream.status() == StatusCode::SERVICE_UNAVAILABLE
                    && Instant::now() < deadline =>
            {
                drop(in_flight);
                if !refused.contains(&replica.pod) {
                    tracing::info!(replica = %replica.pod, "the replica is not serving yet (503); waiting for it or another");
                    refused.push(replica.pod);
                }
                tokio::time::sleep(REFUSED_PAUSE).await;
            }
            // The engine key is the gateway's, not the client's: a replica that refuses it
            // (a Secret rotated and not yet seen) is the gateway's failure.
            Ok(upstream)
                if matches!(
                    upstream.status(),
                    StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
                ) =>
            {
                return gw.refuse(
                    Some(&model),
                    ApiError::new(
                        StatusCode::BAD_GATEWAY,
                        "upstream_auth_failed",
                        format!(
                            "the replica {} refused the gateway's engine key for {} (HTTP {}); the Secret {key_name} may have changed since the gateway read it",
                            replica.pod,
                            model.key(),
                            upstream.status().as_u16()
                        ),
                    ),
                );
            }
            Ok(upstream) => {
                return stream_back(&gw, &model, upstream, (in_flight, asking), started);
            }
            Err(e) if e.is_connect() && Instant::now() < deadline => {
                drop(in_flight);
                if !refused.contains(&replica.pod) {
                    tracing::info!(replica = %replica.pod, error = %e.without_url(), "the replica refused the connection; waiting for it or another");
                    refused.push(replica.pod);
                }
                tokio::time::sleep(REFUSED_PAUSE).await;
            }
            Err(e) if e.is_connect() => {
                return gw.refuse(
                    Some(&model),
                    ApiError::unavailable(
                        "upstream_unreachable",
                        format!(
                            "no replica of {} ({}) accepted the request within {}; refused by {}",
                            model.served(),
                            model.key(),
                            crate::units::human_duration(gw.config.activation_timeout),
                            refused.join(", ")
                        ),
                        2,
                    ),
                );
            }
            Err(e) if e.is_timeout() => {
                return gw.refuse(
                    Some(&model),
                    ApiError::new(
                        StatusCode::GATEWAY_TIMEOUT,
                        "upstream_timeout",
                        format!("the replica {} did not answer in time", replica.pod),
                    ),
                );
            }
            Err(e) => {
                return gw.refuse(
                    Some(&model),
                    ApiError::new(
                        StatusCode::BAD_GATEWAY,
                        "upstream_error",
                        format!("the replica {} failed: {}", replica.pod, e.without_url()),
                    ),
                );
            }
        }
    }
}

/// Headers that belong to one connection and are not passed on.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// The replica's answer as the client's: its status and headers, and its body streamed through
/// as it comes. The guards (the replica's in-flight count, the model's demand) live as long as
/// the body, so they end when the answer is whole or the client hangs up.
fn stream_back(
    gw: &Arc<Gateway>,
    model: &Model,
    upstream: reqwest::Response,
    guards: (super::balance::InFlight, super::balance::Asking),
    started: Instant,
) -> Response {
    let status = upstream.status();
    gw.count(Some(model), status);
    let label = ModelLabel {
        namespace: model.namespace.clone(),
        model: model.name.clone(),
    };
    let gauge = gw.metrics.in_flight.get_or_create(&label).clone();
    gauge.inc();
    let mut headers = HeaderMap::with_capacity(upstream.headers().len());
    for (k, v) in upstream.headers() {
        if !hop_by_hop(k) {
            headers.append(k.clone(), v.clone());
        }
    }
    let first_byte = gw.metrics.first_byte.get_or_create(&label).clone();
    let mut first = true;
    let held = Held {
        gauge,
        _guards: guards,
    };
    let body = upstream.bytes_stream().map(move |chunk| {
        let _ = &held;
        if first {
            first = false;
            first_byte.observe(started.elapsed().as_secs_f64());
        }
        chunk
    });
    let mut r = Response::new(Body::from_stream(body));
    *r.status_mut() = status;
    *r.headers_mut() = headers;
    r
}

/// What a streamed answer holds until it ends.
struct Held {
    gauge: prometheus_client::metrics::gauge::Gauge,
    _guards: (super::balance::InFlight, super::balance::Asking),
}

impl Drop for Held {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// `GET /v1/models`: every name of every model the key may use, ready or not.
async fn models(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let scope = match gw.authenticate(&headers) {
        Ok(s) => s,
        Err(e) => return gw.refuse(None, e),
    };
    let idx = gw.views.models.get();
    let replicas = gw.views.replicas.get();
    let mut data = Vec::new();
    for m in idx.visible(&scope) {
        let created = m
            .object
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(0, |t| t.0.as_second());
        let ready = !replicas.of(m.key()).is_empty();
        for name in &m.names {
            data.push(serde_json::json!({
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": m.namespace,
                "root": m.served(),
                "modelserve": {"namespace": m.namespace, "name": m.name, "ready": ready,
                               "onDemand": m.object.spec.on_demand.is_some()},
            }));
        }
    }
    gw.count(None, StatusCode::OK);
    axum::Json(serde_json::json!({"object": "list", "data": data})).into_response()
}
