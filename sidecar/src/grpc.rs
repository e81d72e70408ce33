//! The sidecar's gRPC server (port 9100): the KV event stream and the KV block API, both
//! behind the guard (`blocks::guard`: which prompts a pod holds is the graph's business),
//! their request messages bounded (`--grpc-message-timeout`, `--grpc-max-message-bytes`,
//! `--grpc-max-connection-bytes`).

use std::pin::Pin;
use std::time::Duration;

use crate::blocks::guard::Guard;
use crate::blocks::service::BlockApiServer;
use dynamo_kvstream::KvEventHub;
use dynamo_kvstream::pb::kv_event_stream_server::{KvEventStream, KvEventStreamServer};
use dynamo_kvstream::pb::{EventMessage, SubscribeRequest};
use dynamo_server::{GrpcConnection, MessageLimitsLayer};
use futures::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;
use tonic::{Request, Response, Status};

/// Serves until `stop` is cancelled, which also ends every open subscription (they
/// never end by themselves, and a graceful HTTP/2 shutdown waits for open streams).
/// HTTP/2 keepalive pings find subscribers that vanished without closing their stream.
pub async fn serve(
    incoming: impl Stream<Item = std::io::Result<GrpcConnection>> + Send + 'static,
    hub: KvEventHub,
    guard: Guard,
    blocks: BlockApiServer,
    limits: MessageLimitsLayer,
    stop: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    let subscriptions = Subscriptions {
        hub,
        stop: stop.clone(),
    };
    Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .initial_stream_window_size(dynamo_kvblocks::HTTP2_WINDOW_BYTES)
        .initial_connection_window_size(dynamo_kvblocks::HTTP2_WINDOW_BYTES)
        .max_frame_size(dynamo_kvblocks::HTTP2_FRAME_BYTES)
        .layer(limits)
        .add_service(InterceptedService::new(
            KvEventStreamServer::new(subscriptions),
            guard,
        ))
        .add_service(blocks)
        .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
        .await
}

/// The hub's subscriptions, each ending when the sidecar stops.
struct Subscriptions {
    hub: KvEventHub,
    stop: CancellationToken,
}

type EventStream = Pin<Box<dyn Stream<Item = Result<EventMessage, Status>> + Send>>;

#[tonic::async_trait]
impl KvEventStream for Subscriptions {
    type SubscribeStream = EventStream;

    async fn subscribe(
        &self,
        request: Request<SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let events = self.hub.subscribe(request).await?.into_inner();
        let stop = self.stop.clone().cancelled_owned();
        Ok(Response::new(Box::pin(events.take_until(stop))))
    }
}
