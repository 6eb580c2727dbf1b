//! Inference mode and no_grad: what each records and what it makes.

use leaklab_probe::mode::{is_grad_enabled, is_inference_mode_enabled};
use leaklab_probe::{inference_mode, InferenceModeGuard};
use tch::{nn, nn::Module, Device, Kind, Tensor};

fn model() -> (nn::VarStore, nn::Linear) {
    let vs = nn::VarStore::new(Device::Cpu);
    let lin = nn::linear(vs.root(), 8, 4, Default::default());
    (vs, lin)
}

#[test]
fn grad_enabled_forward_records_a_graph() {
    let (_vs, lin) = model();
    let y = lin.forward(&Tensor::ones([2, 8], (Kind::Float, Device::Cpu)));
    assert!(
        y.requires_grad(),
        "a forward pass with trainable weights records a graph"
    );
    assert!(!y.is_inference());
}

#[test]
fn inference_mode_records_nothing_and_makes_inference_tensors() {
    let (_vs, lin) = model();
    let x = Tensor::ones([2, 8], (Kind::Float, Device::Cpu));
    let y = inference_mode(|| {
        assert!(is_inference_mode_enabled());
        assert!(!is_grad_enabled());
        lin.forward(&x)
    });
    assert!(!y.requires_grad());
    assert!(y.is_inference());
    assert!(
        !is_inference_mode_enabled(),
        "the mode ends with the closure"
    );
    assert!(is_grad_enabled());
}

#[test]
fn the_guard_nests_and_restores() {
    let outer = InferenceModeGuard::new();
    assert!(is_inference_mode_enabled());
    {
        let _inner = InferenceModeGuard::with_enabled(false);
        assert!(!is_inference_mode_enabled());
        assert!(is_grad_enabled());
    }
    assert!(is_inference_mode_enabled());
    drop(outer);
    assert!(!is_inference_mode_enabled());
}

#[test]
fn no_grad_records_nothing_but_makes_normal_tensors() {
    let (_vs, lin) = model();
    let y = tch::no_grad(|| lin.forward(&Tensor::ones([2, 8], (Kind::Float, Device::Cpu))));
    assert!(!y.requires_grad());
    assert!(!y.is_inference());
}
