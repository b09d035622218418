//! Chain or tree: [`TreePolicy`], the setting, and [`ShapeChooser`], which picks the round's
//! shape from what each shape measured.
//!
//! A tree round scores more rows than a chain round for the same depth, and pays only when the
//! extra branches are accepted often enough to cover the wider target call (T(m) grows with m
//! on a CPU) and the wider draft calls. Both sides of that trade are what the chooser
//! measures: each shape's tokens per second, acceptance and costs together.

use super::prober::{PROBE_BUDGET, PROBE_MAX_GAP};
use crate::error::{Error, Result};
use crate::tree::TreeBudget;

/// Whether rounds draft chains or trees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TreePolicy {
    /// Chains only, k chosen by the [`KPolicy`](super::KPolicy) (the default).
    #[default]
    Never,
    /// Every round drafts a tree within the budget.
    Always(TreeBudget),
    /// Trees within the budget when they pay: rounds run the shape, chain (with the k policy's
    /// k) or tree, with more measured tokens per second, and now and then try the other (every
    /// 12th round when the two are close, more rarely the slower the other is, so that these
    /// probes cost about 2 % of the time).
    Adaptive(TreeBudget),
}

impl std::str::FromStr for TreePolicy {
    type Err = Error;

    /// `none`, a budget (always: `WxDxN` or `WxDxNxE`, see [`TreeBudget`]) or `auto` /
    /// `auto:BUDGET` (adaptive, the default budget without one).
    fn from_str(s: &str) -> Result<Self> {
        match s.split_once(':') {
            _ if s == "none" => Ok(Self::Never),
            _ if s == "auto" => Ok(Self::Adaptive(TreeBudget::default())),
            Some(("auto", b)) => Ok(Self::Adaptive(b.parse()?)),
            None => Ok(Self::Always(s.parse()?)),
            Some(_) => Err(Error::setting("tree", s, "none, WxDxN[xE], auto or auto:WxDxN[xE] (e.g. 2x6x12)")),
        }
    }
}

impl std::fmt::Display for TreePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Never => write!(f, "none"),
            Self::Always(b) => write!(f, "{b}"),
            Self::Adaptive(b) => write!(f, "auto:{b}"),
        }
    }
}

/// Chain rounds before the first tree round: the k controller measures the draft first, and
/// only the second half of them counts for the chain's rate (the first drafts short blocks
/// while the k controller measures, slower than it settles to).
const WARMUP_ROUNDS: usize = 24;
/// Tree rounds in a row when trees are first tried, so the first estimate is not one round's.
const FIRST_TREE_ROUNDS: usize = 3;
/// At most every this many rounds, one of the shape not in use; spaced so that probes cost
/// about `PROBE_BUDGET` of the time, but at least every `PROBE_MAX_GAP` rounds (the k
/// controller's probing rule).
const PROBE_MIN_GAP: usize = 12;
/// Weight of a new round in each shape's moving averages.
const WEIGHT: f64 = 0.25;

/// Tokens and seconds per round, as moving averages.
#[derive(Debug, Clone, Copy, Default)]
struct Rate {
    tokens: f64,
    secs: f64,
    rounds: usize,
}

impl Rate {
    fn add(&mut self, tokens: usize, secs: f64) {
        let w = if self.rounds == 0 { 1.0 } else { WEIGHT };
        self.tokens += w * (tokens as f64 - self.tokens);
        self.secs += w * (secs - self.secs);
        self.rounds += 1;
    }

    fn per_sec(&self) -> f64 {
        if self.secs > 0.0 {
            self.tokens / self.secs
        } else {
            0.0
        }
    }
}

/// Picks chain or tree before each round (see [`TreePolicy::Adaptive`]) and learns from the
/// round's tokens and time. Like the k controller, it keeps what it learned from one
/// generation to the next. The choice rests on past rounds only, so decoding stays exact.
#[derive(Debug, Clone)]
pub struct ShapeChooser {
    policy: TreePolicy,
    chain: Rate,
    tree: Rate,
    rounds: usize,
    since_probe: usize,
}

impl ShapeChooser {
    /// A chooser for `policy`.
    pub fn new(policy: TreePolicy) -> Self {
        Self { policy, chain: Rate::default(), tree: Rate::default(), rounds: 0, since_probe: 0 }
    }

    /// The policy.
    pub fn policy(&self) -> TreePolicy {
        self.policy
    }

    /// The next round's tree budget, or `None` for a chain round. `drafting_pays` is false
    /// when the k controller has given up on the draft (then no tree is tried either).
    pub fn next(&mut self, drafting_pays: bool) -> Option<TreeBudget> {
        self.rounds += 1;
        match self.policy {
            TreePolicy::Never => None,
            TreePolicy::Always(b) => Some(b),
            TreePolicy::Adaptive(_) if !drafting_pays || self.rounds <= WARMUP_ROUNDS => None,
            TreePolicy::Adaptive(b) if self.tree.rounds < FIRST_TREE_ROUNDS => Some(b),
            TreePolicy::Adaptive(b) => {
                let (chain, tree) = self.rates();
                // A probe round runs at the slower rate: it loses `faster/slower − 1` of a round.
                let loss = chain.max(tree) / chain.min(tree).max(f64::MIN_POSITIVE) - 1.0;
                let gap = ((loss / PROBE_BUDGET).ceil() as usize).clamp(PROBE_MIN_GAP, PROBE_MAX_GAP);
                self.since_probe += 1;
                let probe = self.since_probe >= gap;
                if probe {
                    self.since_probe = 0;
                }
                ((tree > chain) != probe).then_some(b)
            }
        }
    }

    /// Records a round: whether it was a tree, the tokens it emitted and its seconds.
    pub fn observe(&mut self, tree: bool, tokens: usize, secs: f64) {
        let settling = !tree && self.rounds <= WARMUP_ROUNDS / 2;
        if secs.is_finite() && secs > 0.0 && !settling {
            if tree { &mut self.tree } else { &mut self.chain }.add(tokens, secs);
        }
    }

    /// Measured tokens per second of chain rounds and of tree rounds (0 before any).
    pub fn rates(&self) -> (f64, f64) {
        (self.chain.per_sec(), self.tree.per_sec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(chooser: &mut ShapeChooser, rounds: usize, chain_rate: f64, tree_rate: f64) -> usize {
        let mut trees = 0;
        for _ in 0..rounds {
            let tree = chooser.next(true).is_some();
            trees += usize::from(tree);
            chooser.observe(tree, 3, 3.0 / if tree { tree_rate } else { chain_rate });
        }
        trees
    }

    #[test]
    fn text_forms_parse() -> Result<()> {
        assert_eq!("none".parse::<TreePolicy>()?, TreePolicy::Never);
        assert_eq!("auto".parse::<TreePolicy>()?, TreePolicy::Adaptive(TreeBudget::default()));
        assert_eq!("3x4x10".parse::<TreePolicy>()?, TreePolicy::Always("3x4x10".parse::<TreeBudget>()?));
        for p in [TreePolicy::Adaptive("2x6x16x3".parse::<TreeBudget>()?), TreePolicy::Always(TreeBudget::default())] {
            assert_eq!(p.to_string().parse::<TreePolicy>()?, p);
        }
        for bad in ["", "auto:", "2x3", "0x3x4", "2x3x65", "2x3x4x0", "tree:2x3x4", "ax3x4"] {
            assert!(bad.parse::<TreePolicy>().is_err(), "{bad:?}");
        }
        Ok(())
    }

    #[test]
    fn adaptive_uses_the_faster_shape_and_keeps_probing() {
        let mut faster_tree = ShapeChooser::new(TreePolicy::Adaptive(TreeBudget::default()));
        let trees = run(&mut faster_tree, 200, 10.0, 14.0);
        // All but the warm-up and the chain's probes.
        assert!(trees > 150, "{trees}");
        // Slower trees are probed: every 12 rounds when close, rarely when far slower.
        let mut slower_tree = ShapeChooser::new(TreePolicy::Adaptive(TreeBudget::default()));
        let trees = run(&mut slower_tree, 200, 10.0, 9.5);
        assert!((12..=22).contains(&trees), "{trees}");
        let mut far_slower = ShapeChooser::new(TreePolicy::Adaptive(TreeBudget::default()));
        let trees = run(&mut far_slower, 400, 10.0, 4.0);
        assert!((4..=8).contains(&trees), "{trees}");
        // A draft the k controller gave up on gets no tree rounds.
        let mut given_up = ShapeChooser::new(TreePolicy::Adaptive(TreeBudget::default()));
        assert!((0..100).all(|_| given_up.next(false).is_none()));
    }
}
