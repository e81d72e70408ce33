//! Set-up that each worker thread of the runtime needs once, done before serving instead
//! of on the time of the first request each thread takes.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

/// How long a worker that has run its part waits for the others to start theirs.
const WAIT_FOR_OTHERS: Duration = Duration::from_secs(2);

/// Runs `f` once on every worker thread of the current tokio runtime (a thread-local
/// cache to build, as a tokenizer's). Each run holds its thread until every run is done
/// (for at most [`WAIT_FOR_OTHERS`]), so no thread takes two and each takes one.
pub async fn on_every_worker<F>(f: F)
where
    F: Fn() + Send + Sync + 'static,
{
    let workers = tokio::runtime::Handle::current().metrics().num_workers();
    let f = Arc::new(f);
    let done = Arc::new((Mutex::new(0_usize), Condvar::new()));
    let runs: Vec<_> = (0..workers)
        .map(|_| {
            let (f, done) = (f.clone(), done.clone());
            tokio::spawn(async move {
                f();
                let (count, all_done) = &*done;
                let mut count = count.lock().unwrap_or_else(PoisonError::into_inner);
                *count += 1;
                all_done.notify_all();
                let _ = all_done.wait_timeout_while(count, WAIT_FOR_OTHERS, |n| *n < workers);
            })
        })
        .collect();
    for run in runs {
        let _ = run.await;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::thread::ThreadId;

    use super::*;

    fn threads_reached(runtime: tokio::runtime::Runtime) -> (usize, HashSet<ThreadId>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        runtime.block_on(on_every_worker(move || {
            record.lock().unwrap().push(std::thread::current().id());
        }));
        let seen = seen.lock().unwrap().clone();
        (seen.len(), seen.into_iter().collect())
    }

    #[test]
    fn each_worker_of_a_multi_thread_runtime_runs_it_once() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .build()
            .unwrap();
        let (runs, threads) = threads_reached(runtime);
        assert_eq!(runs, 4);
        assert_eq!(threads.len(), 4, "one run per worker thread: {threads:?}");
        assert!(!threads.contains(&std::thread::current().id()));
    }

    #[test]
    fn a_current_thread_runtime_runs_it_on_its_one_thread() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (runs, threads) = threads_reached(runtime);
        assert_eq!(runs, 1);
        assert_eq!(threads, HashSet::from([std::thread::current().id()]));
    }
}
