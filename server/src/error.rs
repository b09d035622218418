//! Errors as OpenAI clients expect them: a status and `{"error": {"message", "type", "param",
//! "code"}}`. Each kind of error has its status, OpenAI `type` and `code` in one place,
//! [`ErrorKind`].

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

/// What went wrong, as a client sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 400: a field is missing, of the wrong type or out of range, or the body is not JSON.
    Invalid,
    /// 400: a field the API does not have.
    UnknownParameter,
    /// 400: the prompt, or the prompt and `max_tokens`, past the context.
    ContextLengthExceeded,
    /// 404: a model this server does not serve.
    ModelNotFound,
    /// 404: no such route.
    NotFound,
    /// 413: a body over the limit.
    TooLarge,
    /// 429: the queue is full.
    Busy,
    /// 500: the request failed while generating (the server goes on).
    Internal,
}

impl ErrorKind {
    /// The HTTP status.
    pub fn status(self) -> StatusCode {
        match self {
            Self::Invalid | Self::UnknownParameter | Self::ContextLengthExceeded => StatusCode::BAD_REQUEST,
            Self::ModelNotFound | Self::NotFound => StatusCode::NOT_FOUND,
            Self::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Busy => StatusCode::TOO_MANY_REQUESTS,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `type`.
    pub fn openai_type(self) -> &'static str {
        match self {
            Self::Busy => "rate_limit_error",
            Self::Internal => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// OpenAI's `code`, where it has one.
    pub fn code(self) -> Option<&'static str> {
        match self {
            Self::UnknownParameter => Some("unknown_parameter"),
            Self::ContextLengthExceeded => Some("context_length_exceeded"),
            Self::ModelNotFound => Some("model_not_found"),
            Self::Busy => Some("server_busy"),
            _ => None,
        }
    }
}

/// An error answer.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    /// The field at fault, if one is.
    pub param: Option<String>,
}

/// The body OpenAI's clients read.
#[derive(Serialize)]
struct Body<'a> {
    error: Fields<'a>,
}

#[derive(Serialize)]
struct Fields<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'a str>,
    code: Option<&'static str>,
}

impl ApiError {
    /// An error of `kind` about `param` (none when empty).
    pub fn new(kind: ErrorKind, param: &str, message: impl Into<String>) -> Self {
        Self { kind, message: message.into(), param: Some(param.to_string()).filter(|p| !p.is_empty()) }
    }

    /// 400: the request is wrong in `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, param, message)
    }

    /// 500 for a request that failed while running: the message says what failed in words a
    /// client can show and names the request, whose details go to the server's log (stderr).
    pub fn failed(request: &str, e: &specdec::Error) -> Self {
        eprintln!("request {request} failed: {e} ({e:?})");
        let what = match e {
            specdec::Error::Tokenizer { .. } => "the model's output could not be decoded",
            specdec::Error::Panicked(_) => "internal error",
            _ => "the model failed while generating",
        };
        Self::new(ErrorKind::Internal, "", format!("{what}; see the server log for request {request}"))
    }

    /// The error body.
    pub fn body(&self) -> serde_json::Value {
        let error = Fields {
            message: &self.message,
            kind: self.kind.openai_type(),
            param: self.param.as_deref(),
            code: self.kind.code(),
        };
        serde_json::to_value(Body { error }).unwrap_or_default()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.kind.status(), Json(self.body())).into_response()
    }
}

impl From<specdec::Error> for ApiError {
    /// Errors of the library met while preparing a request (before it runs).
    fn from(e: specdec::Error) -> Self {
        match e {
            specdec::Error::Busy { .. } => Self::new(ErrorKind::Busy, "", e.to_string()),
            specdec::Error::Template(_) => Self::invalid("messages", e.to_string()),
            specdec::Error::Grammar(_) => Self::invalid("response_format", e.to_string()),
            specdec::Error::InvalidSetting { name, .. } => Self::invalid(name, e.to_string()),
            specdec::Error::ContextTooLong { .. } => {
                Self::new(ErrorKind::ContextLengthExceeded, "messages", e.to_string())
            }
            other => Self::failed("(not started)", &other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_while_running_shows_words_not_the_panic() {
        let e = ApiError::failed("chatcmpl-7", &specdec::Error::Panicked("index out of bounds: src/x.rs:3".into()));
        let body = e.body();
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("internal error") && message.contains("chatcmpl-7"), "{message}");
        assert!(!message.contains("index out of bounds") && !message.contains("src/"), "{message}");
        assert_eq!(
            (e.kind.status(), &body["error"]["type"]),
            (StatusCode::INTERNAL_SERVER_ERROR, &serde_json::json!("server_error"))
        );
    }

    #[test]
    fn each_kind_has_its_status_type_and_code() {
        let kinds = [
            (ErrorKind::Invalid, 400, "invalid_request_error", None),
            (ErrorKind::UnknownParameter, 400, "invalid_request_error", Some("unknown_parameter")),
            (ErrorKind::ContextLengthExceeded, 400, "invalid_request_error", Some("context_length_exceeded")),
            (ErrorKind::ModelNotFound, 404, "invalid_request_error", Some("model_not_found")),
            (ErrorKind::NotFound, 404, "invalid_request_error", None),
            (ErrorKind::TooLarge, 413, "invalid_request_error", None),
            (ErrorKind::Busy, 429, "rate_limit_error", Some("server_busy")),
            (ErrorKind::Internal, 500, "server_error", None),
        ];
        for (kind, status, openai, code) in kinds {
            assert_eq!((kind.status().as_u16(), kind.openai_type(), kind.code()), (status, openai, code), "{kind:?}");
            let body = ApiError::new(kind, "x", "m").body();
            assert_eq!(body["error"]["code"], serde_json::json!(code), "{kind:?}");
            assert_eq!(body["error"]["param"], serde_json::json!("x"), "{kind:?}");
        }
    }
}
