//! The two engines behind the one model type: [`Weights`] holds either engine's weights, and
//! [`Bound`] a model instance's cache with the weights it runs on, so that `Llama` calls the
//! same methods whatever the engine. (Two engines: an enum each, no trait objects.)

use std::sync::Arc;

use candle_core::Device;

use crate::error::{Error, Result};
use crate::model::KvRows;
use crate::models::candle_llama::{CandleCache, CandleWeights};
use crate::models::config::LlamaConfig;
use crate::models::engine::{Backend, BatchCall, Cache, Engine, Pass, Tap, TokenMatrices};
use crate::models::native::{NativeCache, NativeWeights};
use crate::tree::TreeShape;

/// The weights as one of the two engines holds them.
#[derive(Debug)]
pub(crate) enum Weights {
    Native(Arc<NativeWeights>),
    Candle(Arc<CandleWeights>),
}

/// A model instance's cache, with the weights (of the same engine) it runs on. One per model:
/// the size of the larger variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Bound {
    Native(Arc<NativeWeights>, NativeCache),
    Candle(Arc<CandleWeights>, CandleCache),
}

impl Weights {
    /// The model's shape.
    pub(crate) fn config(&self) -> &LlamaConfig {
        match self {
            Self::Native(w) => w.config(),
            Self::Candle(w) => w.config(),
        }
    }

    /// Bytes of weights one token's forward pass reads (native engine; `None` for candle's).
    pub(crate) fn bytes_per_token(&self) -> Option<usize> {
        match self {
            Self::Native(w) => w.bytes_per_token(),
            Self::Candle(w) => w.bytes_per_token(),
        }
    }

    /// The token embedding and output head as these weights hold them, in f32 on `device`.
    ///
    /// # Errors
    /// Backend failures.
    pub(crate) fn token_matrices(&self, device: &Device) -> Result<TokenMatrices> {
        match self {
            Self::Native(w) => w.token_matrices(device),
            Self::Candle(w) => w.token_matrices(device),
        }
    }

    /// The engine that computes the forward pass.
    pub(crate) fn engine(&self) -> Engine {
        match self {
            Self::Native(w) => w.engine(),
            Self::Candle(w) => w.engine(),
        }
    }

    /// A new instance's cache for the blocks `layers`.
    pub(crate) fn bind(&self, layers: &[usize]) -> Result<Bound> {
        Ok(match self {
            Self::Native(w) => Bound::Native(Arc::clone(w), w.new_cache(layers)?),
            Self::Candle(w) => Bound::Candle(Arc::clone(w), w.new_cache(layers)?),
        })
    }

    /// [`Backend::forward_batch`] on the caches of `bound`, which these weights made.
    pub(crate) fn forward_batch(&self, bound: &mut [&mut Bound], calls: &[BatchCall]) -> Result<Vec<Vec<f32>>> {
        let other = || Error::setting("batch", "models on other engines", "one engine");
        match self {
            Self::Native(w) => {
                let caches = bound.iter_mut().map(|b| if let Bound::Native(_, c) = b { Ok(c) } else { Err(other()) });
                w.forward_batch(&mut caches.collect::<Result<Vec<_>>>()?, calls)
            }
            Self::Candle(w) => {
                let caches = bound.iter_mut().map(|b| if let Bound::Candle(_, c) = b { Ok(c) } else { Err(other()) });
                w.forward_batch(&mut caches.collect::<Result<Vec<_>>>()?, calls)
            }
        }
    }
}

impl Bound {
    /// As [`Backend::forward_hidden`] on this cache.
    pub(crate) fn forward_hidden(&mut self, pos: usize, tokens: &[u32], rows: usize, taps: &[Tap]) -> Result<Pass> {
        match self {
            Self::Native(w, c) => w.forward_hidden(c, pos, tokens, rows, taps),
            Self::Candle(w, c) => w.forward_hidden(c, pos, tokens, rows, taps),
        }
    }

    /// As [`Backend::forward_tree`] on this cache.
    pub(crate) fn forward_tree(&mut self, pos: usize, tokens: &[u32], tree: &TreeShape, taps: &[Tap]) -> Result<Pass> {
        match self {
            Self::Native(w, c) => w.forward_tree(c, pos, tokens, tree, taps),
            Self::Candle(w, c) => w.forward_tree(c, pos, tokens, tree, taps),
        }
    }

    /// As [`Backend::keep_path`] on this cache.
    pub(crate) fn keep_path(&mut self, pos: usize, path: &[usize]) -> Result<()> {
        match self {
            Self::Native(w, c) => w.keep_path(c, pos, path),
            Self::Candle(w, c) => w.keep_path(c, pos, path),
        }
    }

    /// As [`Backend::limit_output`] on this cache.
    pub(crate) fn limit_output(&mut self, ids: Option<&[u32]>) -> Result<bool> {
        match self {
            Self::Native(w, c) => w.limit_output(c, ids),
            Self::Candle(w, c) => w.limit_output(c, ids),
        }
    }

    /// The first `to` positions' keys and values from `from` on, where the engine hands them
    /// out (the native one: its rows do not depend on how positions were split into calls, so
    /// restoring them changes no later row; candle's do not promise that).
    pub(crate) fn save_rows(&self, from: usize, to: usize) -> Option<KvRows> {
        match self {
            Self::Native(w, c) => KvRows::new(c.row_width(w.config()), c.save_rows(w.config(), from, to)).ok(),
            Self::Candle(..) => None,
        }
    }

    /// Makes `rows` the cache's first positions; false (nothing changed) on the candle engine
    /// or for rows of another width.
    pub(crate) fn restore_rows(&mut self, rows: &KvRows) -> bool {
        match self {
            Self::Native(w, c) if rows.width() == c.row_width(w.config()) => {
                c.restore_rows(w.config(), rows.as_slice());
                true
            }
            _ => false,
        }
    }

    /// The blocks this cache runs.
    pub(crate) fn blocks(&self) -> &[usize] {
        match self {
            Self::Native(_, c) => c.blocks(),
            Self::Candle(_, c) => c.blocks(),
        }
    }
}
