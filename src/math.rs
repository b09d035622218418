//! Small numeric helpers shared by the sampling code and the native engine: a vectorizable
//! `exp`, and the `multiversion!` macro that compiles a loop for the CPU at hand.

/// Defines `fn name(args)` that runs its body compiled for AVX-512 or AVX2+FMA when the CPU has
/// them (and `SPECDEC_SIMD` does not ask for less: see [`crate::cpu`]), else for the baseline.
/// The body is inlined into copies with those features enabled, so its loops vectorize for them
/// and `mul_add` is one instruction, not a libm call.
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name($($arg: $ty),*) {
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn body($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            {
                /// # Safety
                /// The CPU has AVX-512 F and FMA.
                #[target_feature(enable = "avx512f,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx512($($arg: $ty),*) { body($($arg),*) }
                /// # Safety
                /// The CPU has AVX2 and FMA.
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2($($arg: $ty),*) { body($($arg),*) }
                let level = $crate::cpu::level();
                if level.wide() {
                    // SAFETY: the wide levels are chosen only when the CPU has AVX-512 F and FMA.
                    return unsafe { avx512($($arg),*) };
                }
                if level.simd() {
                    // SAFETY: every SIMD level is chosen only when the CPU has AVX2 and FMA.
                    return unsafe { avx2($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}

/// e^x to about 2e-7 relative error, in plain arithmetic that vectorizes (the libm call
/// does not): x = n·ln2 + r with |r| <= ln2/2, e^r by its Taylor polynomial, 2^n from the bits.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding then subtracting 1.5·2^23 rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x));
    let mut p: f32 = 1.0 / 720.0;
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = p.mul_add(r, c);
    }
    // n as an integer, read off the bits of `shifted` (1.5·2^23 + n): `n as i32`, a saturating
    // cast, stayed sixteen scalar conversions a vector and was most of SiLU's time. (A NaN
    // gives some integer here, and NaN all the same through `p`.)
    let n_int = shifted.to_bits() as i32 - 0x4B40_0000;
    p * f32::from_bits(((n_int + 127) << 23) as u32)
}

multiversion! {
    /// Σ x accumulated in f64 (eight lanes, so that it vectorizes).
    pub fn sum_into(xs: &[f32], out: &mut f64) {
        let mut lanes = [0f64; 8];
        let mut it = xs.chunks_exact(8);
        for c in &mut it {
            for l in 0..8 {
                lanes[l] += c[l] as f64;
            }
        }
        *out = lanes.iter().sum::<f64>() + it.remainder().iter().map(|&x| x as f64).sum::<f64>();
    }
}

/// Σ x accumulated in f64.
pub fn sum(xs: &[f32]) -> f64 {
    let mut total = 0.0;
    sum_into(xs, &mut total);
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_accurate() {
        for i in -8000..8000 {
            let x = i as f32 / 100.0;
            let (got, want) = (exp(x), (x as f64).exp());
            assert!(((got as f64 - want) / want).abs() < 5e-7, "exp({x}) = {got}, want {want}");
        }
        // Past the clamps, and NaN.
        assert_eq!((exp(-1e9), exp(1e9)), (exp(-87.0), exp(88.0)));
        assert!(exp(-87.0) > 0.0 && exp(88.0).is_finite() && exp(f32::NAN).is_nan());
    }

    #[test]
    fn sum_matches_f64() {
        let xs: Vec<f32> = (0..50_000).map(|i| ((i * 7919) % 1000) as f32 * 1e-3).collect();
        let want: f64 = xs.iter().map(|&x| x as f64).sum();
        assert!((sum(&xs) - want).abs() < 1e-12 * want);
    }
}
