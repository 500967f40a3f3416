//! Latency percentiles and rates, as the report shows them.

use std::time::Duration;

use serde::Serialize;

/// Percentiles of a set of latencies, in microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Latency {
    pub samples: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

impl Latency {
    pub fn of(mut samples: Vec<Duration>) -> Self {
        samples.sort_unstable();
        let at = |q: f64| {
            let rank = ((samples.len() as f64 - 1.0) * q).round() as usize;
            samples.get(rank).map_or(0.0, |d| d.as_secs_f64() * 1e6)
        };
        Latency {
            samples: samples.len(),
            p50_us: at(0.50),
            p99_us: at(0.99),
            p999_us: at(0.999),
            max_us: at(1.0),
        }
    }
}

/// `value / base`, or `None` when either is missing or the base is zero.
pub fn ratio(value: Option<f64>, base: Option<f64>) -> Option<f64> {
    match (value, base) {
        (Some(v), Some(b)) if b > 0.0 => Some(v / b),
        _ => None,
    }
}

/// Microseconds, readably: `87 µs`, `1.24 ms`, `2.10 s`.
pub fn micros(us: f64) -> String {
    if us >= 1e6 {
        format!("{:.2} s", us / 1e6)
    } else if us >= 1e3 {
        format!("{:.2} ms", us / 1e3)
    } else {
        format!("{us:.0} µs")
    }
}

/// A count per second, readably: `950/s`, `12.3k/s`.
pub fn rate(per_second: f64) -> String {
    if per_second >= 1e4 {
        format!("{:.1}k/s", per_second / 1e3)
    } else if per_second >= 10.0 {
        format!("{per_second:.0}/s")
    } else {
        format!("{per_second:.1}/s")
    }
}

/// Bytes, readably.
pub fn bytes(n: f64) -> String {
    if n >= 10_240.0 {
        format!("{:.1} KiB", n / 1024.0)
    } else {
        format!("{n:.0} B")
    }
}

/// The least-squares slope of `y` over `x`, or `None` with fewer than two distinct `x`.
pub fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    (points.len() >= 2 && sxx > 0.0).then(|| sxy / sxx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_the_nearest_rank() {
        let samples = (1..=1000).map(Duration::from_micros).collect();
        let l = Latency::of(samples);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-6;
        assert_eq!(l.samples, 1000);
        assert!(close(l.p50_us, 501.0), "{l:?}");
        assert!(close(l.p99_us, 990.0), "{l:?}");
        assert!(close(l.p999_us, 999.0), "{l:?}");
        assert!(close(l.max_us, 1000.0), "{l:?}");
        assert_eq!(Latency::of(Vec::new()).p50_us, 0.0);
    }

    #[test]
    fn ratios_need_both_sides() {
        assert_eq!(ratio(Some(3.0), Some(2.0)), Some(1.5));
        assert_eq!(ratio(Some(3.0), None), None);
        assert_eq!(ratio(Some(3.0), Some(0.0)), None);
    }

    #[test]
    fn slopes_fit_a_line() {
        let line = [(1.0, 5.0), (100.0, 203.0), (10_000.0, 20_003.0)];
        assert!(slope(&line).is_some_and(|s| (s - 2.0).abs() < 1e-9));
        assert_eq!(slope(&[(1.0, 2.0)]), None);
        assert_eq!(slope(&[(3.0, 2.0), (3.0, 4.0)]), None);
    }

    #[test]
    fn figures_read_well() {
        assert_eq!(micros(87.4), "87 µs");
        assert_eq!(micros(1_240.0), "1.24 ms");
        assert_eq!(rate(12_345.0), "12.3k/s");
        assert_eq!(rate(950.2), "950/s");
        assert_eq!(bytes(700.0), "700 B");
    }
}
