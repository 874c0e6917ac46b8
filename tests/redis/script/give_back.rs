//! Give-backs (`cancel`): a held reservation that waits is logged with an
//! id; giving it back takes it out of the log and charges the requests
//! logged after it again, so the key holds exactly what it would had it
//! never been made (`core::Limits::give_back`).

use super::*;

#[test]
fn a_resume_and_the_give_backs_of_late_reservations_commute() {
    // Reservations that reach Redis after the limiter switched to its
    // fallback are given back when their replies come; the probe's resume
    // may land before or after those give-backs. Either way the key ends
    // with the fallback's debt on top of what it held before them: the
    // resume is logged, and charged again with the others.
    let mut fx = fixture();
    let args = Args::bursty("10", 0).held();
    let late = |fx: &mut Fixture, key: &str| {
        assert_eq!(fx.run(key, &args.clone().at(T0)), 0); // ticket T0 + 100 ms
        let ids: Vec<u64> = (0..2)
            .map(|_| fx.call(key, &args.clone().at(T0)).id())
            .collect();
        assert_eq!(fx.state(key).next(), T0 + 300_000);
        ids
    };
    let resume = args.clone().resume(500_000).at(T0 + 10_000);

    // Resume first: the give-backs then take the reservations out from
    // under it.
    let ids = late(&mut fx, "a");
    fx.call("a", &resume);
    assert_eq!(fx.value("a").logged(), Some(3));
    for id in ids.iter().rev() {
        assert_eq!(fx.run("a", &args.clone().cancel(id).at(T0 + 20_000)), 1);
    }
    // Give-backs first.
    let ids = late(&mut fx, "b");
    let outcomes: Vec<i64> = ids
        .iter()
        .rev()
        .map(|id| fx.run("b", &args.clone().cancel(id).at(T0 + 10_000)))
        .collect();
    assert_eq!(outcomes, [1, 1]);
    assert_eq!(fx.state("b").next(), T0 + 100_000);
    fx.call("b", &resume);

    assert_eq!(fx.state("a").next(), T0 + 600_000);
    assert_eq!(fx.state("b").next(), T0 + 600_000);
}

#[test]
fn a_give_back_of_the_latest_reservation_restores_the_state_it_found() {
    let mut fx = fixture();
    let args = Args::bursty("5", 1_000_000);
    // From full: 5 stored and 1 fresh, the ticket 200 ms ahead.
    assert_eq!(fx.run("k", &args.clone().permits(6).at(T0)), 0);
    let found = fx.state("k");
    // 100 ms later it waits 100 ms, and charges 200 ms.
    let reply = fx.call("k", &args.clone().held().at(T0 + 100_000));
    assert_eq!((reply.first, reply.debt), (100_000, 300_000));
    let id = reply.id();
    assert_eq!(fx.value("k").logged(), Some(1));

    let cancel = fx.call("k", &args.clone().cancel(id).at(T0 + 150_000));
    assert_eq!(
        cancel,
        Reply {
            first: 1,
            debt: 1,
            value: None
        }
    );
    let state = fx.state("k");
    assert_eq!(
        state,
        LimiterState {
            // The TTL the reservation set outlasts what the key needs: kept.
            expires_micros: state.expires_micros,
            last_now_micros: (T0 + 150_000) as f64,
            ..found
        }
    );
    assert!(state.expires_micros >= found.expires_micros);
    assert_eq!(fx.value("k").logged(), None);
    // As if it had never been made: at 200 ms the limiter owes nothing.
    assert_eq!(fx.call("k", &args.clone().at(T0 + 200_000)).first, 0);

    // Giving it back again gives nothing back, and writes nothing.
    let dump = fx.dump("k");
    let again = fx.call("k", &args.clone().cancel(id).at(T0 + 200_000));
    assert_eq!(again.first, 0);
    assert_eq!(fx.dump("k"), dump);
}

#[test]
fn a_give_back_of_an_earlier_reservation_leaves_what_it_never_made() {
    let mut fx = fixture();
    let args = Args::bursty("5", 0).held(); // no burst: 200 ms per permit
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0);
    let b = fx.call("k", &args.clone().at(T0)); // waits until T0 + 200 ms
    assert_eq!(b.first, 200_000);
    assert_eq!(fx.run("k", &args.clone().at(T0)), 400_000); // next: T0 + 600 ms

    let cancel = fx.call("k", &args.clone().cancel(b.id()).at(T0 + 100_000));
    assert_eq!(cancel.first, 1);
    let state = fx.state("k");
    assert_eq!((state.stored_permits, state.next()), (0.0, T0 + 400_000));
    assert_eq!(state.last_now_micros, (T0 + 100_000) as f64);
    // The next caller is scheduled as if it had never been made.
    assert_eq!(fx.run("k", &args.clone().at(T0 + 100_000)), 300_000);
}

#[test]
fn a_waiter_given_back_after_another_never_lets_the_next_caller_in_early() {
    // 1 permit/s, one second of burst. A and B hold an hour each; A is
    // given back, B keeps its slot. Half an hour later a limiter that
    // never made A and B is idle, so S and ten more go at 1800 s to 1810 s
    // there; here they wait behind B. When B is given back too, the next
    // caller goes at 1810 s. (Moving the ticket back by B's whole charge
    // would send it at 1801 s.)
    const S: u64 = 1_000_000;
    let mut fx = fixture();
    let args = Args::bursty("1", S);
    let held = args.clone().held();
    // The key reads as idle: its one stored permit, then one second.
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0);
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0);
    let a = fx.call("k", &held.clone().permits("3600+").at(T0)); // waits 1 s
    let b = fx.call("k", &held.clone().permits("3600+").at(T0)); // until 3601 s
    assert_eq!((a.first, b.first), (S as i64, 3601 * S as i64));
    assert_eq!(fx.run("k", &args.clone().cancel(a.id()).at(T0 + S / 2)), 1);
    // S (at 1800 s, behind B) and ten more.
    assert_eq!(
        fx.run("k", &args.clone().at(T0 + 1800 * S)),
        1801 * S as i64
    );
    for _ in 0..10 {
        fx.run("k", &args.clone().at(T0 + 1800 * S));
    }
    assert_eq!(
        fx.run("k", &args.clone().cancel(b.id()).at(T0 + 1801 * S)),
        1
    );
    assert_eq!(fx.run("k", &args.clone().at(T0 + 1801 * S)), 9 * S as i64);
    assert_eq!(fx.state("k").next(), T0 + 1811 * S);
}

#[test]
fn a_reservation_not_held_gets_no_id_and_cannot_be_given_back() {
    // A reservation made without `+` (its caller was not going to give it
    // back: `reserve`, `try_reserve`) is logged only while held ones wait,
    // and with no id: nothing can give it back. It errs towards limiting,
    // never towards granting twice.
    let mut fx = fixture();
    let args = Args::bursty("5", 0);
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0);
    let b = fx.call("k", &args.clone().at(T0)); // waits until T0 + 200 ms
    assert_eq!(b.first, 200_000);
    assert_eq!(b.stored().next_id, 0.0);
    assert_eq!(fx.value("k").logged(), None);
    // A held one is logged with its id; a plain one after it, with none.
    let held = fx.call("k", &args.clone().held().at(T0));
    assert_eq!(held.id(), T0);
    fx.call("k", &args.clone().at(T0));
    let value = fx.value("k");
    let ids: Vec<f64> = value.log.iter().map(|entry| entry[0]).collect();
    assert_eq!(ids, [T0 as f64, -1.0]);
    // No id gives the plain ones back; the held one's does.
    fx.persist("k");
    let dump = fx.dump("k");
    for id in [0, T0 - 1, T0 + 1] {
        assert_eq!(fx.run("k", &args.clone().cancel(id).at(T0 + 100_000)), 0);
        assert_eq!(fx.dump("k"), dump);
    }
    assert_eq!(fx.run("k", &args.clone().cancel(T0).at(T0 + 100_000)), 1);
    assert_eq!(fx.state("k").next(), T0 + 600_000);
}

#[test]
fn a_give_back_restores_the_fraction_too() {
    let mut fx = fixture();
    let args = Args::bursty("3", 0).at(T0);
    assert_eq!(fx.run("k", &args), 0); // T0 + 333 333 µs, 349 525 units
    let found = fx.state("k");
    let b = fx.call("k", &args.clone().held()); // T0 + 666 666 µs, 699 050 units
    assert_eq!(fx.state("k").next_free_fraction, 699_050);
    assert_eq!(fx.run("k", &args.clone().cancel(b.id())), 1);
    let state = fx.state("k");
    assert_eq!(
        (state.next(), state.next_free_fraction),
        (found.next(), found.next_free_fraction)
    );
}

#[test]
fn a_give_back_of_an_earlier_reservation_is_exact_below_the_microsecond() {
    let mut fx = fixture();
    let args = Args::bursty("3", 0).held().at(T0);
    // Five reservations: the ticket after the k-th is k × 333 333.33 µs,
    // to 2^-20 µs (349 525 units each past the µs). The first goes at
    // once; the others wait, with ids.
    assert_eq!(fx.run("k", &args), 0);
    let ids: Vec<u64> = (0..4).map(|_| fx.call("k", &args).id()).collect();
    let state = fx.state("k");
    assert_eq!(
        (state.next(), state.next_free_fraction),
        (T0 + 1_666_666, 699_049)
    );
    // The fourth given back: the key holds what four reservations leave,
    // to the 2^-20 µs (moving the ticket back by the fourth's whole µs would
    // leave 699 049 units).
    assert_eq!(fx.run("k", &args.clone().cancel(ids[2]).at(T0 + 1)), 1);
    let state = fx.state("k");
    assert_eq!(
        (state.next(), state.next_free_fraction),
        (T0 + 1_333_333, 349_524)
    );
}

#[test]
fn a_give_back_may_take_the_ticket_behind_now() {
    let mut fx = fixture();
    let args = Args::bursty("5", 0).held(); // 200 ms per permit
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0);
    let a = fx.call("k", &args.clone().at(T0)); // waits until T0 + 200 ms
    let b = fx.call("k", &args.clone().at(T0)); // waits until T0 + 400 ms
    assert_eq!((a.first, b.first), (200_000, 400_000));
    // Both wait, so both are logged, with ids.
    assert_eq!(fx.value("k").logged(), Some(2));
    // A goes first: the ticket moves back from T0 + 600 ms to 400 ms.
    assert_eq!(
        fx.run("k", &args.clone().cancel(a.id()).at(T0 + 100_000)),
        1
    );
    assert_eq!(fx.state("k").next(), T0 + 400_000);
    // Then B, at T0 + 300 ms, before its moment: the ticket goes back to T0 +
    // 200 ms, behind now, where a limiter that never made A and B has it:
    // the key reads as idle since then. Nothing waits any more: no log.
    assert_eq!(
        fx.run("k", &args.clone().cancel(b.id()).at(T0 + 300_000)),
        1
    );
    assert_eq!(fx.state("k").next(), T0 + 200_000);
    assert_eq!(fx.value("k").logged(), None);
    // The next caller goes at once.
    assert_eq!(fx.run("k", &args.clone().at(T0 + 300_000)), 0);
    assert_eq!(fx.state("k").next(), T0 + 500_000);
}

#[test]
fn a_give_back_gives_nothing_when_it_cannot() {
    let mut fx = fixture();
    let args = Args::bursty("5", 0);

    // A missing key: nothing, and still missing.
    let missing = fx.call("missing", &args.clone().cancel(T0).at(T0));
    assert_eq!(missing.first, 0);
    assert!(!fx.exists("missing"));

    // Its moment has come: nothing (its permits were used), and nothing
    // written.
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0);
    let a = fx.call("k", &args.clone().held().at(T0)); // waits until T0 + 200 ms
    fx.persist("k");
    let dump = fx.dump("k");
    let nothing = fx.call("k", &args.clone().cancel(a.id()).at(T0 + 200_000));
    assert_eq!(nothing.first, 0);
    assert_eq!(fx.dump("k"), dump);
    assert_eq!(fx.pttl("k"), -1);

    // A cold warming-up limiter: a held reservation that spent stored
    // permits is given back exactly too, warm-up included.
    let warm = Args::warming_up("2", 4_000_000, "3");
    assert_eq!(fx.run("w", &warm.clone().at(T0)), 0);
    let found = fx.state("w");
    let second = fx.call("w", &warm.clone().held().at(T0));
    assert_eq!(second.first, 1_375_000);
    assert_eq!(fx.run("w", &warm.clone().cancel(second.id()).at(T0)), 1);
    let state = fx.state("w");
    assert_eq!(
        (state.stored_permits, state.next(), state.next_free_fraction),
        (found.stored_permits, found.next(), found.next_free_fraction)
    );
}

#[test]
fn a_give_back_across_a_rate_change_gives_nothing() {
    let mut fx = fixture();
    let args = Args::bursty("5", 0);
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0);
    let b = fx.call("k", &args.clone().held().at(T0)); // next T0 + 400 ms
    // A resume at 10/s changes the rate and nothing else (no stored permits,
    // the ticket ahead); the log empties: its requests were charged at the
    // old rate.
    assert_eq!(
        fx.run("k", &args.clone().rate("10").resume(0).at(T0)),
        400_000
    );
    assert_eq!(fx.value("k").logged(), None);
    let dump = fx.dump("k");
    // At the old rate or the new, nothing is given back.
    for rate in ["5", "10"] {
        let cancel = fx.call("k", &args.clone().rate(rate).cancel(b.id()).at(T0));
        assert_eq!(cancel.first, 0);
        assert_eq!(fx.dump("k"), dump);
    }
    let state = fx.state("k");
    assert_eq!((state.stored_permits, state.next()), (0.0, T0 + 400_000));
    assert_eq!((state.permits_per_second, state.max_permits), (10.0, 0.0));
}

#[test]
fn ids_rise_with_the_clock_and_survive_the_log() {
    let mut fx = fixture();
    let args = Args::bursty("5", 0).held();
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0);
    // Two at one clock reading: the clock, then the next.
    let ids: Vec<u64> = (0..2)
        .map(|_| fx.call("k", &args.clone().at(T0)).id())
        .collect();
    assert_eq!(ids, [T0, T0 + 1]);
    // Given back, the log empties; the next id is still above them, and
    // later ones follow the clock.
    for id in &ids {
        assert_eq!(fx.run("k", &args.clone().cancel(id).at(T0)), 1);
    }
    assert_eq!(fx.value("k").logged(), None);
    assert_eq!(fx.value("k").next_id, (T0 + 2) as f64);
    let next = fx.call("k", &args.clone().permits("2+").at(T0));
    assert_eq!(next.id(), T0 + 2);
    let later = fx.call("k", &args.clone().at(T0 + 5_000));
    assert_eq!(later.id(), T0 + 5_000);
}

#[test]
fn ids_that_run_out_leave_the_key_readable() {
    // The last id below 2^53 is 2^53 - 2: a key whose ids run out (a clock
    // at the end of time, or a next_id written elsewhere) serves the held
    // reservations that find none left as ones that cannot be given back,
    // marks next_id 2^53, and every call on it still reads it.
    let args = Args::bursty("5", 0);
    let max = MAX_MICROS as f64;
    for (name, now, next_id, last) in [
        ("a clock at 2^53 - 1", MAX_MICROS - 1, 0, None),
        (
            "a clock at 2^53 - 2",
            MAX_MICROS - 2,
            0,
            Some(MAX_MICROS - 2),
        ),
        ("next_id 2^53 - 1", T0, MAX_MICROS - 1, None),
        ("next_id 2^53 - 2", T0, MAX_MICROS - 2, Some(MAX_MICROS - 2)),
    ] {
        let mut fx = fixture();
        assert_eq!(fx.run("k", &args.clone().at(now)), 0, "{name}");
        let value = fx.value("k");
        let value = Stored {
            next_id: next_id as f64,
            ..value
        };
        fx.set_bytes("k", &value.encode());
        // Held reservations that wait (the first gets the last id, if it
        // is left), then every mode.
        let next_ids: Vec<f64> = (0..3)
            .map(|_| {
                let reply = fx.call("k", &args.clone().held().at(now));
                assert!(reply.first > 0, "{name}: {reply:?}");
                reply.stored().next_id
            })
            .collect();
        let first = if last.is_some() { max - 1.0 } else { max };
        assert_eq!(next_ids, [first, max, max], "{name}");
        assert_eq!(
            fx.value("k").logged(),
            last.map(|_| 3),
            "{name}: the one with an id, and those after it"
        );
        let cancel = fx.run("k", &args.clone().cancel(MAX_MICROS - 2).at(now));
        assert_eq!(cancel, i64::from(last.is_some()), "{name}");
        assert!(fx.run("k", &args.clone().at(now)) > 0, "{name}");
        assert!(fx.wait("k", &args.clone().at(now)) > 0, "{name}");
        assert!(fx.run("k", &args.clone().probe().at(now)) > 0, "{name}");
        // A call needs an id (to be settled, to learn): an error, the key
        // untouched.
        let dump = fx.dump("k");
        let call = args.clone().permits("call").timeout("1:-1").at(now);
        let error = fx.run_err(&["k"], &call.to_vec());
        assert!(error.contains("no id left for a call"), "{name}: {error}");
        assert_eq!(fx.dump("k"), dump, "{name}");
    }
}

#[test]
fn a_full_log_written_in_place_keeps_a_few_dead_requests_and_gives_back_exactly() {
    // A hot key of held reservations: each leaves the oldest logged request
    // out of the full log. Written in place, the value keeps up to 16 of
    // those (dead) before it is written whole again; the log reads the
    // same either way, and a give-back from it is exact. One permit a
    // second: the key's TTL (twice its debt, on the real clock) outlasts
    // the calls however slowly a loaded machine runs them. (At 1000/s the
    // first TTLs were a few milliseconds, and the key could expire between
    // a call and the read of what it wrote.)
    let mut fx = fixture();
    let args = Args::bursty("1", 0).held();
    let mut ids = vec![];
    let mut most_dead = 0;
    for i in 0..300u64 {
        let reply = fx.call("k", &args.clone().at(T0 + i));
        if i > 0 {
            ids.push(reply.id());
        }
        let value = fx.value("k");
        let logged = (i > 0).then_some(i.min(128) as usize);
        assert_eq!(value.logged(), logged, "call {i}");
        assert!(
            value.dead.len() <= 16,
            "call {i}: {} dead",
            value.dead.len()
        );
        assert_eq!(
            value.log.last().map(|request| request[0] as u64),
            ids.last().copied(),
            "call {i}"
        );
        most_dead = most_dead.max(value.dead.len());
    }
    assert_eq!(most_dead, 16, "the value was written in place");
    // Every logged request's id, oldest first; giving back the oldest
    // moves the ticket back by its second, as if it was never made.
    let logged: Vec<u64> = fx.value("k").log.iter().map(|r| r[0] as u64).collect();
    assert_eq!(logged, ids[ids.len() - 128..]);
    let before = fx.state("k").next();
    let cancel = args.clone().cancel(logged[0]).at(T0 + 300);
    assert_eq!(fx.run("k", &cancel), 1);
    assert_eq!(fx.state("k").next(), before - 1_000_000);
    let value = fx.value("k");
    assert_eq!((value.logged(), value.dead.len()), (Some(127), 0));
}
