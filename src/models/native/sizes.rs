//! Buffer sizes computed from dimensions that a model file or a caller gave, checked where the
//! buffer is made: hostile dimensions are an error there, not a wrapped size that only a later
//! bounds check catches.

use crate::error::{Error, Result};

/// The product of `dims`, or [`Error::TooLarge`] naming `what` when it overflows `usize`.
pub(crate) fn product(what: &'static str, dims: &[usize]) -> Result<usize> {
    dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).ok_or_else(|| Error::TooLarge { what, dims: dims.to_vec() })
}

/// `n` rounded up to a multiple of `to` (> 0), or [`Error::TooLarge`] naming `what`.
pub(crate) fn round_up(what: &'static str, n: usize, to: usize) -> Result<usize> {
    product(what, &[n.div_ceil(to), to])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflowing_sizes_are_an_error() {
        assert_eq!(product("m", &[3, 5, 7]).ok(), Some(105));
        assert_eq!(product("m", &[]).ok(), Some(1));
        assert_eq!(product("m", &[usize::MAX, 0]).ok(), Some(0));
        assert!(matches!(product("m", &[1 << 40, 1 << 40]), Err(Error::TooLarge { what: "m", .. })));
        assert_eq!(round_up("m", 17, 16).ok(), Some(32));
        assert!(round_up("m", usize::MAX - 3, 16).is_err());
    }
}
