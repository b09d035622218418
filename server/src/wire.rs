//! A request body as serde types: each field's name, type and check live in one definition
//! (a range is a type that checks itself), and a field the API does not have is refused by
//! the type (`deny_unknown_fields`), not by a list beside it. `params.rs` turns a body into
//! the [`Params`](crate::params::Params) the rest of the server reads.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;
use specdec::sampling::MAX_TOP_LOGPROBS;

/// A number that must lie in a range: a type per field, whose check runs as it is read.
macro_rules! ranged {
    ($(#[$meta:meta])* $name:ident: $lo:expr, $hi:expr, $above_lo:expr) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, Deserialize)]
        #[serde(try_from = "f32")]
        pub struct $name(pub f32);

        impl TryFrom<f32> for $name {
            type Error = String;

            fn try_from(v: f32) -> Result<Self, String> {
                let above = if $above_lo { v > $lo } else { v >= $lo };
                match v.is_finite() && above && v <= $hi {
                    true => Ok(Self(v)),
                    false => {
                        let bound = if $above_lo { "above" } else { "from" };
                        Err(format!("{v}: expected a number {bound} {} to {}", $lo, $hi))
                    }
                }
            }
        }
    };
}

ranged!(
    /// `temperature`: 0 (greedy) to 2.
    Temperature: 0.0, 2.0, false
);
ranged!(
    /// `top_p`: above 0, to 1.
    TopP: 0.0, 1.0, true
);
ranged!(
    /// `min_p`: 0 to 1.
    MinP: 0.0, 1.0, false
);
ranged!(
    /// `presence_penalty`, `frequency_penalty`: −2 to 2.
    Penalty: -2.0, 2.0, false
);
ranged!(
    /// `repetition_penalty`: 0.01 to 10.
    RepetitionPenalty: 0.01, 10.0, false
);
ranged!(
    /// A `logit_bias` value: −100 to 100.
    Bias: -100.0, 100.0, false
);

/// A count that must lie in `LO..=HI`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(try_from = "u64")]
pub struct Count<const LO: usize, const HI: usize>(pub usize);

impl<const LO: usize, const HI: usize> TryFrom<u64> for Count<LO, HI> {
    type Error = String;

    fn try_from(v: u64) -> Result<Self, String> {
        match usize::try_from(v) {
            Ok(n) if (LO..=HI).contains(&n) => Ok(Self(n)),
            _ if HI == usize::MAX => Err(format!("{v}: expected at least {LO}")),
            _ => Err(format!("{v}: expected {LO} to {HI}")),
        }
    }
}

/// The most choices one request may ask for (`n`).
pub const MAX_CHOICES: usize = 16;

/// A request body, both endpoints' fields (each endpoint refuses the other's).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Body {
    pub model: Option<String>,
    /// Chat only.
    pub messages: Option<Vec<Message>>,
    /// Completions only.
    pub prompt: Option<Prompt>,
    pub max_tokens: Option<Count<1, { usize::MAX }>>,
    /// Chat only: the same as `max_tokens`.
    pub max_completion_tokens: Option<Count<1, { usize::MAX }>>,
    pub temperature: Option<Temperature>,
    pub top_p: Option<TopP>,
    /// 0: off.
    pub top_k: Option<usize>,
    pub min_p: Option<MinP>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub presence_penalty: Option<Penalty>,
    pub frequency_penalty: Option<Penalty>,
    pub repetition_penalty: Option<RepetitionPenalty>,
    /// Token id → bias.
    pub logit_bias: Option<BTreeMap<u32, Bias>>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<Count<1, MAX_CHOICES>>,
    /// Accepted, without effect.
    #[serde(rename = "user")]
    pub _user: Option<String>,
    /// Chat: `true` or `false`; completions: the number of alternatives.
    pub logprobs: Option<LogprobsField>,
    /// Chat only.
    pub top_logprobs: Option<Count<0, MAX_TOP_LOGPROBS>>,
    /// An extension: `raw` (the default) or `processed`.
    pub logprobs_mode: Option<LogprobsMode>,
    /// Checked where it is compiled to a grammar (`prepare.rs`).
    pub response_format: Option<Value>,
    /// Chat only; checked in `prepare.rs`.
    pub tools: Option<Vec<Value>>,
    /// Chat only; checked in `prepare.rs`.
    pub tool_choice: Option<Value>,
    /// Chat only. Accepted, without effect.
    pub parallel_tool_calls: Option<bool>,
    /// Completions only: `false` (echoing the prompt is not supported).
    pub echo: Option<bool>,
}

/// `stream_options`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// `stop`: a string, or up to 4.
#[derive(Debug, Deserialize)]
#[serde(try_from = "OneOrMany")]
pub struct Stop(pub Vec<String>);

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl TryFrom<OneOrMany> for Stop {
    type Error = String;

    fn try_from(v: OneOrMany) -> Result<Self, String> {
        let all = match v {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(list) => list,
        };
        match all.len() {
            0..=4 => Ok(Self(all)),
            n => Err(format!("{n} strings: at most 4")),
        }
    }
}

/// `prompt`: a string, or a list of one string.
#[derive(Debug, Deserialize)]
#[serde(try_from = "OneOrMany")]
pub struct Prompt(pub String);

impl TryFrom<OneOrMany> for Prompt {
    type Error = String;

    fn try_from(v: OneOrMany) -> Result<Self, String> {
        match v {
            OneOrMany::One(s) => Ok(Self(s)),
            OneOrMany::Many(mut list) if list.len() == 1 => Ok(Self(list.remove(0))),
            OneOrMany::Many(_) => Err("a string (or a list of one string)".into()),
        }
    }
}

/// `logprobs`: chat's flag, or a completion's number of alternatives.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(untagged)]
pub enum LogprobsField {
    Flag(bool),
    Alternatives(Count<0, MAX_TOP_LOGPROBS>),
}

/// `logprobs_mode`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogprobsMode {
    Raw,
    Processed,
}

/// A chat message. Fields other than these (`name`, `refusal`, …) are ignored: clients send
/// back what they were given.
#[derive(Debug, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: Option<Content>,
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// Who speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    /// Read as `system`.
    Developer,
    User,
    Assistant,
    Tool,
}

impl Role {
    /// The role as chat templates name it.
    pub fn template_name(self) -> &'static str {
        match self {
            Self::System | Self::Developer => "system",
            Self::User => "user",
            Self::Assistant => "assistant",
            Self::Tool => "tool",
        }
    }
}

/// Message content: a string, or text parts.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

/// A content part; only `text` parts are supported.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    Text { text: String },
}

/// An assistant's earlier tool call.
#[derive(Debug, Deserialize)]
pub struct ToolCall {
    pub function: FunctionCall,
}

/// A called function: its name and arguments (a JSON string, as OpenAI sends them, or JSON).
#[derive(Debug, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: Value,
}
