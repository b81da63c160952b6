//! Bad input gets a clear error, and the engine stays usable with nothing leaked.

use crate::common;

use common::*;
use plateau_engine::{AbortOutcome, EngineError, SamplingParams};

#[test]
fn each_bad_request_is_refused_and_leaves_nothing() {
    let mut e = engine_with(|c| c.max_model_len = Some(64));
    let ok = || req(1, prompt(1, 8), 1, 4, 1);
    let cases: Vec<(plateau_engine::Request, &str)> = vec![
        (
            {
                let mut r = ok();
                r.prompt.clear();
                r
            },
            "empty prompt",
        ),
        (
            {
                let mut r = ok();
                r.prompt = prompt(1, 64);
                r
            },
            "maximum length",
        ),
        (
            {
                let mut r = ok();
                r.params.n = 0;
                r
            },
            "n must be",
        ),
        (
            {
                let mut r = ok();
                r.params.max_tokens = 0;
                r
            },
            "max_tokens",
        ),
        (
            {
                let mut r = ok();
                r.params.top_p = 0.0;
                r
            },
            "top_p",
        ),
        (
            {
                let mut r = ok();
                r.params.top_p = 1.5;
                r
            },
            "top_p",
        ),
        (
            {
                let mut r = ok();
                r.params.temperature = -0.1;
                r
            },
            "temperature",
        ),
        (
            {
                let mut r = ok();
                r.params.temperature = f32::NAN;
                r
            },
            "temperature",
        ),
        (
            {
                let mut r = ok();
                r.prompt[3] = 100_000;
                r
            },
            "outside the vocabulary",
        ),
        (
            {
                let mut r = ok();
                r.params = SamplingParams { n: 1000, ..r.params };
                r
            },
            "max_num_seqs",
        ),
    ];
    for (r, want) in cases {
        let err = e.add_request(r).unwrap_err().to_string();
        assert!(err.contains(want), "error `{err}` does not say `{want}`");
        assert_eq!(e.check_idle(), Ok(()));
    }
    e.add_request(ok()).unwrap();
    assert_eq!(e.add_request(ok()), Err(EngineError::DuplicateRequest(1)));
    assert_eq!(e.abort(999), AbortOutcome::Unknown);
    let outs = drain(&mut e, 100);
    assert_eq!(outs.len(), 1);
    assert_eq!(e.check_idle(), Ok(()));
}

#[test]
fn asleep_refuses_requests_and_busy_refuses_sleep() {
    let mut e = engine_with(|_| {});
    e.add_request(req(1, prompt(1, 8), 1, 4, 1)).unwrap();
    assert_eq!(e.sleep(1), Err(EngineError::Busy(1)));
    assert_eq!(e.sleep(3), Err(EngineError::BadSleepLevel(3)));
    drain(&mut e, 100);
    e.sleep(2).unwrap();
    assert_eq!(e.add_request(req(2, prompt(2, 8), 1, 4, 1)), Err(EngineError::Asleep(2)));
    assert_eq!(e.check_idle(), Ok(()));
    e.wake().unwrap();
    assert_eq!(e.wake(), Err(EngineError::NotAsleep));
    e.add_request(req(2, prompt(2, 8), 1, 4, 1)).unwrap();
    drain(&mut e, 100);
    assert_eq!(e.check_idle(), Ok(()));
}

#[test]
fn a_sequence_that_outgrows_the_pool_ends_in_error() {
    let mut e = engine_with(|c| c.num_kv_blocks = 4);
    e.add_request(req(1, prompt(1, 8), 1, 40, 1)).unwrap();
    let outs = drain(&mut e, 200);
    assert_eq!(outs[0].finish(), plateau_engine::FinishReason::Error);
    assert!(outs[0].error.as_deref().unwrap().contains("KV cache too small"));
    assert_eq!(e.check_idle(), Ok(()));
}

/// Any request, however malformed, is admitted or refused with an error; never a panic. Whatever
/// was admitted ends, and the engine is idle and whole afterwards.
mod random_requests {
    use super::common::*;
    use plateau_engine::{ImageInput, Request, SamplingParams};
    use proptest::prelude::*;

    fn float() -> impl Strategy<Value = f32> {
        prop_oneof![Just(f32::NAN), Just(f32::INFINITY), Just(-1.0f32), Just(0.0f32), Just(1e30f32), 0.0f32..2.0]
    }

    fn request() -> impl Strategy<Value = Request> {
        let prompt = prop::collection::vec(prop_oneof![0u32..320, Just(2u32), Just(u32::MAX)], 0..24);
        let image = prop_oneof![
            prop::collection::vec(any::<u8>(), 0..64).prop_map(ImageInput::Encoded),
            (0u32..40, 0u32..40, prop::collection::vec(any::<u8>(), 0..64))
                .prop_map(|(width, height, pixels)| ImageInput::Rgb { width, height, pixels }),
        ];
        let params =
            (0u32..70, float(), float(), 0u32..400, 0u32..3000, prop::collection::vec(0u32..400, 0..3), any::<bool>());
        (0u64..6, prompt, prop::collection::vec(image, 0..2), params).prop_map(
            |(id, prompt, images, (n, temperature, top_p, top_k, max_tokens, stop_token_ids, ignore_eos))| Request {
                id,
                prompt,
                images,
                params: SamplingParams {
                    n,
                    temperature,
                    top_p,
                    top_k,
                    max_tokens,
                    stop_token_ids,
                    ignore_eos,
                    seed: Some(id),
                },
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]
        #[test]
        fn any_request_is_admitted_or_refused(reqs in prop::collection::vec(request(), 1..8)) {
            let mut e = engine_with(|c| c.max_model_len = Some(256));
            for r in reqs {
                let _ = e.add_request(r);
            }
            drain(&mut e, 20_000);
            prop_assert_eq!(e.check_idle(), Ok(()));
        }
    }
}
