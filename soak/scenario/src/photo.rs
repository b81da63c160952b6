//! Seeded photo-like pictures for image requests: a sky-to-ground gradient, a few soft blobs and
//! fine grain, so that resizing and encoding do real work. Made for every image a scenario sends
//! (a unique image per request is the commonest multimodal workload), so the per-pixel work is
//! hoisted out of the loops where it does not depend on the pixel; every value is computed with
//! the same operations in the same order as the plain definition (`photo_reference`, in the
//! tests), so the bytes, and every image hash and trace downstream, are the same.

use rand_core::RngCore;

use crate::seeds::rng_for;

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
    // Each pixel's grain before the row's term: `x * 73856093 ^ seed`, per column.
    let grain_x: Vec<u32> = (0..width).map(|x| x.wrapping_mul(73_856_093) ^ seed as u32).collect();
    let w = width as usize;
    // One row at a time, a plane per channel and the row's blob weights, so that each loop below
    // is one operation over a row (the blends and clamps vectorize; `exp` stays a call per pixel
    // the blob reaches). A pixel a blob does not reach takes the weight 0, which leaves it
    // unchanged to the bit: `v * 1 + c * 0` is `v` for the non-negative finite values a picture
    // holds.
    let mut planes = [vec![0.0f32; w], vec![0.0f32; w], vec![0.0f32; w]];
    let mut weight = vec![0.0f32; w];
    let mut grain = vec![0.0f32; w];
    let mut bytes = [vec![0u8; w], vec![0u8; w], vec![0u8; w]];
    let mut out = vec![0u8; w * height as usize * 3];
    for (y, out_row) in (0..height).zip(out.chunks_exact_mut(w * 3)) {
        let t = y as f32 / height as f32;
        for (plane, (top, bottom)) in planes.iter_mut().zip(top.iter().zip(bottom)) {
            plane.fill(top * (1.0 - t) + bottom * t);
        }
        for (b, dx2) in blobs.iter().zip(&dx2) {
            let dy2 = (y as f32 - b.cy).powi(2);
            // A blob whose vertical distance alone is past its reach touches no pixel of this row.
            if dy2 >= 4.0 * b.r2 {
                continue;
            }
            for (wt, &dx2) in weight.iter_mut().zip(dx2) {
                let d2 = dx2 + dy2;
                *wt = if d2 < 4.0 * b.r2 { (-d2 / b.r2).exp() } else { 0.0 };
            }
            for (plane, c) in planes.iter_mut().zip(b.colour) {
                for (v, &wt) in plane.iter_mut().zip(&weight) {
                    *v = *v * (1.0 - wt) + c * wt;
                }
            }
        }
        let grain_y = y.wrapping_mul(19_349_663);
        for (g, &gx) in grain.iter_mut().zip(&grain_x) {
            *g = ((gx ^ grain_y) % 17) as f32 - 8.0;
        }
        for (bytes, plane) in bytes.iter_mut().zip(&planes) {
            for ((b, &v), &g) in bytes.iter_mut().zip(plane).zip(&grain) {
                // Through i32: the same truncation in [0, 255], in one instruction (a float to u8
                // saturates through a longer sequence).
                *b = (v + g).clamp(0.0, 255.0) as i32 as u8;
            }
        }
        for (x, px) in out_row.chunks_exact_mut(3).enumerate() {
            px.copy_from_slice(&[bytes[0][x], bytes[1][x], bytes[2][x]]);
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
