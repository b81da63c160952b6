//! PNG and JPEG to RGB bytes and back: what a client's encoded image becomes before it is resized,
//! and how the workload and the load generator make encoded images. `png` and `zune-jpeg` decode
//! (the decoders the `image` crate uses, without its colour management, which cost a minute of
//! every build), `png` and `jpeg-encoder` encode.

use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;

/// Quality of encoded JPEGs (the common default).
pub const JPEG_QUALITY: u8 = 75;

/// The encodings a client may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Png,
    Jpeg,
}

/// The encoding `bytes` start with, from their magic numbers.
pub fn sniff(bytes: &[u8]) -> Option<Format> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some(Format::Png)
    } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some(Format::Jpeg)
    } else {
        None
    }
}

/// Decodes PNG or JPEG bytes into (width, height, RGB bytes). `check` sees the size from the
/// header before any pixel is decoded, and refuses what it must (a decompression bomb).
pub fn decode(bytes: &[u8], check: impl Fn(u32, u32) -> Result<(), String>) -> Result<(u32, u32, Vec<u8>), String> {
    let (w, h, rgb) = match sniff(bytes) {
        Some(Format::Png) => {
            let mut d = png::Decoder::new(std::io::Cursor::new(bytes));
            // Palettes and low bit depths expanded, 16-bit samples cut to 8.
            d.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
            let mut reader = d.read_info().map_err(|e| format!("cannot read the image header: {e}"))?;
            let (w, h) = (reader.info().width, reader.info().height);
            zero_sized(w, h)?;
            check(w, h)?;
            let size = reader.output_buffer_size().ok_or("cannot read the image header: the image is too large")?;
            let mut buf = vec![0u8; size];
            let frame = reader.next_frame(&mut buf).map_err(corrupt)?;
            buf.truncate(frame.buffer_size());
            (w, h, to_rgb(buf, frame.color_type)?)
        }
        Some(Format::Jpeg) => {
            let options = DecoderOptions::default()
                .set_strict_mode(false)
                .set_max_width(usize::MAX)
                .set_max_height(usize::MAX)
                .jpeg_set_out_colorspace(ColorSpace::RGB);
            let mut d = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(bytes), options);
            d.decode_headers().map_err(|e| format!("cannot read the image header: {e}"))?;
            let (w, h) = d.dimensions().ok_or("cannot read the image header: no dimensions")?;
            let (w, h) = (w as u32, h as u32);
            zero_sized(w, h)?;
            check(w, h)?;
            (w, h, d.decode().map_err(corrupt)?)
        }
        None => return Err("not an image: the bytes are neither PNG nor JPEG".into()),
    };
    if rgb.len() != w as usize * h as usize * 3 {
        return Err(format!("cannot decode the image (truncated or corrupt?): {} bytes for {w}x{h} RGB", rgb.len()));
    }
    Ok((w, h, rgb))
}

fn zero_sized(w: u32, h: u32) -> Result<(), String> {
    if w == 0 || h == 0 {
        return Err(format!("zero-sized image ({w}x{h})"));
    }
    Ok(())
}

fn corrupt(e: impl std::fmt::Display) -> String {
    format!("cannot decode the image (truncated or corrupt?): {e}")
}

/// 8-bit samples of any PNG colour type as RGB: grey repeated, alpha dropped.
fn to_rgb(buf: Vec<u8>, color: png::ColorType) -> Result<Vec<u8>, String> {
    let channels = match color {
        png::ColorType::Rgb => return Ok(buf),
        png::ColorType::Grayscale => 1,
        png::ColorType::GrayscaleAlpha => 2,
        png::ColorType::Rgba => 4,
        png::ColorType::Indexed => return Err("cannot decode the image: an indexed PNG left unexpanded".into()),
    };
    Ok(buf
        .chunks_exact(channels)
        .flat_map(|px| if channels <= 2 { [px[0], px[0], px[0]] } else { [px[0], px[1], px[2]] })
        .collect())
}

/// RGB bytes as a PNG file.
pub fn encode_png(width: u32, height: u32, rgb: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut e = png::Encoder::new(&mut out, width, height);
    e.set_color(png::ColorType::Rgb);
    e.set_depth(png::BitDepth::Eight);
    let mut w = e.write_header().map_err(|e| format!("PNG: {e}"))?;
    w.write_image_data(rgb).map_err(|e| format!("PNG: {e}"))?;
    w.finish().map_err(|e| format!("PNG: {e}"))?;
    Ok(out)
}

/// RGB bytes as a baseline JPEG at [`JPEG_QUALITY`].
pub fn encode_jpeg(width: u32, height: u32, rgb: &[u8]) -> Result<Vec<u8>, String> {
    let (w, h) = (u16::try_from(width), u16::try_from(height));
    let (Ok(w), Ok(h)) = (w, h) else { return Err(format!("JPEG: {width}x{height} is past 65535 on a side")) };
    let mut out = Vec::new();
    jpeg_encoder::Encoder::new(&mut out, JPEG_QUALITY)
        .encode(rgb, w, h, jpeg_encoder::ColorType::Rgb)
        .map_err(|e| format!("JPEG: {e}"))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn picture(w: u32, h: u32) -> Vec<u8> {
        (0..w * h).flat_map(|i| [(i % w * 3) as u8, (i / w * 5) as u8, 90]).collect()
    }

    #[test]
    fn png_round_trips_exactly_and_jpeg_closely() {
        let rgb = picture(37, 21);
        let png = encode_png(37, 21, &rgb).unwrap();
        assert_eq!(sniff(&png), Some(Format::Png));
        assert_eq!(decode(&png, |_, _| Ok(())).unwrap(), (37, 21, rgb.clone()));
        let jpeg = encode_jpeg(37, 21, &rgb).unwrap();
        assert_eq!(sniff(&jpeg), Some(Format::Jpeg));
        let (w, h, back) = decode(&jpeg, |_, _| Ok(())).unwrap();
        assert_eq!((w, h), (37, 21));
        // A smooth picture survives quality 75 within a few levels on average.
        let mean = rgb.iter().zip(&back).map(|(a, b)| (*a as f64 - *b as f64).abs()).sum::<f64>() / rgb.len() as f64;
        assert!(mean < 4.0, "JPEG at quality {JPEG_QUALITY} is off by {mean:.1} levels on average");
    }

    #[test]
    fn the_size_is_checked_before_the_pixels_and_bad_bytes_are_named() {
        let png = encode_png(8, 8, &picture(8, 8)).unwrap();
        assert_eq!(decode(&png, |w, h| Err(format!("{w}x{h} too big"))).unwrap_err(), "8x8 too big");
        assert!(decode(b"GIF89a....", |_, _| Ok(())).unwrap_err().contains("neither PNG nor JPEG"));
        let cut = &png[..png.len() / 2];
        assert!(decode(cut, |_, _| Ok(())).unwrap_err().contains("truncated or corrupt"));
    }
}
