//! Leader election on a Lease, against the mocked client: acquire, renew, respect another
//! holder, take over an expired lease, yield, and notice a lost lease. Time is tokio's
//! paused clock, so lease expiry takes no real time.

mod common;

use std::time::Duration;

use common::api::FakeApi;
use common::path;
use dynamo_operator::controller::leader::{LeaderElector, LeaseTiming};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::Api;
use serde_json::{Value, json};

const LEASE: &str = "dynamo-operator";

fn elector(client: &Client, identity: &str) -> LeaderElector {
    let api: Api<Lease> = Api::namespaced(client.clone(), "dynamo-system");
    LeaderElector::new(api, LEASE, identity, LeaseTiming::default())
}

fn lease(api: &FakeApi) -> Value {
    api.object(&lease_path()).expect("the lease exists")["spec"].clone()
}

fn lease_path() -> String {
    path("coordination.k8s.io/v1", "dynamo-system", "leases", LEASE)
}

#[tokio::test(start_paused = true)]
async fn acquires_renews_and_yields() {
    let (client, api) = FakeApi::start();
    let mut a = elector(&client, "a");
    assert!(
        a.try_acquire_or_renew().await.unwrap(),
        "a free lease is taken"
    );
    let first = lease(&api);
    assert_eq!(first["holderIdentity"], "a");
    assert_eq!(first["leaseDurationSeconds"], 15);
    assert_eq!(first["leaseTransitions"], 0);
    assert_eq!(
        api.requests().last().unwrap().method,
        "POST",
        "created when missing"
    );

    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(a.try_acquire_or_renew().await.unwrap());
    let renewed = lease(&api);
    assert_eq!(renewed["holderIdentity"], "a");
    assert_eq!(renewed["acquireTime"], first["acquireTime"], "same term");
    assert_eq!(renewed["leaseTransitions"], 0);
    assert_eq!(api.requests().last().unwrap().method, "PUT");

    a.release().await.unwrap();
    let released = lease(&api);
    assert!(released["holderIdentity"].is_null(), "{released}");
    assert_eq!(released["leaseDurationSeconds"], 1);

    // A yielded lease is free for the next candidate at once.
    let mut b = elector(&client, "b");
    assert!(b.try_acquire_or_renew().await.unwrap());
    assert_eq!(lease(&api)["holderIdentity"], "b");
    assert_eq!(lease(&api)["leaseTransitions"], 1);
    api.assert_rbac_allows_all();
}

#[tokio::test(start_paused = true)]
async fn a_held_lease_is_taken_over_only_after_it_expires() {
    let (client, api) = FakeApi::start();
    let mut a = elector(&client, "a");
    let mut b = elector(&client, "b");
    assert!(a.try_acquire_or_renew().await.unwrap());

    api.take_requests();
    assert!(!b.try_acquire_or_renew().await.unwrap(), "a holds it");
    assert!(
        api.take_requests().iter().all(|r| r.method == "GET"),
        "a candidate does not write a held lease"
    );

    // a keeps renewing: b never gets it.
    for _ in 0..10 {
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(a.try_acquire_or_renew().await.unwrap());
        assert!(!b.try_acquire_or_renew().await.unwrap());
    }

    // a stops; once the record has not changed for the lease duration, b takes over.
    tokio::time::advance(Duration::from_secs(14)).await;
    assert!(!b.try_acquire_or_renew().await.unwrap(), "not expired yet");
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(b.try_acquire_or_renew().await.unwrap(), "expired");
    let spec = lease(&api);
    assert_eq!(spec["holderIdentity"], "b");
    assert_eq!(spec["leaseTransitions"], 1);

    // a comes back and finds b holding a fresh lease.
    assert!(!a.try_acquire_or_renew().await.unwrap());
    // Releasing a lease one does not hold changes nothing.
    a.release().await.unwrap();
    assert_eq!(lease(&api)["holderIdentity"], "b");
}

#[tokio::test(start_paused = true)]
async fn a_conflicting_write_loses_the_round() {
    let (client, api) = FakeApi::start();
    let mut a = elector(&client, "a");
    assert!(a.try_acquire_or_renew().await.unwrap());
    api.fail("PUT", "/leases/", 409);
    assert!(
        !a.try_acquire_or_renew().await.unwrap(),
        "another writer won the update"
    );
}

#[tokio::test(start_paused = true)]
async fn the_leader_notices_when_another_replica_holds_the_lease() {
    let (client, api) = FakeApi::start();
    let mut a = elector(&client, "a");
    a.acquire().await;
    // Someone else's record appears (a takeover a did not see coming).
    api.edit(&lease_path(), |l| {
        l["spec"]["holderIdentity"] = json!("b");
    });
    tokio::time::timeout(Duration::from_secs(60), a.hold())
        .await
        .expect("hold returns once the lease is lost");
}

#[tokio::test(start_paused = true)]
async fn the_leader_gives_up_when_it_cannot_renew_in_time() {
    let (client, api) = FakeApi::start();
    let mut a = elector(&client, "a");
    a.acquire().await;
    api.fail("GET", "/leases/", 503);
    let started = tokio::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(60), a.hold())
        .await
        .expect("hold returns after the renew deadline");
    let held = started.elapsed();
    assert!(
        held >= Duration::from_secs(10) && held < Duration::from_secs(15),
        "gave up after the 10 s renew deadline, before the 15 s lease ran out: {held:?}"
    );
}
