//! Gives the shared library a versioned soname (`libkvc.so.<ABI major>`) so that programs
//! linked against it record the ABI they need, and a new ABI major can be installed beside
//! an old one. The ABI major here must equal `KVC_ABI_VERSION_MAJOR` in src/version.rs (a
//! unit test checks it).

const ABI_MAJOR: u32 = 0;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let soname = match os.as_str() {
        "macos" | "ios" => {
            let name = format!("libkvc.{ABI_MAJOR}.dylib");
            println!("cargo:rustc-cdylib-link-arg=-Wl,-install_name,@rpath/{name}");
            name
        }
        "windows" => "kvc.dll".to_owned(),
        _ => {
            let name = format!("libkvc.so.{ABI_MAJOR}");
            println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{name}");
            name
        }
    };
    println!("cargo:rustc-env=KVC_SONAME={soname}");
}
