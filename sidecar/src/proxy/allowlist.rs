//! `--proxy-paths`: only requests to these paths reach the engine; any other (vLLM's
//! admin routes: `/reset_prefix_cache`, `/sleep`, ...) is refused with
//! [`ProxyError::PathNotProxied`].

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::{self, Either, Ready};
use tower::{Layer, Service};

use super::error::ProxyError;

/// The paths the proxy passes on: exact paths, or prefixes written with a trailing `*`.
#[derive(Clone, Debug, PartialEq)]
pub struct PathAllowlist {
    exact: Vec<String>,
    prefixes: Vec<String>,
}

impl PathAllowlist {
    pub fn new<S: AsRef<str>>(entries: &[S]) -> Self {
        let (mut exact, mut prefixes) = (Vec::new(), Vec::new());
        for entry in entries.iter().map(|e| e.as_ref().trim()) {
            match entry.strip_suffix('*') {
                Some(prefix) => prefixes.push(prefix.to_owned()),
                None => exact.push(entry.to_owned()),
            }
        }
        Self { exact, prefixes }
    }

    pub fn allows(&self, path: &str) -> bool {
        self.exact.iter().any(|p| p == path) || self.prefixes.iter().any(|p| path.starts_with(p))
    }
}

#[derive(Clone)]
pub struct AllowlistLayer(Arc<PathAllowlist>);

impl AllowlistLayer {
    pub fn new(paths: PathAllowlist) -> Self {
        Self(Arc::new(paths))
    }
}

impl<S> Layer<S> for AllowlistLayer {
    type Service = Allowlist<S>;

    fn layer(&self, inner: S) -> Allowlist<S> {
        Allowlist {
            inner,
            paths: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Allowlist<S> {
    inner: S,
    paths: Arc<PathAllowlist>,
}

impl<S, B> Service<http::Request<B>> for Allowlist<S>
where
    S: Service<http::Request<B>, Error = ProxyError>,
{
    type Response = S::Response;
    type Error = ProxyError;
    type Future = Either<Ready<Result<S::Response, ProxyError>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let path = request.uri().path();
        if self.paths.allows(path) {
            Either::Right(self.inner.call(request))
        } else {
            Either::Left(future::ready(Err(ProxyError::PathNotProxied(
                path.to_owned(),
            ))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::ServiceExt;

    #[test]
    fn the_allowlist_takes_exact_paths_and_prefixes() {
        let paths = PathAllowlist::new(&["/v1/completions", "/v1/models/*", " /metrics "]);
        assert!(paths.allows("/v1/completions"));
        assert!(!paths.allows("/v1/completions/x"));
        assert!(paths.allows("/v1/models/qwen"));
        assert!(!paths.allows("/v1/models"));
        assert!(paths.allows("/metrics"));
        assert!(!paths.allows("/reset_prefix_cache"));
        assert!(PathAllowlist::new(&["*"]).allows("/reset_prefix_cache"));
    }

    #[tokio::test]
    async fn only_allowed_paths_reach_the_service_behind() {
        let reached = Arc::new(AtomicUsize::new(0));
        let engine = {
            let reached = reached.clone();
            tower::service_fn(move |request: http::Request<()>| {
                reached.fetch_add(1, Ordering::Relaxed);
                async move { Ok::<_, ProxyError>(request.uri().to_string()) }
            })
        };
        let layer = AllowlistLayer::new(PathAllowlist::new(&["/v1/completions"]));
        let request = |uri: &str| http::Request::get(uri).body(()).unwrap();

        let passed = layer.layer(engine.clone());
        let answer = passed.oneshot(request("/v1/completions?x=1")).await;
        assert_eq!(answer.unwrap(), "/v1/completions?x=1");

        let refused = layer.layer(engine);
        match refused.oneshot(request("/reset_prefix_cache?all=1")).await {
            Err(ProxyError::PathNotProxied(path)) => assert_eq!(path, "/reset_prefix_cache"),
            other => panic!("not refused: {other:?}"),
        }
        assert_eq!(reached.load(Ordering::Relaxed), 1);
    }
}
