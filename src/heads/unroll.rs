//! An EAGLE head run over a whole sequence at several drafting depths at once, the way it
//! drafts: depth 1 reads the target's states, depth `d` reads the head's own states from
//! depth `d − 1`, and each row attends to the target-state positions up to its own and to its
//! own line of guesses (the "training-time test" of EAGLE-3). Training and evaluation use it;
//! its rows equal what [`EagleDraft`](super::EagleDraft) proposes. Its cache concatenates, so
//! gradients flow through every level.

use candle_core::Tensor;

use super::eagle::{EagleHead, HeadInput};
use crate::error::{Error, Result};
use crate::models::block::mask;

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
        let rows = n - 1;
        let mut cache = self.cache(true)?;
        let mut levels: Vec<Tensor> = Vec::with_capacity(depth);
        for d in 1..=depth {
            let ids: Vec<u32> = (0..rows).map(|j| tokens.get(j + d).copied().unwrap_or(0)).collect();
            let positions: Vec<usize> = (0..rows).map(|j| j + d - 1).collect();
            // Row j sees the target-state positions 0..=j and its own guesses at every level.
            let m = mask(rows, rows * d, self.device(), |r, c| if c < rows { c <= r } else { c % rows == r })?;
            let input = match levels.last() {
                None => HeadInput::Target(features.narrow(0, 0, rows)?),
                Some(prev) => HeadInput::Own(prev.clone()),
            };
            levels.push(self.step(&ids, input, &positions, m.as_ref(), &mut cache)?);
        }
        Ok(levels)
    }
}
