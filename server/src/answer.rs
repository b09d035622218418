//! What the server answers, as serde types in OpenAI's shapes: whole answers and stream
//! chunks (one envelope around the choices), messages and deltas, tool calls, usage, the
//! server's `timings`, and log-probabilities for chat and for completions.

use serde::Serialize;

/// A whole answer or one stream chunk.
#[derive(Debug, Serialize)]
pub struct Envelope<'a> {
    pub id: &'a str,
    /// `chat.completion`, `chat.completion.chunk` or `text_completion`.
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub system_fingerprint: &'static str,
    pub choices: Vec<Choice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The server's own figures for the first choice (an extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
}

/// One choice of an answer or chunk.
#[derive(Debug, Serialize)]
pub struct Choice {
    pub index: usize,
    #[serde(flatten)]
    pub body: ChoiceBody,
    pub finish_reason: Option<&'static str>,
    pub logprobs: Option<Logprobs>,
}

/// A choice's payload, under the key its endpoint and form use.
#[derive(Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChoiceBody {
    /// A whole chat answer.
    Message(Message),
    /// A chat stream chunk.
    Delta(Delta),
    /// A completion's text, whole or a chunk of it.
    Text(String),
}

/// The assistant's whole message: its text (`null` when it only calls tools) and its calls.
#[derive(Debug, Serialize)]
pub struct Message {
    pub role: &'static str,
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// What a chat chunk adds: the role (first chunk), text, or tool calls.
#[derive(Debug, Default, Serialize)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// A tool call the model made.
#[derive(Debug, Clone, Serialize)]
pub struct ToolCall {
    /// Its place among a chunk's calls (streams only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

/// The function called: its name and its arguments as a JSON string.
#[derive(Debug, Clone, Serialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

/// Token counts: the prompt once, every choice's completion.
#[derive(Debug, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptDetails,
}

/// The prompt tokens served from the prefix cache.
#[derive(Debug, Serialize)]
pub struct PromptDetails {
    pub cached_tokens: usize,
}

/// Time to first token, decoding speed, prefill and how speculation went.
#[derive(Debug, Serialize)]
pub struct Timings {
    pub first_token_ms: f64,
    pub tokens_per_second: f64,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub prefill_tokens: usize,
    pub prefill_ms: f64,
    pub prefill_tokens_per_second: f64,
    pub acceptance_rate: f64,
    pub tokens_per_target_call: f64,
    pub drafted: usize,
    pub accepted: usize,
    pub target_calls: usize,
}

/// Log-probabilities in the endpoint's shape.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Logprobs {
    /// Chat: one entry per token.
    Chat { content: Vec<ChatLogprob> },
    /// Completions: parallel lists.
    Text {
        tokens: Vec<String>,
        token_logprobs: Vec<f32>,
        /// Per token, its alternatives: token text → log-probability.
        top_logprobs: Vec<serde_json::Map<String, serde_json::Value>>,
        text_offset: Vec<usize>,
    },
}

/// A chat token's log-probability, with its alternatives.
#[derive(Debug, Serialize)]
pub struct ChatLogprob {
    #[serde(flatten)]
    pub token: TokenValue,
    pub top_logprobs: Vec<TokenValue>,
}

/// A token's text (lossy where it holds part of a character), log-probability and bytes.
#[derive(Debug, Serialize)]
pub struct TokenValue {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// `GET /v1/models`.
#[derive(Debug, Serialize)]
pub struct ModelList<'a> {
    pub object: &'static str,
    pub data: [Model<'a>; 1],
}

/// The model served.
#[derive(Debug, Serialize)]
pub struct Model<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
}

/// `GET /health`.
#[derive(Debug, Serialize)]
pub struct Health {
    pub status: &'static str,
}
