//! A reader that closes stdout early ends `kvc` quietly (SIGPIPE), never with a panic.

#[cfg(unix)]
#[test]
fn closed_stdout_ends_kvc_without_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};

    let mut child = Command::new(env!("CARGO_BIN_EXE_kvc"))
        .args(["bench", "--repeat", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kvc");
    drop(child.stdout.take()); // the reader goes away before kvc writes anything
    let out = child.wait_with_output().expect("wait for kvc");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "kvc panicked: {stderr}");
    assert_eq!(
        out.status.signal(),
        Some(libc_sigpipe()),
        "status {:?}",
        out.status
    );
}

#[cfg(unix)]
fn libc_sigpipe() -> i32 {
    13 // SIGPIPE on Linux and the BSDs
}
