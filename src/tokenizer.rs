//! Tokenizers from an HF `tokenizer.json` or rebuilt from GGUF metadata: GPT-2 byte-level BPE
//! (SmolLM2, Llama 3) and SentencePiece-style BPE with scores (Llama 2, the tinyllamas models).

use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;

use candle_core::quantized::gguf_file::Value;
use serde_json::{json, Value as Json};

use crate::chat::{ChatMessage, ChatTemplate};
use crate::error::{BoxError, Error, Result};
use crate::model::Vocabulary;

/// A tokenizer plus what generation needs from it.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    chat_system: Option<String>,
    /// The model's own chat template, when it has one.
    template: Option<ChatTemplate>,
    /// The model's end-of-sequence ids, from its config (set when a model is loaded).
    eos: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokenizer({} tokens)", self.vocab_size())
    }
}

fn tok_err<E: std::fmt::Display + Into<BoxError>>(e: E) -> Error {
    Error::Tokenizer { message: e.to_string(), source: Some(e.into()) }
}

impl Tokenizer {
    /// Loads an HF `tokenizer.json`.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] when the file cannot be read or parsed.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| Error::Tokenizer { message: format!("{}: {e}", path.display()), source: Some(e) })?;
        Ok(Self { inner, chat_system: None, template: None, eos: Vec::new() })
    }

    /// Rebuilds the tokenizer stored in GGUF metadata (`tokenizer.ggml.*`).
    ///
    /// # Errors
    /// [`Error::Tokenizer`] when the metadata is missing or of an unsupported kind.
    pub fn from_gguf_metadata(md: &HashMap<String, Value>) -> Result<Self> {
        let get = |key: &str| md.get(key).ok_or_else(|| Error::tokenizer(format!("GGUF metadata has no `{key}`")));
        let strings = |key: &str| -> Result<Vec<String>> {
            get(key)?.to_vec().map_err(tok_err)?.iter().map(|v| v.to_string().cloned().map_err(tok_err)).collect()
        };
        let kind = get("tokenizer.ggml.model")?.to_string().map_err(tok_err)?.clone();
        let tokens = strings("tokenizer.ggml.tokens")?;
        let types: Vec<i64> = match md.get("tokenizer.ggml.token_type").and_then(|v| v.to_vec().ok()) {
            Some(v) => v
                .iter()
                .map(|t| t.to_i32().map(i64::from).or_else(|_| t.to_u32().map(i64::from)).unwrap_or(1))
                .collect(),
            None => vec![1; tokens.len()],
        };
        let id = |key: &str| md.get(key).and_then(|v| v.to_u32().ok());
        let flag = |key: &str, default: bool| md.get(key).and_then(|v| v.to_bool().ok()).unwrap_or(default);
        let json = match kind.as_str() {
            "gpt2" => {
                let pre =
                    md.get("tokenizer.ggml.pre").and_then(|v| v.to_string().ok()).map_or("default", |s| s.as_str());
                let merges = strings("tokenizer.ggml.merges")?;
                let bos =
                    flag("tokenizer.ggml.add_bos_token", false).then(|| id("tokenizer.ggml.bos_token_id")).flatten();
                gpt2_json(&tokens, &types, merges, pre, bos)?
            }
            "llama" => {
                let scores: Vec<f32> = get("tokenizer.ggml.scores")?
                    .to_vec()
                    .map_err(tok_err)?
                    .iter()
                    .map(|v| v.to_f32().unwrap_or(0.0))
                    .collect();
                let bos =
                    flag("tokenizer.ggml.add_bos_token", true).then(|| id("tokenizer.ggml.bos_token_id")).flatten();
                let unk = id("tokenizer.ggml.unknown_token_id").unwrap_or(0);
                sentencepiece_json(&tokens, &types, &scores, flag("tokenizer.ggml.add_space_prefix", true), bos, unk)?
            }
            other => {
                return Err(Error::tokenizer(format!(
                    "GGUF tokenizer model `{other}` is not supported (gpt2 or llama)"
                )))
            }
        };
        let inner = tokenizers::Tokenizer::from_str(&json.to_string()).map_err(tok_err)?;
        let source = md.get("tokenizer.chat_template").and_then(|v| v.to_string().ok());
        let text = |key: &str| id(key).and_then(|i| tokens.get(i as usize)).cloned().unwrap_or_default();
        let template = source.map(|t| {
            ChatTemplate::new(t.clone(), text("tokenizer.ggml.bos_token_id"), text("tokenizer.ggml.eos_token_id"))
        });
        let chat_system = source.and_then(|t| default_system_prompt(t));
        Ok(Self { inner, chat_system, template, eos: Vec::new() })
    }

    /// Text to token ids, with the model's start token when it wants one; special tokens written
    /// in the text (such as `<|im_start|>`) become their ids.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] when encoding fails.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.inner.encode(text, true).map_err(tok_err)?.get_ids().to_vec())
    }

    /// Token ids to text, special tokens left out.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] when decoding fails.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, true).map_err(tok_err)
    }

    /// The id of a token, if it is in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Tokens in the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// A hash of the token → id map (FNV-1a over the tokens in id order): equal for tokenizers
    /// that assign the same ids to the same strings.
    pub fn fingerprint(&self) -> u64 {
        let mut vocab: Vec<(String, u32)> = self.inner.get_vocab(true).into_iter().collect();
        vocab.sort_by_key(|&(_, id)| id);
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for (token, id) in vocab {
            for b in token.bytes().chain(id.to_le_bytes()) {
                h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
            }
        }
        h
    }

    /// The tokenizer as HF `tokenizer.json` text.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] when serialization fails.
    pub fn to_json(&self) -> Result<String> {
        self.inner.to_string(false).map_err(tok_err)
    }

    /// The tokenizer without the space some add before a text (a `Prepend` normalizer, a
    /// Metaspace pre-tokenizer that prepends): what tokenizes text in the middle of an output.
    #[cfg(feature = "grammar")]
    pub(crate) fn plain_encoder(&self) -> Result<tokenizers::Tokenizer> {
        fn strip(v: &mut Json) {
            if let Some(list) = v.get_mut("normalizers").and_then(Json::as_array_mut) {
                list.retain(|n| n["type"] != "Prepend");
                list.iter_mut().for_each(strip);
            }
            if let Some(list) = v.get_mut("pretokenizers").and_then(Json::as_array_mut) {
                list.iter_mut().for_each(strip);
            }
            if v["type"] == "Metaspace" {
                v["prepend_scheme"] = json!("never");
            }
        }
        let mut json: Json = serde_json::from_str(&self.to_json()?).map_err(tok_err)?;
        if json["normalizer"]["type"] == "Prepend" {
            json["normalizer"] = Json::Null;
        }
        strip(&mut json["normalizer"]);
        strip(&mut json["pre_tokenizer"]);
        tokenizers::Tokenizer::from_str(&json.to_string()).map_err(tok_err)
    }

    /// The model's chat template, if it came with one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.template.as_ref()
    }

    /// `messages` written out by the model's chat template, followed by the opening of the
    /// assistant's turn, ready for [`encode`](Self::encode) (a start token the template writes
    /// is left out when `encode` adds it). Without a template: ChatML or Gemma's turns where
    /// the vocabulary has their tokens, else the messages' contents one after another.
    ///
    /// # Errors
    /// [`Error::Template`] when the template fails (a role it refuses, an order it forbids).
    pub fn chat(&self, messages: &[ChatMessage]) -> Result<String> {
        let Some(template) = &self.template else { return Ok(self.fallback_chat(messages)) };
        let text = template.render(messages, true)?;
        let adds_bos = self.inner.encode("", true).is_ok_and(|e| !e.get_ids().is_empty());
        match text.strip_prefix(template.bos()).filter(|_| adds_bos && !template.bos().is_empty()) {
            Some(rest) => Ok(rest.to_string()),
            None => Ok(text),
        }
    }

    /// The hard-coded turns, for models without a template.
    fn fallback_chat(&self, messages: &[ChatMessage]) -> String {
        let gemma = self.token_to_id("<start_of_turn>").is_some();
        let chatml = self.token_to_id("<|im_start|>").is_some();
        let mut out = String::new();
        if chatml && !messages.iter().any(|m| m.role == "system") {
            if let Some(s) = &self.chat_system {
                out.push_str(&format!("<|im_start|>system\n{s}<|im_end|>\n"));
            }
        }
        for m in messages {
            match (gemma, chatml) {
                (true, _) => {
                    let role = if m.role == "assistant" { "model" } else { "user" };
                    out.push_str(&format!("<start_of_turn>{role}\n{}<end_of_turn>\n", m.content));
                }
                (false, true) => out.push_str(&format!("<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content)),
                _ => out.push_str(&m.content),
            }
        }
        match (gemma, chatml) {
            (true, _) => out.push_str("<start_of_turn>model\n"),
            (false, true) => out.push_str("<|im_start|>assistant\n"),
            _ => {}
        }
        out
    }

    /// A user message in the model's chat template (see [`chat`](Self::chat)); the message
    /// unchanged for a model with neither a template nor chat tokens. Where the template fails,
    /// the hard-coded turns.
    pub fn chat_prompt(&self, user: &str) -> String {
        let messages = [ChatMessage::new("user", user)];
        if self.template.is_some() {
            if let Ok(text) = self.chat(&messages) {
                return text;
            }
        }
        self.fallback_chat(&messages)
    }

    /// The ids of the tokens added to the model's vocabulary beside the learned ones: the
    /// special tokens (`<|im_end|>`, `<|endoftext|>`, …), sorted.
    pub fn added_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.inner.get_added_tokens_decoder().into_keys().collect();
        ids.sort_unstable();
        ids
    }

    /// The tokens that end a generation: the model's end-of-sequence ids (from its config,
    /// when the tokenizer came with a loaded model) and the tokens that end a chat turn
    /// (`<|im_end|>`, `<|eot_id|>`, `</s>`, `<end_of_turn>`, …) found in the vocabulary. The one
    /// list to pass to a decoder's `stop_tokens`.
    pub fn stop_ids(&self) -> Vec<u32> {
        let turn = ["<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "</s>", "<end_of_turn>"];
        let mut ids = self.eos.clone();
        for id in turn.iter().filter_map(|t| self.token_to_id(t)) {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        ids
    }

    /// The tokenizer with a chat template (read from a model folder's `tokenizer_config.json`).
    pub(crate) fn with_chat_template(mut self, template: ChatTemplate) -> Self {
        self.chat_system = default_system_prompt(template.source());
        self.template = Some(template);
        self
    }

    /// The tokenizer with the model's end-of-sequence ids (see [`stop_ids`](Self::stop_ids)).
    pub(crate) fn with_eos(mut self, eos: Vec<u32>) -> Self {
        self.eos = eos;
        self
    }
}

/// As a cross-vocabulary drafter reads it: special tokens written out in text and read back
/// from it; a start token (`<s>`, `<bos>`) where the model wants one.
impl Vocabulary for Tokenizer {
    fn text(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(tok_err)
    }

    fn ids(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.inner.encode(text, false).map_err(tok_err)?.get_ids().to_vec())
    }

    fn len(&self) -> usize {
        self.vocab_size()
    }

    fn start(&self) -> Vec<u32> {
        self.encode("").unwrap_or_default()
    }

    fn is_special(&self, id: u32) -> bool {
        // Special tokens are what decoding leaves out.
        self.decode(&[id]).is_ok_and(|s| s.is_empty()) && self.text(&[id]).is_ok_and(|s| !s.is_empty())
    }
}

/// The system prompt a ChatML template inserts when the conversation has none: the first
/// `<|im_start|>system` turn written out as plain text (Qwen's templates open that turn in
/// template code first, and write the newline as a `\n` escape in a string literal).
fn default_system_prompt(template: &str) -> Option<String> {
    const OPEN: &str = "<|im_start|>system";
    template.match_indices(OPEN).find_map(|(at, _)| {
        let rest = &template[at + OPEN.len()..];
        let rest = rest.strip_prefix('\n').or_else(|| rest.strip_prefix("\\n"))?;
        let text = &rest[..rest.find("<|im_end|>")?];
        (!text.is_empty() && !text.contains(['\'', '"', '{', '}', '\\'])).then(|| text.to_string())
    })
}

/// Added-token entries for control (3) and user-defined (4) tokens.
fn added_tokens(tokens: &[String], types: &[i64]) -> Vec<Json> {
    tokens
        .iter()
        .zip(types)
        .enumerate()
        .filter(|(_, (_, &t))| t == 3 || t == 4)
        .map(|(id, (content, &t))| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": t == 3})
        })
        .collect()
}

fn vocab_map(tokens: &[String]) -> serde_json::Map<String, Json> {
    tokens.iter().enumerate().map(|(id, t)| (t.clone(), json!(id))).collect()
}

fn bos_processor(tokens: &[String], bos: Option<u32>) -> Json {
    let Some(name) = bos.and_then(|id| tokens.get(id as usize)) else { return Json::Null };
    json!({"type": "TemplateProcessing",
           "single": [{"SpecialToken": {"id": name, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
           "pair": [{"SpecialToken": {"id": name, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
           "special_tokens": {name: {"id": name, "ids": [bos], "tokens": [name]}}})
}

/// GPT-2 byte-level BPE as an HF `tokenizer.json` document.
fn gpt2_json(tokens: &[String], types: &[i64], merges: Vec<String>, pre: &str, bos: Option<u32>) -> Result<Json> {
    const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    // Qwen2's split is Llama 3's with single digits.
    const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |pattern: &str| {
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false}, byte_level(false)]})
    };
    let pre_tokenizer = match pre {
        "default" | "gpt2" | "gpt-2" => byte_level(true),
        "smollm" | "starcoder" | "refact" => {
            json!({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level(true)]})
        }
        "llama-bpe" | "llama3" => split(LLAMA3_SPLIT),
        "qwen2" | "deepseek-r1-qwen" => split(QWEN2_SPLIT),
        other => {
            return Err(Error::tokenizer(format!(
                "GGUF pre-tokenizer `{other}` is not supported (gpt2, smollm, llama-bpe, qwen2)"
            )))
        }
    };
    // Qwen2's own tokenizer.json composes text (NFC) before splitting; llama.cpp does not, so the
    // two differ only on decomposed input, where we follow the model's trainers.
    let normalizer = if matches!(pre, "qwen2" | "deepseek-r1-qwen") { json!({"type": "NFC"}) } else { Json::Null };
    Ok(json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added_tokens(tokens, types),
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": bos_processor(tokens, bos),
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab_map(tokens), "merges": merges}
    }))
}

/// SentencePiece-style BPE (tokens with scores, `▁` for spaces, byte fallback) as an HF
/// `tokenizer.json` document. The merges are every split of a normal token into two tokens,
/// ranked by the score of the merged token, as SentencePiece's BPE ranks them.
fn sentencepiece_json(
    tokens: &[String],
    types: &[i64],
    scores: &[f32],
    space_prefix: bool,
    bos: Option<u32>,
    unk: u32,
) -> Result<Json> {
    // Tries over the tokens' bytes, forwards and backwards, find every split of a token into a
    // token prefix and a token suffix in time linear in its length (a hash lookup per split is
    // quadratic, and a forged file can hold a token of megabytes).
    let forward = Trie::new(tokens.iter().map(|t| t.bytes()));
    let backward = Trie::new(tokens.iter().map(|t| t.bytes().rev()));
    let mut merges: Vec<(f32, usize, String)> = Vec::new();
    for (id, token) in tokens.iter().enumerate().filter(|&(i, _)| types.get(i).is_none_or(|&t| t == 1)) {
        let (prefixes, suffixes) = (forward.matches(token.bytes()), backward.matches(token.bytes().rev()));
        for split in 1..token.len() {
            // A prefix that is a whole token ends on a character boundary.
            let Some((left, right)) = token.split_at_checked(split) else { continue };
            if prefixes[split] && suffixes[token.len() - split] {
                merges.push((scores.get(id).copied().unwrap_or(0.0), id, format!("{left} {right}")));
            }
        }
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut normalizers = Vec::new();
    if space_prefix {
        normalizers.push(json!({"type": "Prepend", "prepend": "▁"}));
    }
    normalizers.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"}));
    let unk_token = tokens.get(unk as usize).cloned();
    let strip = if space_prefix { 1 } else { 0 };
    Ok(json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added_tokens(tokens, types),
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": null,
        "post_processor": bos_processor(tokens, bos),
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": strip, "stop": 0}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": unk_token, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                  "vocab": vocab_map(tokens), "merges": merges.into_iter().map(|m| m.2).collect::<Vec<_>>()}
    }))
}

/// A byte trie: which strings of a set are prefixes of a given string.
struct Trie {
    edges: HashMap<(usize, u8), usize>,
    ends: Vec<bool>,
}

impl Trie {
    fn new<W: Iterator<Item = u8>>(words: impl Iterator<Item = W>) -> Self {
        let (mut edges, mut ends) = (HashMap::new(), vec![false]);
        for word in words {
            let mut node = 0;
            for b in word {
                node = *edges.entry((node, b)).or_insert_with(|| {
                    ends.push(false);
                    ends.len() - 1
                });
            }
            ends[node] = true;
        }
        Self { edges, ends }
    }

    /// `m[n]` is true when the first `n` bytes of `s` are one of the words.
    fn matches(&self, s: impl ExactSizeIterator<Item = u8>) -> Vec<bool> {
        let mut m = vec![false; s.len() + 1];
        let mut node = Some(0);
        for (n, b) in s.enumerate() {
            m[n] = node.is_some_and(|i| self.ends[i]);
            node = node.and_then(|i| self.edges.get(&(i, b)).copied());
            if node.is_none() {
                return m;
            }
        }
        if let (Some(i), Some(last)) = (node, m.last_mut()) {
            *last = self.ends[i];
        }
        m
    }
}

/// Turns a growing list of token ids into text increments, holding back bytes that do not yet
/// form whole characters.
///
/// Each push decodes only a short window: the tokens not yet turned into text, after those of
/// the last text returned (decoded alike, so that a tokenizer's word-start handling, such as
/// SentencePiece dropping a leading space, cancels out; a prefix of whole characters, so that
/// byte-fallback tokens are never cut mid-character), so streaming n tokens costs O(n).
/// This is the algorithm of tokenizers' `DecodeStream`, kept here because that type borrows
/// its tokenizer for its whole life, and ours also decodes GGUF vocabularies.
#[derive(Debug, Default)]
pub struct TextStream {
    /// Tokens from the start of the window on: those of the last text returned, then the rest.
    tokens: Vec<u32>,
    /// How many of `tokens` are the last text returned (the window's prefix).
    read: usize,
    /// The length of that prefix decoded alone (decoded once per text returned).
    prefix_len: usize,
}

impl TextStream {
    /// An empty stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds tokens and returns the new text they complete (possibly empty).
    ///
    /// # Errors
    /// [`Error::Tokenizer`] when decoding fails.
    pub fn push(&mut self, tokenizer: &Tokenizer, tokens: &[u32]) -> Result<String> {
        self.tokens.extend_from_slice(tokens);
        let (text, before) = (tokenizer.decode(&self.tokens)?, self.prefix_len);
        if text.len() <= before || text.ends_with('\u{FFFD}') || !text.is_char_boundary(before) {
            return Ok(String::new());
        }
        // The next window: this text's tokens as its prefix.
        let new = text[before..].to_string();
        self.tokens.drain(..self.read);
        self.read = self.tokens.len();
        self.prefix_len = tokenizer.decode(&self.tokens)?.len();
        Ok(new)
    }
}
