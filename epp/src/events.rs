//! One task per pod follows the pod's KV event stream (`dynamo-kvstream`) and applies
//! what it says to the router's shared index: a snapshot replaces the pod's blocks, an
//! event changes them, and `Lost` drops them until the next snapshot, so the index never
//! credits a pod with blocks nobody can vouch for.

use std::sync::Arc;

use dynamo_kvblocks::Credential;
use dynamo_kvcache::WorkerId;
use dynamo_kvstream::SubscriberConfig;

use crate::router::Router;

/// Follows the stream at `url` (`http://ip:9100`) for `worker`, with the graph's
/// `credential`, until the task is aborted.
pub async fn follow(
    router: Arc<Router>,
    worker: WorkerId,
    url: String,
    credential: Option<Credential>,
) {
    let config = SubscriberConfig {
        credential,
        ..SubscriberConfig::default()
    };
    dynamo_kvstream::follow(url, config, move |update| {
        router.apply_update(worker, update)
    })
    .await
}
