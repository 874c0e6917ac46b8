//! The cold modes: a probe (proves the key can be read and written, and
//! changes nothing), and a resume (carries a fallback's debt into the key).

use std::net::TcpListener;
use std::thread::sleep;
use std::time::{Duration, Instant};

use super::*;

/// Writes to the dataset since the server started (`rdb_changes_since_last_save`).
fn changes(con: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("persistence").query(con).unwrap();
    info.lines()
        .find_map(|line| line.trim().strip_prefix("rdb_changes_since_last_save:"))
        .expect("rdb_changes_since_last_save in INFO")
        .parse()
        .unwrap()
}

#[test]
fn probe_writes_the_same_bytes_and_keeps_the_ttl() {
    let mut fx = fixture();
    let args = Args::bursty("5", 0);
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0);
    assert_eq!(fx.run("k", &args.clone().at(T0)), 200_000); // next: T0 + 400 ms
    fx.pexpire("k", 50_000);
    let before = fx.raw("k");
    // Later, earlier, at another rate, with a timeout: the value is written
    // back as it is, and the reply is the debt.
    for (now, rate, timeout, debt) in [
        (T0 + 100_000, "5", "-1", 300_000),
        (T0 - 1_000_000, "5", "-1", 400_000),
        (T0 + 100_000, "50", "0", 300_000),
        (T0 + 1_000_000, "5", "-1", 0),
    ] {
        let writes = changes(&mut fx.con);
        let reply = fx.call(
            "k",
            &args.clone().rate(rate).timeout(timeout).probe().at(now),
        );
        assert_eq!(
            reply,
            Reply {
                first: debt,
                debt,
                value: None
            },
            "at {now}"
        );
        assert_eq!(changes(&mut fx.con), writes + 1, "the probe did not write");
        assert_eq!(fx.raw("k"), before, "the probe changed the value");
    }
    let pttl = fx.pttl("k");
    assert!((49_000..=50_000).contains(&pttl), "PTTL {pttl}");
    // Without a TTL, none is set.
    fx.persist("k");
    assert_eq!(fx.run("k", &args.clone().probe().at(T0)), 400_000);
    assert_eq!(fx.pttl("k"), -1);
    assert_eq!(fx.raw("k"), before);
    // A status does not write.
    let writes = changes(&mut fx.con);
    assert_eq!(fx.wait("k", &args.clone().at(T0)), 400_000);
    assert_eq!(changes(&mut fx.con), writes);
}

#[test]
fn probe_of_a_missing_key_writes_it_as_it_reads() {
    let mut fx = fixture();
    fx.script.load(&mut fx.con).expect("SCRIPT LOAD");
    let args = Args::bursty("5", 1_000_000).probe().at(T0);
    // One transaction, so that the 4 ms TTL cannot end between the calls.
    let mut invocation = fx.script.prepare_invoke();
    invocation.key("m");
    for arg in args.to_vec() {
        invocation.arg(arg);
    }
    let (reply, value, pttl): (Value, Vec<u8>, i64) = redis::pipe()
        .atomic()
        .invoke_script(&invocation)
        .cmd("GET")
        .arg("m")
        .cmd("PTTL")
        .arg("m")
        .query(&mut fx.con)
        .unwrap();
    assert_eq!(
        Reply::decode(reply, false).unwrap(),
        Reply {
            first: 0,
            debt: 0,
            value: None
        }
    );
    // Full, ticket now; it needs no time at all (+ 2 ms), and gets twice that.
    assert_eq!(value.len(), VALUE_LEN);
    assert_eq!(
        LimiterState::decode(&value).unwrap(),
        LimiterState {
            stored_permits: 5.0,
            next_free_micros: T0 as f64,
            permits_per_second: 5.0,
            max_permits: 5.0,
            expires_micros: (T0 + 4_000) as f64,
            last_now_micros: T0 as f64,
            next_free_fraction: 0,
        }
    );
    assert!((0..=4).contains(&pttl), "PTTL {pttl}");
    // Whether or not it is still there, it reads as a missing key.
    assert_eq!(fx.run("m", &Args::bursty("5", 1_000_000).at(T0)), 0);
    assert_eq!(fx.state("m").stored_permits, 4.0);
}

#[test]
fn probe_fails_with_oom_when_the_server_is_full() {
    let mut fx = fixture();
    let args = Args::bursty("5", 1_000_000).at(T0);
    assert_eq!(fx.run("k", &args), 0);
    fx.persist("k");
    fx.set_bytes("filler", &[b'x'; 1_000]);
    let dump = fx.dump("k");
    for (name, value) in [("maxmemory-policy", "noeviction"), ("maxmemory", "1")] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query(&mut fx.con)
            .unwrap();
    }
    for key in ["k", "missing"] {
        for call in [args.clone().probe(), args.clone(), args.clone().resume(0)] {
            let error = fx.run_err(&[key], &call.to_vec());
            assert!(error.contains("OOM"), "{key}, {call:?}: {error}");
        }
    }
    // A status writes nothing, so it still answers.
    assert_eq!(fx.wait("k", &args), 0);
    assert_eq!(fx.dump("k"), dump);
    assert!(!fx.exists("missing"));

    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("0")
        .query(&mut fx.con)
        .unwrap();
    assert_eq!(fx.run("k", &args.clone().probe()), 0);
}

/// A port that was free a moment ago.
fn any_free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local address").port()
}

#[test]
fn probe_fails_with_readonly_on_a_replica() {
    let mut fx = fixture();
    let args = Args::bursty("5", 1_000_000).at(T0);
    assert_eq!(fx.run("k", &args), 0);
    fx.persist("k");
    let port = fx.server.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port], any_free_port);
    let mut con = replica.connection();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut con)
            .unwrap();
        let up = info
            .lines()
            .any(|line| line.trim() == "master_link_status:up");
        let synced: i64 = redis::cmd("EXISTS").arg("k").query(&mut con).unwrap();
        if up && synced == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replica did not sync: {info}"
        );
        sleep(Duration::from_millis(20));
    }
    let value: Vec<u8> = redis::cmd("GET").arg("k").query(&mut con).unwrap();
    assert_eq!(value, fx.raw("k"));

    for key in ["k", "missing"] {
        for call in [args.clone().probe(), args.clone(), args.clone().resume(0)] {
            let error = eval_on(&fx.script, &mut con, &[key], &call.to_vec())
                .map(|reply| panic!("{key}, {call:?}: expected READONLY, got {reply:?}"))
                .unwrap_err();
            let error = server_error(&error);
            assert!(error.contains("READONLY"), "{key}, {call:?}: {error}");
        }
    }
    // A status writes nothing, so a replica answers it.
    let status = args.clone().status().to_vec();
    let reply = eval_on(&fx.script, &mut con, &["k"], &status).unwrap();
    let state = Reserved::from_reply(&reply, 1).unwrap();
    assert_eq!(state.refused_wait(), Some(0));
}

#[test]
fn resume_drains_stored_permits_and_applies_the_debt() {
    let mut fx = fixture();
    let args = Args::bursty("5", 1_000_000);
    // A missing key: written without stored permits, so no burst after an
    // outage.
    let reply = fx.call("m", &args.clone().resume(0).at(T0));
    assert_eq!(
        reply,
        Reply {
            first: 0,
            debt: 0,
            value: None
        }
    );
    assert_eq!(
        fx.state("m"),
        LimiterState {
            stored_permits: 0.0,
            next_free_micros: T0 as f64,
            permits_per_second: 5.0,
            max_permits: 5.0,
            // 5 permits to refill at 200 ms: 1 s + 2 ms, and 1 s of slack.
            expires_micros: (T0 + 2_002_000) as f64,
            last_now_micros: T0 as f64,
            next_free_fraction: 0,
        }
    );
    assert!(fx.pttl("m") > 1_900);
    assert_eq!(fx.run("m", &args.clone().at(T0)), 0);
    assert_eq!(fx.run("m", &args.clone().at(T0)), 200_000);

    // Stored permits (4, and 0.5 more after 100 ms) are dropped; the debt
    // run up locally is added to the ticket, which the resync brought to now.
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0);
    let reply = fx.call("k", &args.clone().resume(1_000_000).at(T0 + 100_000));
    assert_eq!((reply.first, reply.debt), (1_000_000, 1_000_000));
    let state = fx.state("k");
    assert_eq!(state.stored_permits, 0.0);
    assert_eq!(state.next(), T0 + 1_100_000);
    assert_eq!(state.last_now_micros, (T0 + 100_000) as f64);
    assert_eq!(fx.run("k", &args.clone().at(T0 + 100_000)), 1_000_000);
    // A debt is added to the key's own (reservations made through Redis
    // meanwhile, by other processes or late ones a cancel may still take
    // out), not merged with it.
    let reply = fx.call("k", &args.clone().resume(500_000).at(T0 + 100_000));
    assert_eq!((reply.first, reply.debt), (1_700_000, 1_700_000));
    assert_eq!(fx.state("k").next(), T0 + 1_800_000);

    // At a new rate: the rate change is applied first.
    let reply = fx.call("k", &args.clone().rate("10").resume(0).at(T0 + 10_000_000));
    assert_eq!((reply.first, reply.debt), (0, 0));
    let state = fx.state("k");
    assert_eq!((state.permits_per_second, state.max_permits), (10.0, 10.0));
    assert_eq!((state.stored_permits, state.next()), (0.0, T0 + 10_000_000));

    // A debt beyond 2^53 saturates.
    let reply = fx.call(
        "k",
        &args
            .clone()
            .rate("10")
            .resume("100000000000000000000")
            .at(T0 + 10_000_000),
    );
    let expected = i64::try_from(MAX_MICROS - T0 - 10_000_000).unwrap();
    assert_eq!((reply.first, reply.debt), (expected, expected));
    assert_eq!(fx.state("k").next(), MAX_MICROS);
}

#[test]
fn resume_keeps_the_fraction_below_2_pow_53_and_drops_it_there() {
    let mut fx = fixture();
    let args = Args::bursty("3", 0);
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0); // T0 + 333 333 µs, 349 525 units
    // A debt moves the ticket's whole µs; the fraction stays.
    assert_eq!(fx.run("k", &args.clone().resume(1_000).at(T0)), 334_333);
    let state = fx.state("k");
    assert_eq!(
        (state.next(), state.next_free_fraction),
        (T0 + 334_333, 349_525)
    );
    // A ticket that reaches 2^53 is 2^53, with no fraction (as a charge's).
    let to_the_end = MAX_MICROS - (T0 + 334_333);
    let debt = i64::try_from(MAX_MICROS - T0).unwrap();
    assert_eq!(fx.run("k", &args.clone().resume(to_the_end).at(T0)), debt);
    let state = fx.state("k");
    assert_eq!((state.next(), state.next_free_fraction), (MAX_MICROS, 0));
    // A resync moves the ticket to now, with no fraction.
    assert_eq!(fx.run("r", &args.clone().at(T0)), 0);
    assert_eq!(fx.run("r", &args.clone().resume(0).at(T0 + 400_000)), 0);
    let state = fx.state("r");
    assert_eq!((state.next(), state.next_free_fraction), (T0 + 400_000, 0));
}

#[test]
fn resume_keeps_a_warming_up_limits_stored_permits() {
    let mut fx = fixture();
    // 10/s, 1 s of warm-up from three times the interval: a missing key is
    // cold. A resume used to drop what it stored, so that after an outage
    // the key ran warm (the second request 100 ms after the first) where
    // it was cold (280 ms: the first stored permit's price, near 300 ms).
    let args = Args::warming_up("10", 1_000_000, "3");
    let reply = fx.call("w", &args.clone().resume(0).at(T0));
    assert_eq!((reply.first, reply.debt), (0, 0));
    let state = fx.state("w");
    assert_eq!(state.stored_permits, state.max_permits);
    assert_eq!(fx.run("w", &args.clone().at(T0)), 0);
    assert_eq!(fx.run("w", &args.clone().at(T0)), 280_000);
    // A bursty limit still drops them (nothing bursts after an outage).
    let bursty = Args::bursty("10", 1_000_000);
    fx.call("b", &bursty.clone().resume(0).at(T0));
    assert_eq!(fx.state("b").stored_permits, 0.0);
}
