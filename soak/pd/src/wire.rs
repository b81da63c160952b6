//! The framing of the TCP transport between plateau processes.
//!
//! A frame: magic `PLT1`, header length (u32 LE), blob length (u32 LE), CRC-32 of header and blob
//! (u32 LE), then the header (JSON) and the blob (raw bytes: KV data). A frame that is cut short,
//! too large, or whose checksum does not match is rejected with a clear error and never applied.

use std::io::{Read, Write};

use serde::de::DeserializeOwned;
use serde::Serialize;

const MAGIC: &[u8; 4] = b"PLT1";
/// The largest header accepted.
pub const MAX_HEADER_BYTES: usize = 16 << 20;
/// The largest blob accepted (one request's KV).
pub const MAX_BLOB_BYTES: usize = 1 << 30;

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("connection closed")]
    Closed,
    #[error("frame cut short: {0}")]
    Truncated(String),
    #[error("not a plateau frame (bad magic {0:?})")]
    BadMagic([u8; 4]),
    #[error("frame too large: header {header} bytes, blob {blob} bytes")]
    TooLarge { header: usize, blob: usize },
    #[error("frame checksum mismatch: got {got:#010x}, computed {computed:#010x} (corrupted on the wire)")]
    Checksum { got: u32, computed: u32 },
    #[error("frame header is not a valid message: {0}")]
    BadMessage(String),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

pub fn write_frame<T: Serialize>(w: &mut impl Write, msg: &T, blob: &[u8]) -> Result<(), WireError> {
    let header = serde_json::to_vec(msg).map_err(|e| WireError::BadMessage(e.to_string()))?;
    if header.len() > MAX_HEADER_BYTES || blob.len() > MAX_BLOB_BYTES {
        return Err(WireError::TooLarge { header: header.len(), blob: blob.len() });
    }
    let mut crc = crc32fast::Hasher::new();
    crc.update(&header);
    crc.update(blob);
    let mut head = Vec::with_capacity(16);
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&(header.len() as u32).to_le_bytes());
    head.extend_from_slice(&(blob.len() as u32).to_le_bytes());
    head.extend_from_slice(&crc.finalize().to_le_bytes());
    w.write_all(&head)?;
    w.write_all(&header)?;
    w.write_all(blob)?;
    w.flush()?;
    Ok(())
}

fn read_exact(r: &mut impl Read, buf: &mut [u8], what: &str, first: bool) -> Result<(), WireError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 && first => return Err(WireError::Closed),
            Ok(0) => return Err(WireError::Truncated(format!("{what}: {got} of {} bytes", buf.len()))),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

pub fn read_frame<T: DeserializeOwned>(r: &mut impl Read) -> Result<(T, Vec<u8>), WireError> {
    let mut head = [0u8; 16];
    read_exact(r, &mut head, "frame head", true)?;
    let magic: [u8; 4] = head[0..4].try_into().expect("4 bytes");
    if &magic != MAGIC {
        return Err(WireError::BadMagic(magic));
    }
    let word = |i: usize| u32::from_le_bytes(head[i..i + 4].try_into().expect("4 bytes"));
    let (hlen, blen, crc_got) = (word(4) as usize, word(8) as usize, word(12));
    if hlen > MAX_HEADER_BYTES || blen > MAX_BLOB_BYTES {
        return Err(WireError::TooLarge { header: hlen, blob: blen });
    }
    let mut header = vec![0u8; hlen];
    read_exact(r, &mut header, "header", false)?;
    let mut blob = vec![0u8; blen];
    read_exact(r, &mut blob, "blob", false)?;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&header);
    crc.update(&blob);
    let computed = crc.finalize();
    if computed != crc_got {
        return Err(WireError::Checksum { got: crc_got, computed });
    }
    let msg = serde_json::from_slice(&header).map_err(|e| WireError::BadMessage(e.to_string()))?;
    Ok((msg, blob))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejections() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &serde_json::json!({"call": "stats"}), b"kvkv").unwrap();
        let (v, blob): (serde_json::Value, Vec<u8>) = read_frame(&mut buf.as_slice()).unwrap();
        assert_eq!(v["call"], "stats");
        assert_eq!(blob, b"kvkv");
        // Truncated.
        let cut = &buf[..buf.len() - 2];
        assert!(matches!(read_frame::<serde_json::Value>(&mut &cut[..]), Err(WireError::Truncated(_))));
        // Corrupted payload.
        let mut bad = buf.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0x40;
        assert!(matches!(read_frame::<serde_json::Value>(&mut bad.as_slice()), Err(WireError::Checksum { .. })));
        // Not ours.
        let mut other = buf.clone();
        other[0] = b'X';
        assert!(matches!(read_frame::<serde_json::Value>(&mut other.as_slice()), Err(WireError::BadMagic(_))));
        // Empty stream: closed.
        assert!(matches!(read_frame::<serde_json::Value>(&mut &b""[..]), Err(WireError::Closed)));
    }
}
