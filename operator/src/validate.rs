//! `dynamo validate -f FILE`: the API server's checks (schema, CEL rules, metadata names)
//! and the names the operator would generate, offline. Every file is reported, including
//! those that cannot be read; the exit status says whether all of them passed.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::reconcile::names::validate_manifest;

pub fn run(files: &[PathBuf]) -> anyhow::Result<ExitCode> {
    let mut failed = false;
    for file in files {
        let yaml = match std::fs::read_to_string(file) {
            Ok(yaml) => yaml,
            Err(err) => {
                failed = true;
                eprintln!("{}: cannot read: {err}", file.display());
                continue;
            }
        };
        match validate_manifest(&yaml) {
            Ok(validated) => {
                for object in &validated.objects {
                    println!("{}: {object} is valid", file.display());
                }
            }
            Err(err) => {
                failed = true;
                for line in err.to_string().lines() {
                    eprintln!("{}: {line}", file.display());
                }
            }
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
