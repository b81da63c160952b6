//! Delta debugging (Zeller and Hildebrandt's ddmin): from a set of parts with which a test fails,
//! a subset with which it still fails and from which no single part can be removed (1-minimal),
//! in O(n^2) tests at worst and O(log n) when one part alone is the cause.
//!
//! Each round's candidates are handed to `test` together, so the caller can run them in parallel;
//! the first failing one in the round's order is taken, so the result does not depend on how many
//! run at once. The empty set is never tested here: the caller tries it first.

/// The parts split into `n` chunks of near-equal size, in order.
fn chunks<T: Clone>(parts: &[T], n: usize) -> Vec<Vec<T>> {
    let n = n.clamp(1, parts.len().max(1));
    (0..n).map(|k| parts[k * parts.len() / n..(k + 1) * parts.len() / n].to_vec()).collect()
}

/// A 1-minimal failing subset of `parts` (which fail together), by `test`: for a batch of
/// candidate subsets, whether each still fails.
pub fn ddmin<T: Clone>(parts: &[T], mut test: impl FnMut(&[Vec<T>]) -> Vec<bool>) -> Vec<T> {
    let mut current = parts.to_vec();
    let mut n = 2;
    // Each round either removes at least one part or doubles the granularity up to the size:
    // at most len removals times log2(len) + 1 doublings.
    let bound = (parts.len() + 1) * (usize::BITS - parts.len().leading_zeros() + 1) as usize;
    for _ in 0..bound {
        if current.len() < 2 {
            break;
        }
        let split = chunks(&current, n);
        let found = test(&split);
        assert_eq!(found.len(), split.len(), "the test answers every candidate");
        if let Some(k) = found.iter().position(|&f| f) {
            current = split[k].clone();
            n = 2;
            continue;
        }
        // With two chunks each complement is the other chunk, already tested.
        if n > 2 {
            let complements: Vec<Vec<T>> = (0..split.len())
                .map(|k| split.iter().enumerate().filter(|(j, _)| *j != k).flat_map(|(_, c)| c.clone()).collect())
                .collect();
            let found = test(&complements);
            assert_eq!(found.len(), complements.len(), "the test answers every candidate");
            if let Some(k) = found.iter().position(|&f| f) {
                current = complements[k].clone();
                n = (n - 1).max(2);
                continue;
            }
        }
        if n >= current.len() {
            break;
        }
        n = (2 * n).min(current.len());
    }
    current
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(parts: &[u32], fails: impl Fn(&[u32]) -> bool) -> (Vec<u32>, usize) {
        let mut tests = 0;
        let out = ddmin(parts, |batch| {
            tests += batch.len();
            batch.iter().map(|c| fails(c)).collect()
        });
        (out, tests)
    }

    #[test]
    fn one_cause_is_found_in_few_tests() {
        let parts: Vec<u32> = (0..16).collect();
        let (out, tests) = run(&parts, |c| c.contains(&11));
        assert_eq!(out, [11]);
        assert!(tests <= 2 * 4 + 2, "{tests} tests");
    }

    #[test]
    fn two_causes_that_need_each_other_are_both_kept() {
        let parts: Vec<u32> = (0..10).collect();
        let (out, _) = run(&parts, |c| c.contains(&2) && c.contains(&7));
        assert_eq!(out, [2, 7]);
    }

    proptest! {
        /// Whatever the failure needs (a set of parts that must all be there), ddmin keeps
        /// exactly it: the result fails and no part of it can go.
        #[test]
        fn the_result_fails_and_is_one_minimal(len in 1usize..24, needed in proptest::collection::btree_set(0u32..24, 1..4)) {
            let parts: Vec<u32> = (0..len as u32).collect();
            let needed: Vec<u32> = needed.into_iter().filter(|&p| (p as usize) < len).collect();
            prop_assume!(!needed.is_empty());
            let fails = |c: &[u32]| needed.iter().all(|p| c.contains(p));
            let (out, tests) = run(&parts, fails);
            prop_assert!(fails(&out));
            for k in 0..out.len() {
                let mut less = out.clone();
                less.remove(k);
                prop_assert!(!fails(&less));
            }
            prop_assert!(tests <= 2 * len * len + 4, "{} tests for {} parts", tests, len);
        }
    }
}
