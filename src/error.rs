//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in `specdec`, with the values that were wrong. New kinds may
/// be added: match with a wildcard arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The draft and the target disagree on the vocabulary size.
    #[error("vocabulary mismatch: the draft has {draft} tokens, the target {target}")]
    VocabMismatch { draft: usize, target: usize },

    /// The draft and the target use different tokenizers (their token maps differ).
    #[error("tokenizer mismatch: draft `{draft}` and target `{target}` map tokens differently ({detail})")]
    TokenizerMismatch { draft: String, target: String, detail: String },

    /// A setting is out of its valid range.
    #[error("invalid setting `{name}` = {value}: {expected}")]
    InvalidSetting { name: &'static str, value: String, expected: &'static str },

    /// The prompt holds no tokens.
    #[error("the prompt is empty: at least one token is needed to condition on")]
    EmptyPrompt,

    /// A token id is not in the vocabulary.
    #[error("token {token} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfRange { token: u32, vocab: usize },

    /// The context would grow past what the model supports.
    #[error("context of {len} tokens exceeds the model's maximum of {max}")]
    ContextTooLong { len: usize, max: usize },

    /// A matrix or buffer whose dimensions (from a model file or a caller) make a size that
    /// overflows `usize`.
    #[error("{what} of dimensions {dims:?} is too large: its size overflows usize")]
    TooLarge { what: &'static str, dims: Vec<usize> },

    /// A logits row holds NaN or infinity where a finite value is needed.
    #[error("logits row holds a non-finite value ({value}) at token {index}")]
    NonFiniteLogits { index: usize, value: f32 },

    /// Every token of a row was filtered out or had zero probability.
    #[error("a probability row has no mass left to sample from")]
    EmptyDistribution,

    /// A model returned the wrong number of rows or a row of the wrong length.
    #[error("model `{model}` returned {got} {what}, expected {expected}")]
    BadModelOutput { model: &'static str, what: &'static str, expected: usize, got: usize },

    /// A model was asked to roll back to a length it does not have.
    #[error("cannot truncate a context of {len} tokens to {to}")]
    BadTruncate { len: usize, to: usize },

    /// A previous failure left the decoder's models out of step; `start` must be called again.
    #[error("the decoder needs a new `start` ({0})")]
    NotReady(&'static str),

    /// A model file is missing, truncated, corrupt or of a kind we cannot read (`source`: the
    /// I/O, parser or candle error underneath, when there was one).
    #[error("cannot load model from {path}: {reason}")]
    Load {
        path: PathBuf,
        reason: String,
        #[source]
        source: Option<BoxError>,
    },

    /// The model's architecture is not one this crate implements.
    #[error("unsupported architecture `{0}` (supported: llama-family models)")]
    UnsupportedArchitecture(String),

    /// A tensor the architecture needs is absent from the file.
    #[error("tensor `{0}` is missing from the model file")]
    MissingTensor(String),

    /// The tokenizer could not be built or failed to encode/decode (`source`: the tokenizers
    /// library's error, when it was one).
    #[error("tokenizer: {message}")]
    Tokenizer {
        message: String,
        #[source]
        source: Option<BoxError>,
    },

    /// A Hugging Face hub download or cache lookup failed (`source`: hf-hub's or the index
    /// parser's error, when it was one).
    #[error("hub: {message}")]
    Hub {
        message: String,
        #[source]
        source: Option<BoxError>,
    },

    /// The requested device cannot be used by this build or machine.
    #[error("device `{device}` is not available: {reason}")]
    DeviceUnavailable { device: String, reason: String },

    /// A draft head does not fit its target (hidden size, vocabulary, tensor shapes).
    #[error("draft head does not fit the target: {what} is {head}, the target needs {target}")]
    HeadMismatch { what: String, head: String, target: String },

    /// A chat template that does not parse or fails on the messages.
    #[error("chat template: {0}")]
    Template(String),

    /// A grammar that does not compile, or a matcher that failed.
    #[error("grammar: {0}")]
    Grammar(String),

    /// A tool registered for speculation failed, panicked or was misused.
    #[error("tool `{tool}`: {reason}")]
    Tool { tool: String, reason: String },

    /// A server's queue is full (the `serve` module): try again later.
    #[error("the server is busy: {queued} requests are already waiting")]
    Busy { queued: usize },

    /// A panic caught while serving a request, with its message: that request failed, the
    /// server goes on.
    #[error("a panic while serving the request: {0}")]
    Panicked(String),

    /// An error from candle.
    #[error(transparent)]
    #[cfg(feature = "models")]
    Candle(#[from] candle_core::Error),

    /// An I/O error.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// The error another library reported, kept as an [`Error`]'s source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// [`Error::Tokenizer`] with `message` and no source.
    pub fn tokenizer(message: impl Into<String>) -> Self {
        Error::Tokenizer { message: message.into(), source: None }
    }

    /// [`Error::Hub`] with `message` and no source.
    pub fn hub(message: impl Into<String>) -> Self {
        Error::Hub { message: message.into(), source: None }
    }

    /// [`Error::Load`] of `path` with `reason` and no source.
    pub fn load(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Error::Load { path: path.into(), reason: reason.into(), source: None }
    }

    /// [`Error::Load`] of `path` with `reason`, the error underneath written after it and kept
    /// as its source.
    pub fn load_from(path: impl Into<PathBuf>, reason: impl std::fmt::Display, source: impl Into<BoxError>) -> Self {
        let source = source.into();
        Error::Load { path: path.into(), reason: format!("{reason}: {source}"), source: Some(source) }
    }

    /// Shorthand for [`Error::InvalidSetting`].
    /// This error as one about the file or folder at `path` (as candle-core's `with_path`):
    /// a load error that names no path gets it, and io and candle errors become load errors
    /// that keep the original as their `source()`. Other errors are returned as they are.
    pub fn with_path(self, path: impl Into<PathBuf>) -> Self {
        match self {
            Error::Load { path: old, reason, source } if old.as_os_str().is_empty() => {
                Error::Load { path: path.into(), reason, source }
            }
            Error::Io(e) => Error::load_from(path, "cannot read", e),
            #[cfg(feature = "models")]
            Error::Candle(e) => Error::load_from(path, "cannot read", e),
            other => other,
        }
    }

    pub fn setting(name: &'static str, value: impl std::fmt::Display, expected: &'static str) -> Self {
        Error::InvalidSetting { name, value: value.to_string(), expected }
    }
}
