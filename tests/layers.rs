//! The crate's modules form the layers `lib.rs` documents: each top-level module imports
//! only the modules listed before it there, so the module graph has no cycle and no upward
//! import. The test reads the list from `lib.rs`'s "Layers" section and the imports from
//! the sources, so the docs and the code cannot drift apart unnoticed.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The top-level modules: `src/NAME.rs` and `src/NAME/`.
fn modules(src: &Path) -> BTreeSet<String> {
    let entries = fs::read_dir(src).expect("src is readable");
    entries
        .filter_map(|e| {
            let path = e.ok()?.path();
            let name = path.file_stem()?.to_str()?.to_string();
            let rust = path.is_dir() || path.extension().is_some_and(|x| x == "rs");
            (rust && name != "lib" && name != "main").then_some(name)
        })
        .collect()
}

/// The modules in the order `lib.rs`'s "## Layers" section names them (backticked names
/// that are modules; others, like a type named beside them, are skipped).
fn documented_order(src: &Path, known: &BTreeSet<String>) -> Vec<String> {
    let lib = fs::read_to_string(src.join("lib.rs")).expect("lib.rs is readable");
    let section = lib.split("//! ## Layers").nth(1).expect("lib.rs has a Layers section");
    let section = section.split("//! ## ").next().unwrap_or(section);
    let mut order = Vec::new();
    for (i, part) in section.split('`').enumerate() {
        if i % 2 == 1 && known.contains(part) && !order.iter().any(|m| m == part) {
            order.push(part.to_string());
        }
    }
    order
}

/// Every Rust file of module `name`.
fn files_of(src: &Path, name: &str) -> Vec<PathBuf> {
    let file = src.join(format!("{name}.rs"));
    if file.is_file() {
        return vec![file];
    }
    let mut out = Vec::new();
    let mut dirs = vec![src.join(name)];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).expect("module folder is readable").flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|x| x == "rs") {
                out.push(path);
            }
        }
    }
    out
}

/// The top-level modules a file's code names as `crate::NAME` (comments and the unit-test
/// module at the end left out: tests may import anything).
fn imports(path: &Path) -> BTreeSet<String> {
    let text = fs::read_to_string(path).expect("source is readable");
    let code: String = text
        .lines()
        .take_while(|l| !l.trim_start().starts_with("mod tests"))
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    code.split("crate::")
        .skip(1)
        .filter_map(|rest| {
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

#[test]
fn every_module_imports_only_the_layers_before_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let known = modules(&src);
    let order = documented_order(&src, &known);
    let missing: Vec<&String> = known.iter().filter(|m| !order.contains(m)).collect();
    assert!(missing.is_empty(), "modules missing from lib.rs's Layers section: {missing:?}");
    let mut upward = Vec::new();
    for (at, name) in order.iter().enumerate() {
        for file in files_of(&src, name) {
            for used in imports(&file) {
                let later = order.iter().position(|m| *m == used).is_some_and(|p| p > at);
                if later {
                    upward.push(format!("{} imports {used}", file.display()));
                }
            }
        }
    }
    assert!(upward.is_empty(), "imports of a later layer:\n{}", upward.join("\n"));
}

/// The check finds an upward import: the same reading of a source that names a later module.
#[test]
fn the_check_sees_an_import_of_a_later_layer() {
    let dir = std::env::temp_dir().join(format!("specdec-layers-{}", std::process::id()));
    fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("kernel.rs");
    let source = "//! uses crate::batch in a doc only\nuse crate::batch::BatchDecoder;\n#[cfg(test)]\nmod tests {\n    use crate::tools::X;\n}\n";
    fs::write(&file, source).expect("write");
    let found = imports(&file);
    assert_eq!(found, BTreeSet::from(["batch".to_string()]));
    let _ = fs::remove_dir_all(&dir);
}
