//! A first estimate of the costs the adaptive k decides from, measured on a pair of models
//! over a short context before any request (the server does it when it starts): without it the
//! first round measures the draft with a drafted token, which pays the draft's catch-up on that
//! sequence's whole prompt.

use std::time::Instant;

use super::CostModel;
use crate::error::Result;
use crate::model::{DraftModel, TargetModel};

/// Tokens of the context the calls are timed after.
const CONTEXT: usize = 16;

impl CostModel {
    /// Times target calls of 1 to 9 rows and one-token draft calls after a context of 16 tokens
    /// of id 0, twice each, and leaves both models empty: what the adaptive k needs before it
    /// can choose (hand it to [`BatchDecoder::learn_costs`](crate::BatchDecoder::learn_costs)).
    /// It costs about 30 one-row target passes.
    ///
    /// # Errors
    /// Model failures.
    pub fn warm<T: TargetModel, D: DraftModel>(target: &mut T, draft: &mut D) -> Result<CostModel> {
        let ctx = [0u32; CONTEXT];
        let mut costs = CostModel::default();
        target.truncate(0)?;
        draft.truncate(0)?;
        target.forward(&ctx, 0)?;
        draft.propose(&ctx)?;
        for _ in 0..2 {
            for rows in [1, 2, 3, 5, 9] {
                let start = Instant::now();
                target.forward(&ctx[..rows], rows)?;
                costs.observe_target(rows, start.elapsed().as_secs_f64());
                target.truncate(CONTEXT)?;
            }
            let seen = draft.context_len();
            let start = Instant::now();
            draft.propose(&ctx[..1])?;
            costs.observe_draft(1, start.elapsed().as_secs_f64());
            draft.truncate(seen)?;
        }
        target.truncate(0)?;
        draft.truncate(0)?;
        Ok(costs)
    }
}
