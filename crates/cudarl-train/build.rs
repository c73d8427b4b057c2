//! This crate's tests link libtorch: the link arguments of `cudarl-torch`'s build script
//! (`-ltorch_cuda` kept, rpath to the venv's libtorch), forwarded.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_CUDARL_TORCH_LINK_ARGS");
    if let Ok(args) = std::env::var("DEP_CUDARL_TORCH_LINK_ARGS") {
        for a in args.split(' ').filter(|a| !a.is_empty()) {
            println!("cargo:rustc-link-arg={a}");
        }
    }
}
