//! Every kvc-internal dependency is one `crates/layering.toml` allows, every workspace
//! crate has a row there, and `docs/DEVELOPING.md` shows the same table.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// One row of the table: what a crate may depend on, normally and in its tests.
#[derive(Debug, Default, PartialEq, Eq)]
struct Allowed {
    deps: BTreeSet<String>,
    dev: BTreeSet<String>,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `["a", "b"]`'s names (the table's lists; nothing else is accepted).
fn names(list: &str, line: &str) -> BTreeSet<String> {
    let inner = list
        .trim()
        .strip_prefix('[')
        .and_then(|l| l.strip_suffix(']'))
        .unwrap_or_else(|| panic!("layering.toml: not a [list]: {line}"));
    inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.strip_prefix('"')
                .and_then(|s| s.strip_suffix('"'))
                .unwrap_or_else(|| panic!("layering.toml: not a quoted name {s:?}: {line}"))
                .to_string()
        })
        .collect()
}

/// The table: the `[crates]` section's rows `name = { deps = [...], dev = [...] }`, one
/// per line (a strict subset of TOML, so any TOML reader reads the same table).
fn read_table(text: &str) -> BTreeMap<String, Allowed> {
    let mut table = BTreeMap::new();
    let mut in_crates = false;
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with('[') {
            in_crates = line == "[crates]";
            continue;
        }
        assert!(in_crates, "layering.toml: a line outside [crates]: {line}");
        let (name, row) = line
            .split_once(" = ")
            .unwrap_or_else(|| panic!("layering.toml: not `name = {{ ... }}`: {line}"));
        let row = row
            .strip_prefix("{ deps = ")
            .and_then(|r| r.strip_suffix(" }"))
            .unwrap_or_else(|| {
                panic!("layering.toml: not `{{ deps = [..], dev = [..] }}`: {line}")
            });
        let (deps, dev) = row
            .split_once("], dev = ")
            .unwrap_or_else(|| panic!("layering.toml: no `dev = [..]`: {line}"));
        let allowed = Allowed {
            deps: names(&format!("{deps}]"), line),
            dev: names(dev, line),
        };
        let previous = table.insert(name.trim().to_string(), allowed);
        assert!(previous.is_none(), "layering.toml: {name} has two rows");
    }
    assert!(!table.is_empty(), "layering.toml: no [crates] rows");
    table
}

/// The table in docs/DEVELOPING.md's section "Crates and layering": rows
/// `| `crate` | `a`, `b` | `c` |` (`-` for none).
fn read_doc_table(text: &str) -> BTreeMap<String, Allowed> {
    let section = text
        .split("\n## ")
        .find(|s| s.starts_with("Crates and layering"))
        .expect("DEVELOPING.md: a section \"Crates and layering\"");
    let cell = |c: &str| -> BTreeSet<String> {
        c.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty() && *s != "-")
            .map(|s| s.trim_matches('`').to_string())
            .collect()
    };
    let mut table = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `kvc-")) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').collect();
        assert_eq!(cells.len(), 3, "DEVELOPING.md: a row needs 3 cells: {line}");
        let name = cells[0].trim().trim_matches('`').to_string();
        let allowed = Allowed {
            deps: cell(cells[1]),
            dev: cell(cells[2]),
        };
        assert!(
            table.insert(name, allowed).is_none(),
            "DEVELOPING.md: {line} twice"
        );
    }
    table
}

/// Each workspace crate's kvc-internal dependencies: (normal and build, dev).
fn actual() -> BTreeMap<String, Allowed> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let members: BTreeSet<&str> = meta["workspace_members"]
        .as_array()
        .expect("workspace_members")
        .iter()
        .filter_map(|m| m.as_str())
        .collect();
    let mut crates = BTreeMap::new();
    for p in meta["packages"].as_array().expect("packages") {
        if !members.contains(p["id"].as_str().unwrap_or_default()) {
            continue;
        }
        let mut a = Allowed::default();
        for d in p["dependencies"].as_array().expect("dependencies") {
            let name = d["name"].as_str().expect("dependency name");
            // kvc-internal: a path dependency inside this repository.
            let internal = d["path"]
                .as_str()
                .is_some_and(|path| Path::new(path).starts_with(root().canonicalize().unwrap()));
            if !internal {
                continue;
            }
            match d["kind"].as_str() {
                Some("dev") => a.dev.insert(name.to_string()),
                _ => a.deps.insert(name.to_string()),
            };
        }
        crates.insert(p["name"].as_str().expect("name").to_string(), a);
    }
    crates
}

#[test]
fn every_dependency_is_in_the_layering_table() {
    let table = read_table(
        &std::fs::read_to_string(root().join("crates/layering.toml")).expect("layering.toml"),
    );
    let actual = actual();
    let mut wrong = Vec::new();
    for (name, a) in &actual {
        let Some(allowed) = table.get(name) else {
            wrong.push(format!(
                "{name}: a workspace crate with no row in crates/layering.toml"
            ));
            continue;
        };
        for d in a.deps.difference(&allowed.deps) {
            wrong.push(format!(
                "{name} depends on {d}, which its row does not allow"
            ));
        }
        for d in a
            .dev
            .iter()
            .filter(|d| !allowed.deps.contains(*d) && !allowed.dev.contains(*d))
        {
            wrong.push(format!(
                "{name} has the dev-dependency {d}, which its row does not allow"
            ));
        }
    }
    for (name, allowed) in &table {
        if !actual.contains_key(name) {
            wrong.push(format!(
                "crates/layering.toml has a row for {name}, not a workspace crate"
            ));
        }
        for d in allowed.deps.iter().chain(&allowed.dev) {
            if !table.contains_key(d) {
                wrong.push(format!("{name}'s row allows {d}, which has no row"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "layering violations:\n  {}",
        wrong.join("\n  ")
    );
}

#[test]
fn developing_md_shows_the_same_table() {
    let file = read_table(
        &std::fs::read_to_string(root().join("crates/layering.toml")).expect("layering.toml"),
    );
    let doc = read_doc_table(
        &std::fs::read_to_string(root().join("docs/DEVELOPING.md")).expect("DEVELOPING.md"),
    );
    assert_eq!(
        doc, file,
        "docs/DEVELOPING.md's table differs from crates/layering.toml"
    );
}

#[test]
fn the_table_reader_refuses_what_it_cannot_read() {
    let ok =
        "[crates]\nkvc-a = { deps = [], dev = [] }\nkvc-b = { deps = [\"kvc-a\"], dev = [] }\n";
    let t = read_table(ok);
    assert_eq!(t["kvc-b"].deps, BTreeSet::from(["kvc-a".to_string()]));
    for bad in [
        "[crates]\nkvc-a = { deps = [] }\n",
        "[crates]\nkvc-a = { deps = [kvc-b], dev = [] }\n",
        "kvc-a = { deps = [], dev = [] }\n",
        "[crates]\nkvc-a = { deps = [], dev = [] }\nkvc-a = { deps = [], dev = [] }\n",
    ] {
        assert!(
            std::panic::catch_unwind(|| read_table(bad)).is_err(),
            "{bad}"
        );
    }
}
