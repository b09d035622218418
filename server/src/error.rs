//! Errors as OpenAI clients expect them: a status and `{"error": {"message", "type", "param",
//! "code"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

/// An error answer.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400: the request is wrong in `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.to_string()).filter(|p| !p.is_empty()),
            code: None,
        }
    }

    /// The same error with a `code`.
    pub fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// The same error with another status.
    pub fn status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    /// 429: the queue is full.
    pub fn busy(message: String) -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            message,
            kind: "rate_limit_error",
            param: None,
            code: Some("server_busy"),
        }
    }

    /// 500: generation failed (the server goes on).
    pub fn server(message: String) -> Self {
        Self { status: StatusCode::INTERNAL_SERVER_ERROR, message, kind: "server_error", param: None, code: None }
    }

    /// The error body.
    pub fn body(&self) -> serde_json::Value {
        json!({ "error": { "message": self.message, "type": self.kind, "param": self.param, "code": self.code } })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

impl From<specdec::Error> for ApiError {
    /// Errors of the library met while preparing or running a request.
    fn from(e: specdec::Error) -> Self {
        match e {
            specdec::Error::Busy { .. } => Self::busy(e.to_string()),
            specdec::Error::Template(_) => Self::invalid("messages", e.to_string()),
            specdec::Error::Grammar(_) => Self::invalid("response_format", e.to_string()),
            specdec::Error::InvalidSetting { name, .. } => Self::invalid(name, e.to_string()),
            specdec::Error::ContextTooLong { .. } => {
                Self::invalid("messages", e.to_string()).code("context_length_exceeded")
            }
            other => Self::server(other.to_string()),
        }
    }
}
