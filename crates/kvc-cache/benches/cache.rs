//! Criterion benches of kvc-cache (filled in below).
fn main() {}
