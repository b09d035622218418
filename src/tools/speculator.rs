//! Predictors of an agent's next tool call: the [`Speculator`] trait, a history-based
//! predictor, and an adapter through which a language model proposes the call.

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::model::TargetModel;
use crate::plain::PlainDecoder;
use crate::sampling::SamplingConfig;
use crate::stats::FinishReason;
use crate::tools::ToolCall;

/// Guesses the call an agent will make next, from the calls it has made so far in the episode.
pub trait Speculator {
    /// The predicted next call after `trajectory`, or `None` to not speculate this turn.
    ///
    /// # Errors
    /// Whatever the predictor's machinery raises (a model failure, a bad prompt). The agent loop
    /// may treat an error like `None`: speculation is an optimization.
    fn predict(&mut self, trajectory: &[ToolCall]) -> Result<Option<ToolCall>>;

    /// Learns that the agent called `actual` after `trajectory`. The default ignores it.
    fn observe(&mut self, trajectory: &[ToolCall], actual: &ToolCall) {
        let _ = (trajectory, actual);
    }
}

impl<S: Speculator + ?Sized> Speculator for &mut S {
    fn predict(&mut self, trajectory: &[ToolCall]) -> Result<Option<ToolCall>> {
        (**self).predict(trajectory)
    }

    fn observe(&mut self, trajectory: &[ToolCall], actual: &ToolCall) {
        (**self).observe(trajectory, actual)
    }
}

/// How often, and how recently, one call followed another.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    count: u64,
    last: u64,
}

/// Predicts the call that most often followed the previous call (the first call of an episode
/// follows "nothing"). Ties go to the most recent. When the previous call was never seen
/// before, it falls back to the most frequent call overall.
///
/// # Example
/// ```
/// use serde_json::json;
/// use specdec::tools::{HistoryPredictor, Speculator, ToolCall};
/// let (search, fetch) = (ToolCall::new("search", json!({"q": "x"})), ToolCall::new("fetch", json!({"id": 1})));
/// let mut p = HistoryPredictor::new();
/// p.observe(&[], &search);
/// p.observe(&[search.clone()], &fetch);
/// assert_eq!(p.predict(&[search.clone()])?, Some(fetch));
/// # Ok::<(), specdec::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct HistoryPredictor {
    next: HashMap<Option<ToolCall>, HashMap<ToolCall, Seen>>,
    overall: HashMap<ToolCall, Seen>,
    clock: u64,
}

impl HistoryPredictor {
    /// A predictor that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of calls observed.
    pub fn observed(&self) -> u64 {
        self.clock
    }
}

fn best(counts: &HashMap<ToolCall, Seen>) -> Option<ToolCall> {
    counts.iter().max_by_key(|(_, s)| (s.count, s.last)).map(|(call, _)| call.clone())
}

fn bump(counts: &mut HashMap<ToolCall, Seen>, call: &ToolCall, clock: u64) {
    let seen = counts.entry(call.clone()).or_default();
    seen.count += 1;
    seen.last = clock;
}

impl Speculator for HistoryPredictor {
    fn predict(&mut self, trajectory: &[ToolCall]) -> Result<Option<ToolCall>> {
        let after = self.next.get(&trajectory.last().cloned()).and_then(best);
        Ok(after.or_else(|| best(&self.overall)))
    }

    fn observe(&mut self, trajectory: &[ToolCall], actual: &ToolCall) {
        self.clock += 1;
        bump(self.next.entry(trajectory.last().cloned()).or_default(), actual, self.clock);
        bump(&mut self.overall, actual, self.clock);
    }
}

/// A language model in "speculator mode": `render` writes the trajectory as a prompt asking for
/// the next call, the model decodes it greedily (at most `max_tokens`, ending at a stop token),
/// and `parse` reads the tokens back as a call (`None` when they are not one).
///
/// Each prediction re-prefills the prompt through [`PlainDecoder`]; a serving stack that reuses
/// the agent's prefix KV cache makes σ smaller than measured here.
///
/// # Example
/// ```
/// use serde_json::json;
/// use specdec::{toy::MarkovModel, tools::{ModelSpeculator, Speculator, ToolCall}};
/// // Token t is always followed by t + 1: tool "t3" is predicted after tool "t2".
/// let table = (0..4).flat_map(|t| (0..4).map(move |u| if u == (t + 1) % 4 { 1.0 } else { 0.0 }));
/// let model = MarkovModel::new(4, 1, table.collect())?;
/// let render = |calls: &[ToolCall]| Ok(vec![calls.last().map_or(0, |c| c.name().trim_start_matches('t').parse().unwrap_or(0))]);
/// let parse = |tokens: &[u32]| tokens.first().map(|t| ToolCall::new(format!("t{t}"), json!(null)));
/// let mut spec = ModelSpeculator::new(model, render, parse, 1)?;
/// let got = spec.predict(&[ToolCall::new("t2", json!(null))])?;
/// assert_eq!(got, Some(ToolCall::new("t3", json!(null))));
/// # Ok::<(), specdec::Error>(())
/// ```
pub struct ModelSpeculator<M, R, P> {
    model: M,
    render: R,
    parse: P,
    max_tokens: usize,
    stop_tokens: Vec<u32>,
}

impl<M, R, P> std::fmt::Debug for ModelSpeculator<M, R, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelSpeculator")
            .field("max_tokens", &self.max_tokens)
            .field("stop_tokens", &self.stop_tokens)
            .finish_non_exhaustive()
    }
}

impl<M, R, P> ModelSpeculator<M, R, P>
where
    M: TargetModel,
    R: FnMut(&[ToolCall]) -> Result<Vec<u32>>,
    P: FnMut(&[u32]) -> Option<ToolCall>,
{
    /// An adapter decoding at most `max_tokens` tokens per prediction.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] when `max_tokens` is 0.
    pub fn new(model: M, render: R, parse: P, max_tokens: usize) -> Result<Self> {
        if max_tokens == 0 {
            return Err(Error::setting("max_tokens", max_tokens, "at least 1"));
        }
        Ok(Self { model, render, parse, max_tokens, stop_tokens: Vec::new() })
    }

    /// Tokens that end the call's text (not passed to `parse`).
    pub fn stop_tokens(mut self, tokens: impl IntoIterator<Item = u32>) -> Self {
        self.stop_tokens = tokens.into_iter().collect();
        self
    }

    /// Gives the model back.
    pub fn into_inner(self) -> M {
        self.model
    }
}

impl<M, R, P> Speculator for ModelSpeculator<M, R, P>
where
    M: TargetModel,
    R: FnMut(&[ToolCall]) -> Result<Vec<u32>>,
    P: FnMut(&[u32]) -> Option<ToolCall>,
{
    fn predict(&mut self, trajectory: &[ToolCall]) -> Result<Option<ToolCall>> {
        let prompt = (self.render)(trajectory)?;
        let mut decoder = PlainDecoder::new(&mut self.model, SamplingConfig::greedy())
            .max_new_tokens(self.max_tokens)
            .stop_tokens(self.stop_tokens.iter().copied());
        let generation = decoder.generate(&prompt)?;
        let mut tokens = generation.tokens.as_slice();
        if generation.finish == FinishReason::Stop {
            tokens = tokens.split_last().map_or(tokens, |(_, rest)| rest);
        }
        Ok((self.parse)(tokens))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn call(name: &str) -> ToolCall {
        ToolCall::new(name, json!({}))
    }

    #[test]
    fn history_follows_the_most_frequent_successor() {
        let mut p = HistoryPredictor::new();
        assert_eq!(p.predict(&[]).unwrap(), None);
        for episode in [["a", "b", "c"], ["a", "b", "d"], ["a", "b", "d"]] {
            let calls: Vec<ToolCall> = episode.iter().map(|n| call(n)).collect();
            for i in 0..calls.len() {
                p.observe(&calls[..i], &calls[i]);
            }
        }
        assert_eq!(p.observed(), 9);
        assert_eq!(p.predict(&[]).unwrap(), Some(call("a")));
        assert_eq!(p.predict(&[call("a")]).unwrap(), Some(call("b")));
        assert_eq!(p.predict(&[call("a"), call("b")]).unwrap(), Some(call("d")));
        // Never seen as a predecessor: the most frequent call overall (a and b tie; b is newer).
        assert_eq!(p.predict(&[call("zzz")]).unwrap(), Some(call("b")));
    }
}
