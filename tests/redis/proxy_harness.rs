//! The fault-injection proxy of `crate::support::proxy`, checked against a real
//! `redis-server`: it forwards, its faults look to a client the way they are
//! meant to (a vanished peer hangs, a reset fails at once), new connections
//! are not hit by faults aimed at existing ones, and its counts are right.

use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::support::proxy::Proxy;
use crate::support::redis_server::RedisServer;

/// Budget to connect (a round trip: redis-rs sends `CLIENT SETINFO`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Read and write timeout of the test connections.
const IO_TIMEOUT: Duration = Duration::from_millis(300);

/// How long an asynchronous effect (a close seen by the proxy) may take.
const SETTLE: Duration = Duration::from_secs(2);

/// A connection through `proxy` with [`IO_TIMEOUT`]; panics if it fails.
fn connect(proxy: &Proxy) -> redis::Connection {
    try_connect(proxy, CONNECT_TIMEOUT)
        .unwrap_or_else(|e| panic!("cannot connect through the proxy {}: {e}", proxy.url()))
}

/// A connection through `proxy`, made within `timeout`, with [`IO_TIMEOUT`].
fn try_connect(proxy: &Proxy, timeout: Duration) -> redis::RedisResult<redis::Connection> {
    let con = proxy.client().get_connection_with_timeout(timeout)?;
    con.set_read_timeout(Some(IO_TIMEOUT))?;
    con.set_write_timeout(Some(IO_TIMEOUT))?;
    Ok(con)
}

/// `PING` on `con`.
fn ping(con: &mut redis::Connection) -> redis::RedisResult<String> {
    redis::cmd("PING").query(con)
}

/// Panics unless `con` answers `PING` with `PONG`.
fn assert_pong(con: &mut redis::Connection, what: &str) {
    match ping(con) {
        Ok(pong) => assert_eq!(pong, "PONG", "{what}: PING answered {pong:?}"),
        Err(e) => panic!("{what}: PING failed: {e}"),
    }
}

/// Panics unless `result` is a read timeout.
fn assert_timeout<T: std::fmt::Debug>(result: redis::RedisResult<T>, what: &str) {
    match result {
        Ok(value) => panic!("{what}: expected a timeout, got {value:?}"),
        Err(e) => assert!(e.is_timeout(), "{what}: expected a timeout, got {e}"),
    }
}

/// Panics unless `result` is an I/O failure other than a timeout (a reset
/// or closed connection).
fn assert_dropped<T: std::fmt::Debug>(result: redis::RedisResult<T>, what: &str) {
    match result {
        Ok(value) => panic!("{what}: expected a dropped connection, got {value:?}"),
        Err(e) => assert!(
            e.is_io_error() && !e.is_timeout(),
            "{what}: expected a dropped connection, got {e}"
        ),
    }
}

/// Waits until `proxy` has `n` open connections; panics after [`SETTLE`].
fn await_connections(proxy: &Proxy, n: usize) {
    let deadline = Instant::now() + SETTLE;
    while proxy.connections() != n {
        assert!(
            Instant::now() < deadline,
            "the proxy has {} open connections, expected {n}",
            proxy.connections()
        );
        sleep(Duration::from_millis(5));
    }
}

#[test]
fn forwards_commands_and_replies() {
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let mut con = connect(&proxy);
    assert_pong(&mut con, "through the proxy");

    // Larger than one chunk each way, so order across chunks matters.
    let value: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    let () = redis::cmd("SET")
        .arg("k")
        .arg(&value)
        .query(&mut con)
        .expect("SET through the proxy");
    let read: Vec<u8> = redis::cmd("GET")
        .arg("k")
        .query(&mut con)
        .expect("GET through the proxy");
    assert!(read == value, "GET returned a different value");
    let direct: Vec<u8> = redis::cmd("GET")
        .arg("k")
        .query(&mut server.connection())
        .expect("GET on the server");
    assert!(direct == value, "the server holds a different value");
}

#[tokio::test]
async fn works_under_a_current_thread_runtime() {
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let mut con = proxy
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("async connection through the proxy");
    let pong: String = redis::cmd("PING")
        .query_async(&mut con)
        .await
        .expect("async PING");
    assert_eq!(pong, "PONG");
}

#[test]
fn blackhole_existing_silences_open_connections_only() {
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let mut old = connect(&proxy);
    assert_pong(&mut old, "before the blackhole");

    proxy.blackhole_existing();
    let start = Instant::now();
    assert_timeout(
        redis::cmd("SET").arg("lost").arg(1).query::<()>(&mut old),
        "SET on a blackholed connection",
    );
    assert!(
        start.elapsed() >= IO_TIMEOUT - Duration::from_millis(20),
        "the blackholed SET failed after {:?}, before the read timeout",
        start.elapsed()
    );

    let mut new = connect(&proxy);
    assert_pong(&mut new, "a connection opened after the blackhole");
    let lost: Option<i64> = redis::cmd("GET").arg("lost").query(&mut new).expect("GET");
    assert_eq!(lost, None, "the blackholed SET reached the server");
    assert_eq!(
        proxy.connections(),
        2,
        "the blackholed connection is still open"
    );
}

#[test]
fn blackhole_all_silences_new_connections_until_heal() {
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let mut old = connect(&proxy);
    assert_pong(&mut old, "before the blackhole");

    proxy.blackhole_all();
    assert_timeout(ping(&mut old), "PING on an existing connection");
    // Connecting is a round trip (`CLIENT SETINFO`), so it may be what hangs.
    match try_connect(&proxy, IO_TIMEOUT) {
        Ok(mut con) => assert_timeout(ping(&mut con), "PING on a new connection"),
        Err(e) => assert!(e.is_timeout(), "expected a timeout, got {e}"),
    }

    proxy.heal();
    assert_pong(&mut connect(&proxy), "a connection opened after heal");
    assert_timeout(
        ping(&mut old),
        "PING on a connection blackholed before heal",
    );
}

#[test]
fn latency_delays_both_directions() {
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let mut con = connect(&proxy);
    con.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    assert_pong(&mut con, "before the latency");

    let latency = Duration::from_millis(200);
    proxy.set_latency(latency);
    let start = Instant::now();
    assert_pong(&mut con, "with latency");
    let round_trip = start.elapsed();
    // The request and the reply are each delayed.
    assert!(
        round_trip >= 2 * latency && round_trip < Duration::from_secs(2),
        "a PING took {round_trip:?} with {latency:?} latency each way"
    );

    proxy.set_latency(Duration::ZERO);
    let start = Instant::now();
    assert_pong(&mut con, "after the latency is removed");
    let round_trip = start.elapsed();
    assert!(
        round_trip < Duration::from_millis(100),
        "a PING took {round_trip:?} with no latency"
    );
}

#[test]
fn reset_all_breaks_open_connections_at_once() {
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let mut old = connect(&proxy);
    assert_pong(&mut old, "before the reset");

    proxy.reset_all();
    assert_eq!(proxy.connections(), 0, "reset_all returned before closing");
    let start = Instant::now();
    let result = ping(&mut old);
    assert!(
        result
            .as_ref()
            .is_err_and(|e| e.to_string().contains("reset by peer")),
        "expected a connection reset, got {result:?}"
    );
    assert_dropped(result, "PING on a reset connection");
    assert!(
        start.elapsed() < IO_TIMEOUT,
        "the reset connection took {:?} to fail",
        start.elapsed()
    );

    assert_pong(&mut connect(&proxy), "a connection opened after the reset");
}

#[test]
fn refuse_new_resets_new_connections_only() {
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let mut old = connect(&proxy);
    assert_pong(&mut old, "before refusing");

    proxy.refuse_new(true);
    assert_dropped(
        try_connect(&proxy, CONNECT_TIMEOUT).map(drop),
        "connecting while refused",
    );
    assert_eq!(proxy.accepted(), 2, "the refused connection was accepted");
    assert_eq!(proxy.connections(), 1, "the refused connection is not open");
    assert_pong(&mut old, "an existing connection while refusing");

    proxy.refuse_new(false);
    assert_pong(&mut connect(&proxy), "a connection after refusing");
}

#[test]
fn counts_connections_and_drop_closes_them() {
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    assert_eq!((proxy.accepted(), proxy.connections()), (0, 0));

    let mut first = connect(&proxy);
    let mut second = connect(&proxy);
    assert_pong(&mut first, "first connection");
    assert_pong(&mut second, "second connection");
    assert_eq!(proxy.accepted(), 2);
    assert_eq!(proxy.connections(), 2);

    drop(first);
    await_connections(&proxy, 1);
    assert_eq!(proxy.accepted(), 2, "accepted() counts closed connections");

    drop(proxy);
    assert_dropped(ping(&mut second), "PING after the proxy is dropped");
    assert_pong(&mut server.connection(), "the server itself");
}
