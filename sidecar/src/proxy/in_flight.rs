//! `dynamo_sidecar_requests_in_flight`: a request counts from its arrival until its
//! answer is over. The count rides with the answer's body, so a streamed answer is in
//! flight until its last frame is sent or the client drops it.

use std::task::{Context, Poll};

use futures::future::BoxFuture;
use prometheus_client::metrics::gauge::Gauge;
use tower::{Layer, Service};

use dynamo_server::Guarded;

#[derive(Clone)]
pub struct InFlightLayer {
    gauge: Gauge,
}

impl InFlightLayer {
    pub fn new(gauge: Gauge) -> Self {
        Self { gauge }
    }
}

impl<S> Layer<S> for InFlightLayer {
    type Service = InFlight<S>;

    fn layer(&self, inner: S) -> InFlight<S> {
        InFlight {
            inner,
            gauge: self.gauge.clone(),
        }
    }
}

#[derive(Clone)]
pub struct InFlight<S> {
    inner: S,
    gauge: Gauge,
}

impl<S, R, B> Service<R> for InFlight<S>
where
    S: Service<R, Response = http::Response<B>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<InFlightBody<B>>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let counted = Counted::start(&self.gauge);
        let answered = self.inner.call(request);
        Box::pin(async move {
            let response = answered.await?;
            Ok(response.map(|body| Guarded::new(body, counted)))
        })
    }
}

/// An answer's body, in flight until it ends or is dropped.
pub type InFlightBody<B> = Guarded<B, Counted>;

/// Counts one request in flight until dropped.
pub struct Counted(Gauge);

impl Counted {
    fn start(gauge: &Gauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::{Body, Bytes};
    use futures::StreamExt;
    use tokio::sync::mpsc;
    use tower::ServiceExt;

    /// An answer streamed from `frames`.
    fn streaming(
        frames: mpsc::UnboundedReceiver<Bytes>,
    ) -> impl Service<
        (),
        Response = http::Response<Body>,
        Error = &'static str,
        Future = impl Future<Output = Result<http::Response<Body>, &'static str>> + Send,
    > {
        let mut frames = Some(frames);
        tower::service_fn(move |_: ()| {
            let frames = frames.take().expect("called once");
            let stream = tokio_stream::wrappers::UnboundedReceiverStream::new(frames)
                .map(Ok::<_, std::io::Error>);
            async move { Ok(http::Response::new(Body::from_stream(stream))) }
        })
    }

    #[tokio::test]
    async fn a_streamed_answer_is_in_flight_until_its_body_ends() {
        let gauge = Gauge::default();
        let (send, frames) = mpsc::unbounded_channel();
        let service = InFlightLayer::new(gauge.clone()).layer(streaming(frames));
        let response = service.oneshot(()).await.unwrap();
        assert_eq!(gauge.get(), 1, "the head is sent, the body is not");
        let mut body = Body::new(response.into_body()).into_data_stream();
        send.send(Bytes::from("data: 1\n\n")).unwrap();
        assert_eq!(body.next().await.unwrap().unwrap(), "data: 1\n\n");
        assert_eq!(gauge.get(), 1);
        drop(send);
        assert!(body.next().await.is_none());
        drop(body);
        assert_eq!(gauge.get(), 0);
    }

    #[tokio::test]
    async fn an_answer_the_client_drops_is_no_longer_in_flight() {
        let gauge = Gauge::default();
        let (_send, frames) = mpsc::unbounded_channel();
        let service = InFlightLayer::new(gauge.clone()).layer(streaming(frames));
        let response = service.oneshot(()).await.unwrap();
        assert_eq!(gauge.get(), 1);
        drop(response);
        assert_eq!(gauge.get(), 0);
    }

    #[tokio::test]
    async fn a_failed_request_is_in_flight_only_while_it_is_served() {
        let gauge = Gauge::default();
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let mut released = Some(released);
        let failing = tower::service_fn(move |_: ()| {
            let released = released.take().expect("called once");
            async move {
                let _ = released.await;
                Err::<http::Response<Body>, _>("refused")
            }
        });
        let service = InFlightLayer::new(gauge.clone()).layer(failing);
        let served = tokio::spawn(service.oneshot(()));
        tokio::task::yield_now().await;
        assert_eq!(gauge.get(), 1);
        release.send(()).unwrap();
        assert_eq!(served.await.unwrap().err(), Some("refused"));
        assert_eq!(gauge.get(), 0);
    }
}
