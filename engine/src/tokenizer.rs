//! A byte-level tokenizer: ids 0..3 are special, every byte b is id `BYTE_OFFSET + b`.

pub use plateau_model::vocab::{BOS, BYTE_OFFSET, EOS, IMAGE_PAD, MIN_VOCAB};

/// The text that stands for `IMAGE_PAD` in a prompt.
pub const IMAGE_PAD_TEXT: &str = "<|image_pad|>";

/// Text to token ids, with a leading BOS; each `<|image_pad|>` becomes one `IMAGE_PAD` token.
pub fn encode(text: &str) -> Vec<u32> {
    let mut out = vec![BOS];
    for (k, part) in text.split(IMAGE_PAD_TEXT).enumerate() {
        if k > 0 {
            out.push(IMAGE_PAD);
        }
        out.extend(part.bytes().map(|b| BYTE_OFFSET + b as u32));
    }
    out
}

/// Token ids to text: bytes decoded lossily, specials and ids beyond bytes written as `<id>`.
pub fn decode(tokens: &[u32]) -> String {
    let mut out = String::new();
    let mut bytes = Vec::new();
    let flush = |bytes: &mut Vec<u8>, out: &mut String| {
        out.push_str(&String::from_utf8_lossy(bytes));
        bytes.clear();
    };
    for &t in tokens {
        match t.checked_sub(BYTE_OFFSET) {
            Some(b) if b < 256 => bytes.push(b as u8),
            _ => {
                flush(&mut bytes, &mut out);
                out.push_str(&match t {
                    BOS => "<bos>".to_string(),
                    EOS => "<eos>".to_string(),
                    IMAGE_PAD => "<|image_pad|>".to_string(),
                    _ => format!("<{t}>"),
                });
            }
        }
    }
    flush(&mut bytes, &mut out);
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trip() {
        let ids = super::encode("héllo");
        assert_eq!(ids[0], super::BOS);
        assert_eq!(super::decode(&ids[1..]), "héllo");
        assert_eq!(super::decode(&[super::EOS]), "<eos>");
        let ids = super::encode("a<|image_pad|>b");
        assert_eq!(ids, vec![super::BOS, super::BYTE_OFFSET + 97, super::IMAGE_PAD, super::BYTE_OFFSET + 98]);
    }
}
