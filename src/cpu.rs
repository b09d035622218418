//! Which SIMD kernels this CPU runs: detected once, the first time a kernel asks.
//!
//! Each kernel family has a variant per instruction-set level (see [`Level`]); the level is the
//! best one the CPU has, or a lower one named by the environment variable `SPECDEC_SIMD`
//! (`portable`, `avx2`, `avxvnni`, `avx512`, `avx512vnni`), so that a machine with AVX-512 can
//! run and time the kernels an AVX2 laptop gets. A level the CPU lacks is never chosen: the
//! variable then falls back to the detected level (and [`Kernels::forced`] says so).
//!
//! What each CPU gets:
//!
//! | CPU | f32 products | quantized products | element-wise loops |
//! |---|---|---|---|
//! | AVX-512 with VNNI (Zen 4 and 5, Intel Ice Lake and later servers) | avx512 | avx512vnni | avx512 |
//! | AVX-512 without VNNI (Skylake-X) | avx512 | avx2 | avx512 |
//! | AVX2 with AVX-VNNI (Intel Alder Lake and later clients) | avx2 | avxvnni | avx2 |
//! | AVX2 and FMA (Haswell and later, Zen 1 to 3) | avx2 | avx2 | avx2 |
//! | anything else: older x86-64, aarch64 (Apple silicon, Graviton) | portable | candle's | portable |
//!
//! The portable kernels are plain loops with independent partial sums, which the compiler
//! vectorizes for the baseline (SSE2, NEON) without reordering a sum by itself. No NEON code of
//! ours exists, since nothing here can run it: on such CPUs `Engine::Auto` (feature `models`)
//! gives quantized models to candle, whose quantized kernels have NEON paths.

use std::sync::OnceLock;

/// An instruction-set level, as the kernels see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// No SIMD beyond what the compiler's baseline target has (SSE2 on x86-64, NEON on
    /// aarch64): plain loops written so that the compiler vectorizes them.
    Portable,
    /// AVX2 + FMA + F16C (Haswell and later, Zen 1-3): f32 products in 256-bit registers,
    /// integer dots by `vpmaddubsw`/`vpmaddwd`.
    Avx2,
    /// AVX2 plus AVX-VNNI, the 256-bit VEX `vpdpbusd` (Intel Alder Lake and later, Zen 5).
    AvxVnni,
    /// AVX-512 F/BW/VL without VNNI (Skylake-X): 512-bit f32 products, AVX2 integer dots.
    Avx512,
    /// AVX-512 with VNNI (Ice Lake and later, Zen 4 and 5): 512-bit `vpdpbusd`.
    Avx512Vnni,
}

impl Level {
    /// Every level, lowest first.
    pub const ALL: [Level; 5] = [Level::Portable, Level::Avx2, Level::AvxVnni, Level::Avx512, Level::Avx512Vnni];

    /// The name `SPECDEC_SIMD` takes.
    pub fn name(self) -> &'static str {
        match self {
            Level::Portable => "portable",
            Level::Avx2 => "avx2",
            Level::AvxVnni => "avxvnni",
            Level::Avx512 => "avx512",
            Level::Avx512Vnni => "avx512vnni",
        }
    }

    /// True when this CPU has every feature the level's kernels use.
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx2 = has!("avx2") && has!("fma") && has!("f16c");
            let avx512 = avx2 && has!("avx512f") && has!("avx512bw") && has!("avx512vl");
            match self {
                Level::Portable => true,
                Level::Avx2 => avx2,
                Level::AvxVnni => avx2 && has!("avxvnni"),
                Level::Avx512 => avx512,
                Level::Avx512Vnni => avx512 && has!("avx512vnni"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Level::Portable
        }
    }

    /// The level of the f32 products: 512-bit registers from `Avx512` up, else 256-bit.
    pub fn wide(self) -> bool {
        matches!(self, Level::Avx512 | Level::Avx512Vnni)
    }

    /// True from `Avx2` up.
    pub fn simd(self) -> bool {
        self != Level::Portable
    }
}

/// The kernels chosen for this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kernels {
    /// The level the kernels run at.
    pub level: Level,
    /// The best level the CPU has.
    pub detected: Level,
    /// True when `SPECDEC_SIMD` asked for a level (honoured if the CPU has it).
    pub forced: bool,
}

impl Kernels {
    /// The f32 product's variant.
    pub fn f32_name(&self) -> &'static str {
        match self.level {
            Level::Portable => "portable",
            Level::Avx2 | Level::AvxVnni => "avx2",
            Level::Avx512 | Level::Avx512Vnni => "avx512",
        }
    }

    /// The quantized product's variant. Without SIMD, `Engine::Auto` (feature `models`) hands
    /// quantized models to candle's kernels (the portable one serves `Engine::Native` and the
    /// tests).
    pub fn quant_name(&self) -> &'static str {
        match self.level {
            Level::Portable => "candle",
            Level::Avx2 | Level::Avx512 => "avx2",
            Level::AvxVnni => "avxvnni",
            Level::Avx512Vnni => "avx512vnni",
        }
    }
}

impl std::fmt::Display for Kernels {
    /// `kernels: f32 avx2, quant avxvnni (AMD EPYC ...)`, plus what `SPECDEC_SIMD` did.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "kernels: f32 {}, quant {} ({})", self.f32_name(), self.quant_name(), cpu_name())?;
        if self.forced {
            write!(f, ", SPECDEC_SIMD forced {} of {}", self.level.name(), self.detected.name())?;
        }
        Ok(())
    }
}

/// The kernels this process uses (detected on first use).
pub fn kernels() -> Kernels {
    static CHOSEN: OnceLock<Kernels> = OnceLock::new();
    *CHOSEN.get_or_init(|| choose(std::env::var("SPECDEC_SIMD").ok().as_deref()))
}

/// The level this process's kernels run at.
pub fn level() -> Level {
    kernels().level
}

/// The best available level, or the `requested` one when the CPU has it.
fn choose(requested: Option<&str>) -> Kernels {
    let detected = Level::ALL.into_iter().rev().find(|l| l.available()).unwrap_or(Level::Portable);
    let asked = requested.and_then(|r| Level::ALL.into_iter().find(|l| l.name().eq_ignore_ascii_case(r.trim())));
    match asked {
        Some(l) if l.available() => Kernels { level: l, detected, forced: true },
        _ => Kernels { level: detected, detected, forced: false },
    }
}

/// The CPU's model name with its family and model numbers from `/proc/cpuinfo` (Linux; a
/// virtual machine may show only "AMD EPYC": family 25 is Zen 3 or 4, 26 is Zen 5), else the
/// architecture.
pub fn cpu_name() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |key: &str| {
        info.lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == key))
            .and_then(|l| l.split(':').nth(1))
            .map(|v| v.trim().to_string())
    };
    match (field("model name"), field("cpu family"), field("model")) {
        (Some(name), Some(family), Some(model)) => format!("{name}, family {family} model {model}"),
        (Some(name), _, _) => name,
        _ => std::env::consts::ARCH.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_level_the_cpu_lacks_is_never_chosen() {
        for l in Level::ALL {
            let k = choose(Some(l.name()));
            assert!(k.level.available());
            assert_eq!(k.forced, l.available());
        }
        assert_eq!(choose(Some("nonsense")).level, choose(None).level);
        assert!(Level::Portable.available());
    }
}
