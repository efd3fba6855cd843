//! Checks that kvc's layout and its descriptions agree, and nothing else; all of it is in
//! the tests, this library only holds what more than one of them reads.
//!
//! - `tests/layering.rs` reads the allowed kvc-internal dependencies from
//!   `crates/layering.toml`, reads the real ones from `cargo metadata`, and fails on any
//!   dependency outside the table, any workspace crate without a row, any row without a
//!   crate, and any difference between the table and the one in `docs/DEVELOPING.md`.
//! - `tests/unsafe_code.rs` fails when a crate with `unsafe` in its `src/` is missing from
//!   `scripts/asan-tests.sh`'s default run, or a file with `unsafe` from
//!   `docs/DEVELOPING.md`'s unsafe-code table, or that table names a file that is not there.
//! - `tests/doc_paths.rs` fails when `README.md` or `docs/*.md` names a path that does not
//!   exist, or README's Layout table lacks a row for a crate.
//!
//! Nothing depends on it. To allow a dependency, or to add a crate, edit its row in
//! `crates/layering.toml` and the same row in `docs/DEVELOPING.md`.

use std::path::{Path, PathBuf};

/// The repository's root directory.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// A path as the docs write a set of them: `a/{b,c}.rs` is `a/b.rs` and `a/c.rs` (one
/// level of braces); anything else is itself.
pub fn expand_braces(token: &str) -> Vec<String> {
    match (token.find('{'), token.find('}')) {
        (Some(open), Some(close)) if open < close => token[open + 1..close]
            .split(',')
            .map(|alt| format!("{}{}{}", &token[..open], alt, &token[close + 1..]))
            .collect(),
        _ => vec![token.to_string()],
    }
}

/// The backquoted words in the first cell of each table row of one section of a Markdown
/// document, row by row: the section of `doc` (a path below the repository root) whose
/// heading, `heading` (`"## "`, `"### "`) then text, starts with `title`.
///
/// # Panics
/// When the document cannot be read or has no such section (the tests calling it fail).
pub fn first_cells(doc: &str, heading: &str, title: &str) -> Vec<Vec<String>> {
    let text =
        std::fs::read_to_string(repo_root().join(doc)).unwrap_or_else(|e| panic!("{doc}: {e}"));
    let section = text
        .split(&format!("\n{heading}"))
        .find(|s| s.starts_with(title))
        .unwrap_or_else(|| panic!("{doc}: no section \"{title}\""));
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|line| {
            let first = line.trim_matches('|').split('|').next().unwrap_or_default();
            first
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn braces_expand_to_each_alternative() {
        assert_eq!(expand_braces("a/{b,c}.rs"), ["a/b.rs", "a/c.rs"]);
        assert_eq!(expand_braces("a/b.rs"), ["a/b.rs"]);
    }
}
