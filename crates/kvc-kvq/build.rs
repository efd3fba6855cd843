//! Sets `cfg(kvq_avx512)` when the compiler is rustc 1.89 or later, whose standard library
//! has the AVX-512 intrinsics kvq's 512-bit attention kernels use; older compilers (the
//! workspace MSRV is 1.85) build the AVX2 and portable paths only.

use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(kvq_avx512)");
    println!("cargo::rerun-if-env-changed=RUSTC");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let minor = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| {
            // "rustc 1.95.0 (...)"
            let mut parts = v.split_whitespace().nth(1)?.split('.');
            let major: u32 = parts.next()?.parse().ok()?;
            let minor: u32 = parts.next()?.parse().ok()?;
            (major == 1).then_some(minor)
        });
    if minor.is_some_and(|m| m >= 89) {
        println!("cargo::rustc-cfg=kvq_avx512");
    }
}
