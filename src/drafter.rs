//! [`Drafter`]: the run-time choice of a drafter, as written on a command line
//! ([`DrafterSpec`]): a model draft, n-gram lookup, both, a layer-skip or re-quantized copy of
//! the target, or a draft head. It sits above the drafters, the heads and the loaders it
//! builds from.

use std::str::FromStr;
use std::sync::Arc;

use candle_core::Device;

use crate::draft::suffix_cache::DEFAULT_CAPACITY;
use crate::draft::{CrossMethod, CrossVocabDraft, LookupOr, NGramDraft, SuffixCache, SuffixDraft, VocabPair};
use crate::error::{Error, Result};
#[cfg(feature = "heads")]
use crate::heads::{EagleVersion, HeadDraft};
use crate::loading::{check_compatible, ModelFiles};
use crate::model::{DraftModel, KvRows, Proposal, TokenModel};
use crate::models::{Llama, WeightFormat};
use crate::pair::Pair;
use crate::tokenizer::Tokenizer;
use crate::tree::{ChildPicker, DraftTree, TreeBudget};
#[cfg(not(feature = "heads"))]
pub use no_heads::HeadDraft;

/// Which drafter to build, as written on a command line.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DrafterSpec {
    /// `model` or `model:PATH_OR_HUB_ID[@FORMAT]`: a separate model (default: the target's file
    /// with its weights as stored, e.g. the Q4_1 weights of a Q4_1 GGUF), its weights held
    /// compact (at most Q4_1's 5 bits a weight) or in `FORMAT` (`stored`, `q4_0`, …; see
    /// [`draft_source`]).
    Model(Option<String>),
    /// `ngram`: prompt lookup, no model.
    NGram,
    /// `ngram+model` or `ngram+model:PATH_OR_HUB_ID[@FORMAT]`: lookup where the context has a
    /// match of 4 or more tokens, the model (as for `model`) elsewhere (see [`LookupOr`]).
    LookupModel(Option<String>),
    /// `suffix`: lookup over this request and earlier ones (see [`SuffixDraft`]), no model.
    Suffix,
    /// `suffix+model` or `suffix+model:PATH_OR_HUB_ID[@FORMAT]`: suffix lookup where it
    /// matches 4 or more tokens, the model (as for `model`) elsewhere.
    SuffixModel(Option<String>),
    /// `layerskip:N`: the target's first N blocks, sharing its weights.
    LayerSkip(usize),
    /// `quant:TYPE`: the target's weights re-quantized at load (`q8_0`, `q4_0`, `q4k`, …).
    Quant(WeightFormat),
    /// `eagle:PATH_OR_HUB_ID`: an EAGLE-1/2 head on the target's final hidden states.
    Eagle(String),
    /// `eagle3:PATH_OR_HUB_ID`: an EAGLE-3 head on three of the target's residual streams.
    Eagle3(String),
    /// `medusa:PATH_OR_HUB_ID`: Medusa-1 heads on the target's final hidden states.
    Medusa(String),
    /// `cross:METHOD:PATH_OR_HUB_ID[@FORMAT]`: a model with another tokenizer, proposing by
    /// `METHOD` (`text` or `intersection`, see [`CrossVocabDraft`]). `model:PATH` chooses this by
    /// itself, with the intersection method (the faster of the two on SmolLM2 drafting for
    /// Qwen2.5-Coder-1.5B, greedy and sampled), when the tokenizers differ.
    Cross(CrossMethod, String),
}

impl FromStr for DrafterSpec {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let (kind, arg) = s.split_once(':').map_or((s, None), |(k, a)| (k, Some(a)));
        match (kind, arg) {
            ("model", a) => Ok(Self::Model(a.map(str::to_string))),
            ("ngram", None) => Ok(Self::NGram),
            ("ngram+model", a) => Ok(Self::LookupModel(a.map(str::to_string))),
            ("suffix", None) => Ok(Self::Suffix),
            ("suffix+model", a) => Ok(Self::SuffixModel(a.map(str::to_string))),
            ("layerskip", Some(n)) => n
                .parse()
                .map(Self::LayerSkip)
                .map_err(|_| Error::setting("drafter", s, "layerskip:N with N a number of blocks")),
            ("quant", Some(t)) => Ok(Self::Quant(t.parse()?)),
            ("eagle", Some(p)) => Ok(Self::Eagle(p.to_string())),
            ("eagle3", Some(p)) => Ok(Self::Eagle3(p.to_string())),
            ("medusa", Some(p)) => Ok(Self::Medusa(p.to_string())),
            ("cross", Some(a)) => match a.split_once(':') {
                Some((method, p)) => Ok(Self::Cross(method.parse()?, p.to_string())),
                None => Err(Error::setting("drafter", s, "cross:text:PATH or cross:intersection:PATH")),
            },
            _ => Err(Error::setting(
                "drafter",
                s,
                "model[:PATH], ngram, ngram+model[:PATH], suffix, suffix+model[:PATH], layerskip:N, quant:TYPE, eagle:PATH, eagle3:PATH, \
                 medusa:PATH or cross:METHOD:PATH",
            )),
        }
    }
}

impl std::fmt::Display for DrafterSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Model(None) => write!(f, "model"),
            Self::Model(Some(p)) => write!(f, "model:{p}"),
            Self::NGram => write!(f, "ngram"),
            Self::LookupModel(None) => write!(f, "ngram+model"),
            Self::LookupModel(Some(p)) => write!(f, "ngram+model:{p}"),
            Self::Suffix => write!(f, "suffix"),
            Self::SuffixModel(None) => write!(f, "suffix+model"),
            Self::SuffixModel(Some(p)) => write!(f, "suffix+model:{p}"),
            Self::LayerSkip(n) => write!(f, "layerskip:{n}"),
            Self::Quant(q) => write!(f, "quant:{q}"),
            Self::Eagle(p) => write!(f, "eagle:{p}"),
            Self::Eagle3(p) => write!(f, "eagle3:{p}"),
            Self::Medusa(p) => write!(f, "medusa:{p}"),
            Self::Cross(m, p) => write!(f, "cross:{m}:{p}"),
        }
    }
}

/// A drafter chosen at run time.
// One value per model, built once: the size of the larger variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Drafter {
    /// A model (separate, re-quantized or layer-skip).
    Model(Llama),
    /// Prompt lookup.
    NGram(NGramDraft),
    /// Prompt lookup where it matches, a model elsewhere.
    Lookup(LookupOr<Llama>),
    /// Suffix lookup (this request and earlier ones).
    Suffix(SuffixDraft),
    /// Suffix lookup where it matches, a model elsewhere.
    SuffixModel(LookupOr<Llama, SuffixDraft>),
    /// An EAGLE or Medusa head (with the `heads` feature).
    /// (Without the `heads` feature the variant stays, with a type that has no value: a head
    /// asked for is then a typed error from [`build`](Self::build).)
    Head(HeadDraft),
    /// A model with another tokenizer.
    Cross(CrossVocabDraft<Llama, Tokenizer>),
}

impl Drafter {
    /// Builds the drafter `spec` for `target` (loaded from `files`, with `tokenizer`). Draft
    /// heads set the target to record the hidden states they read (see
    /// [`Llama::record_hidden`]), which empties its context. A model draft with a large
    /// vocabulary scores only its first [`DRAFT_VOCAB`] ids and the added tokens (see
    /// [`limit_vocabulary`](Self::limit_vocabulary), which also undoes it), and, proposing one
    /// sequence, the ids its context brings beside them (see [`Llama::keep_outputs`]).
    ///
    /// # Errors
    /// Loading failures; [`Error::TokenizerMismatch`] for `ngram+model` with a model of
    /// another tokenizer; [`Error::HeadMismatch`] for a head made for another model;
    /// [`Error::InvalidSetting`] for a head when the crate was built without `heads`.
    pub fn build(
        spec: &DrafterSpec,
        files: &ModelFiles,
        target: &mut Llama,
        tokenizer: &Tokenizer,
        device: &Device,
    ) -> Result<Self> {
        let weights = target.weights().clone();
        let mut drafter = match spec {
            #[cfg(feature = "heads")]
            DrafterSpec::Eagle(p) => Self::Head(HeadDraft::eagle(p, EagleVersion::One, target, device)?),
            #[cfg(feature = "heads")]
            DrafterSpec::Eagle3(p) => Self::Head(HeadDraft::eagle(p, EagleVersion::Three, target, device)?),
            #[cfg(feature = "heads")]
            DrafterSpec::Medusa(p) => Self::Head(HeadDraft::medusa(p, target, device)?),
            #[cfg(not(feature = "heads"))]
            DrafterSpec::Eagle(_) | DrafterSpec::Eagle3(_) | DrafterSpec::Medusa(_) => {
                return Err(Error::setting("drafter", spec, "a drafter other than a head: built without `heads`"));
            }
            DrafterSpec::NGram => Self::NGram(NGramDraft::new(target.config().vocab_size)?),
            DrafterSpec::LayerSkip(n) => Self::Model(Llama::with_layers(weights, (0..*n).collect())?),
            DrafterSpec::Quant(format) => Self::Model(Llama::new(files.load(*format, device)?.0)?),
            DrafterSpec::Model(None) => Self::Model(Llama::new(files.load(WeightFormat::Stored, device)?.0)?),
            DrafterSpec::Model(Some(path)) => {
                let (draft, draft_tok) = model_draft(path, device)?;
                match check_compatible(Pair { target: (&files.name(), tokenizer), draft: (path, &draft_tok) }) {
                    Ok(()) => Self::Model(draft),
                    Err(Error::TokenizerMismatch { .. }) => {
                        Self::cross(draft, draft_tok, tokenizer, target, CrossMethod::Intersection)?
                    }
                    Err(e) => return Err(e),
                }
            }
            DrafterSpec::Cross(method, path) => {
                let (draft, draft_tok) = model_draft(path, device)?;
                Self::cross(draft, draft_tok, tokenizer, target, *method)?
            }
            DrafterSpec::LookupModel(None) => {
                Self::Lookup(LookupOr::new(Llama::new(files.load(WeightFormat::Stored, device)?.0)?)?)
            }
            DrafterSpec::LookupModel(Some(path)) => {
                let (draft, draft_tok) = model_draft(path, device)?;
                check_compatible(Pair { target: (&files.name(), tokenizer), draft: (path, &draft_tok) })?;
                Self::Lookup(LookupOr::new(draft)?)
            }
            DrafterSpec::Suffix => {
                Self::Suffix(SuffixDraft::new(SuffixCache::new(target.config().vocab_size, DEFAULT_CAPACITY)?)?)
            }
            DrafterSpec::SuffixModel(path) => {
                let draft = match path {
                    None => Llama::new(files.load(WeightFormat::Stored, device)?.0)?,
                    Some(path) => {
                        let (draft, draft_tok) = model_draft(path, device)?;
                        check_compatible(Pair { target: (&files.name(), tokenizer), draft: (path, &draft_tok) })?;
                        draft
                    }
                };
                let cache = SuffixCache::new(target.config().vocab_size, DEFAULT_CAPACITY)?;
                Self::SuffixModel(LookupOr::with_lookup(SuffixDraft::new(cache)?.with_min_match(4)?, draft)?)
            }
        };
        drafter.limit_vocabulary(tokenizer, Some(DRAFT_VOCAB))?;
        Ok(drafter)
    }

    /// Has a model draft (of the target's tokenizer, `tokenizer`) score only its first `rows`
    /// ids and the tokenizer's added tokens, where its vocabulary holds more than 1.5 times
    /// as many (see [`Llama::limit_output`]); `None` gives back the whole vocabulary.
    /// [`build`](Self::build) sets [`DRAFT_VOCAB`]. Returns the number of ids the draft
    /// scores (`None`: all of them, or no model draft).
    ///
    /// # Errors
    /// Engine failures.
    pub fn limit_vocabulary(&mut self, tokenizer: &Tokenizer, rows: Option<usize>) -> Result<Option<usize>> {
        let model = match self {
            Self::Model(m) => m,
            Self::Lookup(l) => l.model_mut(),
            Self::SuffixModel(l) => l.model_mut(),
            _ => return Ok(None),
        };
        let vocab = model.config().vocab_size;
        let Some(rows) = rows.filter(|&r| r > 0 && 2 * vocab > 3 * r) else {
            model.limit_output(None)?;
            return Ok(None);
        };
        let added = tokenizer.added_ids().into_iter().filter(|&id| id as usize >= rows && (id as usize) < vocab);
        let ids: Vec<u32> = (0..rows as u32).chain(added).collect();
        Ok(model.limit_output(Some(&ids))?.then_some(ids.len()))
    }

    fn cross(
        draft: Llama,
        draft_tok: Tokenizer,
        tokenizer: &Tokenizer,
        target: &Llama,
        method: CrossMethod,
    ) -> Result<Self> {
        let target_len = target.config().vocab_size;
        Ok(Self::Cross(CrossVocabDraft::new(
            draft,
            VocabPair { target: tokenizer.clone(), target_len, draft: draft_tok },
            method,
        )?))
    }

    /// A drafter of the same kind for another sequence: model drafts over the same weights
    /// and blocks, limited to the same vocabulary entries (each with its own copy of those
    /// rows, which its context's ids extend), the same suffix cache, fresh contexts. What a
    /// server makes for each slot of its batch.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] for heads and cross-vocabulary drafts (one per target
    /// instance: build them with [`build`](Self::build)).
    pub fn fork(&self) -> Result<Self> {
        let model = |m: &Llama| -> Result<Llama> {
            let mut fork = Llama::with_layers(m.weights().clone(), m.layers().to_vec())?;
            fork.limit_output(m.output_ids())?;
            Ok(fork)
        };
        Ok(match self {
            Self::Model(m) => Self::Model(model(m)?),
            Self::NGram(n) => Self::NGram(n.fork()),
            Self::Lookup(l) => Self::Lookup(LookupOr::new(model(l.model())?)?),
            Self::Suffix(s) => Self::Suffix(s.fork()),
            Self::SuffixModel(l) => Self::SuffixModel(LookupOr::with_lookup(l.lookup().fork(), model(l.model())?)?),
            _ => {
                return Err(Error::setting(
                    "drafter",
                    "a head or cross-vocabulary draft",
                    "a model, n-gram, lookup or suffix drafter",
                ))
            }
        })
    }

    /// The suffix cache of a `suffix` or `suffix+model` drafter (a clone that shares it: save
    /// it at the end of a session).
    pub fn suffix_cache(&self) -> Option<SuffixCache> {
        match self {
            Self::Suffix(s) => Some(s.cache().clone()),
            Self::SuffixModel(l) => Some(l.lookup().cache().clone()),
            _ => None,
        }
    }

    /// Has a `suffix` or `suffix+model` drafter use `cache` (one loaded from a file, or shared
    /// with other drafters) from its next generation on; other drafters are left alone.
    ///
    /// # Errors
    /// [`Error::VocabMismatch`] for a cache of another vocabulary.
    pub fn use_suffix_cache(&mut self, cache: SuffixCache) -> Result<()> {
        let vocab = self.vocab_size();
        if cache.vocab() != vocab {
            return Err(Error::VocabMismatch { draft: cache.vocab(), target: vocab });
        }
        match self {
            Self::Suffix(s) => *s = SuffixDraft::new(cache)?,
            Self::SuffixModel(l) => l.set_lookup(SuffixDraft::new(cache)?.with_min_match(4)?),
            _ => {}
        }
        Ok(())
    }

    /// What the drafter does beyond its spec, for a status line: how many token ids a model
    /// draft scores when it is limited to part of its vocabulary, or the cross-vocabulary
    /// method and how many token strings the vocabularies share.
    pub fn note(&self) -> Option<String> {
        let limited = |m: &Llama| {
            m.output_limit().map(|n| format!("the draft scores {n} of {} token ids", m.config().vocab_size))
        };
        match self {
            Self::Model(m) => limited(m),
            Self::Lookup(l) => limited(l.model()),
            Self::SuffixModel(l) => limited(l.model()),
            Self::Cross(c) => {
                Some(format!("another tokenizer: {} drafts, {} shared token strings", c.method(), c.map().shared()))
            }
            _ => None,
        }
    }
}

/// How many of its first ids a model draft with a vocabulary of more than 1.5 times as many
/// scores (with the tokenizer's added tokens). BPE ids run in merge order, roughly the order
/// of frequency in the tokenizer's training text, so these hold nearly every token of ordinary
/// text and code (98 % of a Python answer from Qwen2.5-Coder), while the output head over
/// Qwen2.5's 151,936 tokens is 37 % of the 0.5B's bytes per token. The ids a draft's context
/// holds beyond these are added as they come (see [`Llama::keep_outputs`]): the rare identifier
/// of a prompt that an edit copies stays proposable. (Not in a batch, whose drafts share one
/// limited head.) Drafting stays exact (see [`Llama::limit_output`]); it only changes which
/// drafts are proposed.
pub const DRAFT_VOCAB: usize = 65_536;

/// The model draft at `path` and its tokenizer: its weights compact, or in the format the
/// path ends with, `@FORMAT` (see [`draft_source`]).
fn model_draft(path: &str, device: &Device) -> Result<(Llama, Tokenizer)> {
    let (path, format) = draft_source(path)?;
    let (weights, draft_tok) = ModelFiles::resolve(path)?.load(format, device)?;
    Ok((Llama::new(weights)?, draft_tok))
}

/// Splits a draft's `PATH@FORMAT` into the path and the weight format to load it in
/// ([`WeightFormat::Compact`] without the suffix; `@stored` keeps the file's weights). A
/// draft's weights need not be the file's: any format keeps decoding exact, and a smaller one
/// makes the draft cheaper. Qwen2.5-Coder-0.5B, mostly Q5_0 and Q8_0 as stored, drafts about
/// as well compact, at a lower cost (docs/perf/qwen-pair.md).
///
/// # Errors
/// [`Error::InvalidSetting`] for a suffix that is no weight format (a suffix with a `/` or a
/// `.` is taken as part of the path).
pub fn draft_source(path: &str) -> Result<(&str, WeightFormat)> {
    match path.rsplit_once('@') {
        Some((file, tail)) if !tail.contains(['/', '.']) => Ok((file, tail.parse()?)),
        _ => Ok((path, WeightFormat::Compact)),
    }
}

impl TokenModel for Drafter {
    fn vocab_size(&self) -> usize {
        match self {
            Self::Model(m) => TokenModel::vocab_size(m),
            Self::NGram(n) => n.vocab_size(),
            Self::Lookup(l) => l.vocab_size(),
            Self::Suffix(l) => l.vocab_size(),
            Self::SuffixModel(l) => l.vocab_size(),
            Self::Head(h) => h.vocab_size(),
            Self::Cross(c) => c.vocab_size(),
        }
    }

    fn context_len(&self) -> usize {
        match self {
            Self::Model(m) => m.context_len(),
            Self::NGram(n) => TokenModel::context_len(n),
            Self::Lookup(l) => l.context_len(),
            Self::Suffix(l) => l.context_len(),
            Self::SuffixModel(l) => l.context_len(),
            Self::Head(h) => h.context_len(),
            Self::Cross(c) => c.context_len(),
        }
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        match self {
            Self::Model(m) => m.truncate(len),
            Self::NGram(n) => TokenModel::truncate(n, len),
            Self::Lookup(l) => l.truncate(len),
            Self::Suffix(l) => l.truncate(len),
            Self::SuffixModel(l) => l.truncate(len),
            Self::Head(h) => h.truncate(len),
            Self::Cross(c) => c.truncate(len),
        }
    }

    fn save_rows(&self, from: usize) -> Option<KvRows> {
        match self {
            Self::Model(m) => m.save_rows(from),
            Self::Lookup(l) => l.save_rows(from),
            Self::SuffixModel(l) => l.save_rows(from),
            _ => None,
        }
    }

    fn restore_rows(&mut self, tokens: &[u32], rows: &KvRows) -> Result<bool> {
        match self {
            Self::Model(m) => m.restore_rows(tokens, rows),
            Self::Lookup(l) => l.restore_rows(tokens, rows),
            Self::SuffixModel(l) => l.restore_rows(tokens, rows),
            _ => Ok(false),
        }
    }
}

impl Drafter {
    /// Widens a model draft's output limit by the ids of `tokens` it leaves out (see
    /// [`Llama::keep_outputs`]): what the context holds stays proposable.
    fn keep_outputs(&mut self, tokens: &[u32]) -> Result<()> {
        match self {
            Self::Model(m) => m.keep_outputs(tokens).map(drop),
            Self::Lookup(l) => l.model_mut().keep_outputs(tokens).map(drop),
            Self::SuffixModel(l) => l.model_mut().keep_outputs(tokens).map(drop),
            _ => Ok(()),
        }
    }
}

impl DraftModel for Drafter {
    fn propose(&mut self, tokens: &[u32]) -> Result<Proposal> {
        self.keep_outputs(tokens)?;
        match self {
            Self::Model(m) => m.propose(tokens),
            Self::NGram(n) => n.propose(tokens),
            Self::Lookup(l) => l.propose(tokens),
            Self::Suffix(l) => l.propose(tokens),
            Self::SuffixModel(l) => l.propose(tokens),
            Self::Head(h) => h.propose(tokens),
            Self::Cross(c) => c.propose(tokens),
        }
    }

    fn block_len(&mut self, ctx: &[u32], k: usize, max: usize) -> usize {
        match self {
            Self::NGram(n) => n.block_len(ctx, k, max),
            Self::Lookup(l) => l.block_len(ctx, k, max),
            Self::Suffix(l) => l.block_len(ctx, k, max),
            Self::SuffixModel(l) => l.block_len(ctx, k, max),
            _ => k,
        }
    }

    fn propose_tree(&mut self, tokens: &[u32], budget: TreeBudget, picker: &mut ChildPicker) -> Result<DraftTree> {
        self.keep_outputs(tokens)?;
        match self {
            Self::Model(m) => m.propose_tree(tokens, budget, picker),
            Self::NGram(n) => n.propose_tree(tokens, budget, picker),
            Self::Lookup(l) => l.propose_tree(tokens, budget, picker),
            Self::Suffix(l) => l.propose_tree(tokens, budget, picker),
            Self::SuffixModel(l) => l.propose_tree(tokens, budget, picker),
            Self::Head(h) => h.propose_tree(tokens, budget, picker),
            Self::Cross(c) => c.propose_tree(tokens, budget, picker),
        }
    }

    /// Model drafters over shared weights propose in one forward pass; any other mix proposes
    /// one sequence at a time.
    fn propose_batch(drafts: &mut [&mut Self], feeds: &[&[u32]]) -> Result<Vec<Proposal>> {
        let n = drafts.len();
        let mut models: Vec<&mut Llama> = Vec::with_capacity(n);
        for d in drafts.iter_mut() {
            if let Self::Model(m) = &mut **d {
                models.push(m);
            }
        }
        let shared = models.windows(2).all(|w| Arc::ptr_eq(w[0].weights(), w[1].weights()));
        if models.len() == n && shared {
            return Llama::propose_batch(&mut models, feeds);
        }
        if n != feeds.len() {
            return Err(Error::setting("batch feeds", feeds.len(), "one per draft"));
        }
        drafts.iter_mut().zip(feeds).map(|(d, feed)| d.propose(feed)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::GgmlDType;

    #[test]
    fn a_draft_path_may_name_its_weight_format() {
        assert_eq!(draft_source("d.gguf").unwrap(), ("d.gguf", WeightFormat::Compact));
        assert_eq!(draft_source("d.gguf@stored").unwrap(), ("d.gguf", WeightFormat::Stored));
        assert_eq!(draft_source("d.gguf@q4_1").unwrap(), ("d.gguf", WeightFormat::Quantized(GgmlDType::Q4_1)));
        assert_eq!(
            draft_source("hf:org/name@Q4_0").unwrap(),
            ("hf:org/name", WeightFormat::Quantized(GgmlDType::Q4_0))
        );
        // An `@` inside a path is the path's.
        assert_eq!(draft_source("/tmp/a@b/d.gguf").unwrap(), ("/tmp/a@b/d.gguf", WeightFormat::Compact));
        assert!(matches!(draft_source("d.gguf@q4_2"), Err(Error::InvalidSetting { .. })));
        let spec: DrafterSpec = "model:d.gguf@q4_1".parse().unwrap();
        assert_eq!(spec, DrafterSpec::Model(Some("d.gguf@q4_1".into())));
        assert_eq!(spec.to_string(), "model:d.gguf@q4_1");
    }
}

/// The stand-in for [`HeadDraft`] without the `heads` feature: a type with no value, so that
/// [`Drafter`] has the same variants with and without the feature.
#[cfg(not(feature = "heads"))]
mod no_heads {
    use crate::error::Result;
    use crate::model::{DraftModel, Proposal, TokenModel};
    use crate::tree::{ChildPicker, DraftTree, TreeBudget};

    /// A draft head: none can exist in a build without the `heads` feature.
    #[derive(Debug)]
    pub enum HeadDraft {}

    impl TokenModel for HeadDraft {
        fn vocab_size(&self) -> usize {
            match *self {}
        }

        fn context_len(&self) -> usize {
            match *self {}
        }

        fn truncate(&mut self, _: usize) -> Result<()> {
            match *self {}
        }
    }

    impl DraftModel for HeadDraft {
        fn propose(&mut self, _: &[u32]) -> Result<Proposal> {
            match *self {}
        }

        fn propose_tree(&mut self, _: &[u32], _: TreeBudget, _: &mut ChildPicker) -> Result<DraftTree> {
            match *self {}
        }
    }
}
