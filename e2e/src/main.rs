//! `dynamo-e2e bench | replay | planner | overhead`: see `docs/performance.md`.

use clap::Parser;
use dynamo_e2e::cli::{self, Cli};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    cli::main(Cli::parse()).await
}
