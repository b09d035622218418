//! A per-layer key/value cache that grows in place and rolls back by moving its length, or,
//! for training, grows by concatenation so that gradients flow through it.

use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};

/// Keys and values of shape (kv_heads, positions, head_dim); the first `len` positions are
/// live. Truncating only moves `len`, so a rejected draft costs nothing to undo.
///
/// It grows one of two ways. In place (the engines, and draft heads while drafting):
/// appending writes into spare capacity, which doubles when full, so an append costs the new
/// rows alone. Differentiably (draft heads while training): each append concatenates, a copy
/// of the whole cache, because candle's in-place `slice_set` has no backward pass; a block
/// that writes into such a cache runs candle's differentiable ops too (see
/// [`Block::forward`](crate::models::block::Block::forward)).
///
/// Not `Clone`: candle tensor clones share storage, and in-place appends to a copy would
/// overwrite the original.
#[derive(Debug)]
pub struct KvCache {
    k: Tensor,
    v: Tensor,
    len: usize,
    differentiable: bool,
}

impl KvCache {
    /// An empty cache that grows in place, with room for `capacity` positions.
    ///
    /// # Errors
    /// Backend failures.
    pub fn new(kv_heads: usize, head_dim: usize, capacity: usize, device: &Device) -> Result<Self> {
        let k = Tensor::zeros((kv_heads, capacity, head_dim), DType::F32, device)?;
        Ok(Self { v: k.zeros_like()?, k, len: 0, differentiable: false })
    }

    /// An empty cache that grows by concatenation, for passes that gradients flow back through.
    ///
    /// # Errors
    /// Backend failures.
    #[cfg_attr(not(feature = "heads"), allow(dead_code))] // used by the draft heads
    pub fn differentiable(kv_heads: usize, head_dim: usize, device: &Device) -> Result<Self> {
        Ok(Self { differentiable: true, ..Self::new(kv_heads, head_dim, 0, device)? })
    }

    /// Whether appends keep gradients (and the block writing here should too).
    pub fn is_differentiable(&self) -> bool {
        self.differentiable
    }

    /// Live positions.
    #[cfg_attr(not(feature = "heads"), allow(dead_code))] // used by the draft heads
    pub fn len(&self) -> usize {
        self.len
    }

    /// Forgets every position from `len` on (callers check `len` against the live positions).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Appends `k` and `v` of shape (kv_heads, n, head_dim) and returns all live keys and
    /// values, (kv_heads, len, head_dim) (views of the cache when it grows in place).
    ///
    /// # Errors
    /// Backend failures.
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let n = k.dim(1)?;
        if self.differentiable {
            self.k = joined(&self.k, self.len, k)?;
            self.v = joined(&self.v, self.len, v)?;
            self.len += n;
            return Ok((self.k.clone(), self.v.clone()));
        }
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
        if self.differentiable {
            self.k = joined(&self.k, pos, &k)?;
            self.v = joined(&self.v, pos, &v)?;
        } else {
            self.k.slice_set(&k, 1, pos)?;
            self.v.slice_set(&v, 1, pos)?;
        }
        self.len = pos + path.len();
        Ok(())
    }
}

/// The first `live` positions of `t`, then `new`, as one new tensor.
fn joined(t: &Tensor, live: usize, new: &Tensor) -> Result<Tensor> {
    Ok(match live {
        0 => new.clone(),
        _ => Tensor::cat(&[&t.narrow(1, 0, live)?, new], 1)?,
    })
}

fn grow(t: &Tensor, live: usize, capacity: usize) -> Result<Tensor> {
    let (heads, _, dim) = t.dims3()?;
    let bigger = Tensor::zeros((heads, capacity, dim), DType::F32, t.device())?;
    bigger.slice_set(&t.narrow(1, 0, live)?.contiguous()?, 1, 0)?;
    Ok(bigger)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(first: f32, n: usize) -> Result<Tensor> {
        let data: Vec<f32> = (0..2 * n * 3).map(|i| first + i as f32).collect();
        Ok(Tensor::from_vec(data, (2, n, 3), &Device::Cpu)?)
    }

    /// Both ways of growing hold the same keys through appends, roll-backs, growth past the
    /// capacity and a kept path.
    #[test]
    fn in_place_and_differentiable_caches_agree() -> Result<()> {
        let mut a = KvCache::new(2, 3, 2, &Device::Cpu)?;
        let mut b = KvCache::differentiable(2, 3, &Device::Cpu)?;
        for (i, n) in [2usize, 3, 1].into_iter().enumerate() {
            let (k, v) = (rows(10.0 * i as f32, n)?, rows(-10.0 * i as f32, n)?);
            let (ka, va) = a.append(&k, &v)?;
            let (kb, vb) = b.append(&k, &v)?;
            assert_eq!(ka.to_vec3::<f32>()?, kb.to_vec3::<f32>()?);
            assert_eq!(va.to_vec3::<f32>()?, vb.to_vec3::<f32>()?);
            a.truncate(a.len() - 1);
            b.truncate(b.len() - 1);
        }
        a.keep(0, &[0, 2])?;
        b.keep(0, &[0, 2])?;
        assert_eq!((a.len(), b.len()), (2, 2));
        let (ka, _) = a.append(&rows(0.5, 1)?, &rows(0.5, 1)?)?;
        let (kb, _) = b.append(&rows(0.5, 1)?, &rows(0.5, 1)?)?;
        assert_eq!(ka.to_vec3::<f32>()?, kb.to_vec3::<f32>()?);
        Ok(())
    }
}
