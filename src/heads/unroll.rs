//! An EAGLE head run over a whole sequence at several drafting depths at once, the way it
//! drafts: depth 1 reads the target's states, depth `d` reads the head's own states from
//! depth `d − 1`, and each row attends to the target-state positions up to its own and to its
//! own line of guesses (the "training-time test" of EAGLE-3). Training and evaluation use it;
//! its rows equal what [`EagleDraft`](super::EagleDraft) proposes.

use candle_core::Tensor;

use super::eagle::{EagleHead, HeadInput};
use super::layer::{mask, rope_tables, LayerCache};
use crate::error::{Error, Result};

impl EagleHead {
    /// States of `depth` drafting levels over a sequence of `tokens` (length `n` ≥ 2) whose
    /// target states are `features` `(n, width)`. Level `d` (from 1) has `n − 1` rows: row `j`
    /// is the head's guess of the target's state after token `j + d`, having read the target's
    /// states through token `j` and the tokens up to `j + d` (rows past the sequence read token
    /// 0 and are meaningless). Its logits guess token `j + d + 1`.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] for fewer than two tokens or no levels; shape mismatches.
    pub fn unroll(&self, tokens: &[u32], features: &Tensor, depth: usize) -> Result<Vec<Tensor>> {
        let n = tokens.len();
        if n < 2 || depth == 0 {
            return Err(Error::setting(
                "unrolled sequence",
                format!("{n} tokens, depth {depth}"),
                "two tokens or more, depth 1 or more",
            ));
        }
        let (rows, dev) = (n - 1, self.device().clone());
        let mut cache = LayerCache::default();
        let mut levels: Vec<Tensor> = Vec::with_capacity(depth);
        for d in 1..=depth {
            let ids: Vec<u32> = (0..rows).map(|j| tokens.get(j + d).copied().unwrap_or(0)).collect();
            let positions: Vec<usize> = (0..rows).map(|j| j + d - 1).collect();
            let (cos, sin) = rope_tables(&positions, self.head_dim(), self.rope_theta(), &dev)?;
            // Row j sees the target-state positions 0..=j and its own guesses at every level.
            let m = mask(rows, rows * d, &dev, |r, c| if c < rows { c <= r } else { c % rows == r })?;
            let input = match levels.last() {
                None => HeadInput::Target(features.narrow(0, 0, rows)?.unsqueeze(0)?),
                Some(prev) => HeadInput::Own(prev.unsqueeze(0)?),
            };
            let t = Tensor::new(&ids[..], &dev)?.unsqueeze(0)?;
            levels.push(self.step(&t, input, (&cos, &sin), &m, Some(&mut cache))?.squeeze(0)?);
        }
        Ok(levels)
    }
}
