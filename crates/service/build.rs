//! Adds libtorch's lib dir as an rpath, so `cargo run -p leaklab-service` works without LD_LIBRARY_PATH.
//! (The device bundle's launcher sets the loader path itself, since the path differs there.)
fn main() {
    if let Ok(lib) = std::env::var("DEP_LEAKLAB_PROBE_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{lib}");
    }
}
