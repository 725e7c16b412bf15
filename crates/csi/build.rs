//! Generates the CSI gRPC code from the vendored `proto/csi.proto` with protox, a protobuf
//! compiler in Rust, so building needs no `protoc` on the machine. Services get default
//! methods that answer `Unimplemented`, so the driver writes only the calls it offers.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/csi.proto");
    let fds = protox::compile(["csi.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .generate_default_stubs(true)
        .compile_fds(fds)?;
    Ok(())
}
