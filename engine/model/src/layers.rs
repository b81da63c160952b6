//! The layers both CPU models share, the decoder (`cpu.rs`) and the vision encoder (`vision.rs`):
//! pure functions over row-major `f32` slices, each token's row computed independently of the
//! rest of the batch, in the same order every time.

/// y[t, out] = x[t, in] · w[out, in]^T
pub fn linear(x: &[f32], w: &[f32], t: usize, inp: usize, out: usize) -> Vec<f32> {
    assert_eq!(x.len(), t * inp);
    assert_eq!(w.len(), out * inp);
    let mut y = vec![0.0f32; t * out];
    if t == 0 {
        return y;
    }
    // SAFETY: the slices hold exactly t*inp, out*inp and t*out floats, and the strides below stay
    // inside them (asserted above).
    unsafe {
        matrixmultiply::sgemm(
            t,
            inp,
            out,
            1.0,
            x.as_ptr(),
            inp as isize,
            1,
            w.as_ptr(),
            1,
            inp as isize,
            0.0,
            y.as_mut_ptr(),
            out as isize,
            1,
        );
    }
    y
}

pub fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let h = w.len();
    let mut out = vec![0.0; x.len()];
    for (row, o) in x.chunks_exact(h).zip(out.chunks_exact_mut(h)) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / h as f32;
        let r = 1.0 / (ms + eps).sqrt();
        for i in 0..h {
            o[i] = row[i] * r * w[i];
        }
    }
    out
}

/// Rotary embedding, rotate-half convention (Hugging Face Llama), in place on `heads` heads per row.
pub fn rope(x: &mut [f32], positions: &[usize], heads: usize, hd: usize, inv_freq: &[f32]) {
    let half = hd / 2;
    for (row, &pos) in x.chunks_exact_mut(heads * hd).zip(positions) {
        for i in 0..half {
            let angle = pos as f32 * inv_freq[i];
            let (sin, cos) = angle.sin_cos();
            for head in row.chunks_exact_mut(hd) {
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * cos - b * sin;
                head[i + half] = b * cos + a * sin;
            }
        }
    }
}

/// Dot product with eight independent accumulators (vectorisable, and the same order every time).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}
