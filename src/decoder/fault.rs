//! Batch bugs that the tests inject on purpose, to show that their statistics catch each one
//! (`tests/batch.rs`, the `batch_power_*` tests). Not for use: a batch with a fault set emits
//! the wrong distribution, or the wrong tokens, by design. Without the `fault-injection`
//! feature the hooks are empty and inlined, so that no build for use carries them; with it and
//! no fault set (always, outside those tests) every method here does nothing.

use rand::rngs::StdRng;
#[cfg(feature = "fault-injection")]
use rand::SeedableRng;

use super::member::Member;
#[cfg(feature = "fault-injection")]
use super::member::SeqId;

/// A batch bug to inject with `BatchDecoder::inject_fault` (feature `fault-injection`).
#[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Every sequence draws from one random number generator, instead of each from its own:
    /// a sequence's tokens then depend on its batch.
    SharedRng,
    /// At the first step after a sequence joins or leaves, each sequence's first draft is
    /// judged against the q row its slot held the step before (another sequence's, or its own
    /// from another round), while the token was drawn from the fresh row.
    StaleQ,
    /// Each sequence's roll-back after judging is applied to the next sequence's models.
    WrongRollBack,
}

/// The fault a batch carries, with the state it needs.
#[cfg(feature = "fault-injection")]
pub(crate) struct Injected {
    fault: Option<Fault>,
    /// [`Fault::SharedRng`]'s generator.
    rng: StdRng,
    /// [`Fault::StaleQ`]: each slot's first q row and occupant at the last step.
    rows: Vec<Vec<f32>>,
    ids: Vec<SeqId>,
}

#[cfg(feature = "fault-injection")]
impl Injected {
    pub fn new(fault: Option<Fault>) -> Self {
        Self { fault, rng: StdRng::seed_from_u64(0), rows: Vec::new(), ids: Vec::new() }
    }

    /// [`Fault::SharedRng`]: swaps the shared generator with a sequence's own (call again to
    /// swap it back).
    pub fn swap_rng(&mut self, rng: &mut StdRng) {
        if self.fault == Some(Fault::SharedRng) {
            std::mem::swap(rng, &mut self.rng);
        }
    }

    /// [`Fault::StaleQ`], after drafting: on a step whose sequences differ from the last
    /// step's, gives each sequence's first q row the one its slot held last step.
    pub fn stale_q<T, D>(&mut self, seqs: &mut [Member<T, D>]) {
        if self.fault != Some(Fault::StaleQ) {
            return;
        }
        let ids: Vec<SeqId> = seqs.iter().map(|s| s.id).collect();
        let changed = ids != self.ids;
        self.rows.resize_with(seqs.len(), Vec::new);
        for (s, old) in seqs.iter_mut().zip(&mut self.rows) {
            if let Some(q) = s.seq.block.q_row_mut(0) {
                if changed && old.len() == q.len() {
                    std::mem::swap(q, old);
                } else {
                    old.clone_from(q);
                }
            }
        }
        self.ids = ids;
    }

    /// Which of `n` sequences the roll-back of sequence `i` is applied to.
    pub fn roll_back_slot(&self, i: usize, n: usize) -> usize {
        match self.fault {
            Some(Fault::WrongRollBack) => (i + 1) % n,
            _ => i,
        }
    }
}

/// Without the feature: no fault, no state, and hooks that compile to nothing.
#[cfg(not(feature = "fault-injection"))]
pub(crate) struct Injected;

#[cfg(not(feature = "fault-injection"))]
impl Injected {
    pub fn new(_: Option<Fault>) -> Self {
        Self
    }

    #[inline(always)]
    pub fn swap_rng(&mut self, _: &mut StdRng) {}

    #[inline(always)]
    pub fn stale_q<T, D>(&mut self, _: &mut [Member<T, D>]) {}

    #[inline(always)]
    pub fn roll_back_slot(&self, i: usize, _: usize) -> usize {
        i
    }
}
