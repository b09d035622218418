//! Chat messages rendered with the model's own chat template: the Jinja text of a GGUF file's
//! `tokenizer.chat_template` or a folder's `tokenizer_config.json`, on minijinja, set up as
//! Hugging Face `transformers` renders it (blocks trimmed, `tojson` as Python's `json.dumps`,
//! Python string methods, `raise_exception`).

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Serde, Value, ValueKind};
use minijinja::{Environment, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into() }
    }
}

/// A model's chat template with the special tokens it names.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    source: String,
    bos: String,
    eos: String,
}

impl ChatTemplate {
    /// The Jinja `source`, with the texts of the model's start and end tokens (`bos_token`,
    /// `eos_token` in the template).
    pub fn new(source: impl Into<String>, bos: impl Into<String>, eos: impl Into<String>) -> Self {
        Self { source: source.into(), bos: bos.into(), eos: eos.into() }
    }

    /// The text of the model's start token, as the template writes it.
    pub fn bos(&self) -> &str {
        &self.bos
    }

    /// The template's source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// `messages` as the model reads them; with `add_generation_prompt`, followed by the
    /// opening of the assistant's turn.
    ///
    /// # Errors
    /// [`Error::Template`] when the template does not parse, fails (`raise_exception`, for
    /// roles it refuses) or needs what is not given.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// Like [`render`](Self::render), with tool definitions (OpenAI's `tools` list, as the
    /// template's `tools`).
    ///
    /// # Errors
    /// As [`render`](Self::render).
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build().map_err(template_error)?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", |message: String| -> std::result::Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
        });
        let template = env.template_from_str(&self.source).map_err(template_error)?;
        let ctx = minijinja::context! {
            messages => Value::from(Serde(messages)),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos,
            eos_token => &self.eos,
            tools => tools.map(|t| Value::from(Serde(t))),
        };
        template.render(ctx).map_err(template_error)
    }
}

fn template_error(e: minijinja::Error) -> Error {
    let mut message = e.to_string();
    if let Some(detail) = e.detail() {
        message = format!("{message}: {detail}");
    }
    Error::Template(message)
}

/// `tojson` as `transformers` defines it: `json.dumps(value, ensure_ascii=False, indent=…)`
/// (Python's separators `, ` and `: `, keys in their order, no HTML escapes).
fn tojson(value: Value, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&value, indent, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

fn write_json(
    v: &Value,
    indent: Option<usize>,
    depth: usize,
    out: &mut String,
) -> std::result::Result<(), minijinja::Error> {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let (open, close, is_map) = match v.kind() {
        ValueKind::Map => ('{', '}', true),
        ValueKind::Seq | ValueKind::Iterable => ('[', ']', false),
        ValueKind::Undefined | ValueKind::None => {
            out.push_str("null");
            return Ok(());
        }
        ValueKind::Bool => {
            out.push_str(if v.is_true() { "true" } else { "false" });
            return Ok(());
        }
        ValueKind::Number => {
            out.push_str(&v.to_string());
            return Ok(());
        }
        _ => {
            let s = v.as_str().map_or_else(|| v.to_string(), str::to_string);
            out.push_str(
                &serde_json::to_string(&s)
                    .map_err(|e| minijinja::Error::new(ErrorKind::BadSerialization, e.to_string()))?,
            );
            return Ok(());
        }
    };
    let items: Vec<Value> = v.try_iter()?.collect();
    out.push(open);
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(if indent.is_some() { "," } else { ", " });
        }
        newline(out, depth + 1);
        if is_map {
            write_json(item, indent, depth + 1, out)?;
            out.push_str(": ");
            write_json(&v.get_item(item)?, indent, depth + 1, out)?;
        } else {
            write_json(item, indent, depth + 1, out)?;
        }
    }
    if !items.is_empty() {
        newline(out, depth);
    }
    out.push(close);
    Ok(())
}
