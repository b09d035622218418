//! Grammars as logits processors, on [llguidance](https://github.com/guidance-ai/llguidance):
//! JSON, JSON Schema, regular expressions and Lark, for any tokenizer the crate loads.
//!
//! A compiled grammar is a [`ProcessorFactory`]: each sequence gets its own matcher, which
//! follows the history it is handed (advancing on new tokens, rolling back rejected ones), so
//! the decoders keep the law of plain decoding with the same grammar under speculation (see
//! [`crate::sampling::LogitsProcessor`]). At each position the row keeps the tokens of the
//! matcher's mask (end-of-sequence tokens only where the grammar accepts). Where the grammar
//! leaves one byte string (keys, quotes, braces, schema boilerplate), llguidance's mask allows
//! only its canonical spelling, often a single token: the decoders then emit that token without
//! a model call (see [`Stats::forced_tokens`](crate::Stats::forced_tokens)), as plain decoding
//! with the same grammar would draw it with probability 1.
//!
//! The vocabulary's token bytes come from the tokenizer's JSON (llguidance's own reader);
//! `toktrie_hf_tokenizers` would do the same but pins an older `tokenizers` than the crate's.

use std::collections::BTreeMap;
use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};

use crate::error::{Error, Result};
use crate::sampling::{History, LogitsProcessor, ProcessorFactory};
use crate::tokenizer::Tokenizer;

/// The whitespace [`Grammar::json`] and [`Grammar::json_schema`] allow between two JSON tokens:
/// up to 20 spaces, tabs and line breaks (enough for pretty-printed JSON ten levels deep).
pub const JSON_WHITESPACE: &str = r"[\x20\x0A\x0D\x09]{1,20}";

/// A grammar the output must match: JSON, a JSON Schema, a regular expression or a Lark
/// grammar (llguidance's dialect, with `%json` for embedded schemas).
#[derive(Debug, Clone)]
pub struct Grammar {
    top: TopLevelGrammar,
    what: String,
}

impl Grammar {
    /// Any JSON object.
    pub fn json() -> Self {
        Self::json_grammar(serde_json::json!({ "type": "object" }), "JSON object")
    }

    /// JSON that validates against `schema` (llguidance's subset of JSON Schema: an unsupported
    /// keyword is an error at [`compile`](Self::compile)).
    ///
    /// Whitespace between JSON tokens is bounded to [`JSON_WHITESPACE`] at each place, as in
    /// llama.cpp's JSON grammars: unbounded, a sampled model can emit whitespace until the
    /// token limit (seen after a string cut at its `maxLength`). A schema with its own
    /// `x-guidance` options (llguidance's `JsonCompileOptions`) keeps them.
    pub fn json_schema(schema: serde_json::Value) -> Self {
        Self::json_grammar(schema, "JSON schema")
    }

    fn json_grammar(mut schema: serde_json::Value, what: &str) -> Self {
        if let Some(object) = schema.as_object_mut() {
            object.entry("x-guidance").or_insert_with(|| serde_json::json!({ "whitespace_pattern": JSON_WHITESPACE }));
        }
        Self { top: TopLevelGrammar::from_json_schema(schema), what: what.into() }
    }

    /// Text that matches the regular expression `regex` whole.
    pub fn regex(regex: &str) -> Self {
        Self { top: TopLevelGrammar::from_regex(regex), what: format!("regex {regex:?}") }
    }

    /// Text in the language of a Lark grammar (its `start` rule).
    pub fn lark(source: &str) -> Self {
        Self { top: TopLevelGrammar::from_lark(source.to_string()), what: "Lark grammar".into() }
    }

    /// Compiles the grammar for `vocab`: a factory of per-sequence processors for
    /// [`SamplingConfig::with_processor`](crate::SamplingConfig::with_processor).
    ///
    /// # Errors
    /// [`Error::Grammar`] when the grammar does not compile.
    pub fn compile(&self, vocab: &GrammarVocab) -> Result<ProcessorFactory> {
        let mut factory = ParserFactory::new_simple(&vocab.env).map_err(|e| self.error(e))?;
        factory.quiet();
        let parser = factory.create_parser(self.top.clone()).map_err(|e| self.error(e))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(self.error(e));
        }
        let vocab_len = vocab.env.tok_trie().vocab_size();
        let proto = Arc::new(matcher);
        Ok(Arc::new(move || Box::new(GrammarProcessor::new(proto.deep_clone(), vocab_len))))
    }

    fn error(&self, e: impl std::fmt::Display) -> Error {
        Error::Grammar(format!("{}: {e}", self.what))
    }
}

/// A vocabulary as a grammar sees it: every token's bytes and the end-of-sequence tokens.
#[derive(Clone)]
pub struct GrammarVocab {
    env: TokEnv,
}

impl std::fmt::Debug for GrammarVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarVocab").field("tokens", &self.env.tok_trie().vocab_size()).finish()
    }
}

impl GrammarVocab {
    /// The vocabulary of `tokenizer` (GGUF or `tokenizer.json`), its
    /// [`stop_ids`](Tokenizer::stop_ids) as end-of-sequence tokens.
    ///
    /// # Errors
    /// [`Error::Grammar`] when the tokenizer has no stop token or its token bytes cannot be
    /// read (a decoder that is neither byte-level nor byte-fallback).
    pub fn new(tokenizer: &Tokenizer) -> Result<Self> {
        let json: serde_json::Value = serde_json::from_str(&tokenizer.to_json()?)
            .map_err(|e| Error::Grammar(format!("the tokenizer's JSON: {e}")))?;
        let mut tokens = llguidance::token_bytes_from_tokenizer_json(&json)
            .map_err(|e| Error::Grammar(format!("the tokenizer's token bytes: {e}")))?;
        tokens.resize(tokens.len().max(tokenizer.vocab_size()), Vec::new());
        let encoder = tokenizer.plain_encoder()?;
        Self::build(tokens, &tokenizer.stop_ids(), Some(encoder))
    }

    /// A vocabulary given by each token's bytes (special tokens start with byte `0xFF`) and its
    /// end-of-sequence tokens; forced text is tokenized greedily. For toy models and tests.
    ///
    /// # Errors
    /// [`Error::Grammar`] without an end-of-sequence token or with one out of range.
    pub fn from_token_bytes(tokens: Vec<Vec<u8>>, eos: &[u32]) -> Result<Self> {
        Self::build(tokens, eos, None)
    }

    /// The bytes token `id` stands for (a special token: its name, such as `<|im_end|>`;
    /// nothing for an id outside the vocabulary). A byte-level token may hold part of a
    /// character: these are the bytes, not text.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        let trie = self.env.tok_trie();
        if id as usize >= trie.vocab_size() {
            return &[];
        }
        let bytes = trie.token(id);
        bytes.strip_prefix(&[0xFF]).unwrap_or(bytes)
    }

    fn build(tokens: Vec<Vec<u8>>, eos: &[u32], encoder: Option<tokenizers::Tokenizer>) -> Result<Self> {
        let n = tokens.len();
        match eos.iter().find(|&&t| t as usize >= n) {
            _ if eos.is_empty() => return Err(Error::Grammar("the vocabulary has no end-of-sequence token".into())),
            Some(&t) => return Err(Error::Grammar(format!("end-of-sequence token {t} is not in a vocabulary of {n}"))),
            None => {}
        }
        let trie = TokTrie::from(&TokRxInfo::new(n as u32, eos[0]), &tokens).with_eos_tokens(eos);
        Ok(Self { env: Arc::new(VocabEnv { trie, encoder }) })
    }
}

/// llguidance's view of a vocabulary: the token trie, and the tokenizer that writes forced
/// text in canonical tokens (greedy over the trie when there is none).
struct VocabEnv {
    trie: TokTrie,
    encoder: Option<tokenizers::Tokenizer>,
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        match &self.encoder {
            Some(enc) => self.trie.tokenize_with_greedy_fallback(s, |text| {
                enc.encode(text, false)
                    .map_or_else(|_| self.trie.greedy_tokenize(text.as_bytes()), |e| e.get_ids().to_vec())
            }),
            None => self.trie.greedy_tokenize(s),
        }
    }
}

/// What the grammar allows at a position.
#[derive(Debug)]
enum Allowed {
    /// The matcher's mask.
    Mask(SimpleVob),
    /// Anything: past a token the grammar refused (only after an end-of-sequence token, whose
    /// later rows are never kept).
    Any,
}

impl Allowed {
    fn only(&self) -> Option<u32> {
        match self {
            Allowed::Mask(m) if m.num_set() == 1 => m.first_bit_set().map(|t| t as u32),
            _ => None,
        }
    }

    fn allows(&self, token: u32) -> bool {
        match self {
            Allowed::Mask(m) => (token as usize) < m.len() && m.is_allowed(token),
            Allowed::Any => true,
        }
    }
}

/// One sequence's grammar state: a matcher that follows the output it is handed, and what the
/// grammar allows at the positions it has visited (a cache of the output, so that the target's
/// rows reuse the masks the draft's rows computed).
///
/// Going back (a rejected draft, a tree's next branch) never rolls the matcher back: in
/// llguidance 1.9 a roll-back after a mask was computed can leave stale state behind (after
/// `"arguments": ["B` had its mask, a roll-back and `"arguments": {"` gave a mask that refused
/// the key's `":`; `tests/grammar.rs` keeps that case). The matcher is instead a copy of `base`,
/// a matcher that has only ever consumed tokens, brought forward to where the output goes on.
#[derive(Debug)]
struct GrammarProcessor {
    /// The grammar's matcher before any token.
    start: MatcherBox,
    /// A matcher that has consumed `consumed[..base_len]` and never computed a mask.
    base: MatcherBox,
    base_len: usize,
    matcher: MatcherBox,
    /// The tokens the matcher has consumed.
    consumed: Vec<u32>,
    /// What is allowed after `consumed[..n]`, by `n`.
    allowed: BTreeMap<usize, Allowed>,
    vocab: usize,
}

static ANY: Allowed = Allowed::Any;

/// Positions behind the newest one that keep their masks (a block is never longer).
const KEEP: usize = 512;

struct MatcherBox(Matcher);

impl std::fmt::Debug for MatcherBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Matcher")
    }
}

impl GrammarProcessor {
    fn new(matcher: Matcher, vocab: usize) -> Self {
        Self {
            start: MatcherBox(matcher.clone()),
            base: MatcherBox(matcher.clone()),
            base_len: 0,
            matcher: MatcherBox(matcher),
            consumed: Vec::new(),
            allowed: BTreeMap::new(),
            vocab,
        }
    }

    /// What the grammar allows after `output`.
    fn at(&mut self, output: &[u32]) -> Result<&Allowed> {
        let n = output.len();
        let common = self.consumed.iter().zip(output).take_while(|(a, b)| a == b).count();
        if common == n && self.allowed.contains_key(&n) {
            return Ok(&self.allowed[&n]);
        }
        if self.consumed.len() > common {
            self.go_back(common)?;
            self.consumed.truncate(common);
            self.allowed.split_off(&(common + 1));
        }
        let m = &mut self.matcher.0;
        let rest = &output[common..];
        let took = m.try_consume_tokens(rest).map_err(grammar_error)?;
        self.consumed.extend_from_slice(&rest[..took]);
        let allowed = if took < rest.len() {
            Allowed::Any
        } else {
            Allowed::Mask(m.compute_mask_or_eos().map_err(grammar_error)?)
        };
        if let Allowed::Any = allowed {
            // Not a state of the matcher: never cached.
            return Ok(&ANY);
        }
        self.allowed = self.allowed.split_off(&n.saturating_sub(KEEP));
        Ok(self.allowed.entry(n).or_insert(allowed))
    }

    /// Makes the matcher one that has consumed `consumed[..len]` (and no more), without a
    /// roll-back: a copy of the base, first moved up to `len` when it lags by `STRIDE` or more
    /// (or restarted from the grammar's start when `len` lies before it).
    fn go_back(&mut self, len: usize) -> Result<()> {
        if self.base_len > len {
            (self.base, self.base_len) = (MatcherBox(self.start.0.clone()), 0);
        }
        if len - self.base_len >= STRIDE {
            self.base.0.consume_tokens(&self.consumed[self.base_len..len]).map_err(grammar_error)?;
            self.base_len = len;
        }
        let mut m = self.base.0.clone();
        m.consume_tokens(&self.consumed[self.base_len..len]).map_err(grammar_error)?;
        self.matcher = MatcherBox(m);
        Ok(())
    }
}

/// How far the base may lag behind a position the matcher goes back to: the tokens a copy of
/// it consumes again to get there.
const STRIDE: usize = 16;

fn grammar_error(e: impl std::fmt::Display) -> Error {
    Error::Grammar(e.to_string())
}

impl LogitsProcessor for GrammarProcessor {
    fn process(&mut self, history: &History, logits: &mut [f32]) -> Result<()> {
        let output: Vec<u32> = history.output().collect();
        let vocab = self.vocab;
        match self.at(&output)? {
            Allowed::Any => {}
            Allowed::Mask(mask) => {
                for (i, x) in logits.iter_mut().enumerate() {
                    if i >= vocab || !mask.is_allowed(i as u32) {
                        *x = f32::NEG_INFINITY;
                    }
                }
            }
        }
        Ok(())
    }

    fn forced(&mut self, history: &History) -> Result<Option<u32>> {
        let output: Vec<u32> = history.output().collect();
        Ok(self.at(&output)?.only())
    }

    fn allows(&mut self, history: &History, token: u32) -> Result<bool> {
        let output: Vec<u32> = history.output().collect();
        Ok(self.at(&output)?.allows(token))
    }
}
