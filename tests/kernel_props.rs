//! Property tests of the accept/reject kernel: for arbitrary p and q (zeros in either, p = q,
//! disjoint supports, one-hot rows) the analytic emission probability of one speculative step
//! equals p, and the acceptance probability equals Σ min(p, q).

use proptest::prelude::*;
use specdec::kernel::{
    accept_probability, acceptance_rate, emission_probabilities, tree_emission_probabilities, DraftRow,
};

/// A probability row over `n` tokens with some exact zeros, unnormalized.
fn row(n: usize) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(prop_oneof![3 => 0.0f32..1.0, 1 => Just(0.0f32)], n)
        .prop_filter("needs mass", |r| r.iter().sum::<f32>() > 1e-3)
}

/// Pairs of rows in the shapes that break naive kernels.
fn pair() -> impl Strategy<Value = (Vec<f32>, Vec<f32>)> {
    (2usize..=64).prop_flat_map(|n| {
        prop_oneof![
            (row(n), row(n)),
            row(n).prop_map(|p| (p.clone(), p)),
            (row(n), 0..n).prop_map(move |(p, i)| {
                let mut q = vec![0.0; n];
                q[i] = 1.0;
                (p, q)
            }),
            (0..n, 0..n).prop_map(move |(i, j)| {
                let (mut p, mut q) = (vec![0.0; n], vec![0.0; n]);
                p[i] = 1.0;
                q[j] = 1.0;
                (p, q)
            }),
            (1..n).prop_map(move |cut| {
                let p: Vec<f32> = (0..n).map(|i| if i < cut { 1.0 } else { 0.0 }).collect();
                let q: Vec<f32> = (0..n).map(|i| if i < cut { 0.0 } else { 1.0 }).collect();
                (p, q)
            }),
        ]
    })
}

fn normalized(r: &[f32]) -> Vec<f64> {
    let total: f64 = r.iter().map(|&x| x as f64).sum();
    r.iter().map(|&x| x as f64 / total).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn emission_equals_target((p, q) in pair()) {
        let emitted = emission_probabilities(&p, DraftRow::Dense(&q), 0);
        for (e, t) in emitted.iter().zip(normalized(&p)) {
            prop_assert!((e - t).abs() <= 1e-9, "emitted {e} target {t}");
        }
    }

    #[test]
    fn acceptance_is_overlap((p, q) in pair()) {
        let qn = normalized(&q);
        let analytic: f64 = (0..p.len()).filter(|&t| qn[t] > 0.0).map(|t| qn[t] * accept_probability(&p, DraftRow::Dense(&q), t as u32)).sum();
        let overlap: f64 = normalized(&p).iter().zip(&qn).map(|(a, b)| a.min(*b)).sum();
        prop_assert!((analytic - overlap).abs() <= 1e-9);
        prop_assert!((acceptance_rate(&p, &q) - overlap).abs() <= 1e-9);
    }

    #[test]
    fn point_mass_emission_equals_target(p in (2usize..=64).prop_flat_map(row), pick in any::<prop::sample::Index>()) {
        let t = pick.index(p.len()) as u32;
        let emitted = emission_probabilities(&p, DraftRow::Point, t);
        for (e, target) in emitted.iter().zip(normalized(&p)) {
            prop_assert!((e - target).abs() <= 1e-9);
        }
        prop_assert!((accept_probability(&p, DraftRow::Point, t) - normalized(&p)[t as usize]).abs() <= 1e-9);
    }

    /// At a tree node, children tried in order (sampled ones from their own rows, point masses,
    /// repeats included) emit the target's row first, whatever the rows.
    #[test]
    fn tree_node_emission_equals_target(
        (p, qs, tokens, dense) in (2usize..=32).prop_flat_map(|n| (
            row(n),
            prop::collection::vec(row(n), 1..=5),
            prop::collection::vec(0..n as u32, 5),
            prop::collection::vec(any::<bool>(), 5),
        ))
    ) {
        let children: Vec<(u32, DraftRow)> = qs.iter().zip(&tokens).zip(&dense)
            .map(|((q, &t), &d)| (t, if d { DraftRow::Dense(q) } else { DraftRow::Point }))
            .collect();
        let emitted = tree_emission_probabilities(&p, &children).expect("p has mass");
        for (e, t) in emitted.iter().zip(normalized(&p)) {
            prop_assert!((e - t).abs() <= 1e-9, "emitted {e} target {t}");
        }
    }
}
