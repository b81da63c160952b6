//! Images through the vision encoder and the encoder cache.

use crate::common;

use common::*;
use plateau_engine::tokenizer::{encode, IMAGE_PAD};
use plateau_engine::{Engine, FinishReason, ImageInput, Injection, Injections, RequestStage, WeightSource};

fn vl(f: impl FnOnce(&mut plateau_engine::EngineConfig)) -> Engine {
    engine_with(|c| {
        c.model = WeightSource::Preset { name: "tiny-vl".into(), seed: 0 };
        c.block_size = 16;
        c.num_kv_blocks = 256;
        c.max_num_batched_tokens = 256;
        f(c)
    })
}

fn rgb(w: u32, h: u32, salt: u8) -> ImageInput {
    let pixels = (0..w * h).flat_map(|i| [(i % w) as u8 ^ salt, (i / w) as u8, salt]).collect();
    ImageInput::Rgb { width: w, height: h, pixels }
}

fn png(w: u32, h: u32) -> Vec<u8> {
    let pixels: Vec<u8> = (0..w * h).flat_map(|i| [(i % w) as u8, (i / w) as u8, 7]).collect();
    plateau_engine::multimodal::codec::encode_png(w, h, &pixels).unwrap()
}

fn mm(id: u64, question: &str, images: Vec<ImageInput>, n: u32, max_tokens: u32) -> plateau_engine::Request {
    let pads: String = images.iter().map(|_| "<|image_pad|>").collect();
    let mut r =
        req(id, encode(&format!("Question {question}{pads} Conclude this image in 10 words.")), n, max_tokens, id);
    r.images = images;
    r
}

fn stat(e: &Engine, name: &str) -> u64 {
    e.stats().into_iter().find(|m| m.name == name).unwrap_or_else(|| panic!("no {name}")).value
}

#[test]
fn same_image_in_two_requests_encodes_once_and_frees_both() {
    let mut e = vl(|_| {});
    e.add_request(mm(1, "A", vec![rgb(200, 150, 1)], 2, 4)).unwrap();
    e.add_request(mm(2, "B", vec![rgb(200, 150, 1)], 2, 4)).unwrap();
    e.step().unwrap(); // encodes the image for request 1; request 2 hits the cache
    e.step().unwrap();
    assert_eq!(stat(&e, "engine.encoder_runs"), 1);
    assert_eq!(stat(&e, "registry.encoder_cache.entries"), 1);
    let outs = drain(&mut e, 200);
    assert_eq!(outs.len(), 2);
    assert_eq!(stat(&e, "engine.encoder_cache_hits"), 1);
    assert_eq!(stat(&e, "registry.encoder_cache.refs"), 0);
    assert_eq!(stat(&e, "registry.encoder_cache.entries"), 1, "freed entries stay cached");
    assert_eq!(e.check_idle(), Ok(()));
}

#[test]
fn placeholders_expand_to_the_encoder_output() {
    let mut e = vl(|_| {});
    e.add_request(mm(1, "A", vec![rgb(200, 150, 1)], 1, 1)).unwrap();
    let outs = drain(&mut e, 100);
    // 200x150 -> 196x140 on the 28-pixel grid -> 7 x 5 = 35 embeddings; the text is 42 tokens.
    let text = encode("Question A Conclude this image in 10 words.").len();
    assert_eq!(outs[0].prompt_tokens as usize, text + 35);
}

#[test]
fn aborts_at_every_image_stage_free_everything() {
    // Two images per request and an encoder budget of one image per step: mid-encode is visible.
    let mut e = vl(|c| c.max_encoder_tokens_per_step = 40);
    e.add_request(mm(1, "mid-encode", vec![rgb(200, 150, 2), rgb(200, 150, 3)], 2, 8)).unwrap();
    e.step().unwrap();
    assert_eq!(e.stage(1), Some(RequestStage::Encoding));
    e.abort(1);
    drain(&mut e, 100);
    assert_eq!(e.check_idle(), Ok(()));

    e.add_request(mm(2, "encoded", vec![rgb(200, 150, 4)], 2, 8)).unwrap();
    e.step().unwrap();
    assert_eq!(e.stage(2), Some(RequestStage::Encoded));
    e.abort(2);
    drain(&mut e, 100);
    assert_eq!(e.check_idle(), Ok(()));

    e.add_request(mm(3, "decoding", vec![rgb(200, 150, 5)], 2, 20)).unwrap();
    for _ in 0..4 {
        e.step().unwrap();
    }
    assert_eq!(e.stage(3), Some(RequestStage::Decode));
    e.abort(3);
    let outs = drain(&mut e, 100);
    assert_eq!(outs[0].finish(), FinishReason::Aborted);
    assert_eq!(e.check_idle(), Ok(()));
}

#[test]
fn same_prompt_other_image_misses_the_prefix_cache() {
    let mut e = vl(|c| c.block_size = 4);
    // The image comes first, so every block after it carries the image's hash.
    let r = |id, img| {
        let mut r = req(id, encode("<|image_pad|> Describe the picture in detail please."), 1, 1, id);
        r.images = vec![img];
        r
    };
    e.add_request(r(1, rgb(200, 150, 9))).unwrap();
    drain(&mut e, 100);
    e.add_request(r(2, rgb(200, 150, 9))).unwrap();
    let same = drain(&mut e, 100);
    assert!(same[0].cached_prompt_tokens > 30, "the same image hits: {}", same[0].cached_prompt_tokens);
    e.add_request(r(3, rgb(200, 150, 10))).unwrap();
    let other = drain(&mut e, 100);
    assert_eq!(other[0].cached_prompt_tokens, 0, "another image must not hit");
    assert_eq!(e.check_idle(), Ok(()));
}

#[test]
fn outputs_do_not_depend_on_batch_composition() {
    let run = |others: bool| {
        let mut e = vl(|_| {});
        if others {
            e.add_request(mm(7, "other", vec![rgb(300, 200, 11)], 2, 6)).unwrap();
        }
        let mut r = mm(1, "A", vec![rgb(200, 150, 1)], 2, 8);
        r.params.temperature = 0.8;
        e.add_request(r).unwrap();
        drain(&mut e, 200).into_iter().find(|o| o.id == 1).unwrap().seqs
    };
    assert_eq!(run(false), run(true));
}

#[test]
fn bad_images_are_refused_and_nothing_leaks() {
    let mut e = vl(|_| {});
    let mut cases = vec![
        (mm(1, "x", vec![ImageInput::Encoded(b"GIF? no, plain text".to_vec())], 1, 2), "not an image"),
        (mm(2, "x", vec![ImageInput::Encoded(png(100, 80)[..60].to_vec())], 1, 2), "truncated or corrupt"),
        (mm(3, "x", vec![ImageInput::Rgb { width: 0, height: 10, pixels: vec![] }], 1, 2), "zero-sized"),
        (mm(4, "x", vec![rgb(20_000, 1, 0)], 1, 2), "hard limit"),
    ];
    let mut two = mm(5, "x", vec![rgb(50, 50, 0)], 1, 2);
    two.images.push(rgb(50, 50, 1));
    cases.push((two, "1 image placeholders and the request 2 images"));
    for (r, want) in cases {
        let err = e.add_request(r).unwrap_err().to_string();
        assert!(err.contains(want), "`{err}` should say `{want}`");
    }
    assert_eq!(e.check_idle(), Ok(()));
    // The engine is still usable.
    e.add_request(mm(9, "ok", vec![ImageInput::Encoded(png(100, 80))], 1, 2)).unwrap();
    drain(&mut e, 100);
    assert_eq!(e.check_idle(), Ok(()));
    // A text-only preset refuses images.
    let mut text_only = engine_with(|_| {});
    let err = text_only.add_request(mm(1, "x", vec![rgb(50, 50, 0)], 1, 2)).unwrap_err().to_string();
    assert!(err.contains("no vision encoder"), "{err}");
    assert!(text_only.add_request(req(2, vec![0, IMAGE_PAD, 5], 1, 2, 1)).is_err());
}

#[test]
fn encoder_cache_abort_leaves_references() {
    let mut e = vl(|c| c.injections = Injections::none().with(Injection::EncoderCacheAbort));
    // Aborted after its image is encoded, before its prefill consumed the embeddings.
    e.add_request(mm(1, "A", vec![rgb(200, 150, 1)], 2, 20)).unwrap();
    e.step().unwrap();
    assert_eq!(e.stage(1), Some(RequestStage::Encoded));
    e.abort(1);
    drain(&mut e, 100);
    let v = e.check_idle().unwrap_err();
    assert!(v.iter().any(|v| v.metric == "registry.encoder_cache.refs"), "{v:?}");
}
