//! Compiles the small subset of etcd's v3 gRPC API the benchmark speaks (KV.Put and
//! Maintenance.Status) with protox, so no system protoc is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/etcd.proto");
    let fds = protox::compile(["proto/etcd.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(fds)?;
    Ok(())
}
