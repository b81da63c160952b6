//! Image input: encoded bytes (PNG, JPEG) or raw RGB pixels, converted to RGB, resized to stay
//! within `[min_pixels, max_pixels]` by the square root of the ratio (as the reported reproduction
//! did), rounded to the vision encoder's patch grid, and normalised into a pixel tensor that the
//! request keeps for its whole life (a preempted request may need to encode it again).

use std::borrow::Cow;

use super::codec;

/// An image as a client sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageInput {
    /// PNG or JPEG bytes.
    Encoded(Vec<u8>),
    /// Row-major RGB, 3 bytes per pixel.
    Rgb { width: u32, height: u32, pixels: Vec<u8> },
}

/// The limits images are held to (engine configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    /// Smaller images are scaled up to about this many pixels.
    pub min_pixels: u64,
    /// Larger images are scaled down to about this many pixels.
    pub max_pixels: u64,
    /// Refused if still above this after resizing (extreme aspect ratios), or if the input itself
    /// is above 64 times this (a decompression bomb).
    pub hard_max_pixels: u64,
}

impl Default for ImageLimits {
    fn default() -> Self {
        ImageLimits { min_pixels: 128 * 128, max_pixels: 320 * 320, hard_max_pixels: 4 * 320 * 320 }
    }
}

pub use plateau_model::vision::PixelTensor;

/// Target size: scale by sqrt(limit / pixels) into the range, then round each side to a multiple
/// of `factor` (at least one factor).
pub fn target_size(width: u32, height: u32, limits: &ImageLimits, factor: u32) -> (u32, u32) {
    let px = width as f64 * height as f64;
    let scale = if px > limits.max_pixels as f64 {
        (limits.max_pixels as f64 / px).sqrt()
    } else if px < limits.min_pixels as f64 {
        (limits.min_pixels as f64 / px).sqrt()
    } else {
        1.0
    };
    let round = |v: f64| (((v / factor as f64).round() as u32).max(1)) * factor;
    (round(width as f64 * scale), round(height as f64 * scale))
}

/// Decodes, resizes and normalises one image. Errors name what is wrong with it.
pub fn process(input: &ImageInput, limits: &ImageLimits, factor: u32) -> Result<PixelTensor, String> {
    let (sw, sh, rgb): (u32, u32, Cow<[u8]>) = match input {
        ImageInput::Rgb { width, height, pixels } => {
            if *width == 0 || *height == 0 {
                return Err(format!("zero-sized image ({width}x{height})"));
            }
            check_input_size(*width, *height, limits)?;
            let want = *width as usize * *height as usize * 3;
            if pixels.len() != want {
                return Err(format!("{width}x{height} RGB needs {want} bytes, got {}", pixels.len()));
            }
            (*width, *height, Cow::Borrowed(pixels))
        }
        ImageInput::Encoded(bytes) => {
            let (w, h, rgb) = codec::decode(bytes, |w, h| check_input_size(w, h, limits))?;
            (w, h, Cow::Owned(rgb))
        }
    };
    let (w, h) = target_size(sw, sh, limits, factor);
    if w as u64 * h as u64 > limits.hard_max_pixels {
        return Err(format!(
            "{sw}x{sh} would be {w}x{h} after resizing, above the hard limit of {} pixels",
            limits.hard_max_pixels
        ));
    }
    // Read in place where no resize is needed: the bytes are only hashed and normalised.
    let raw = if (w, h) == (sw, sh) { rgb } else { Cow::Owned(resize(&rgb, (sw, sh), w, h)?) };
    let hash = crate::stable_hash::StableHasher::new().u32(w).u32(h).bytes(&raw).finish();
    let values = raw.iter().map(|&b| b as f32 / 127.5 - 1.0).collect();
    Ok(PixelTensor { width: w, height: h, values, hash })
}

/// Bilinear (triangle-filter) resampling through `fast_image_resize` (SIMD; no threads), typed
/// to RGB bytes: its untyped `resize` instantiates every pixel type it knows, which made three
/// quarters of this crate's machine code and most of its build time.
fn resize(rgb: &[u8], (sw, sh): (u32, u32), w: u32, h: u32) -> Result<Vec<u8>, String> {
    use fast_image_resize::{
        images::{TypedImage, TypedImageRef},
        pixels::U8x3,
        FilterType, ResizeAlg, ResizeOptions, Resizer,
    };
    // Views of the caller's bytes and of the output: no copy of either.
    let src = TypedImageRef::<U8x3>::from_buffer(sw, sh, rgb).map_err(|e| format!("resize: {e}"))?;
    let mut out = vec![0u8; w as usize * h as usize * 3];
    let mut dst = TypedImage::<U8x3>::from_buffer(w, h, &mut out).map_err(|e| format!("resize: {e}"))?;
    let options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Bilinear));
    Resizer::new().resize_typed(&src, &mut dst, &options).map_err(|e| format!("resize: {e}"))?;
    Ok(out)
}

fn check_input_size(w: u32, h: u32, limits: &ImageLimits) -> Result<(), String> {
    let max_input = limits.hard_max_pixels.saturating_mul(64);
    if w as u64 * h as u64 > max_input {
        return Err(format!("{w}x{h} is above the input limit of {max_input} pixels"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(w: u32, h: u32) -> Vec<u8> {
        let rgb: Vec<u8> = (0..w * h).flat_map(|i| [((i % w) * 7) as u8, ((i / w) * 3) as u8, 90]).collect();
        codec::encode_png(w, h, &rgb).unwrap()
    }

    #[test]
    fn resizes_into_range_by_the_square_root() {
        let l = ImageLimits::default();
        assert_eq!(target_size(1024, 768, &l, 28), (364, 280));
        let (w, h) = target_size(64, 48, &l, 28);
        assert!(w as u64 * h as u64 >= 12_000 && w * 3 / 4 <= h + 28, "{w}x{h}");
        assert_eq!(target_size(280, 280, &l, 28), (280, 280));
    }

    #[test]
    fn decodes_png_and_hashes_content() {
        let l = ImageLimits::default();
        let a = process(&ImageInput::Encoded(png(200, 150)), &l, 28).unwrap();
        let b = process(&ImageInput::Encoded(png(200, 150)), &l, 28).unwrap();
        assert_eq!(a.hash, b.hash);
        assert_eq!((a.width % 28, a.height % 28), (0, 0));
        let c = process(&ImageInput::Encoded(png(201, 150)), &l, 28).unwrap();
        assert_ne!(a.hash, c.hash);
    }

    #[test]
    fn bad_images_are_named() {
        let l = ImageLimits::default();
        let e = process(&ImageInput::Encoded(b"hello, not an image".to_vec()), &l, 28).unwrap_err();
        assert!(e.contains("not an image"), "{e}");
        let mut p = png(200, 150);
        p.truncate(p.len() / 2);
        let e = process(&ImageInput::Encoded(p), &l, 28).unwrap_err();
        assert!(e.contains("truncated or corrupt"), "{e}");
        let e = process(&ImageInput::Rgb { width: 0, height: 5, pixels: vec![] }, &l, 28).unwrap_err();
        assert!(e.contains("zero-sized"), "{e}");
        let e = process(&ImageInput::Rgb { width: 20_000, height: 1, pixels: vec![0; 60_000] }, &l, 28).unwrap_err();
        assert!(e.contains("hard limit"), "{e}");
    }
}
