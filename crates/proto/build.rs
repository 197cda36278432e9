//! Compiles `proto/kairos/v1/*.proto` with a vendored protoc, so no manual install is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let files = ["session.proto", "job.proto", "agent.proto", "admin.proto", "raft.proto"]
        .map(|f| root.join("kairos/v1").join(f));
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("kairos_descriptor.bin"))
        .compile_protos(&files, &[root])?;
    Ok(())
}
