//! The token ids every model of plateau's shares: ids 0..3 are special, every byte b is id
//! `BYTE_OFFSET + b` (the engine's byte-level tokenizer maps text onto them).

pub const BOS: u32 = 0;
pub const EOS: u32 = 1;
/// Stands in the prompt for one image; the engine expands it to the encoder's output length.
pub const IMAGE_PAD: u32 = 2;
pub const BYTE_OFFSET: u32 = 3;
/// The smallest vocabulary that holds every byte.
pub const MIN_VOCAB: usize = BYTE_OFFSET as usize + 256;
