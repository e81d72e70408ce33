//! `dynamo crds`: writes every generated file where it is checked in (the CRDs, the API
//! reference, the chart's RBAC rules).

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

/// Writes each generated file under `root`, and removes YAML files that a rename or a
/// removed resource left behind in the generated folders.
pub fn write_all(root: &Path) -> anyhow::Result<ExitCode> {
    let mut files = dynamo_crds::generated_files();
    files.extend(crate::controller::rbac::generated_files());
    for dir in dynamo_crds::GENERATED_CRD_DIRS {
        let dir = root.join(dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            let stale = path.extension().is_some_and(|e| e == "yaml")
                && !files.iter().any(|(rel, _)| root.join(rel) == path);
            if stale {
                std::fs::remove_file(&path)?;
                println!("removed {}", path.display());
            }
        }
    }
    for (rel, content) in &files {
        let path = root.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, content).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
