//! Compiles keysync.proto with protox (pure Rust), so building needs no protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=keysync/v1/keysync.proto");
    let fds = protox::compile(["keysync/v1/keysync.proto"], ["."])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
