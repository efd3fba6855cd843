//! Generates `include/kvc.h` from this crate's source with cbindgen.
//!
//! `cargo run -p kvc-capi --example gen-header -- OUT` writes the header to OUT
//! (`-` for stdout). The test `tests/header_current.rs` runs the same [`generate`] and fails
//! when the checked-in header differs, so `cargo test` (and CI) catch a stale header.
//!
//! A generator run on demand rather than a build.rs: a build script would compile
//! cbindgen (and syn) into every build of the library, including every engine's CMake
//! build through cargo, and would write into the source tree, which cargo forbids for
//! published crates and which breaks read-only checkouts. Here cbindgen is a
//! dev-dependency, built only for development and CI.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let out = match std::env::args_os().nth(1) {
        Some(out) => PathBuf::from(out),
        None => {
            eprintln!("usage: gen-header OUT   (OUT = - for stdout)");
            return ExitCode::from(2);
        }
    };
    let bindings = match generate() {
        Ok(bindings) => bindings,
        Err(err) => {
            eprintln!("gen-header: {err}");
            return ExitCode::FAILURE;
        }
    };
    if out.as_os_str() == "-" {
        bindings.write(std::io::stdout());
    } else {
        bindings.write_to_file(&out);
    }
    ExitCode::SUCCESS
}

/// The header's bindings, from this crate's source and its `cbindgen.toml`.
pub fn generate() -> Result<cbindgen::Bindings, String> {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .map_err(|err| format!("cbindgen.toml: {err}"))?;
    cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .map_err(|err| err.to_string())
}
