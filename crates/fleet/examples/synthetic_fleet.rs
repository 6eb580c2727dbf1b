//! Writes the synthetic fleet as OpenMetrics for `promtool tsdb create-blocks-from openmetrics`,
//! to try the fleet scan (and the alert rules) on a real Prometheus without a fleet:
//!
//! ```sh
//! cargo run -p leaklab-fleet --example synthetic_fleet -- fleet.om 12 60 1796300000
//! promtool tsdb create-blocks-from openmetrics fleet.om data/
//! prometheus --storage.tsdb.path=data/ --config.file=/dev/null &   # then leaklab scan --prometheus ...
//! ```
//!
//! Arguments: output file, pods per pattern (12: 204 pods), step in seconds (60), the range's
//! end in unix seconds (default: five minutes ago, on a whole minute). It prints the end.

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(out) = args.first() else {
        anyhow::bail!("usage: synthetic_fleet OUT.om [PODS_PER_PATTERN] [STEP_S] [END_UNIX_S]")
    };
    let per_pattern: usize = args.get(1).map_or(Ok(12), |a| a.parse())?;
    let step: f64 = args.get(2).map_or(Ok(60.0), |a| a.parse())?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let end: f64 = args
        .get(3)
        .map_or(Ok((now / 60 * 60 - 300) as f64), |a| a.parse())?;
    let pods = leaklab_fleet::synthetic::fleet(per_pattern, end, 12.0 * 3600.0, step);
    std::fs::write(out, leaklab_fleet::synthetic::openmetrics(&pods))?;
    println!(
        "{} pods over the 12 h ending at {end} (unix seconds), at {step} s steps, in {out}",
        pods.len()
    );
    Ok(())
}
