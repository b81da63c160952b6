//! Streams that end short of a choice: a server that ignores `n`, told from one that leaves an
//! empty choice out.
//!
//! A completion that asks for `n > 1` choices is answered by one stream that carries each choice
//! by its index. A server that ignores `n` answers every such stream with one choice: the run did
//! not send the work its scenario says, so it is a target failure (exit 3), never judged. A real
//! server can also leave a choice out now and then: vLLM 0.8.5's streaming completions skip a
//! choice that has produced no token yet (a check meant for a chunked prefill), and a choice that
//! ends at its very first token (the end-of-sequence token, not returned) is skipped with its
//! finish, so the stream never names it while the same request unstreamed answers it with
//! `"text": "", "finish_reason": "stop"`. Measured here: once in 5,200 requests of n-sampling
//! (n = 2, seed 0, iteration 259) against the tiny random Llama. That server did the work, and
//! its run is judged; the streams it left short are counted and said.

use plateau_driver::AbortCounts;

/// Short streams a run sees before it decides mid-run that the target ignores `n`: one early
/// short stream from a server that leaves an empty choice out is not called ignoring `n`, and a
/// server that ignores `n` is stopped within its first three streams that ask for more than one.
const SHORT_BEFORE_DECIDING: u64 = 3;

/// Counts a completed stream that asked for `n` choices and never carried `missing` of them.
pub fn count(c: &mut AbortCounts, n: u32, missing: u32) {
    if n > 1 {
        c.multi_choice += 1;
        c.short_of_choices += u64::from(missing > 0);
    }
}

/// Why the target ignores `n`, when it does: most streams that asked for more than one choice
/// ended short of one. A server that ignores `n` leaves out a choice in every such stream, the
/// one that leaves out an empty choice in about one in 5,000 here (the module's comment): a half
/// lies orders of magnitude from both. Mid-run (`run_ended` false) it is decided once
/// [`SHORT_BEFORE_DECIDING`] streams were short; at the end of a run, on what the run saw.
pub fn ignores_n(c: &AbortCounts, run_ended: bool) -> Option<String> {
    let enough = run_ended || c.short_of_choices >= SHORT_BEFORE_DECIDING;
    (enough && c.short_of_choices > 0 && 2 * c.short_of_choices > c.multi_choice).then(|| {
        format!(
            "{} of the {} streams that asked for more than one choice (n > 1) ended short of the choices asked for: the target ignores n, an error of the target",
            c.short_of_choices, c.multi_choice
        )
    })
}

/// What a run whose target was judged says of the streams it left short, if any.
pub fn warning(c: &AbortCounts) -> Option<String> {
    (c.short_of_choices > 0).then(|| {
        format!(
            "{} of the {} streams that asked for n > 1 ended without one of their choices (a server may leave out a choice that ends at its first token, as vLLM 0.8.5's streaming completions do); the run sent the rest as planned",
            c.short_of_choices, c.multi_choice
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(streams: &[(u32, u32)]) -> AbortCounts {
        let mut c = AbortCounts::default();
        for &(n, missing) in streams {
            count(&mut c, n, missing);
        }
        c
    }

    #[test]
    fn a_server_that_ignores_n_is_stopped_at_its_third_short_stream() {
        assert_eq!(ignores_n(&after(&[(2, 1), (2, 1)]), false), None);
        let why = ignores_n(&after(&[(2, 1), (2, 1), (2, 1)]), false).expect("ignores n");
        assert!(why.contains("3 of the 3 streams") && why.contains("ignores n"), "{why}");
    }

    #[test]
    fn one_empty_choice_left_out_in_thousands_is_counted_not_fatal() {
        let mut streams = vec![(2, 0); 5_188];
        streams.push((2, 1));
        streams.extend([(2, 0); 11]);
        let c = after(&streams);
        assert_eq!((c.multi_choice, c.short_of_choices), (5_200, 1));
        assert_eq!(ignores_n(&c, false), None);
        assert_eq!(ignores_n(&c, true), None);
        assert!(warning(&c).expect("said").starts_with("1 of the 5200 streams"));
    }

    #[test]
    fn an_early_short_stream_is_not_called_ignoring_n_once_the_rest_are_whole() {
        let mut streams = vec![(2, 1)];
        streams.extend([(2, 0); 40]);
        assert_eq!(ignores_n(&after(&streams), true), None);
    }

    #[test]
    fn a_run_that_ends_before_deciding_is_judged_on_what_it_saw() {
        let c = after(&[(2, 1), (2, 1)]);
        assert_eq!(ignores_n(&c, false), None);
        assert!(ignores_n(&c, true).is_some());
    }

    #[test]
    fn single_choice_streams_are_not_counted() {
        let c = after(&[(1, 0), (1, 0), (2, 0)]);
        assert_eq!((c.multi_choice, c.short_of_choices), (1, 0));
        assert_eq!(warning(&c), None);
    }
}
