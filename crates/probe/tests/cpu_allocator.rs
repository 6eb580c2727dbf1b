//! The counting allocator counts libtorch's CPU storage exactly.
//!
//! Tests in one binary run in parallel, so each measures in a memory context of its own:
//! live bytes per context are untouched by other threads' allocations.

use leaklab_probe::{cpu, MemoryContext};
use tch::{Device, Kind, Tensor};

fn context(name: &str) -> MemoryContext {
    cpu::install().expect("counting allocator installs");
    MemoryContext::named(name)
}

#[test]
fn one_more_tensor_is_exactly_its_bytes() {
    let ctx = context("test-exact");
    let _in_ctx = ctx.enter();
    let before = cpu::live_bytes_in(ctx);
    let kept = Tensor::zeros([64, 512], (Kind::Float, Device::Cpu));
    assert_eq!(cpu::live_bytes_in(ctx) - before, 131_072);
    drop(kept);
    assert_eq!(cpu::live_bytes_in(ctx), before);
}

#[test]
fn a_kept_history_grows_by_exactly_one_output_per_step() {
    let ctx = context("test-history");
    let _in_ctx = ctx.enter();
    let x = Tensor::ones([64, 512], (Kind::Float, Device::Cpu));
    let start = cpu::live_bytes_in(ctx);
    let mut history = Vec::new();
    for step in 1..=10 {
        history.push(&x * 2.0);
        assert_eq!(
            cpu::live_bytes_in(ctx) - start,
            step * 131_072,
            "after step {step}"
        );
    }
    history.clear();
    assert_eq!(cpu::live_bytes_in(ctx), start);
}

#[test]
fn frees_on_another_thread_are_charged_to_the_birth_context() {
    let ctx = context("test-cross-thread");
    let t = {
        let _in_ctx = ctx.enter();
        Tensor::zeros([1000], (Kind::Float, Device::Cpu))
    };
    assert_eq!(cpu::live_bytes_in(ctx), 4000);
    std::thread::spawn(move || drop(t)).join().unwrap();
    assert_eq!(cpu::live_bytes_in(ctx), 0);
}

#[test]
fn global_counters_move_with_allocations() {
    context("test-global");
    let before = cpu::stats();
    let t = Tensor::zeros([256, 256], (Kind::Float, Device::Cpu));
    let mid = cpu::stats();
    drop(t);
    assert!(mid.alloc_count > before.alloc_count);
    assert!(mid.alloc_bytes_total >= before.alloc_bytes_total + 262_144);
    assert!(mid.peak_bytes >= mid.live_bytes);
    cpu::reset_peak();
    let after = cpu::stats();
    assert!(after.free_count > before.free_count);
    assert!(after.peak_bytes >= after.live_bytes);
}

#[test]
fn live_blocks_list_the_blocks_of_a_context() {
    let ctx = context("test-blocks");
    let _in_ctx = ctx.enter();
    let t = Tensor::zeros([7, 11], (Kind::Double, Device::Cpu));
    let mine: Vec<_> = cpu::live_blocks()
        .into_iter()
        .filter(|b| b.context == ctx)
        .collect();
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0].size, 7 * 11 * 8);
    assert_eq!(mine[0].addr, t.data_ptr() as u64);
}

#[test]
fn contexts_are_interned_and_restored() {
    let a = context("test-a");
    assert_eq!(MemoryContext::named("test-a"), a);
    assert_eq!(a.name(), "test-a");
    let outer = MemoryContext::current();
    {
        let _g = a.enter();
        assert_eq!(MemoryContext::current(), a);
    }
    assert_eq!(MemoryContext::current(), outer);
}

#[test]
fn a_limit_fails_allocations_like_a_real_out_of_memory() {
    // Only this test sets a limit; the limit is process-wide, so it stays far above what the
    // other tests of this binary allocate.
    let ctx = context("test-limit");
    let _in_ctx = ctx.enter();
    cpu::set_limit(Some(cpu::stats().live_bytes as u64 + (64 << 20)));
    let failed = Tensor::f_zeros([1 << 30], (Kind::Float, Device::Cpu));
    cpu::set_limit(None);
    let err = failed.expect_err("a 4 GiB tensor passes a 64 MiB limit");
    assert!(
        err.to_string().contains("leaklab CPU memory limit"),
        "{err}"
    );
    assert_eq!(
        cpu::live_bytes_in(ctx),
        0,
        "a failed allocation leaves nothing behind"
    );
    let ok = Tensor::f_zeros([16], (Kind::Float, Device::Cpu)).unwrap();
    assert_eq!(cpu::live_bytes_in(ctx), 64);
    drop(ok);
}
