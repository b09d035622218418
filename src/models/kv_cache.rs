//! A per-layer key/value cache that grows in place and rolls back by moving its length.

use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};

/// Keys and values of shape (kv_heads, capacity, head_dim); the first `len` positions are live.
/// Appending writes in place; truncating only moves `len`, so a rejected draft costs nothing to
/// undo. Capacity doubles when full. Not `Clone`: candle tensor clones share storage, and
/// in-place appends to a copy would overwrite the original.
#[derive(Debug)]
pub struct KvCache {
    k: Tensor,
    v: Tensor,
    len: usize,
}

impl KvCache {
    /// An empty cache with room for `capacity` positions.
    ///
    /// # Errors
    /// Backend failures.
    pub fn new(kv_heads: usize, head_dim: usize, capacity: usize, device: &Device) -> Result<Self> {
        let k = Tensor::zeros((kv_heads, capacity, head_dim), DType::F32, device)?;
        Ok(Self { v: k.zeros_like()?, k, len: 0 })
    }

    /// Forgets every position from `len` on (callers check `len` against the live positions).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Appends `k` and `v` of shape (kv_heads, n, head_dim) and returns views of all live keys
    /// and values, (kv_heads, len, head_dim).
    ///
    /// # Errors
    /// Backend failures.
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let n = k.dim(1)?;
        let capacity = self.k.dim(1)?;
        if self.len + n > capacity {
            let grown = (capacity * 2).max(self.len + n);
            self.k = grow(&self.k, self.len, grown)?;
            self.v = grow(&self.v, self.len, grown)?;
        }
        self.k.slice_set(k, 1, self.len)?;
        self.v.slice_set(v, 1, self.len)?;
        self.len += n;
        Ok((self.k.narrow(1, 0, self.len)?, self.v.narrow(1, 0, self.len)?))
    }
}

impl KvCache {
    /// Keeps the positions `pos + path[j]` at `pos + j` (a tree's accepted path, see
    /// `Backend::keep_path`) and forgets the rest from `pos + path.len()` on.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] for a path outside the live positions; backend failures.
    pub fn keep(&mut self, pos: usize, path: &[usize]) -> Result<()> {
        if path.iter().any(|&t| pos + t >= self.len) {
            return Err(Error::setting("kept path", format!("{path:?}"), "tokens of the last tree call"));
        }
        let at = Tensor::new(path.iter().map(|&t| (pos + t) as u32).collect::<Vec<u32>>(), self.k.device())?;
        let (k, v) = (self.k.index_select(&at, 1)?, self.v.index_select(&at, 1)?);
        self.k.slice_set(&k, 1, pos)?;
        self.v.slice_set(&v, 1, pos)?;
        self.len = pos + path.len();
        Ok(())
    }
}

fn grow(t: &Tensor, live: usize, capacity: usize) -> Result<Tensor> {
    let (heads, _, dim) = t.dims3()?;
    let bigger = Tensor::zeros((heads, capacity, dim), DType::F32, t.device())?;
    bigger.slice_set(&t.narrow(1, 0, live)?.contiguous()?, 1, 0)?;
    Ok(bigger)
}
