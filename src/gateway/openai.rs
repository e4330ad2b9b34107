//! Errors in the shape OpenAI's clients parse: `{"error": {"message", "type", "param", "code"}}`,
//! so an SDK shows the gateway's sentence instead of a decoding failure.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// A refusal or failure of the gateway, as the client sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    /// OpenAI's machine-readable code, such as `model_not_found`.
    pub code: &'static str,
    pub message: String,
    /// Seconds after which a retry may succeed (503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    /// A 503 the client may retry after `secs`.
    pub fn unavailable(code: &'static str, message: impl Into<String>, secs: u64) -> ApiError {
        ApiError {
            retry_after: Some(secs),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, code, message)
        }
    }

    /// OpenAI's error type for the status.
    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND | StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE => {
                "invalid_request_error"
            }
            _ => "server_error",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": serde_json::Value::Null,
                "code": self.code,
            }
        });
        let mut r = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"modelserve-gateway\""),
            );
        }
        if let Some(secs) = self.retry_after
            && let Ok(v) = HeaderValue::from_str(&secs.to_string())
        {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_error_has_openais_shape_and_a_503_says_when_to_retry() {
        let r = ApiError::unavailable("model_not_ready", "tiny is loading", 5).into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "5");
        let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["message"], "tiny is loading");
        assert_eq!(v["error"]["code"], "model_not_ready");
        assert_eq!(v["error"]["type"], "server_error");
        assert!(v["error"]["param"].is_null());
    }

    #[test]
    fn a_401_asks_for_a_bearer_token() {
        let r =
            ApiError::new(StatusCode::UNAUTHORIZED, "invalid_api_key", "no key").into_response();
        assert!(r.headers().contains_key(header::WWW_AUTHENTICATE));
    }
}
