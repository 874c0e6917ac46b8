//! Reservations: replies, the state written, the ticket's fraction, what
//! must not be written, the clock, precision, and expiry.

use super::*;

#[test]
fn first_reserve_on_missing_key_is_free_and_writes_the_state() {
    let mut fx = fixture();
    // A missing key is a limiter idle for a long time: 5 stored permits.
    assert_eq!(fx.run("k", &Args::bursty("5", 1_000_000).at(T0)), 0);
    assert_eq!(fx.raw("k").len(), VALUE_LEN);
    // Full again after one stable interval (200 ms): the key needs 200 + 2
    // ms, and a TTL the script sets is twice the need (at most 1 s more).
    let ttl = 2 * (200 + 2);
    assert_eq!(
        fx.state("k"),
        LimiterState {
            stored_permits: 4.0,
            next_free_micros: T0 as f64,
            permits_per_second: 5.0,
            max_permits: 5.0,
            expires_micros: (T0 + ttl as u64 * 1_000) as f64,
            last_now_micros: T0 as f64,
            next_free_fraction: 0,
        }
    );
    let pttl = fx.pttl("k");
    assert!((ttl - 100..=ttl).contains(&pttl), "PTTL {pttl}");
}

#[test]
fn reserve_replies_the_value_it_wrote() {
    let mut fx = fixture();
    let args = Args::bursty("5", 1_000_000);
    // From full (5 stored): 3 stored spent, 2 fresh charged forward.
    let first = fx.call("k", &args.clone().permits(3).at(T0));
    assert_eq!((first.first, first.debt), (0, 0));
    let reply = fx.call("k", &args.clone().permits(4).at(T0 + 100_000));
    // 100 ms idle stores 0.5: 2.5 stored spent, 1.5 fresh = 300 ms.
    assert_eq!((reply.first, reply.debt), (0, 300_000));
    // The reply is what it wrote (`Fixture::call` checks it against the
    // key), with the record of the request: its moment, and no limit that
    // bound it (it did not wait).
    let value = reply.stored();
    let state = fx.state("k");
    assert_eq!(
        state,
        LimiterState {
            stored_permits: 0.0,
            next_free_micros: (T0 + 400_000) as f64,
            permits_per_second: 5.0,
            max_permits: 5.0,
            expires_micros: state.expires_micros,
            last_now_micros: (T0 + 100_000) as f64,
            next_free_fraction: 0,
        }
    );
    let limit = value.limits[0];
    assert_eq!(
        (
            limit.stored_permits,
            limit.next_free_micros,
            value.last_now_micros
        ),
        (
            state.stored_permits,
            state.next_free_micros,
            state.last_now_micros
        )
    );
    assert_eq!(
        (value.moment_micros, value.bound),
        ((T0 + 100_000) as f64, -1.0)
    );
    // Owing 300 ms: it waits for the one limit.
    let reply = fx.call("k", &args.clone().at(T0 + 100_000));
    assert_eq!((reply.first, reply.debt), (300_000, 500_000));
    let value = reply.stored();
    assert_eq!(
        (value.moment_micros, value.bound),
        ((T0 + 400_000) as f64, 0.0)
    );
    // Not held: no id was given.
    assert_eq!(value.next_id, 0.0);
    // A refused try: its debt. The limit stores nothing, so it replies its
    // wait, negated: all the state it found tells (the ticket is ahead, so
    // its fraction tells nothing).
    let refused = fx.call("k", &args.clone().timeout(0).at(T0 + 200_000));
    assert_eq!(
        (refused.first, refused.debt, refused.value),
        (-1, 400_000, None)
    );
    assert_eq!(
        fx.eval("k", &args.clone().timeout(0).at(T0 + 200_000))
            .unwrap(),
        Value::Int(-400_000)
    );
    let state = fx.state("k");
    assert_eq!((state.stored_permits, state.next()), (0.0, T0 + 600_000));
    // One that stores some (warming up, cold): the state as read, with the
    // clock.
    let cold = Args::warming_up("10", 1_000_000, "3.0");
    assert_eq!(fx.run("w", &cold.clone().at(T0)), 0);
    let Value::BulkString(bytes) = fx.eval("w", &cold.clone().timeout(0).at(T0)).unwrap() else {
        panic!("a refusal with permits stored replies the state");
    };
    let found = fx.value("w").limits[0];
    assert!(found.stored_permits > 0.0, "{found:?}");
    assert_eq!(
        Reserved::decode(&bytes, 1).unwrap(),
        Reserved::Refused {
            now: T0,
            limits: vec![LimitState {
                permits_per_second: -1.0,
                max_permits: -1.0,
                ..found
            }],
        }
    );
    // A status: the debt.
    assert_eq!(fx.wait("k", &args.clone().at(T0 + 200_000)), 400_000);
}

#[test]
fn written_value_is_84_bytes_with_the_marker() {
    let mut fx = fixture();
    assert_eq!(fx.run("k", &Args::bursty("5", 1_000_000).at(T0)), 0);
    let raw = fx.raw("k");
    assert_eq!(raw.len(), VALUE_LEN);
    assert_eq!(&raw[..4], b"plv1");
    let value = fx.value("k");
    assert_eq!(value.last_now_micros, T0 as f64);
    assert_eq!(value.encode(), raw);
    // The head: one limit, no log; no id given yet.
    assert_eq!(f64::from_le_bytes(raw[4..12].try_into().unwrap()), 1.0);
    assert_eq!(value.next_id, 0.0);

    // At 3/s a permit costs 333 333.33 µs: the ticket keeps the third of a
    // µs, to the nearest 2^-20 µs (349 525 units).
    assert_eq!(fx.run("f", &Args::bursty("3", 0).at(T0)), 0);
    let state = fx.state("f");
    assert_eq!(state.next(), T0 + 333_333);
    assert_eq!(state.next_free_fraction, 349_525);
    assert_eq!(fx.value("f").encode(), fx.raw("f"));
}

#[test]
fn bursty_sequence_with_explicit_now() {
    let mut fx = fixture();
    let at = |now| Args::bursty("5", 1_000_000).at(now);
    // Five stored permits are free; then each permit pays 200 ms forward.
    let waits: Vec<i64> = (0..8).map(|_| fx.run("k", &at(T0))).collect();
    assert_eq!(waits, [0, 0, 0, 0, 0, 0, 200_000, 400_000]);
    assert_eq!(fx.state("k").next(), T0 + 600_000);

    // 400 ms after the ticket: 2 stored permits, ticket moves to now.
    let now = T0 + 1_000_000;
    assert_eq!(fx.run("k", &at(now).permits(3)), 0); // 2 stored + 1 fresh
    assert_eq!(fx.run("k", &at(now)), 200_000);
    // Debt is now 400 ms.
    assert_eq!(fx.run("k", &at(now).timeout(100_000)), -1);
    assert_eq!(fx.run("k", &at(now).timeout(399_999)), -1);
    assert_eq!(fx.run("k", &at(now).timeout(400_000)), 400_000);
    // Debt 600 ms: a try is judged on the debt only, not on its own size.
    assert_eq!(fx.run("k", &at(now).timeout(599_999).permits(1000)), -1);
    assert_eq!(
        fx.run("k", &at(now).timeout(600_000).permits(1000)),
        600_000
    );
    // 1000 fresh permits at 200 ms each were charged forward.
    assert_eq!(fx.state("k").next(), now + 600_000 + 200_000_000);
    assert_eq!(fx.run("k", &at(now)), 200_600_000);
}

#[test]
fn warming_up_sequence_with_explicit_now() {
    let mut fx = fixture();
    // 2 permits/s, 4 s warm-up, cold factor 3: a missing key is cold (8
    // stored permits), so the limiter starts at 1.375 s and speeds up.
    let mut now = T0;
    let mut waits = vec![];
    for _ in 0..6 {
        let wait = fx.run("w", &Args::warming_up("2", 4_000_000, "3").at(now));
        now += u64::try_from(wait).unwrap();
        waits.push(wait);
    }
    assert_eq!(waits, [0, 1_375_000, 1_125_000, 875_000, 625_000, 500_000]);
    assert_eq!(fx.state("w").max_permits, 8.0);
    // A seventh permit, at the sixth one's moment: it waits for the sixth
    // one's charge and, like every permit so far (8 were stored), spends a
    // stored one at the stable price, below the threshold of 4.
    let reply = fx.call("w", &Args::warming_up("2", 4_000_000, "3").at(now));
    assert_eq!((reply.first, reply.debt), (500_000, 1_000_000));
    let state = fx.state("w");
    assert_eq!((state.stored_permits, state.max_permits), (1.0, 8.0));
}

#[test]
fn rate_change_credits_idle_time_at_the_old_rate_and_rescales() {
    let mut fx = fixture();
    let args = Args::bursty("5", 1_000_000);
    assert_eq!(fx.run("k", &args.clone().at(T0).permits(5)), 0); // stored 0
    // 100 ms idle at 5/s = 0.5 stored of max 5, i.e. 1.0 of max 10 at 10/s;
    // then 1 stored (free) + 1 fresh (100 ms).
    let now = T0 + 100_000;
    assert_eq!(fx.run("k", &args.clone().rate("10").at(now).permits(2)), 0);
    let state = fx.state("k");
    assert_eq!(state.stored_permits, 0.0);
    assert_eq!(state.next(), now + 100_000);
    assert_eq!(state.permits_per_second, 10.0);
    assert_eq!(state.max_permits, 10.0);
    assert_eq!(fx.run("k", &args.clone().rate("10").at(now)), 100_000);

    // Leaving an infinite rate, a bursty limiter is full (ready to burst).
    // (At an infinite rate the key reads as full at once: its TTL is a few
    // ms, which a loaded machine may outrun before the next call reads it.)
    assert_eq!(fx.run("inf", &args.clone().rate("inf").at(T0)), 0);
    let _: () = redis::cmd("PERSIST").arg("inf").query(&mut fx.con).unwrap();
    assert_eq!(fx.state("inf").permits_per_second, f64::INFINITY);
    assert_eq!(fx.state("inf").max_permits, 0.0);
    assert_eq!(fx.run("inf", &args.clone().at(T0)), 0);
    assert_eq!(fx.state("inf").stored_permits, 4.0);
}

#[test]
fn reconfiguration_at_the_same_rate_rescales_stored_permits() {
    let mut fx = fixture();
    assert_eq!(fx.run("k", &Args::bursty("5", 1_000_000).at(T0)), 0);
    assert_eq!(fx.state("k").stored_permits, 4.0);
    // Twice the burst: 4 of 5 becomes 8 of 10, then one is spent.
    assert_eq!(fx.run("k", &Args::bursty("5", 2_000_000).at(T0)), 0);
    assert_eq!(fx.state("k").max_permits, 10.0);
    assert_eq!(fx.state("k").stored_permits, 4.0 / 5.0 * 10.0 - 1.0);
}

#[test]
fn huge_debt_saturates_at_max_micros() {
    let mut fx = fixture();
    let args = Args::bursty("1e-300", 1_000_000).permits(u32::MAX);
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0);
    assert_eq!(fx.state("k").next(), MAX_MICROS);
    let expected = i64::try_from(MAX_MICROS - T0).unwrap();
    assert_eq!(fx.run("k", &args.at(T0)), expected);
    assert_eq!(fx.state("k").next(), MAX_MICROS);
}

#[test]
fn a_rate_above_one_permit_per_microsecond_limits() {
    let mut fx = fixture();
    // 1.5e6/s: a permit costs 2/3 µs, 699 051 units of 2^-20 µs. On a
    // frozen clock the waits are the ticket rounded down to the µs: 0, 2/3,
    // 4/3, 2, 8/3, 10/3, 4 (whole-µs costs would not limit at all).
    // 3 000 reservations in one transaction, each followed by a PERSIST:
    // the few milliseconds of TTL the script sets (on this frozen clock)
    // run on the real one.
    let args = Args::bursty("1.5e6", 0).at(T0);
    fx.script.load(&mut fx.con).expect("SCRIPT LOAD");
    let mut invocation = fx.script.prepare_invoke();
    invocation.key("k");
    for arg in args.to_vec() {
        invocation.arg(arg);
    }
    let mut pipe = redis::pipe();
    pipe.atomic();
    for i in 0..3_000 {
        pipe.invoke_script(&invocation);
        pipe.cmd("PERSIST").arg("k").ignore();
        if i == 6 {
            pipe.cmd("GET").arg("k");
        }
    }
    let mut replies: Vec<Value> = pipe.query(&mut fx.con).unwrap();
    let after_seven =
        LimiterState::decode(&redis::from_redis_value::<Vec<u8>>(replies.remove(7)).unwrap())
            .unwrap();
    let waits: Vec<i64> = replies
        .into_iter()
        .map(|reply| Reply::decode(reply, true).unwrap().first)
        .collect();
    assert_eq!(waits[..7], [0, 0, 1, 2, 2, 3, 4]);
    assert_eq!(after_seven.next(), T0 + 4);
    assert_eq!(after_seven.next_free_fraction, 7 * 699_051 - 4 * 1_048_576);
    // 3 000 permits in 2 000 µs (and 1 000 units: the rounding of each
    // cost to 2^-20 µs); the last one waited for 2 999 × 2/3 µs.
    assert_eq!(waits[2_999], 1_999);
    let state = fx.state("k");
    assert_eq!(state.next(), T0 + 2_000);
    assert_eq!(state.next_free_fraction, 1_000);
    assert_eq!(fx.wait("k", &args), 2_000);
}

#[test]
fn a_cost_of_2_pow_32_micros_or_more_is_whole_and_keeps_the_fraction() {
    let mut fx = fixture();
    // One permit at 3/s leaves 349 525 units past T0 + 333 333 µs.
    assert_eq!(fx.run("k", &Args::bursty("3", 0).at(T0)), 0);
    assert_eq!(fx.state("k").next_free_fraction, 349_525);
    // Five permits at 1/1000 s: 5e9 µs, above 2^32 µs: charged in whole
    // µs (truncated), the ticket's fraction as it was. (The ticket is
    // ahead: the rate change moves nothing.)
    let reply = fx.call("k", &Args::bursty("0.001", 0).permits(5).at(T0));
    assert_eq!((reply.first, reply.debt), (333_333, 5_000_333_333));
    let state = fx.state("k");
    assert_eq!(state.next(), T0 + 5_000_333_333);
    assert_eq!(state.next_free_fraction, 349_525);
}

#[test]
fn idle_time_counts_from_the_exact_ticket() {
    let mut fx = fixture();
    let args = Args::bursty("3", 1_000_000);
    // From full (3 stored): 3 stored and 1 fresh, charged to T0 + 333 333
    // µs and 349 525 units.
    assert_eq!(fx.run("k", &args.clone().permits(4).at(T0)), 0);
    let state = fx.state("k");
    assert_eq!(
        (state.next(), state.next_free_fraction),
        (T0 + 333_333, 349_525)
    );
    // Idle from that ticket to T0 + 1 s: 666 666.67 µs, 2 permits stored
    // (not 666 667 µs, which would store a little more); one is spent.
    assert_eq!(fx.run("k", &args.clone().at(T0 + 1_000_000)), 0);
    let idle = (1_000_000.0 - 333_333.0) - 349_525.0 / 1_048_576.0;
    let expected = (0.0_f64 + idle / (1e6 / 3.0)).min(3.0) - 1.0;
    let state = fx.state("k");
    assert_eq!(state.stored_permits.to_bits(), expected.to_bits());
    assert_eq!(
        (state.next(), state.next_free_fraction),
        (T0 + 1_000_000, 0)
    );
}

#[test]
fn refused_try_leaves_the_key_untouched() {
    let mut fx = fixture();
    let args = Args::bursty("5", 0).at(T0); // no burst: debt from the first call
    assert_eq!(fx.run("k", &args), 0);
    assert_eq!(fx.run("k", &args), 200_000);

    let dump = fx.dump("k");
    let pttl = fx.pttl("k");
    assert!(pttl > 0);
    assert_eq!(fx.run("k", &args.clone().timeout(0)), -1);
    assert_eq!(fx.run("k", &args.clone().timeout(399_999)), -1);
    assert_eq!(fx.dump("k"), dump, "a refused try changed the key");
    let after = fx.pttl("k");
    assert!(
        after <= pttl && after > pttl - 1_000,
        "PTTL {pttl} -> {after}"
    );

    // Without a TTL, a refused try (even one with a new rate, later) must not
    // write one, nor the new rate.
    fx.persist("k");
    let dump = fx.dump("k");
    let refused = args.clone().rate("50").timeout(0).at(T0 + 1_000);
    assert_eq!(fx.run("k", &refused), -1);
    assert_eq!(fx.pttl("k"), -1, "a refused try wrote a TTL");
    assert_eq!(fx.dump("k"), dump, "a refused try changed the key");
    assert_eq!(fx.state("k").permits_per_second, 5.0);

    // A try that fits is granted and writes (with a TTL, as its debt
    // outlasts the one the first call set).
    assert_eq!(fx.run("k", &args.clone().timeout(400_000)), 400_000);
    assert_ne!(fx.dump("k"), dump, "a granted try wrote nothing");
    assert_eq!(fx.state("k").next(), T0 + 600_000);
    assert!(fx.pttl("k") > 0);
}

#[test]
fn status_reads_the_wait_and_writes_nothing() {
    let mut fx = fixture();
    let args = Args::bursty("5", 0);
    // Missing key: no wait, and still missing.
    assert_eq!(fx.wait("k", &args.clone().at(T0)), 0);
    assert_eq!(fx.wait("k", &args), 0);
    assert!(!fx.exists("k"));

    assert_eq!(fx.run("k", &args.clone().at(T0)), 0);
    assert_eq!(fx.run("k", &args.clone().at(T0)), 200_000); // next = T0 + 400 ms
    fx.persist("k");
    let dump = fx.dump("k");
    assert_eq!(fx.wait("k", &args.clone().at(T0)), 400_000);
    assert_eq!(fx.wait("k", &args.clone().at(T0 + 150_000)), 250_000);
    assert_eq!(
        fx.wait("k", &args.clone().timeout(0).at(T0 + 150_000)),
        250_000
    );
    assert_eq!(fx.wait("k", &args.clone().at(T0 + 400_000)), 0);
    // Long idle and a new rate: no resync, no rate change written.
    let idle = args.clone().rate("1000").at(T0 + 3_600_000_000);
    assert_eq!(fx.wait("k", &idle), 0);
    assert_eq!(fx.dump("k"), dump, "a status changed the key");
    assert_eq!(fx.pttl("k"), -1, "a status wrote a TTL");
}

#[test]
fn status_reads_the_state_and_writes_nothing() {
    let mut fx = fixture();
    let args = Args::bursty("5", 0);
    let read = |fx: &mut Fixture, args: &Args| -> Vec<f64> {
        let Value::BulkString(bytes) = fx.eval("k", args).unwrap() else {
            panic!("a status replies a string");
        };
        bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    // Missing: as it starts, full (no burst: 0 stored), with the clock.
    assert_eq!(
        read(&mut fx, &args.clone().status().at(T0)),
        [T0 as f64, 0.0, T0 as f64, 0.0]
    );
    assert!(!fx.exists("k"));
    let args = Args::bursty("5", 1_000_000);
    assert_eq!(fx.run("k", &args.clone().permits(3).at(T0)), 0);
    fx.persist("k");
    let dump = fx.dump("k");
    // The state at the call's rate, as its reservation would find it (2
    // of 5 stored are 20 of 50; the clock never below the key's), and the
    // key untouched.
    assert_eq!(
        read(&mut fx, &args.clone().rate("50").status().at(T0 - 5)),
        [T0 as f64, 20.0, T0 as f64, 0.0]
    );
    assert_eq!(fx.dump("k"), dump);
    assert_eq!(fx.pttl("k"), -1);
}

#[test]
fn server_clock_is_used_without_explicit_now() {
    let mut fx = fixture();
    let args = Args::bursty("1", 0); // 1 permit/s, no burst
    assert_eq!(fx.run("k", &args), 0);
    let wait = fx.run("k", &args);
    assert!((900_000..=1_000_000).contains(&wait), "wait {wait}");
    // The ticket is a real server time: within a few seconds of TIME.
    let next = fx.state("k").next();
    let now = fx.server_time();
    assert!(
        next > now && next <= now + 2_000_000,
        "next {next}, now {now}"
    );
}

#[test]
fn script_flush_is_survived() {
    let mut fx = fixture();
    let args = Args::bursty("5", 0).at(T0);
    assert_eq!(fx.run("k", &args), 0);
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut fx.con)
        .unwrap();
    let cached: Vec<i64> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(fx.script.get_hash())
        .query(&mut fx.con)
        .unwrap();
    assert_eq!(cached, [0], "SCRIPT FLUSH did not flush");
    // NOSCRIPT: the invocation loads the script again and retries.
    assert_eq!(fx.run("k", &args), 200_000);
    let cached: Vec<i64> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(fx.script.get_hash())
        .query(&mut fx.con)
        .unwrap();
    assert_eq!(cached, [1]);
}

#[test]
fn state_is_stored_exactly() {
    let mut fx = fixture();
    let args = Args::bursty("1", 0);
    let before = fx.server_time();
    assert_eq!(fx.run("k", &args), 0);
    let after = fx.server_time();

    // The ticket is a 16-digit integer, stored without rounding.
    let next = fx.state("k").next();
    assert!(
        (before + 1_000_000..=after + 1_000_000).contains(&next),
        "next {next} not within [{before}, {after}] + 1 s"
    );
    // A status at now = 0 reads the key's latest clock instead (time never
    // runs backwards) and replies with the ticket minus that: to the
    // microsecond.
    let last_now = fx.state("k").last_now_micros;
    assert!(
        (before as f64..=after as f64).contains(&last_now),
        "{last_now}"
    );
    assert_eq!(
        fx.wait("k", &args.clone().at(0)),
        (next as f64 - last_now) as i64
    );

    // The next reservation's wait is exactly the ticket minus the server time.
    let before = fx.server_time();
    let wait = u64::try_from(fx.run("k", &args)).unwrap();
    let after = fx.server_time();
    assert!(
        (next - after..=next - before).contains(&wait),
        "wait {wait}, next {next}, time in [{before}, {after}]"
    );
    assert_eq!(fx.state("k").next(), next + 1_000_000);

    // Stored permits keep all their bits.
    assert_eq!(
        fx.run("s", &Args::bursty("3", 1_000_000).at(T0).permits(1)),
        0
    );
    assert_eq!(
        fx.run("s", &Args::bursty("3", 1_000_000).at(T0 + 100_000)),
        0
    );
    // 3 - 1 = 2, + 0.1 s × 3/s = 0.3 (as f64), capped at 3, - 1.
    let expected = (2.0_f64 + 100_000.0 / (1e6 / 3.0)).min(3.0) - 1.0;
    assert_eq!(fx.state("s").stored_permits.to_bits(), expected.to_bits());
}

#[test]
fn time_going_backwards_reads_as_the_latest_time() {
    let mut fx = fixture();
    let args = Args::bursty("5", 0); // no burst: 200 ms per permit
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0);
    assert_eq!(fx.run("k", &args.clone().at(T0)), 200_000); // next: T0 + 400 ms
    let before = fx.raw("k");

    // 10 s back reads as T0: the debt is 400 ms, not 10.4 s.
    let back = T0 - 10_000_000;
    assert_eq!(fx.wait("k", &args.clone().at(back)), 400_000);
    assert_eq!(
        fx.call("k", &args.clone().timeout(399_999).at(back)).debt,
        400_000
    );
    assert_eq!(fx.raw("k"), before, "a status or a refused try wrote");
    assert_eq!(
        fx.run("k", &args.clone().timeout(400_000).at(back)),
        400_000
    );
    let state = fx.state("k");
    assert_eq!(state.next(), T0 + 600_000);
    assert_eq!(state.last_now_micros, T0 as f64);
    // The TTL is counted on the clock as read: until that clock reaches the
    // ticket (10.6 s, + 2 ms), plus 1 s of slack.
    assert_eq!(state.expires_micros, (back + 11_602_000) as f64);
    let pttl = fx.pttl("k");
    assert!((11_500..=11_602).contains(&pttl), "PTTL {pttl}");

    // Forward again, but not past T0 + 600 ms, then back a little: the
    // latest time stands.
    assert_eq!(fx.run("k", &args.clone().at(T0 + 100_000)), 500_000);
    assert_eq!(fx.wait("k", &args.clone().at(T0 + 50_000)), 700_000);
    assert_eq!(fx.wait("k", &args.clone().at(0)), 700_000);
    assert_eq!(fx.state("k").last_now_micros, (T0 + 100_000) as f64);

    // A step forwards reads as idle time: at most one burst.
    let burst = Args::bursty("5", 1_000_000);
    assert_eq!(fx.run("f", &burst.clone().permits(5).at(T0)), 0);
    let later = T0 + 3_600_000_000;
    assert_eq!(
        fx.call("f", &burst.clone().permits(6).at(later)).debt,
        200_000
    );
    // And back to T0 + 1 s: still an hour later, 200 ms of debt.
    assert_eq!(fx.run("f", &burst.clone().at(T0 + 1_000_000)), 200_000);
}

#[test]
fn ttl_lasts_until_the_key_would_read_as_missing() {
    let mut fx = fixture();
    // Bursty 5/s, 1 s burst: 10 permits from full = 5 stored + 5 fresh, so
    // the ticket is 1 s ahead and refilling 5 permits takes 1 s more; then
    // 2 ms of margin, and the slack of a TTL the script sets: twice the
    // need, at most 1 s more.
    assert_eq!(
        fx.run("b", &Args::bursty("5", 1_000_000).permits(10).at(T0)),
        0
    );
    let pttl = fx.pttl("b");
    assert!((2_900..=3_002).contains(&pttl), "PTTL {pttl}");
    assert_eq!(fx.state("b").expires_micros, (T0 + 3_002_000) as f64);

    // Warming-up 2/s, 4 s, cold 3 (max 8): the first permit from cold costs
    // 1.375 s forward; one stored permit refills in 4 s / 8 = 0.5 s.
    let args = Args::warming_up("2", 4_000_000, "3").at(T0);
    assert_eq!(fx.run("w", &args), 0);
    let pttl = fx.pttl("w");
    assert!((2_777..=2_877).contains(&pttl), "PTTL {pttl}");

    // A full limiter (infinite rate: nothing to store, no debt) needs only
    // the 2 ms margin, and gets as much again.
    assert_eq!(fx.run("i", &Args::bursty("inf", 1_000_000).at(T0)), 0);
    let pttl = fx.pttl("i");
    assert!((0..=4).contains(&pttl) || pttl == -2, "PTTL {pttl}");
}

#[test]
fn ttl_is_kept_while_it_lasts_long_enough_then_renewed() {
    let mut fx = fixture();
    let args = Args::bursty("1", 0).at(T0); // no burst: 1 s per permit
    assert_eq!(fx.run("k", &args), 0);
    // The ticket is T0 + 1 s: the key needs 1.002 s, and gets 1 s more.
    assert_eq!(fx.state("k").expires_micros, (T0 + 2_002_000) as f64);
    let pttl = fx.pttl("k");
    assert!((1_900..=2_002).contains(&pttl), "PTTL {pttl}");

    // A write whose need the recorded end covers, here exactly (ticket at
    // T0 + 2 s, so T0 + 2.002 s), keeps the TTL it finds (here one set from
    // outside, so that keeping it shows).
    fx.pexpire("k", 50_000);
    assert_eq!(fx.run("k", &args), 1_000_000);
    assert_eq!(fx.state("k").next(), T0 + 2_000_000);
    assert_eq!(fx.state("k").expires_micros, (T0 + 2_002_000) as f64);
    let pttl = fx.pttl("k");
    assert!((49_000..=50_000).contains(&pttl), "PTTL {pttl}");

    // One more permit needs T0 + 3.002 s: a new TTL, 1 s past that.
    assert_eq!(fx.run("k", &args), 2_000_000);
    assert_eq!(fx.state("k").expires_micros, (T0 + 4_002_000) as f64);
    let pttl = fx.pttl("k");
    assert!((3_900..=4_002).contains(&pttl), "PTTL {pttl}");
}

#[test]
fn ttl_is_capped() {
    let mut fx = fixture();
    // Ticket saturated at 2^53 and a refill of 2^53 µs: far beyond the cap.
    let args = Args::bursty("0.001", MAX_MICROS).permits(u32::MAX).at(T0);
    assert_eq!(fx.run("k", &args), 0);
    assert_eq!(fx.state("k").next(), MAX_MICROS);
    let pttl = fx.pttl("k");
    assert!(
        pttl <= TTL_CAP_MS && pttl > TTL_CAP_MS - 10_000,
        "PTTL {pttl}"
    );
}
