//! `dynamo validate -f FILE`: the API server's schema and CEL checks, offline.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

pub fn run(files: &[PathBuf]) -> anyhow::Result<ExitCode> {
    let mut failed = false;
    for file in files {
        let yaml =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        match dynamo_crds::validate_manifest(&yaml) {
            Ok(validated) => {
                for object in &validated.objects {
                    println!("{}: {object} is valid", file.display());
                }
            }
            Err(err) => {
                failed = true;
                eprintln!("{}: {err}", file.display());
            }
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
