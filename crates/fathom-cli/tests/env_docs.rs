//! Every environment variable the code reads is documented, with the
//! code's default, in docs/environment-variables.md.

use std::path::{Path, PathBuf};

/// Every variable the code reads, with its documented default: the plan's,
/// the hub lookup's, the server's, the backends' and the kernels'
/// registries.
fn registry() -> Vec<(&'static str, &'static str)> {
    let plan = fathom_plan::env::ENV_VARS
        .iter()
        .map(|v| (v.name, v.default));
    plan.chain(fathom_hub::ENV_VARS.iter().copied())
        .chain(fathom_server::ENV_VARS.iter().copied())
        .chain(fathom_backend::ENV_VARS.iter().copied())
        .chain(fathom_kernels::ENV_VARS.iter().copied())
        .collect()
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rust_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Quoted names that look like variables fathom reads: `FATHOM_*`, the
/// ROCm backend's `MLX_ROCM_*` and the Hugging Face hub's `HF_*`.
fn variables_named_in(source: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (i, _) in source.match_indices('"') {
        let rest = &source[i + 1..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        let closed = rest[name.len()..].starts_with('"');
        let ours = ["FATHOM_", "MLX_ROCM_", "HF_"]
            .iter()
            .any(|p| name.starts_with(p));
        if closed && ours {
            found.push(name);
        }
    }
    found
}

/// `| `NAME` | default | ...` rows of the doc's table.
fn documented() -> Vec<(String, String)> {
    let doc = std::fs::read_to_string(workspace().join("docs/environment-variables.md")).unwrap();
    doc.lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            Some((name.to_string(), cells.get(2)?.to_string()))
        })
        .collect()
}

#[test]
fn every_variable_in_the_code_is_in_the_registry() {
    let mut sources = Vec::new();
    rust_sources(&workspace().join("crates"), &mut sources);
    assert!(sources.len() > 10, "found the sources");
    for path in sources {
        // Tests name variables to set them, not to read them.
        if path.components().any(|c| c.as_os_str() == "tests") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for name in variables_named_in(&text) {
            assert!(
                registry().iter().any(|(v, _)| *v == name),
                "{} names {name}, which none of fathom_plan::env::ENV_VARS, fathom_hub::ENV_VARS, fathom_server::ENV_VARS, fathom_backend::ENV_VARS and fathom_kernels::ENV_VARS lists",
                path.display()
            );
        }
    }
}

#[test]
fn every_registered_variable_is_documented_with_its_default() {
    let docs = documented();
    let registry = registry();
    for (var, code_default) in &registry {
        let Some((_, default)) = docs.iter().find(|(name, _)| name == var) else {
            panic!("{var} is missing from docs/environment-variables.md");
        };
        assert_eq!(default, code_default, "documented default of {var}");
    }
    for (name, _) in &docs {
        assert!(
            registry.iter().any(|(v, _)| v == name),
            "{name} is documented but not read"
        );
    }
}

#[test]
fn the_scanner_finds_quoted_variable_names() {
    let found = variables_named_in(
        r#"std::env::var("FATHOM_X_Y"); "MLX_ROCM_Z"; "OTHER"; "FATHOM_lower"; "HF_HOME""#,
    );
    assert_eq!(found, ["FATHOM_X_Y", "MLX_ROCM_Z", "HF_HOME"]);
}
