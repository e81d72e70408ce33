//! `dynamo-epp`: the endpoint picker binary (see `docs/epp.md`).

use std::process::ExitCode;

use dynamo_epp::{Args, DYNAMO_ENV_ALIASES};
use dynamo_server::{exit_code, init_logging, parse_args, shutdown_signal};

#[tokio::main]
async fn main() -> ExitCode {
    release_large_allocations();
    let args: Args = parse_args(DYNAMO_ENV_ALIASES);
    init_logging(&args.log);
    let log = args.log.clone();
    exit_code(&log, serve(args).await)
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let config = args.into_config()?;
    let epp = dynamo_epp::start(config).await?;
    tracing::info!(
        model = %epp.model_name,
        http = %epp.http_addr,
        ext_proc = %epp.ext_proc_addr,
        metrics = ?epp.metrics_addr,
        mode = %epp.router.config().mode,
        block_size = epp.router.config().block_size,
        "dynamo-epp serving"
    );
    let stop = epp.stop_token();
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        stop.cancel();
    });
    epp.wait().await
}

/// Serves every allocation of 1 MiB or more from its own mapping, unmapped when freed.
/// A refused oversized request allocates its body, parse and prompt in such blocks; by
/// default glibc raises its mmap threshold to the largest block freed (up to 32 MiB,
/// `mallopt(3)`), so from the second such request on they come from the arenas and stay
/// there: 100 MB kept after a few 17 MB bodies, measured in `tests/memory.rs`. Setting
/// the threshold turns that adjustment off, and with it the trim threshold's, which is
/// set as glibc would (twice the mmap threshold): left at its 128 KiB start, the heaps
/// shrink and grow back on every request (0.1 ms more CPU per 8k-token request in
/// `data_path_overhead`).
fn release_large_allocations() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt sets global parameters of glibc's allocator under its arena lock;
    // it touches no memory of ours.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 2 << 20);
    }
}
