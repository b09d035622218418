//! A toy target that misbehaves on a chosen forward call, for the error and batch tests.

use specdec::toy::MarkovModel;
use specdec::TokenModel;
use specdec::{Error, Logits, Result, TargetModel};

/// A toy target that misbehaves on its `fail_at`-th forward call.
#[derive(Clone)]
pub struct Faulty {
    pub inner: MarkovModel,
    pub calls: usize,
    pub fail_at: usize,
    pub fault: Fault,
}

#[derive(Debug, Clone, Copy)]
pub enum Fault {
    NanLogits,
    InfLogits,
    WrongRows,
    Fails,
}

impl TokenModel for Faulty {
    fn vocab_size(&self) -> usize {
        self.inner.vocab()
    }

    fn context_len(&self) -> usize {
        TokenModel::context_len(&self.inner)
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        TokenModel::truncate(&mut self.inner, len)
    }
}

impl TargetModel for Faulty {
    fn forward(&mut self, tokens: &[u32], rows: usize) -> Result<Logits> {
        self.calls += 1;
        let logits = self.inner.forward(tokens, rows)?;
        if self.calls != self.fail_at {
            return Ok(logits);
        }
        let mut data = logits.as_slice().to_vec();
        match self.fault {
            Fault::NanLogits => data[0] = f32::NAN,
            Fault::InfLogits => data[1] = f32::INFINITY,
            Fault::WrongRows => data.extend(logits.row(0).to_vec()),
            Fault::Fails => return Err(Error::setting("fault", "injected", "no failure")),
        }
        Logits::new(data, logits.vocab())
    }
}
