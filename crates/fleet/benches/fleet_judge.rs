//! The fleet scan's judging cost: 1,000 series × 12 h at 15 s (2,881 points each), the
//! synthetic fleet's every pattern, judged as `leaklab scan --prometheus` does once the answer
//! is in. Goal: the whole fleet, query included, in under 5 s (docs/fleet.md has both figures).

use criterion::{criterion_group, criterion_main, Criterion};
use leaklab_detect::budget::Budget;
use leaklab_fleet::prometheus::Range;
use leaklab_fleet::{judge_fleet, synthetic, JudgeConfig};

fn fleet_judge(c: &mut Criterion) {
    let end = 1_700_000_000.0;
    let span = 12.0 * 3600.0;
    // 17 patterns × 59 pods = 1,003 series.
    let pods = synthetic::fleet(59, end, span, 15.0);
    let series = synthetic::series(&pods);
    let config = JudgeConfig {
        range: Range {
            start: end - span,
            end,
            step: 15.0,
        },
        unit_bytes: 1024.0 * 1024.0,
        warmup_s: 1800.0,
        budget: Budget {
            steps_per_second: 1.0,
            seconds: 3.0 * 86400.0,
        },
    };
    let mut group = c.benchmark_group("fleet_judge");
    group.sample_size(10);
    group.bench_function(
        format!(
            "{}_series_x_{}_points",
            series.len(),
            series[0].points.len()
        ),
        |b| {
            b.iter(|| {
                judge_fleet(
                    &series,
                    &Default::default(),
                    Some(80 << 30),
                    &Default::default(),
                    &config,
                )
            })
        },
    );
    group.finish();
}

criterion_group!(benches, fleet_judge);
criterion_main!(benches);
