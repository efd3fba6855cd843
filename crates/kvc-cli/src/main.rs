//! The `kvc` command: benchmarks, inspection and offline replay.
//!
//! `kvc` runs kvc's codecs, policies and compressors on files and on the embedded sample of
//! real KV-cache data, and prints what they achieve (ratios, MB/s, errors) as a table and as
//! JSON. It is a thin layer over the library crates and holds no algorithm of its own.

fn main() {}
