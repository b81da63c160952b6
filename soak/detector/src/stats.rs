//! Robust trend statistics: Theil–Sen slope and the Mann–Kendall trend test with the Hamed–Rao
//! variance correction for autocorrelated series.

/// At most this many points enter an O(n²) statistic; longer series are thinned evenly.
pub const MAX_POINTS: usize = 600;

/// Evenly spaced indices of at most `MAX_POINTS` out of `n`, first and last included.
fn thin(n: usize) -> Vec<usize> {
    if n <= MAX_POINTS {
        return (0..n).collect();
    }
    (0..MAX_POINTS).map(|k| k * (n - 1) / (MAX_POINTS - 1)).collect()
}

/// The median of a series that is never empty here; reorders `v`.
pub fn median(v: &mut [f64]) -> f64 {
    plateau_reports::figures::median(v).expect("the median of an empty series")
}

/// Robust scale: 1.4826 x the median absolute deviation from the median (the standard deviation
/// for normal noise, untouched by rare blips).
pub fn mad_scale(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut w = v.to_vec();
    let m = median(&mut w);
    let mut dev: Vec<f64> = v.iter().map(|x| (x - m).abs()).collect();
    1.4826 * median(&mut dev)
}

/// Theil–Sen slope: the median of the slopes between every pair of points with distinct x.
pub fn theil_sen(x: &[f64], y: &[f64]) -> f64 {
    assert_eq!(x.len(), y.len());
    let idx = thin(x.len());
    let mut slopes = Vec::with_capacity(idx.len() * idx.len() / 2);
    for (a, &i) in idx.iter().enumerate() {
        for &j in &idx[a + 1..] {
            let dx = x[j] - x[i];
            if dx != 0.0 {
                slopes.push((y[j] - y[i]) / dx);
            }
        }
    }
    if slopes.is_empty() {
        0.0
    } else {
        median(&mut slopes)
    }
}

/// Standard normal upper tail, P(Z > z).
pub fn normal_sf(z: f64) -> f64 {
    0.5 * erfc(z / std::f64::consts::SQRT_2)
}

/// Complementary error function (Numerical Recipes' Chebyshev fit, relative error < 1.2e-7).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// Mann–Kendall test for an increasing trend.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MannKendall {
    pub s: f64,
    pub z: f64,
    /// One-sided p-value for an increase.
    pub p_increase: f64,
    /// Variance inflation from autocorrelation (>= 1).
    pub correction: f64,
}

fn ranks(v: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    let mut r = vec![0.0; v.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && v[idx[j + 1]] == v[idx[i]] {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0 + 1.0;
        for &k in &idx[i..=j] {
            r[k] = avg;
        }
        i = j + 1;
    }
    r
}

/// Mann–Kendall with ties, variance corrected after Hamed & Rao (1998): the lag autocorrelations
/// of the ranks of the series detrended by `slope` (its Theil–Sen slope) that are significant at
/// 5% inflate the variance, so a series that wanders (aging data, a sawtooth) is not taken for a
/// trend.
pub fn mann_kendall(x: &[f64], y: &[f64], slope: f64) -> MannKendall {
    let idx = thin(y.len());
    let (x, y): (Vec<f64>, Vec<f64>) = idx.iter().map(|&i| (x[i], y[i])).unzip();
    let n = y.len();
    if n < 3 {
        return MannKendall { s: 0.0, z: 0.0, p_increase: 1.0, correction: 1.0 };
    }
    let mut s = 0.0;
    for i in 0..n {
        for j in i + 1..n {
            s += (y[j] - y[i]).signum() * f64::from(y[j] != y[i]);
        }
    }
    let nf = n as f64;
    let mut var = nf * (nf - 1.0) * (2.0 * nf + 5.0);
    let mut sorted = y.clone();
    sorted.sort_by(f64::total_cmp);
    let mut i = 0;
    while i < n {
        let mut j = i;
        while j + 1 < n && sorted[j + 1] == sorted[i] {
            j += 1;
        }
        let t = (j - i + 1) as f64;
        var -= t * (t - 1.0) * (2.0 * t + 5.0);
        i = j + 1;
    }
    var /= 18.0;
    let detrended: Vec<f64> = x.iter().zip(&y).map(|(a, b)| b - slope * a).collect();
    let r = ranks(&detrended);
    let mean = r.iter().sum::<f64>() / nf;
    let denom: f64 = r.iter().map(|v| (v - mean).powi(2)).sum();
    let mut sum = 0.0;
    if denom > 0.0 {
        let bound = 1.96 / nf.sqrt();
        for k in 1..n.min(n / 3 + 1) {
            let rho: f64 = (0..n - k).map(|i| (r[i] - mean) * (r[i + k] - mean)).sum::<f64>() / denom;
            if rho.abs() > bound {
                let kf = k as f64;
                sum += (nf - kf) * (nf - kf - 1.0) * (nf - kf - 2.0) * rho;
            }
        }
    }
    let correction = (1.0 + 2.0 / (nf * (nf - 1.0) * (nf - 2.0)) * sum).max(1.0);
    let var = var * correction;
    let z = if var <= 0.0 {
        0.0
    } else if s > 0.0 {
        (s - 1.0) / var.sqrt()
    } else if s < 0.0 {
        (s + 1.0) / var.sqrt()
    } else {
        0.0
    };
    MannKendall { s, z, p_increase: normal_sf(z), correction }
}

/// The best single step through `y`: the split `k` (both sides at least `min_side` long) that
/// leaves the least squared error around the two sides' means. None when `y` is too short.
pub fn best_split(y: &[f64], min_side: usize) -> Option<usize> {
    let n = y.len();
    if n < 2 * min_side {
        return None;
    }
    let mean = y.iter().sum::<f64>() / n as f64;
    // Centred, so the prefix sums stay exact for byte counts in the gigabytes.
    let c: Vec<f64> = y.iter().map(|v| v - mean).collect();
    let (mut s, mut s2) = (vec![0.0; n + 1], vec![0.0; n + 1]);
    for i in 0..n {
        s[i + 1] = s[i] + c[i];
        s2[i + 1] = s2[i] + c[i] * c[i];
    }
    let sse = |a: usize, b: usize| {
        let m = (b - a) as f64;
        (s2[b] - s2[a]) - (s[b] - s[a]).powi(2) / m
    };
    (min_side..=n - min_side).min_by(|&a, &b| (sse(0, a) + sse(a, n)).total_cmp(&(sse(0, b) + sse(b, n))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn theil_sen_ignores_outliers() {
        let x: Vec<f64> = (0..50).map(f64::from).collect();
        let mut y: Vec<f64> = x.iter().map(|v| 3.0 * v + 10.0).collect();
        y[7] = 1e9;
        y[30] = -1e9;
        assert!((theil_sen(&x, &y) - 3.0).abs() < 1e-9);
    }

    #[test]
    fn median_of_even_and_odd() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn normal_tail() {
        assert!((normal_sf(0.0) - 0.5).abs() < 1e-7);
        assert!((normal_sf(1.96) - 0.025).abs() < 1e-4);
        assert!((normal_sf(-1.0) - 0.841_344_7).abs() < 1e-6);
    }

    fn mk(x: &[f64], y: &[f64]) -> MannKendall {
        mann_kendall(x, y, theil_sen(x, y))
    }

    #[test]
    fn mann_kendall_sees_a_noisy_trend_and_not_flat_noise() {
        let x: Vec<f64> = (0..80).map(f64::from).collect();
        let noise = |i: usize| ((i * 7919) % 101) as f64 / 101.0 - 0.5;
        let trend: Vec<f64> = (0..80).map(|i| i as f64 * 0.05 + noise(i)).collect();
        let flat: Vec<f64> = (0..80).map(noise).collect();
        assert!(mk(&x, &trend).p_increase < 1e-4);
        assert!(mk(&x, &flat).p_increase > 0.01);
        let constant = vec![5.0; 80];
        assert!((mk(&x, &constant).p_increase - 0.5).abs() < 1e-6);
    }

    #[test]
    fn autocorrelation_widens_the_variance() {
        // A slow random-walk-like wander: plain MK would call it a trend.
        let x: Vec<f64> = (0..120).map(f64::from).collect();
        let y: Vec<f64> = (0..120).map(|i| ((i as f64) / 15.0).sin() * 10.0 + (i / 40) as f64).collect();
        assert!(mk(&x, &y).correction > 1.0);
    }

    #[test]
    fn the_best_split_finds_a_step() {
        let y: Vec<f64> = (0..40).map(|i| if i < 29 { 5.0 } else { 9.0 }).collect();
        assert_eq!(best_split(&y, 3), Some(29));
        assert_eq!(best_split(&y[..5], 3), None);
    }
}
