//! The one cost model the k chooser decides from, in the decoders (a single decoder is a batch
//! of one) and in a [`KController`](super::KController). It keeps the measured seconds of a target pass
//! by its number of rows, T(m); of a draft call by its number of rows, D(b); of the rest of a
//! step per row; and how far its predictions were off. From these and each sequence's
//! acceptance it predicts a step's tokens per second and chooses the k's that maximize it.
//! With one sequence (drafting one row a call, no catch-up, nothing else measured) the
//! prediction is `E[tokens](k, α) / (k·D(1) + T(k + 1))`, the speedup the seed maximizes.

use std::time::Instant;

use super::speedup::MIN_GAIN;
use super::RELAX;
use crate::error::Result;
use crate::model::TargetModel;
use crate::stats::expected_tokens_per_call;

/// Weight of a new measurement in the running averages.
const NEW: f64 = 0.1;

/// A T(m) curve's shape at a size comes from this many passes of that size (the fastest:
/// interruptions only ever slow a pass down, and the first pass of a size may find cold
/// caches); later passes move its level.
const SHAPE_PASSES: usize = 3;

/// Before two sizes are measured, scoring m rows is taken to cost 1 + 0.25·(m − 1) one-row
/// passes (a memory-bound pass widens cheaply), scaled through the one measured size; past the
/// largest size measured, no less than that line through it.
const PRIOR_SLOPE: f64 = 0.25;

/// How much faster than plain steps drafting must be predicted to be before drafts start whose
/// catch-up costs more than a plain step: the T(m) curve moves with the machine's load (a
/// memory-bound pass slows more than a compute-bound one when neighbours share the memory), so
/// smaller predicted gains are as likely losses, and the catch-up is spent either way. Drafts
/// already in step, or whose catch-up costs less than a step, need the gain every choice
/// needs, [`MIN_GAIN`].
const MARGIN: f64 = 0.1;

/// The most steps over which a catch-up is expected to pay back.
const PAYBACK_STEPS: f64 = 16.0;

/// One sequence as the cost model sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// Its estimated chance that a drafted position is accepted.
    pub alpha: f64,
    /// The most it may draft this step.
    pub limit: usize,
    /// Tokens its draft must catch up on before drafting (the prompt, or what it decoded
    /// plainly meanwhile).
    pub behind: usize,
    /// Tokens it has left to generate.
    pub remaining: usize,
}

/// The measured costs. Unmeasured sizes are read off the straight line through the nearest
/// measured ones (with one measured target size, off the prior line through it).
///
/// T's shape at a size comes from its first three passes (or from a calibration, see
/// [`measure`](Self::measure)); later passes move its level only, one factor for all sizes.
/// (Per-size averages would drift apart: the sizes a decoder uses grow slower as contexts
/// lengthen and the machine's speed drifts, the others keep their old times, and the curve
/// would bend toward whatever was not used lately.)
#[derive(Debug, Clone)]
pub struct CostModel {
    /// T's shape by size: the fastest pass so far over the level then, and how many passes.
    target: Vec<Option<(f64, usize)>>,
    target_level: f64,
    /// Measured over predicted throughput, for plain steps and for drafting steps: what the
    /// model misses (the curve's shape moving with the machine's load, overheads).
    bias: [f64; 2],
    draft: Vec<Option<f64>>,
    other_per_row: Option<f64>,
    /// Whether a target pass was seen. The first is a warm-up: it may find cold caches,
    /// untouched pages of the weights and buffers still to be allocated (and run markedly
    /// slower: docs/perf/adaptive.md), so it stands only until the next pass, then its size is
    /// measured again.
    warm: bool,
    /// The size whose only measurement is that warm-up pass, until the next pass.
    cold: Option<usize>,
}

impl Default for CostModel {
    fn default() -> Self {
        Self {
            target: Vec::new(),
            target_level: 1.0,
            bias: [1.0; 2],
            draft: Vec::new(),
            other_per_row: None,
            warm: false,
            cold: None,
        }
    }
}

impl CostModel {
    /// Measures T(m) on `target`: `m` copies of `token` scored after its context, then rolled
    /// back, for m from 1 to `max_rows` in steps of about 1.5× (fewer where the context runs
    /// out). Each size is timed three times and keeps its fastest, after one unkept warm-up
    /// call; a size never costs less than a smaller one. It takes about as long as scoring
    /// 1,500 rows.
    ///
    /// # Errors
    /// A failed roll-back.
    pub fn measure<T: TargetModel>(target: &mut T, token: u32, max_rows: usize) -> Result<Self> {
        let mut costs = Self { warm: true, ..Self::default() };
        let base = target.context_len();
        let sizes = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256];
        let mut time = |m: usize| -> Result<Option<f64>> {
            let start = Instant::now();
            let scored = target.forward(&vec![token; m], m);
            let secs = start.elapsed().as_secs_f64();
            target.truncate(base)?;
            Ok(scored.ok().map(|_| secs))
        };
        time(1)?;
        let mut floor = 0.0f64;
        for m in sizes.into_iter().filter(|&m| m <= max_rows.max(1)) {
            let mut best = f64::INFINITY;
            for _ in 0..SHAPE_PASSES {
                match time(m)? {
                    Some(secs) => best = best.min(secs),
                    None => return Ok(costs),
                }
            }
            floor = floor.max(best);
            set(&mut costs.target, m, Some((floor, SHAPE_PASSES)));
        }
        Ok(costs)
    }

    /// Takes over every size `other` measured that this lacks.
    pub fn merge(&mut self, other: CostModel) {
        for (size, shape) in other.target.into_iter().enumerate() {
            if shape.is_some() && !self.has_target(size) {
                set(&mut self.target, size, shape);
            }
        }
        for (size, secs) in other.draft.into_iter().enumerate() {
            if let (Some(secs), false) = (secs, self.draft.get(size).is_some_and(Option::is_some)) {
                observe(&mut self.draft, size, secs);
            }
        }
        self.other_per_row = self.other_per_row.or(other.other_per_row);
        self.warm |= other.warm;
    }

    /// Records a target pass of `rows` rows that took `secs`: the first three at its size set
    /// the curve there, later ones move the level of the whole curve. The first pass of all
    /// (unless [`measure`](Self::measure) warmed up) counts only until the next one.
    /// Impossible times (negative, NaN, infinite) are ignored.
    pub fn observe_target(&mut self, rows: usize, secs: f64) {
        if !(secs.is_finite() && secs >= 0.0) {
            return;
        }
        if let Some(size) = self.cold.take() {
            set(&mut self.target, size, None);
        }
        if !self.warm {
            (self.warm, self.cold) = (true, Some(rows));
        }
        match self.target.get(rows).copied().flatten() {
            Some((shape, SHAPE_PASSES..)) if shape > 0.0 => {
                self.target_level = (1.0 - NEW) * self.target_level + NEW * secs / shape;
            }
            Some((shape, n)) => set(&mut self.target, rows, Some((shape.min(secs / self.target_level), n + 1))),
            None => set(&mut self.target, rows, Some((secs / self.target_level, 1))),
        }
    }

    /// Records a draft call over `rows` rows that took `secs` (impossible times are ignored).
    pub fn observe_draft(&mut self, rows: usize, secs: f64) {
        if secs.is_finite() && secs >= 0.0 {
            observe(&mut self.draft, rows, secs);
        }
    }

    /// Records the rest of a step over `rows` rows (target and draft rows), `secs` in all.
    pub fn observe_other(&mut self, rows: usize, secs: f64) {
        let per_row = secs.max(0.0) / rows.max(1) as f64;
        self.other_per_row = Some(self.other_per_row.map_or(per_row, |old| (1.0 - NEW) * old + NEW * per_row));
    }

    /// True once a target pass of `rows` rows was measured.
    pub fn has_target(&self, rows: usize) -> bool {
        self.target.get(rows).is_some_and(Option::is_some)
    }

    /// True once a draft call over `rows` rows was measured.
    pub fn has_draft(&self, rows: usize) -> bool {
        self.draft.get(rows).is_some_and(Option::is_some)
    }

    /// True once any draft call was measured.
    pub fn has_any_draft(&self) -> bool {
        self.draft.iter().any(Option::is_some)
    }

    /// T(m): the seconds of a target pass of `rows` rows (`None` before any measurement).
    pub fn target_secs(&self, rows: usize) -> Option<f64> {
        let shape = |m: usize| self.target[m].map(|(secs, _)| secs);
        let prior = |m: usize| 1.0 + PRIOR_SLOPE * m.saturating_sub(1) as f64;
        let mut measured = (0..self.target.len()).filter_map(|m| shape(m).map(|v| (m, v)));
        let t = match (measured.next(), measured.next()) {
            (Some((m, v)), None) => v * prior(rows) / prior(m),
            _ => {
                // Past the largest size measured, the line through the last two may be flat
                // (a memory-bound stretch) where the pass has long turned compute-bound: no
                // flatter than the prior's slope from there, so that a size never tried does
                // not look free (the first batch to try it measures it).
                let line = estimate(self.target.len(), shape, rows)?;
                let (last, v) = (0..self.target.len()).rev().find_map(|m| shape(m).map(|v| (m, v)))?;
                if rows > last {
                    line.max(v * prior(rows) / prior(last))
                } else {
                    line
                }
            }
        };
        Some(t * self.target_level)
    }

    /// D(b): the seconds of a draft call over `rows` rows: the line through the measured
    /// sizes once there are two. Before that, a draft is taken to stream its weights in half
    /// the target's one-row time (or as measured at the one size) and to cost as much as the
    /// target for each further row (a self-draft's compute per row is the target's), so that
    /// neither a first guess nor one measured point makes a long catch-up look cheap.
    pub fn draft_secs(&self, rows: usize) -> f64 {
        if rows == 0 {
            return 0.0;
        }
        let mut measured = self.draft.iter().enumerate().filter_map(|(b, v)| v.map(|v| (b, v)));
        let (first, second) = (measured.next(), measured.next());
        if second.is_some() {
            return estimate(self.draft.len(), |b| self.draft[b], rows).unwrap_or(0.0);
        }
        let t = |m: usize| self.target_secs(m).unwrap_or(0.0);
        let (at, secs) = first.unwrap_or((1, 0.5 * t(1)));
        (secs + t(rows) - t(at)).max(0.0)
    }

    /// Records a step's measured seconds (catch-up and calibration left out) against
    /// [`step_secs`](Self::step_secs) for it: how far off the model's time is, separately for
    /// plain and drafting steps. Time only: the tokens a step emits are acceptance's business
    /// (its estimate learns them), and judging the model by them too counted every lucky or
    /// unlucky sampled round twice. (This keeps each estimate to what it can learn; see
    /// docs/perf/adaptive.md.)
    /// After a plain step, the drafting correction relaxes toward none (by `RELAX`), so that a
    /// few slow drafting steps do not rule drafting out for good.
    pub fn observe_outcome(&mut self, drafting: bool, predicted_secs: f64, measured_secs: f64) {
        if predicted_secs > 0.0 && measured_secs > 0.0 && measured_secs.is_finite() {
            let b = &mut self.bias[usize::from(drafting)];
            *b = (1.0 - NEW) * *b + NEW * (predicted_secs / measured_secs).clamp(0.2, 5.0);
        }
        if !drafting {
            self.bias[1] += RELAX * (1.0 - self.bias[1]);
        }
    }

    /// The predicted tokens per second of one step in which sequence i drafts `ks[i]` tokens,
    /// corrected by how far off such predictions were (`None` before T is measured).
    pub fn throughput(&self, seqs: &[Candidate], ks: &[usize]) -> Option<f64> {
        let drafting = ks.iter().any(|&k| k > 0);
        Some(self.predicted(seqs, ks)? * self.bias[usize::from(drafting)])
    }

    /// As [`throughput`](Self::throughput), before the correction.
    pub fn predicted(&self, seqs: &[Candidate], ks: &[usize]) -> Option<f64> {
        let tokens: f64 = seqs.iter().zip(ks).map(|(s, &k)| expected_tokens_per_call(k as f64, s.alpha)).sum();
        Some(tokens / self.step_secs(seqs, ks)?.max(1e-12))
    }

    /// The predicted seconds of one step in which sequence i drafts `ks[i]` tokens (`None`
    /// before T is measured).
    pub fn step_secs(&self, seqs: &[Candidate], ks: &[usize]) -> Option<f64> {
        let rows: usize = ks.iter().map(|k| k + 1).sum();
        let depth = ks.iter().copied().max().unwrap_or(0);
        let drafting: f64 = (0..depth).map(|j| self.draft_secs(ks.iter().filter(|&&k| k > j).count())).sum();
        let catch_up = self.catch_up_secs(seqs, ks);
        let other = self.other_per_row.unwrap_or(0.0) * (rows + ks.iter().sum::<usize>()) as f64;
        Some(self.target_secs(rows)? + drafting + catch_up + other)
    }

    /// The tokens a batch loses when sequence `i` alone drafts one token (a probe) in a step
    /// the policy runs plainly: the probe step's predicted tokens times how much faster plain
    /// steps yield them, less one. The probe pays its draft's whole catch-up, where a draft
    /// that starts drafting for good spreads it over the steps to come (`None` before T is
    /// measured).
    pub fn probe_loss(&self, seqs: &[Candidate], i: usize) -> Option<f64> {
        let mut seqs = seqs.to_vec();
        seqs.get_mut(i)?.remaining = 1;
        let seqs = &seqs[..];
        let plain = vec![0; seqs.len()];
        let mut probe = plain.clone();
        *probe.get_mut(i)? = 1;
        let tokens: f64 = seqs.iter().zip(&probe).map(|(s, &k)| expected_tokens_per_call(k as f64, s.alpha)).sum();
        let (plain, probe) = (self.throughput(seqs, &plain)?, self.throughput(seqs, &probe)?);
        Some(tokens * (plain / probe.max(1e-12) - 1.0))
    }

    /// The share of this step in the catch-up of the drafts that start drafting: one batched
    /// call over all their missed tokens, spread over the steps each has left (as if it kept
    /// drafting), but over no more than 16, so that drafting starts only where it pays the
    /// catch-up back soon (the estimates it starts from may be off, and a draft that stops
    /// again wasted it).
    fn catch_up_secs(&self, seqs: &[Candidate], ks: &[usize]) -> f64 {
        let starting = seqs.iter().zip(ks).filter(|(s, &k)| k > 0 && s.behind > 0);
        let (mut rows, mut share) = (0, 0.0);
        for (s, &k) in starting {
            rows += s.behind;
            let steps = s.remaining as f64 / expected_tokens_per_call(k as f64, s.alpha);
            share += s.behind as f64 / steps.clamp(1.0, PAYBACK_STEPS);
        }
        if rows == 0 {
            return 0.0;
        }
        self.draft_secs(rows) * (share / rows as f64).min(1.0)
    }

    /// The k of each sequence (at most its limit) with the highest predicted throughput: the
    /// best common k, then, one sequence at a time (the most accepting first, then back from
    /// the least), the best k for it with the others held; the smaller k on ties. Plain steps
    /// (all zeros) unless that beats them by `MIN_GAIN` (by 10 % where drafts must first catch
    /// up on more than a plain step's worth), and before T is measured.
    pub fn choose(&self, seqs: &[Candidate]) -> Vec<usize> {
        let max = seqs.iter().map(|s| s.limit).max().unwrap_or(0);
        let score = |ks: &[usize]| self.throughput(seqs, ks).unwrap_or(0.0);
        let common = |k: usize| -> Vec<usize> { seqs.iter().map(|s| k.min(s.limit)).collect() };
        let mut best = common(0);
        for k in 1..=max {
            let trial = common(k);
            if score(&trial) > score(&best) {
                best = trial;
            }
        }
        // Then each sequence on its own: the most accepting may draft more, the least less.
        let mut order: Vec<usize> = (0..seqs.len()).collect();
        order.sort_by(|&a, &b| seqs[b].alpha.total_cmp(&seqs[a].alpha));
        for &i in order.iter().chain(order.iter().rev()) {
            for k in 0..=seqs[i].limit {
                let mut trial = best.clone();
                trial[i] = k;
                if score(&trial) > score(&best) {
                    best = trial;
                }
            }
        }
        // A predicted gain within the estimates' error is not worth starting drafts that must
        // catch up first; drafts already in step keep drafting while it is predicted to pay.
        let plain = common(0);
        let gain = if self.risky_start(seqs, &best) { 1.0 + MARGIN } else { MIN_GAIN };
        if score(&best) < gain * score(&plain) {
            return plain;
        }
        best
    }

    /// Whether drafts that must catch up start in `ks` and their catch-up, one batched draft
    /// call over all the tokens they missed, costs more than a plain step: a start that is
    /// spent either way if the predicted gain was the estimates' error. (A catch-up cheaper
    /// than a step risks less than the step.)
    fn risky_start(&self, seqs: &[Candidate], ks: &[usize]) -> bool {
        let missed: usize = seqs.iter().zip(ks).filter(|&(_, &k)| k > 0).map(|(s, _)| s.behind).sum();
        let plain = vec![0; seqs.len()];
        missed > 0 && self.step_secs(seqs, &plain).is_none_or(|step| self.draft_secs(missed) > step)
    }
}

fn set<V>(table: &mut Vec<Option<V>>, size: usize, value: Option<V>) {
    if table.len() <= size {
        table.resize_with(size + 1, || None);
    }
    table[size] = value;
}

fn observe(table: &mut Vec<Option<f64>>, size: usize, secs: f64) {
    let old = table.get(size).copied().flatten();
    set(table, size, Some(old.map_or(secs, |old| (1.0 - NEW) * old + NEW * secs)));
}

/// The value measured at `size` (`value` of each size below `len`), or the line through the
/// nearest measured sizes around it (or the two nearest on one side; a single measurement
/// scales in proportion).
fn estimate(len: usize, value: impl Fn(usize) -> Option<f64>, size: usize) -> Option<f64> {
    if let Some(v) = (size < len).then(|| value(size)).flatten() {
        return Some(v);
    }
    // Measured points, nearest first, below and above `size` (no allocation: the policy asks
    // this hundreds of times a step).
    let point = |m: usize| value(m).map(|v| (m as f64, v));
    let mut below = (0..size.min(len)).rev().filter_map(point);
    let mut above = (size + 1..len).filter_map(point);
    let (a, b) = match (below.next(), above.next()) {
        (Some(a), Some(b)) => (a, b),
        (Some(b), None) => match below.next() {
            Some(a) => (a, b),
            None => return Some(b.1 * size as f64 / b.0.max(1.0)),
        },
        (None, Some(a)) => match above.next() {
            Some(b) => (a, b),
            None => return Some(a.1 * size as f64 / a.0.max(1.0)),
        },
        (None, None) => return None,
    };
    let slope = ((b.1 - a.1) / (b.0 - a.0)).max(0.0);
    Some((a.1 + slope * (size as f64 - a.0)).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// T(m) of a pass that streams its weights in 10 ms, then turns compute-bound at 4 rows;
    /// a draft call that costs `draft_ms` for one row and 30 % more for each further one.
    fn costs(draft_ms: f64) -> CostModel {
        let mut c = CostModel::default();
        c.observe_target(1, 1.0); // the warm-up, replaced by the next pass
        for m in [1, 2, 4, 8, 16, 32, 64, 128] {
            c.observe_target(m, 0.010f64.max(0.0025 * m as f64));
        }
        for b in [1, 8] {
            c.observe_draft(b, draft_ms / 1000.0 * (0.7 + 0.3 * b as f64));
        }
        c
    }

    fn seq(alpha: f64, limit: usize) -> Candidate {
        Candidate { alpha, limit, behind: 0, remaining: 100 }
    }

    #[test]
    fn estimates_follow_the_measured_points() {
        let c = costs(1.0);
        assert_eq!(c.target_secs(8), Some(0.02));
        assert!((c.target_secs(12).unwrap_or(0.0) - 0.03).abs() < 1e-12);
        assert!((c.target_secs(256).unwrap_or(0.0) - 0.64).abs() < 1e-9);
        assert!((c.draft_secs(4) - 0.0019).abs() < 1e-12);
        // Slower passes later move the whole curve, in proportion.
        let mut slow = c.clone();
        for _ in 0..200 {
            slow.observe_target(4, 0.020);
        }
        assert!((slow.target_secs(4).unwrap_or(0.0) - 0.020).abs() < 1e-9);
        assert!((slow.target_secs(64).unwrap_or(0.0) - 0.32).abs() < 1e-6);
        assert_eq!(CostModel::default().target_secs(3), None);
        assert_eq!(CostModel::default().draft_secs(3), 0.0);
        // Before two draft sizes are measured: half the target's one-row time, plus what the
        // target adds per row.
        let mut fresh = CostModel::default();
        fresh.observe_target(1, 0.5);
        fresh.observe_target(1, 0.010);
        fresh.observe_target(8, 0.020);
        assert!((fresh.draft_secs(1) - 0.005).abs() < 1e-12);
        assert!((fresh.draft_secs(8) - 0.015).abs() < 1e-12);
        fresh.observe_draft(2, 0.004);
        assert!((fresh.draft_secs(8) - (0.004 + 0.020 - 0.010 - 0.010 / 7.0)).abs() < 1e-9);
    }

    #[test]
    fn sizes_past_the_largest_measured_are_not_free() {
        // Passes of 2 and 8 rows measured alike (a memory-bound stretch): 48 rows are not read
        // off that flat line but rise from 8 rows at least as the prior does.
        let mut c = CostModel::default();
        c.observe_target(1, 1.0);
        for m in [2, 8] {
            c.observe_target(m, 0.010);
        }
        assert_eq!(c.target_secs(5), Some(0.010));
        let t48 = c.target_secs(48).unwrap_or(0.0);
        assert!((t48 - 0.010 * (1.0 + 0.25 * 47.0) / (1.0 + 0.25 * 7.0)).abs() < 1e-12, "{t48}");
    }

    #[test]
    fn speculation_shrinks_as_the_batch_grows() {
        let c = costs(1.0);
        let ks = |b: usize| c.choose(&vec![seq(0.8, 8); b]);
        let one: usize = ks(1).iter().sum();
        let sixteen = ks(16);
        assert!(one >= 3, "batch 1 drafts {one}");
        assert!(sixteen.iter().all(|&k| k == 0), "batch 16 drafts {sixteen:?}");
    }

    #[test]
    fn sequences_that_reject_draft_less() {
        let c = costs(1.0);
        let ks = c.choose(&[seq(0.95, 8), seq(0.05, 8)]);
        assert!(ks[0] > ks[1], "{ks:?}");
        // Limits hold, and nothing is drafted before T is measured.
        assert!(c.choose(&[seq(0.9, 1), seq(0.9, 0)]).iter().zip([1, 0]).all(|(k, l)| *k <= l));
        assert_eq!(CostModel::default().choose(&[seq(0.9, 4)]), vec![0]);
    }

    #[test]
    fn a_probe_in_a_large_batch_costs_the_batch_tokens() {
        let c = costs(1.0);
        // Alone, drafting one token beats a plain step: a probe loses nothing.
        assert!(c.probe_loss(&[seq(0.8, 8)], 0).unwrap() < 0.0);
        // In a batch of 16 that steps plainly, the probe adds a row and a draft call to a step
        // of all 16, and the draft's whole catch-up where it fell behind.
        let batch = vec![seq(0.8, 8); 16];
        assert!(c.choose(&batch).iter().all(|&k| k == 0));
        let in_step = c.probe_loss(&batch, 3).unwrap();
        let behind = c.probe_loss(&vec![Candidate { behind: 40, ..seq(0.8, 8) }; 16], 3).unwrap();
        assert!(in_step > 0.0 && behind > in_step + 0.5, "{in_step} {behind}");
        assert_eq!(c.probe_loss(&batch, 16), None);
    }

    #[test]
    fn a_long_catch_up_keeps_a_draft_idle() {
        let c = costs(1.0);
        assert!(c.choose(&[seq(0.8, 4)])[0] > 0);
        // Catching up on 2,000 tokens does not pay back soon enough; on 30 it does.
        let behind = Candidate { behind: 2000, remaining: 10_000, ..seq(0.8, 4) };
        assert_eq!(c.choose(&[behind]), vec![0]);
        assert!(c.choose(&[Candidate { behind: 30, ..behind }])[0] > 0);
    }

    #[test]
    fn a_shape_is_the_fastest_of_three_passes_and_later_ones_move_the_level() {
        let mut c = CostModel::default();
        c.observe_target(2, 0.09);
        assert_eq!(c.target_secs(2), Some(0.09), "the warm-up stands until the next pass");
        for secs in [0.03, 0.02, 0.025] {
            c.observe_target(2, secs);
        }
        assert_eq!(c.target_secs(2), Some(0.02), "the first (0.09) was a warm-up");
        // One measured size: the prior line through it (1 + 0.25 per further row).
        assert!((c.target_secs(1).unwrap_or(0.0) - 0.016).abs() < 1e-12);
        assert!((c.target_secs(5).unwrap_or(0.0) - 0.032).abs() < 1e-12);
        c.observe_target(2, 0.04);
        assert!((c.target_secs(2).unwrap_or(0.0) - 0.022).abs() < 1e-12);
        // Impossible times change nothing.
        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            c.observe_target(2, bad);
            c.observe_target(3, bad);
            c.observe_draft(1, bad);
        }
        assert!((c.target_secs(2).unwrap_or(0.0) - 0.022).abs() < 1e-12);
        assert!(!c.has_target(3) && !c.has_draft(1));
    }

    #[test]
    fn one_sequence_gets_the_k_of_the_speedup_formula() {
        // A batch of one that drafts one row a call is the single decoder's choice:
        // E[tokens](k, α) / (k·D(1) + T(k + 1)), plain below a 3 % gain.
        for (draft_ms, slope) in [(0.5, 0.02), (1.5, 0.1), (4.0, 0.3), (12.0, 0.05)] {
            let mut c = CostModel::default();
            c.observe_target(1, 1.0);
            for m in 1..=9 {
                c.observe_target(m, 0.010 * (1.0 + slope * (m - 1) as f64));
            }
            c.observe_draft(1, draft_ms / 1000.0);
            let verify: Vec<f64> = (1..=9).map(|m| c.target_secs(m).unwrap_or(0.0)).collect();
            for alpha in [0.2, 0.5, 0.7, 0.85, 0.95] {
                let single = crate::adaptive::best_k(alpha, c.draft_secs(1), &verify);
                assert_eq!(c.choose(&[seq(alpha, 8)]), vec![single], "D {draft_ms} ms, slope {slope}, α {alpha}");
            }
        }
    }
}
