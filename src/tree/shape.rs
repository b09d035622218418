//! The attention layout of a tree call: which tokens of the call each token sees.

use crate::error::{Error, Result};

/// The shape of a tree call: each token's depth below the root (token 0) and which tokens of
/// the call it sees (its ancestors and itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeShape {
    depth: Vec<usize>,
    /// `sees[i][j]` for `j <= i`: token `j` is token `i` or one of its ancestors.
    sees: Vec<Vec<bool>>,
}

impl TreeShape {
    /// The tree whose token `i` (for `i >= 1`) hangs under token `parents[i - 1]`.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] when a parent is not an earlier token.
    pub fn new(parents: &[usize]) -> Result<Self> {
        let (mut depth, mut sees) = (vec![0], vec![vec![true]]);
        for (i, &p) in parents.iter().enumerate().map(|(i, p)| (i + 1, p)) {
            if p >= i {
                return Err(Error::setting("tree parent", p, "the index of an earlier token"));
            }
            depth.push(depth[p] + 1);
            let mut row = sees[p].clone();
            row.resize(i, false);
            row.push(true);
            sees.push(row);
        }
        Ok(Self { depth, sees })
    }

    /// Tokens in the tree, the root included.
    pub fn len(&self) -> usize {
        self.depth.len()
    }

    /// Always false: the root is a token.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Token `i`'s depth (the root's is 0).
    pub fn depth(&self, i: usize) -> usize {
        self.depth[i]
    }

    /// Which tokens `0..=i` token `i` sees.
    pub fn sees(&self, i: usize) -> &[bool] {
        &self.sees[i]
    }

    /// True when every token follows the one before (a plain block).
    pub fn is_chain(&self) -> bool {
        self.depth.iter().enumerate().all(|(i, &d)| i == d)
    }
}
