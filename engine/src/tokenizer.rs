//! A byte-level tokenizer: ids 0..3 are special, every byte b is id `BYTE_OFFSET + b`.

pub const BOS: u32 = 0;
pub const EOS: u32 = 1;
/// Stands in the prompt for one image; the engine expands it to the encoder's output length.
pub const IMAGE_PAD: u32 = 2;
pub const BYTE_OFFSET: u32 = 3;
/// The smallest vocabulary that holds every byte.
pub const MIN_VOCAB: usize = BYTE_OFFSET as usize + 256;

/// Text to token ids, with a leading BOS.
pub fn encode(text: &str) -> Vec<u32> {
    std::iter::once(BOS)
        .chain(text.bytes().map(|b| BYTE_OFFSET + b as u32))
        .collect()
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
    }
}
