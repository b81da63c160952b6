//! The one hash that seeds, cache keys and traces depend on: SipHash-1-3 with zero keys (as
//! specified by Aumasson and Bernstein; the `siphasher` crate) over bytes this module writes
//! explicitly, in little-endian order. Nothing here depends on the standard library's hasher or
//! on how its `Hash` implementations lay out a value, which may change between compiler versions:
//! a replay from a seed gives the same tokens, prefix-cache keys and image keys on any toolchain.
//! (The byte layout is the one those implementations used when this was written, so hashes made
//! before and after agree.)

use std::hash::Hasher;

use siphasher::sip::SipHasher13;

/// An explicit-layout hasher; every method says what bytes it writes.
#[derive(Debug, Clone)]
pub struct StableHasher(SipHasher13);

impl Default for StableHasher {
    fn default() -> Self {
        StableHasher(SipHasher13::new_with_keys(0, 0))
    }
}

impl StableHasher {
    pub fn new() -> Self {
        Self::default()
    }

    /// 8 bytes, little-endian.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.write(&v.to_le_bytes());
        self
    }

    /// 4 bytes, little-endian.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.write(&v.to_le_bytes());
        self
    }

    /// A length or a position: 8 bytes, little-endian, on every platform.
    pub fn len(&mut self, v: usize) -> &mut Self {
        self.u64(v as u64)
    }

    /// The length, then each value's 4 bytes.
    pub fn u32s(&mut self, v: &[u32]) -> &mut Self {
        self.len(v.len());
        for x in v {
            self.0.write(&x.to_le_bytes());
        }
        self
    }

    /// The length, then each value's 8 bytes.
    pub fn u64s(&mut self, v: &[u64]) -> &mut Self {
        self.len(v.len());
        for x in v {
            self.0.write(&x.to_le_bytes());
        }
        self
    }

    /// The length, then the bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.len(v.len());
        self.0.write(v);
        self
    }

    /// The UTF-8 bytes, then 0xff (a terminator no UTF-8 text contains).
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.0.write(s.as_bytes());
        self.0.write(&[0xff]);
        self
    }

    /// 8 bytes of tag (0 for none, 1 for some), then the value's 8 bytes if any.
    pub fn opt_u64(&mut self, v: Option<u64>) -> &mut Self {
        match v {
            None => self.u64(0),
            Some(x) => self.u64(1).u64(x),
        }
    }

    pub fn finish(&self) -> u64 {
        self.0.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::StableHasher;

    /// Known values: a change here changes every prefix-cache key, image key and seed derived
    /// from names, and with them every replay. It must be a deliberate decision.
    #[test]
    fn known_values() {
        assert_eq!(StableHasher::new().finish(), 0xd1fb_a762_150c_532c);
        assert_eq!(StableHasher::new().u32s(&[1, 2, 3]).finish(), 0xbc87_eb5a_f6d7_0cea);
        assert_eq!(StableHasher::new().u64(7).str("model.embed_tokens.weight").finish(), 0x6415_e233_bba8_5395);
    }
}
