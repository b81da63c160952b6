//! Seeded photo-like pictures for image requests: a sky-to-ground gradient, a few soft blobs and
//! fine grain, so that resizing and encoding do real work. Made for every image a scenario sends
//! (a unique image per request is the commonest multimodal workload), so the per-pixel work is
//! hoisted out of the loops where it does not depend on the pixel; every value is computed with
//! the same operations in the same order as the plain definition (`photo_reference`, in the
//! tests), so the bytes, and every image hash and trace downstream, are the same.

use rand_core::RngCore;

use crate::workload::rng_for;

/// A blob: its colour, centre, and squared radius.
struct Blob {
    colour: [f32; 3],
    cx: f32,
    cy: f32,
    r2: f32,
}

/// A seeded `width` x `height` RGB picture, row-major, 3 bytes a pixel.
pub fn photo(width: u32, height: u32, seed: u64) -> Vec<u8> {
    let mut rng = rng_for(&[seed, width as u64, height as u64]);
    let mut colour = || [(rng.next_u32() % 256) as f32, (rng.next_u32() % 256) as f32, (rng.next_u32() % 256) as f32];
    let (top, bottom) = (colour(), colour());
    let blobs: Vec<Blob> = (0..4)
        .map(|_| {
            let c = colour();
            let (cx, cy) = ((c[0] / 255.0) * width as f32, (c[1] / 255.0) * height as f32);
            let r = (0.08 + c[2] / 255.0 * 0.25) * width.max(height) as f32;
            Blob { colour: colour(), cx, cy, r2: r * r }
        })
        .collect();
    // Each blob's squared horizontal distance, per column.
    let dx2: Vec<Vec<f32>> = blobs.iter().map(|b| (0..width).map(|x| (x as f32 - b.cx).powi(2)).collect()).collect();
    let mut out = vec![0u8; width as usize * height as usize * 3];
    let mut px_at = 0;
    for y in 0..height {
        let t = y as f32 / height as f32;
        let mut ground = [0.0f32; 3];
        for k in 0..3 {
            ground[k] = top[k] * (1.0 - t) + bottom[k] * t;
        }
        // A blob whose vertical distance alone is past its reach touches no pixel of this row.
        let near: Vec<(usize, f32)> = blobs
            .iter()
            .enumerate()
            .map(|(i, b)| (i, (y as f32 - b.cy).powi(2)))
            .filter(|&(i, dy2)| dy2 < 4.0 * blobs[i].r2)
            .collect();
        for x in 0..width {
            let mut px = ground;
            for &(i, dy2) in &near {
                let b = &blobs[i];
                let d2 = dx2[i][x as usize] + dy2;
                if d2 < 4.0 * b.r2 {
                    let w = (-d2 / b.r2).exp();
                    for (v, c) in px.iter_mut().zip(b.colour) {
                        *v = *v * (1.0 - w) + c * w;
                    }
                }
            }
            let grain = ((x.wrapping_mul(73_856_093) ^ y.wrapping_mul(19_349_663) ^ seed as u32) % 17) as f32 - 8.0;
            for (o, v) in out[px_at..px_at + 3].iter_mut().zip(px) {
                *o = (v + grain).clamp(0.0, 255.0) as u8;
            }
            px_at += 3;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The picture as first written, pixel by pixel: what [`photo`] must reproduce to the byte.
    pub(crate) fn photo_reference(width: u32, height: u32, seed: u64) -> Vec<u8> {
        let mut rng = rng_for(&[seed, width as u64, height as u64]);
        let mut colour =
            || [(rng.next_u32() % 256) as f32, (rng.next_u32() % 256) as f32, (rng.next_u32() % 256) as f32];
        let (top, bottom) = (colour(), colour());
        let blobs: Vec<([f32; 3], f32, f32, f32)> = (0..4)
            .map(|_| {
                let c = colour();
                let (cx, cy) = ((c[0] / 255.0) * width as f32, (c[1] / 255.0) * height as f32);
                let r = (0.08 + c[2] / 255.0 * 0.25) * width.max(height) as f32;
                (colour(), cx, cy, r * r)
            })
            .collect();
        let mut out = Vec::with_capacity(width as usize * height as usize * 3);
        for y in 0..height {
            let t = y as f32 / height as f32;
            for x in 0..width {
                let mut px = [0.0f32; 3];
                for k in 0..3 {
                    px[k] = top[k] * (1.0 - t) + bottom[k] * t;
                }
                for (c, cx, cy, r2) in &blobs {
                    let d2 = (x as f32 - cx).powi(2) + (y as f32 - cy).powi(2);
                    if d2 < 4.0 * r2 {
                        let w = (-d2 / r2).exp();
                        for k in 0..3 {
                            px[k] = px[k] * (1.0 - w) + c[k] * w;
                        }
                    }
                }
                let grain = ((x.wrapping_mul(73_856_093) ^ y.wrapping_mul(19_349_663) ^ seed as u32) % 17) as f32 - 8.0;
                out.extend(px.iter().map(|v| (v + grain).clamp(0.0, 255.0) as u8));
            }
        }
        out
    }

    #[test]
    fn the_hoisted_loops_make_the_same_bytes_as_the_plain_definition() {
        for (w, h) in [(96, 64), (64, 64), (320, 320), (17, 5), (1, 1), (56, 200)] {
            for seed in [0, 1, 7, 0xdead_beef, u64::MAX] {
                assert!(photo(w, h, seed) == photo_reference(w, h, seed), "{w}x{h} seed {seed}");
            }
        }
    }
}
