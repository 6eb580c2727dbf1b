//! The `leaklab` binary (placeholder until the lab exists).
fn main() -> anyhow::Result<()> {
    leaklab_probe::cpu::install()?;
    println!("leaklab: CUDA devices visible: {}", leaklab_probe::cuda::device_count());
    Ok(())
}
