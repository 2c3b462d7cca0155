//! A worker with connections that parks when idle (`worker.park_after_us`) on `soft`: it
//! parks (and so gives its core up), a message sent to it while it is parked still reaches its
//! handler, whose answer comes back, and its keepalive still probes an idle connection; by
//! default a worker with connections never parks.

#[path = "common/echo.rs"]
mod echo;

use std::net::SocketAddr;
use std::time::Duration;

use echo::{connect, echo_once, engine, metric_when};

#[test]
fn an_idle_worker_with_connections_parks_and_still_hears_its_messages() {
    let addr: SocketAddr = "10.97.0.1:7000".parse().unwrap();
    let worker = "park_after_us = 200\nkeepalive_ms = 40";
    let (server, _) = engine("10.97.0.1:7000", worker);
    let (mut client_engine, _) = engine("10.97.0.2:7000", worker);
    let (mut client, conn) = connect(&mut client_engine, addr);
    // Idle: both park, a slice at a time, and their keepalive probes go on.
    for e in [&server, &client_engine] {
        metric_when(e, |m| m.parks, |n| n >= 20);
        metric_when(e, |m| m.keepalive_probes, |n| n >= 3);
    }
    let before: u64 = server.metrics().iter().map(|m| m.voluntary_switches).sum();
    assert!(before >= 20, "a parked worker gives its core up: {before} voluntary switches");
    // A message to the parked server is heard and answered (within a slice of each park).
    for round in 0..3u8 {
        echo_once(&mut client, conn, &[round; 64]);
        std::thread::sleep(Duration::from_millis(20)); // (parked again)
    }
    let failed: u64 =
        client_engine.metrics().iter().chain(&server.metrics()).map(|m| m.keepalive_failures).sum();
    assert_eq!(failed, 0, "parking made no probe fail");
    drop(client);
    client_engine.shutdown().unwrap();
    server.shutdown().unwrap();
}

#[test]
fn a_worker_with_connections_never_parks_by_default() {
    let addr: SocketAddr = "10.97.0.3:7000".parse().unwrap();
    let (server, _) = engine("10.97.0.3:7000", "");
    let (mut client_engine, _) = engine("10.97.0.4:7000", "");
    let (client, _conn) = connect(&mut client_engine, addr);
    std::thread::sleep(Duration::from_millis(100));
    let metrics = client_engine.shutdown().unwrap().into_iter().chain(server.shutdown().unwrap());
    assert_eq!(metrics.map(|m| m.parks).sum::<u64>(), 0);
    drop(client);
}
