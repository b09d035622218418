//! The hidden states a target records for a draft head: one row per token of its context,
//! kept in step with its roll-backs, and the rows of its last tree call until a path is kept.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Error, Result};

/// A shared log of a target's hidden states, one row of [`width`](Features::width) values per
/// context token (row `i`: the state after token `i`). The target writes it
/// ([`Llama::record_hidden`](crate::Llama::record_hidden)); a draft head reads it.
#[derive(Debug, Clone)]
pub struct Features {
    inner: Arc<Mutex<Rows>>,
}

#[derive(Debug)]
struct Rows {
    width: usize,
    data: Vec<f32>,
    /// The rows of the last tree call, one per tree token.
    tree: Vec<f32>,
}

impl Features {
    /// An empty log of rows of `width` values.
    pub(crate) fn new(width: usize) -> Self {
        Self::from_rows(width, Vec::new())
    }

    /// A log holding `rows` (row-major, `width` each) as if a target had recorded them: for
    /// evaluating heads on stored states, and for tests.
    pub fn from_rows(width: usize, rows: Vec<f32>) -> Self {
        Self { inner: Arc::new(Mutex::new(Rows { width: width.max(1), data: rows, tree: Vec::new() })) }
    }

    /// Keeps the first `len` rows (what a target's roll-back does).
    pub(crate) fn truncate(&self, len: usize) {
        let mut rows = self.lock();
        let keep = len * rows.width;
        rows.data.truncate(keep);
        rows.tree.clear();
    }

    fn lock(&self) -> MutexGuard<'_, Rows> {
        // The data stay consistent even if a holder panicked: every write is one call.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Values per row.
    pub fn width(&self) -> usize {
        self.lock().width
    }

    /// The number of rows held (the target's context length).
    pub fn len(&self) -> usize {
        let rows = self.lock();
        rows.data.len() / rows.width
    }

    /// Whether no row is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of rows `from..to`, row-major.
    ///
    /// # Errors
    /// [`Error::NotReady`] when the target has not computed them.
    pub fn rows(&self, from: usize, to: usize) -> Result<Vec<f32>> {
        let rows = self.lock();
        let w = rows.width;
        match rows.data.get(from * w..to * w) {
            Some(r) if from <= to => Ok(r.to_vec()),
            _ => Err(Error::NotReady("the target has not computed the hidden states the draft head needs")),
        }
    }

    /// Replaces the rows from `pos` on by `new`.
    pub(crate) fn write(&self, pos: usize, new: &[f32]) {
        let mut rows = self.lock();
        let keep = (pos * rows.width).min(rows.data.len());
        rows.data.truncate(keep);
        rows.data.extend_from_slice(new);
        rows.tree.clear();
    }

    /// Holds the rows of a tree call until [`keep_path`](Self::keep_path).
    pub(crate) fn set_tree(&self, tree: Vec<f32>) {
        self.lock().tree = tree;
    }

    /// Appends, at `pos`, the rows of the tree tokens `path`.
    pub(crate) fn keep_path(&self, pos: usize, path: &[usize]) {
        let mut rows = self.lock();
        let w = rows.width;
        let tree = std::mem::take(&mut rows.tree);
        rows.data.truncate(pos * w);
        for &i in path {
            if let Some(r) = tree.get(i * w..(i + 1) * w) {
                rows.data.extend_from_slice(r);
            }
        }
    }
}

/// Row `i` of each tap, concatenated, for every row: `taps` holds `tokens × hidden` each (one
/// tap is passed through as it is).
pub(crate) fn interleave(mut taps: Vec<Vec<f32>>, tokens: usize) -> Vec<f32> {
    if taps.len() == 1 {
        return taps.pop().unwrap_or_default();
    }
    let mut out = Vec::with_capacity(taps.iter().map(Vec::len).sum());
    for i in 0..tokens {
        for t in &taps {
            let h = t.len() / tokens.max(1);
            out.extend_from_slice(&t[i * h..(i + 1) * h]);
        }
    }
    out
}
