//! Renders the incident drill's handlers from their template into `OUT_DIR/incidents/`: one
//! file per incident as shipped, and `fixed.rs` with every fix in. The library compiles them
//! (`drill::originals`, `drill::reference_fix`), so the tests run them without the learner's
//! copy; each is line for line what `cargo xtask lab incident` writes for the learner.

#[path = "src/drill/render.rs"]
#[allow(dead_code)]
mod render;

fn main() {
    println!("cargo:rerun-if-changed=incidents/handler.rs");
    println!("cargo:rerun-if-changed=src/drill/render.rs");
    let out = std::path::Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("incidents");
    std::fs::create_dir_all(&out).expect("OUT_DIR is writable");
    let mut handlers: Vec<(String, Option<&str>)> = render::tagged_incidents(render::TEMPLATE)
        .into_iter()
        .map(|name| (render::module_name(name), Some(name)))
        .collect();
    handlers.push(("fixed".into(), None));
    for (file, incident) in handlers {
        let text = render::included_text(&render::render(render::TEMPLATE, incident));
        std::fs::write(out.join(format!("{file}.rs")), text).expect("OUT_DIR is writable");
    }
}
