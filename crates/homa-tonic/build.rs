//! Generates the test protos' messages, clients and servers (tests/proto)
//! with tonic-prost-build, using the protoc that protoc-bin-vendored ships
//! (no system package needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=tests/proto");
    std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        .build_transport(false)
        .compile_protos(
            &[
                "tests/proto/helloworld.proto",
                "tests/proto/routeguide.proto",
            ],
            &["tests/proto"],
        )?;
    Ok(())
}
