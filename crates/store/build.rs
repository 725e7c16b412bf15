//! Generates the Pub/Sub client (`events_pubsub.rs`) from the vendored, trimmed
//! `proto/pubsub.proto` with protox, a protobuf compiler in Rust: no `protoc` needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/pubsub.proto");
    let fds = protox::compile(["pubsub.proto"], ["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(false).compile_fds(fds)?;
    Ok(())
}
