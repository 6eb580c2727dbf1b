//! The detector's promises, as properties over synthetic series.

use leaklab_detect::{judge, judge_noisy, DetectorConfig, LeakCheck, NoisyConfig, Sample, Verdict};
use proptest::prelude::*;

/// Uniform noise in [-amp, amp] from a seeded generator (deterministic per case).
fn noise(seed: u64, i: u64, amp: f64) -> f64 {
    let mut x = seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    amp * ((x as f64 / u64::MAX as f64) * 2.0 - 1.0)
}

fn series(n: u64, f: impl Fn(u64) -> f64) -> Vec<Sample> {
    (0..n).map(|i| (i, f(i).round() as i64)).collect()
}

proptest! {
    // A fixed seed: CI explores the same 200 cases every run, so a verdict test can never flake;
    // change the seed locally to explore further (1,800 random cases per property passed too).
    #![proptest_config(ProptestConfig { cases: 200, rng_seed: proptest::test_runner::RngSeed::Fixed(0x01ea_41ab), ..ProptestConfig::default() })]

    /// A line of slope s with noise below s·n/32 is a leak, and s lies inside the bound.
    #[test]
    fn a_linear_series_is_a_leak_with_its_slope_inside_the_bound(
        slope in 256.0f64..1e7, n in 40u64..600, noise_frac in 0.0f64..1.0, seed: u64, base in 0.0f64..1e10,
    ) {
        let amp = noise_frac * slope * n as f64 / 32.0;
        let s = series(n, |i| base + slope * i as f64 + noise(seed, i, amp));
        // Rounding to whole bytes adds up to half a byte of noise.
        let j = judge(&s, &DetectorConfig::noisy(0, amp + 0.5)).unwrap();
        prop_assert_eq!(j.verdict, Verdict::Leak, "{:?}", j);
        prop_assert!(j.slope.low <= slope && slope <= j.slope.high, "{} not in {:?}", slope, j.slope);
    }

    /// A flat series with noise up to the configured amplitude is never a leak, whatever its shape.
    #[test]
    fn a_flat_noisy_series_is_never_a_leak(
        n in 8u64..1200, amp in 0.0f64..1e8, seed: u64, base in 0.0f64..1e10, shape in 0u8..3,
    ) {
        let s = series(n, |i| base + match shape {
            0 => noise(seed, i, amp),
            // Adversarial shapes: a sawtooth and a ramp inside the noise band.
            1 => amp * ((i % 7) as f64 / 3.0 - 1.0),
            _ => -amp + 2.0 * amp * i as f64 / n as f64,
        });
        let j = judge(&s, &DetectorConfig::noisy(0, amp + 0.5)).unwrap();
        prop_assert_ne!(j.verdict, Verdict::Leak, "{:?}", j);
    }

    /// Growth that stops (a cache filling to its bound) is a plateau: a jump or a ramp, after
    /// which the last half of the window is flat.
    #[test]
    fn a_step_then_flat_series_is_a_plateau(
        n in 40u64..600, at in 0.15f64..0.5, height in 1e3f64..1e9, noise_frac in 0.0f64..0.2, seed: u64, ramp in 0u8..2,
    ) {
        let amp = noise_frac * height;
        let step = (at * n as f64) as u64;
        let fill = if ramp == 1 { step.max(1) } else { 1 };
        let s = series(n, |i| {
            let level = if i >= step { height } else if ramp == 1 { height * i as f64 / fill as f64 } else { 0.0 };
            level + noise(seed, i, amp)
        });
        let j = judge(&s, &DetectorConfig::noisy(0, amp + 0.5)).unwrap();
        prop_assert_eq!(j.verdict, Verdict::Plateau, "{:?}", j);
    }
}

#[test]
fn one_kilobyte_per_request_is_caught_within_a_hundred_requests_after_warm_up() {
    // Warm-up noise (pools filling) followed by an exact 1 KB/request leak.
    let s: Vec<Sample> = (0..120)
        .map(|i| {
            (
                i,
                if i < 20 {
                    5_000_000 + 77_777 * (i % 3) as i64
                } else {
                    6_000_000 + 1024 * i as i64
                },
            )
        })
        .collect();
    let j = judge(&s, &DetectorConfig::exact(20)).unwrap();
    assert_eq!(j.verdict, Verdict::Leak);
    assert_eq!(j.slope.bytes_per_request, 1024.0);
    assert_eq!(j.samples, 100);
}

#[test]
fn a_flat_exact_series_of_a_thousand_is_flat() {
    let s: Vec<Sample> = (0..1000).map(|i| (i, 123_456_789)).collect();
    assert_eq!(
        judge(&s, &DetectorConfig::exact(0)).unwrap().verdict,
        Verdict::Flat
    );
}

#[test]
fn too_few_samples_is_an_error_not_a_verdict() {
    let s: Vec<Sample> = (0..10).map(|i| (i, i as i64)).collect();
    let err = judge(&s, &DetectorConfig::exact(5)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "5 samples after a warm-up of 5; at least 8 are needed for a verdict"
    );
}

#[test]
fn the_harness_fails_a_leak_over_budget_and_passes_one_under_it() {
    let kept = std::cell::Cell::new(0i64);
    let over = LeakCheck::new(3, 30)
        .probe("counter", 0.0, 0.0, || kept.get())
        .run(|_| kept.set(kept.get() + 4096));
    assert!(!over.passed());
    let text = over.to_string();
    assert!(
        text.contains("FAIL counter: leak at 4.10 kB (bound 4.10 kB .. 4.10 kB) per iteration"),
        "{text}"
    );
    assert!(text.contains("iterations ("), "{text}");
    kept.set(0);
    let under = LeakCheck::new(3, 30)
        .probe("counter", 8192.0, 0.0, || kept.get())
        .run(|_| kept.set(kept.get() + 4096));
    assert!(under.passed(), "{under}");
}

#[test]
fn reports_serialise_to_json() {
    let s: Vec<Sample> = (0..50).map(|i| (i, 100 * i as i64)).collect();
    let j = judge(&s, &DetectorConfig::exact(10)).unwrap();
    let json = serde_json::to_value(&j).unwrap();
    assert_eq!(json["verdict"], "leak");
    assert_eq!(json["slope"]["bytes_per_request"], 100.0);
    let back: leaklab_detect::Judgement = serde_json::from_value(json).unwrap();
    assert_eq!(back, j);
}

/// The leak property's margin: a leak whose rise over the judged requests is at least this many
/// times the noise's peak-to-peak amplitude. Measured over 10 million random cases of the
/// property's shape (n 300 to 1,200, i.i.d. noise up to 200 kB, slopes from 1 kB): leaks that
/// rose less than 18.3 times the amplitude were sometimes read `plateau` (1 case in 15,000,
/// all near the shortest series: the tail's bound did not clear zero), none that rose more.
const LEAK_RISE_OVER_NOISE: f64 = 32.0;
const LEAK_NOISE: i64 = 200_000;

proptest! {
    // Fixed seed: CI cannot flake. Noise patterns: any bytes, any shape, including bursts,
    // staircases and slow waves (each sample independently drawn within the amplitude). Each
    // property assumes only what it generates: no case is discarded on the detector's output.
    #![proptest_config(ProptestConfig { cases: 400, rng_seed: proptest::test_runner::RngSeed::Fixed(0x5ca9), ..ProptestConfig::default() })]

    /// A flat series under noise of up to 400 kB and a slow wave of up to 300 kB is never a
    /// leak (measured: none of 200,000 random cases of this shape was).
    #[test]
    fn a_flat_noisy_series_is_never_a_leak_whatever_the_noise(
        noise in proptest::collection::vec(0i64..400_000, 200..1200),
        base in 100_000_000i64..10_000_000_000,
        wave in 0i64..300_000,
    ) {
        let series: Vec<Sample> = noise.iter().enumerate().map(|(i, n)| (i as u64, base + n + wave * ((i as f64 / 37.0).sin() * 1000.0) as i64 / 1000)).collect();
        let j = judge_noisy(&series, &NoisyConfig::new(10)).unwrap();
        prop_assert_ne!(j.verdict, Verdict::Leak, "{:?}", j);
    }

    /// A leak that rises [`LEAK_RISE_OVER_NOISE`] times the noise's amplitude over the judged
    /// requests is a leak, and the detector's stated sensitivity is below its slope.
    #[test]
    fn a_leak_well_above_the_noise_is_always_a_leak(
        (noise, slope) in proptest::collection::vec(0i64..LEAK_NOISE, 300..1200).prop_flat_map(|noise| {
            let judged = (noise.len() - 10) as f64;
            let least = (LEAK_RISE_OVER_NOISE * LEAK_NOISE as f64 / judged).ceil() as i64;
            (Just(noise), least..200_000.max(least + 1))
        }),
    ) {
        let series: Vec<Sample> = noise.iter().enumerate().map(|(i, n)| (i as u64, 500_000_000 + slope * i as i64 + n)).collect();
        let j = judge_noisy(&series, &NoisyConfig::new(10)).unwrap();
        prop_assert_eq!(j.verdict, Verdict::Leak, "{:?}", j);
        prop_assert!(j.sensitivity_bytes <= slope as f64, "a leak of {} B/request is under the stated sensitivity: {:?}", slope, j);
    }
}

#[test]
fn the_stated_sensitivity_meets_the_goal_of_eight_kilobytes_within_a_thousand_requests() {
    // Anonymous memory's measured behaviour: steps of 4 kB to 180 kB. At that noise, 1,000
    // requests resolve a leak of 8 kB per request.
    let steps = |i: u64| ((i * 2_654_435_761) % 180_000) as i64;
    let series: Vec<Sample> = (0..1050)
        .map(|i| (i, 400_000_000 + 8192 * i as i64 + steps(i)))
        .collect();
    let j = judge_noisy(&series, &NoisyConfig::new(50)).unwrap();
    assert_eq!(j.verdict, Verdict::Leak, "{j:?}");
    assert!(
        j.sensitivity_bytes < 8192.0,
        "sensitivity {} B/request",
        j.sensitivity_bytes
    );
}
