//! The native CPU engine: the llama forward pass on plain `f32` buffers with our own kernels,
//! one persistent thread team, no allocation per token. See `models::llama` for the model
//! type that uses it.

/// Defines `fn name(args)` that runs its body compiled for AVX-512 or AVX2+FMA when the CPU has
/// them, else for the baseline. The body is inlined into copies with those features enabled, so
/// its loops vectorize for them and `mul_add` is one instruction, not a libm call.
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
                #[target_feature(enable = "avx512f,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx512($($arg: $ty),*) { body($($arg),*) }
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2($($arg: $ty),*) { body($($arg),*) }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has the features.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                    // SAFETY: as above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}

pub mod attention;
pub mod llama;
pub mod matmul;
pub mod pool;
pub mod quant;

pub use llama::{NativeCache, NativeWeights};
