//! The search of a bisect, as a pure state machine: which candidates to soak next, and when the
//! first bad one is known.
//!
//! Candidates are the commits from the good end (exclusive, index -1) to the bad end (inclusive,
//! the last index), oldest first. Each soaked candidate is good, bad or skipped (undecided after
//! running longer, a failed build, a harness failure). The first bad commit lies after the last
//! good one below the first bad one: the range narrows to (good, bad], and the next probes divide
//! it into equal sections, one per job (multi-section bisection: with 2 jobs a round cuts the range
//! to a third). A skipped candidate is stepped around, as `git bisect skip` does; when every
//! candidate left in the range is skipped, the range itself is the answer.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Good,
    Bad,
    /// Not judged, and why.
    Skip(String),
}

/// Where the search ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    /// The first bad candidate's index.
    FirstBad(usize),
    /// Every candidate left between the last good and the first bad was skipped: the first bad
    /// one is somewhere in `from..=to`.
    Range { from: usize, to: usize },
}

#[derive(Debug, Clone)]
pub struct Search {
    /// Candidates, the bad end last.
    n: usize,
    results: BTreeMap<usize, Outcome>,
}

impl Search {
    /// A search over `n` candidates whose last one is the bad end (known bad once checked).
    pub fn new(n: usize) -> Search {
        assert!(n >= 1, "a bisect has at least the bad end");
        Search { n, results: BTreeMap::new() }
    }

    pub fn record(&mut self, index: usize, outcome: Outcome) {
        assert!(index < self.n, "candidate {index} of {}", self.n);
        self.results.insert(index, outcome);
    }

    pub fn outcome(&self, index: usize) -> Option<&Outcome> {
        self.results.get(&index)
    }

    /// (last good below the first bad, or -1 for the good end; the first bad, or the bad end).
    fn bounds(&self) -> (i64, usize) {
        let hi = self.results.iter().find(|(_, o)| **o == Outcome::Bad).map_or(self.n - 1, |(i, _)| *i);
        let lo = self.results.range(..hi).filter(|(_, o)| **o == Outcome::Good).map(|(i, _)| *i as i64).max();
        (lo.unwrap_or(-1), hi)
    }

    /// Candidates strictly inside the range not soaked yet.
    fn open(&self) -> Vec<usize> {
        let (lo, hi) = self.bounds();
        ((lo + 1) as usize..hi).filter(|i| !self.results.contains_key(i)).collect()
    }

    /// Up to `jobs` candidates to soak next, dividing the open range into equal sections (the
    /// nearest open candidate to each cut); empty when the search is over.
    pub fn next(&self, jobs: usize) -> Vec<usize> {
        let open = self.open();
        if open.is_empty() {
            return Vec::new();
        }
        let (lo, hi) = self.bounds();
        let span = (hi as i64 - lo) as f64;
        let mut picks: Vec<usize> = Vec::new();
        for j in 1..=jobs.max(1) {
            let ideal = lo as f64 + span * j as f64 / (jobs.max(1) + 1) as f64;
            let nearest = open
                .iter()
                .copied()
                .filter(|i| !picks.contains(i))
                .min_by(|a, b| (*a as f64 - ideal).abs().total_cmp(&(*b as f64 - ideal).abs()));
            if let Some(i) = nearest {
                picks.push(i);
            }
        }
        picks.sort_unstable();
        picks
    }

    /// The answer, once nothing is left to soak.
    pub fn found(&self) -> Option<Found> {
        if !self.open().is_empty() {
            return None;
        }
        let (lo, hi) = self.bounds();
        let from = (lo + 1) as usize;
        Some(if from == hi { Found::FirstBad(hi) } else { Found::Range { from, to: hi } })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a search to its end with `truth(i)` as each candidate's outcome; the probes it made.
    fn drive(n: usize, jobs: usize, truth: impl Fn(usize) -> Outcome) -> (Found, Vec<usize>) {
        let mut s = Search::new(n);
        s.record(n - 1, Outcome::Bad);
        let mut probes = Vec::new();
        for _ in 0..64 {
            let next = s.next(jobs);
            if next.is_empty() {
                break;
            }
            for i in next {
                probes.push(i);
                s.record(i, truth(i));
            }
        }
        (s.found().expect("ended"), probes)
    }

    #[test]
    fn finds_the_first_bad_commit_in_log_steps() {
        for first in 0..6 {
            let (f, probes) = drive(6, 1, |i| if i >= first { Outcome::Bad } else { Outcome::Good });
            assert_eq!(f, Found::FirstBad(first), "first bad {first}");
            assert!(probes.len() <= 3, "{probes:?}");
        }
    }

    #[test]
    fn two_jobs_cut_the_range_in_thirds() {
        let s = Search::new(9);
        assert_eq!(s.next(2), vec![2, 5]);
        let (f, probes) = drive(30, 2, |i| if i >= 17 { Outcome::Bad } else { Outcome::Good });
        assert_eq!(f, Found::FirstBad(17));
        assert!(probes.len() <= 8, "{probes:?}");
    }

    #[test]
    fn a_skipped_candidate_is_stepped_around_and_an_all_skipped_range_is_the_answer() {
        let (f, probes) = drive(6, 1, |i| match i {
            2 => Outcome::Skip("build failed".into()),
            i if i >= 4 => Outcome::Bad,
            _ => Outcome::Good,
        });
        assert_eq!(f, Found::FirstBad(4), "{probes:?}");
        // The skipped candidate right before the first bad one: either could be it.
        let (f, _) = drive(6, 1, |i| match i {
            2 => Outcome::Skip("build failed".into()),
            i if i >= 3 => Outcome::Bad,
            _ => Outcome::Good,
        });
        assert_eq!(f, Found::Range { from: 2, to: 3 });
        let (f, _) = drive(6, 1, |i| match i {
            2 | 3 => Outcome::Skip("undecided".into()),
            i if i >= 3 => Outcome::Bad,
            _ => Outcome::Good,
        });
        assert_eq!(f, Found::Range { from: 2, to: 4 });
    }

    #[test]
    fn the_bad_end_alone_is_the_first_bad_commit() {
        let (f, probes) = drive(1, 1, |_| Outcome::Bad);
        assert_eq!((f, probes.len()), (Found::FirstBad(0), 0));
    }
}
