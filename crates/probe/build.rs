//! Compiles the C++ shim against the libtorch that torch-sys found.
//!
//! torch-sys (`links = "tch"`) exports its lib dir as `DEP_TCH_LIBTORCH_LIB`; the headers sit in
//! `../include`. The CUDA half is compiled when the CUDA headers are found beside that libtorch
//! (the PyPI wheel brings them through its nvidia-* and triton dependencies); otherwise a stub
//! that reports "built without the CUDA headers" takes its place.

use std::env;
use std::path::{Path, PathBuf};

fn main() {
    let lib = PathBuf::from(
        env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys exports DEP_TCH_LIBTORCH_LIB"),
    );
    let include = lib.join("../include");
    println!("cargo:rerun-if-changed=csrc");
    println!("cargo:rerun-if-env-changed=LEAKLAB_PROBE_NO_CUDA");
    // Re-exported so that binaries depending on this crate can set an rpath.
    println!("cargo:libtorch_lib={}", lib.display());

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .pic(true)
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .flag_if_supported("-Wno-unused-parameter")
        .file("csrc/cpu.cpp");

    let cuda =
        env::var_os("LEAKLAB_PROBE_NO_CUDA").is_none() && lib.join("libc10_cuda.so").exists();
    match cuda.then(|| cuda_includes(&lib)).flatten() {
        Some(dirs) => {
            build.includes(dirs).file("csrc/cuda.cpp");
            println!("cargo:rustc-link-lib=dylib=c10_cuda");
            println!("cargo:rustc-link-lib=dylib=torch_cuda");
        }
        None => {
            println!("cargo:warning=leaklab-probe: CUDA headers not found beside {}; CUDA probes will report 'not available'", lib.display());
            build.file("csrc/cuda_stub.cpp");
        }
    }
    build.compile("leaklab_probe");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=c10");
    // torch::unwind::unwind (PyTorch's fast unwinder, for the history's native stacks).
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
}

/// The folders holding `cuda_runtime_api.h` and `crt/host_config.h`, if both are found.
fn cuda_includes(lib: &Path) -> Option<Vec<PathBuf>> {
    let site = lib.join("../..");
    let runtime = ["nvidia/cu13/include", "nvidia/cuda_runtime/include"]
        .iter()
        .map(|p| site.join(p))
        .find(|p| p.join("cuda_runtime_api.h").exists())?;
    let mut dirs = vec![runtime.clone()];
    if !runtime.join("crt/host_config.h").exists() {
        // The runtime wheel lacks crt/; triton (a torch dependency) and nvidia-cuda-nvcc carry it.
        let crt = [
            "triton/backends/nvidia/include",
            "nvidia/cu13/nvcc/include",
            "nvidia/cuda_nvcc/include",
        ]
        .iter()
        .map(|p| site.join(p))
        .find(|p| p.join("crt/host_config.h").exists())?;
        dirs.push(crt);
    }
    Some(dirs)
}
