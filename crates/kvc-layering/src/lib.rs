//! The layering check of kvc's crates, and nothing else: its test
//! (`tests/layering.rs`) reads the allowed kvc-internal dependencies from
//! `crates/layering.toml`, reads the real ones from `cargo metadata`, and fails on any
//! dependency outside the table, any workspace crate without a row, any row without a
//! crate, and any difference between the table and the one in `docs/DEVELOPING.md`.
//!
//! It has no code and nothing depends on it. To allow a dependency, or to add a crate,
//! edit its row in `crates/layering.toml` and the same row in `docs/DEVELOPING.md`.
