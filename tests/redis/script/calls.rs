//! The modes of calls to an upstream, by hand: a call (an open call,
//! logged with an id whatever its wait and kept open past its moment),
//! settle (exact in the log, the excess charged once let go), keep,
//! give-back of a call, learn (a refusal's pause and lowered rate, a
//! success's rise, reported quotas), and their arguments. The differential
//! test holds them to the core on random sequences.

use super::*;

/// A refusal without Retry-After, under `Learning::default()`'s constants.
pub const LEARN_429: &str = "1,0,,0.7,0.05,1000000,0.05,1000000,0.97,";
/// A success, under the same constants.
const LEARN_OK: &str = "0,1,,0.7,0.05,1000000,0.05,1000000,0.97,";

fn call(args: &Args, counts: &str) -> Args {
    args.clone().permits("call").timeout(counts)
}

fn settle(args: &Args, what: String) -> Args {
    args.clone().permits("settle").timeout(what)
}

fn keep(args: &Args, id: u64) -> Args {
    args.clone().permits("keep").timeout(id)
}

fn learn(args: &Args, lesson: &str) -> Args {
    args.clone().permits("learn").timeout(lesson)
}

/// The reply of a call, a learn or a settle, decoded as a reservation's
/// (`Fixture::call` checks the modes of reservations by their permits).
fn reply(fx: &mut Fixture, key: &str, args: &Args) -> Reply {
    let value = fx
        .eval(key, args)
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    Reply::decode(value, true).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// The id a call's reply gave: the one before the value's next id.
fn id_of(reply: &Reply) -> u64 {
    reply.stored().next_id as u64 - 1
}

#[test]
fn bad_call_settle_keep_and_learn_arguments_are_errors_and_write_nothing() {
    let mut fx = fixture();
    let good = Args::bursty("5", 1_000_000).at(T0);
    let mut cases = vec![];
    for counts in [
        "",
        "1",
        "1:",
        ":-1",
        "0:-1",
        "1,2:-1",
        "1:-2",
        "1:x",
        "1:0.5",
        "x:-1",
        "-1:-1",
        "1,:-1",
        "9007199254740992:-1",
        "1:-1:",
        " 1:-1",
    ] {
        cases.push(call(&good, counts));
    }
    for what in [
        "",
        "1",
        "1:1",
        "x:1:1",
        "1:1:",
        "1::1",
        "1:1,2:1",
        "1:1:1,2",
        "-1:1:1",
        "1:1:x",
        "9007199254740992:1:1",
        "1:9007199254740992:1",
        "1:1:1:",
    ] {
        cases.push(settle(&good, what.into()));
    }
    for id in ["-1", "x", "", "1.5", "9007199254740992"] {
        cases.push(good.clone().permits("keep").timeout(id));
    }
    let constants = "0.7,0.05,1000000,0.05,1000000,0.97,";
    for lesson in [
        String::new(),
        "1,0,".into(),
        format!("2,0,,{constants}"),
        format!("1,0,x,{constants}"),
        format!("1,0,-1,{constants}"),
        "1,0,,0,0.05,1000000,0.05,1000000,0.97,".into(),
        "1,0,,0.7,1.5,1000000,0.05,1000000,0.97,".into(),
        "1,0,,0.7,0.05,1000000,0,1000000,0.97,".into(),
        "1,0,,0.7,0.05,1000000,0.05,1000000,1.01,".into(),
        "1,0,,0.7,0.05,x,0.05,1000000,0.97,".into(),
        format!("1,0,,{constants};"),
        format!("1,0,,{constants};0,,"),
        format!("1,0,,{constants};inf,,"),
        format!("1,0,,{constants};nan,,"),
        format!("1,0,,{constants};,x,"),
        format!("1,0,,{constants};,,1.5"),
        // Two limits reported for one.
        format!("1,0,,{constants};,,;,,"),
        format!("1,0,,{constants};,,x"),
        // How long ago its call went: whole µs, or empty.
        "1,0,,0.7,0.05,1000000,0.05,1000000,0.97,x".into(),
        "1,0,,0.7,0.05,1000000,0.05,1000000,0.97,-1".into(),
        "1,0,,0.7,0.05,1000000,0.05,1000000,0.97,1.5".into(),
    ] {
        cases.push(learn(&good, &lesson));
    }
    assert_eq!(fx.run("existing", &good), 0);
    fx.persist("existing");
    let dump = fx.dump("existing");
    for args in &cases {
        let argv = args.to_vec();
        let error = fx.run_err(&["k"], &argv);
        assert!(error.contains("ERR paceline:"), "{args:?}: {error}");
        assert!(!fx.exists("k"), "{args:?} wrote the key");
        let error = fx.run_err(&["existing"], &argv);
        assert!(error.contains("ERR paceline:"), "{args:?}: {error}");
        assert_eq!(fx.dump("existing"), dump, "{args:?} changed the key");
    }
    // The same modes, valid, work.
    assert_eq!(reply(&mut fx, "k", &call(&good, "1:-1")).first, 0);
    let lesson = format!("1,0,,{constants};1.5,0,");
    assert!(fx.eval("k", &learn(&good, &lesson)).is_ok());
    assert_eq!(fx.call("k", &keep(&good, 12)).first, 0);
}

/// A call gets an id whatever its wait, and stays in the log past its
/// moment, the requests after it logged behind it, until it is kept.
#[test]
fn a_call_stays_open_in_the_log_until_it_is_kept() {
    let mut fx = fixture();
    let args = Args::bursty("5", 1_000_000);
    let called = reply(&mut fx, "k", &call(&args, "3:-1").at(T0));
    assert_eq!((called.first, called.debt), (0, 0));
    let id = id_of(&called);
    let value = fx.value("k");
    assert_eq!(value.logged(), Some(1));
    // (Open: its count logged as -1 - 3.)
    assert_eq!(value.log[0][..2], [id as f64, -4.0]);
    // Ten seconds on, it is still there; a request after it is logged.
    assert_eq!(fx.run("k", &args.clone().at(T0 + 10_000_000)), 0);
    assert_eq!(fx.value("k").logged(), Some(2));
    assert_eq!(fx.run("k", &keep(&args, id).at(T0 + 10_000_000)), 1);
    assert_eq!(fx.value("k").logged(), None, "nothing left to give back");
    assert_eq!(fx.run("k", &keep(&args, id).at(T0 + 10_000_000)), 0);
}

/// In the log, a settle makes the key what it would be had the call
/// reserved what it cost; once a rate change let it go, its excess is
/// charged as a reservation (the reply is the grant's), and less gives
/// nothing back.
#[test]
fn a_settle_is_exact_in_the_log_and_charges_the_excess_once_let_go() {
    let mut fx = fixture();
    // 5 per second, no burst: 200 ms apart.
    let args = Args::bursty("5", 0);
    let id = id_of(&reply(&mut fx, "k", &call(&args, "3:-1").at(T0)));
    assert_eq!(fx.state("k").next(), T0 + 600_000);
    let exact = settle(&args, format!("{id}:3:1")).at(T0 + 1);
    assert_eq!(fx.run("k", &exact), 1);
    assert_eq!(
        fx.state("k").next(),
        T0 + 200_000,
        "as if it had reserved 1"
    );
    let id = id_of(&reply(&mut fx, "k", &call(&args, "1:-1").at(T0 + 2)));
    assert_eq!(fx.state("k").next(), T0 + 400_000);
    // 10 per second from now: the log empties with the rate change.
    let faster = Args::bursty("10", 0);
    assert_eq!(fx.run("k", &faster.clone().at(T0 + 3)), 400_000 - 3);
    assert_eq!(fx.state("k").next(), T0 + 500_000);
    let charged = reply(
        &mut fx,
        "k",
        &settle(&faster, format!("{id}:1:4")).at(T0 + 4),
    );
    assert!(charged.value.is_some(), "the excess, granted: {charged:?}");
    assert_eq!(fx.state("k").next(), T0 + 800_000, "3 more, at 100 ms");
    let less = settle(&faster, format!("{id}:4:1")).at(T0 + 5);
    assert_eq!(fx.run("k", &less), 0);
    assert_eq!(fx.state("k").next(), T0 + 800_000, "nothing given back");
}

/// A call given back before its moment leaves the key as it found it; one
/// whose moment has passed is kept instead.
#[test]
fn a_call_given_back_before_its_moment_is_gone_and_after_it_kept() {
    let mut fx = fixture();
    let args = Args::bursty("5", 0);
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0);
    let before = fx.state("k");
    let id = id_of(&reply(&mut fx, "k", &call(&args, "2:-1").at(T0)));
    assert_eq!(fx.run("k", &args.clone().cancel(id).at(T0 + 1)), 1);
    assert_eq!(fx.state("k").next_free_micros, before.next_free_micros);
    let id = id_of(&reply(&mut fx, "k", &call(&args, "1:-1").at(T0 + 2)));
    // Its moment (T0 + 200 ms) passed: kept, and the log empties.
    assert_eq!(fx.run("k", &args.clone().cancel(id).at(T0 + 300_000)), 0);
    assert_eq!(fx.value("k").logged(), None);
    assert_eq!(fx.state("k").next(), T0 + 400_000);
}

/// A refusal pauses the key until its Retry-After (the pause's default
/// here), drops what it stored and lowers its rate (10 × 0.7); the value
/// keeps the factor, the pause and the caps, and replies whole. A success
/// raises the rate once the pause and an interval have passed.
#[test]
fn a_learned_refusal_pauses_lowers_and_a_success_raises_later() {
    let mut fx = fixture();
    let args = Args::bursty("10", 1_000_000);
    let learned = reply(&mut fx, "k", &learn(&args, LEARN_429).at(T0));
    assert!(
        learned.value.as_ref().unwrap().starts_with(b"plv1"),
        "whole"
    );
    let value = fx.value("k");
    assert_eq!(
        value.learned,
        Some(vec![
            0.7,
            (T0 + 1_000_000) as f64,
            (T0 + 1_000_000) as f64,
            0.97,
            f64::INFINITY
        ])
    );
    let limit = value.limits[0];
    let rate = 10.0 * 0.7;
    assert_eq!(limit.permits_per_second, rate);
    assert_eq!(limit.max_permits, 1_000_000.0 * rate / 1_000_000.0);
    assert_eq!(
        (limit.stored_permits, limit.next_free_micros),
        (0.0, (T0 + 1_000_000) as f64)
    );
    // The next request waits for the pause.
    assert_eq!(fx.run("k", &args.clone().at(T0 + 500_000)), 500_000);
    // A success a second after the pause raises the rate; not before.
    reply(&mut fx, "k", &learn(&args, LEARN_OK).at(T0 + 1_500_000));
    assert_eq!(fx.value("k").learned.unwrap()[0], 0.7);
    reply(&mut fx, "k", &learn(&args, LEARN_OK).at(T0 + 2_000_000));
    let value = fx.value("k");
    assert_eq!(value.learned.as_ref().unwrap()[0], 0.7 + 0.05);
    assert_eq!(value.limits[0].permits_per_second, 10.0 * (0.7 + 0.05));
}

/// A refusal of a call that went before the last pause ended lowers
/// nothing, however late it comes back (still pausing); one whose call
/// went at its end lowers again (`Limits::learn`).
#[test]
fn a_late_refusal_of_a_call_sent_before_the_pause_ended_lowers_nothing() {
    let mut fx = fixture();
    let args = Args::bursty("10", 1_000_000);
    let refused = |ago: u64| format!("1,0,1000000,0.7,0.05,1000000,0.05,1000000,0.97,{ago}");
    reply(&mut fx, "k", &learn(&args, LEARN_429).at(T0));
    // At 3 s, its call went at 0.5 s: before the pause ended at 1 s.
    reply(
        &mut fx,
        "k",
        &learn(&args, &refused(2_500_000)).at(T0 + 3_000_000),
    );
    let learned = fx.value("k").learned.unwrap();
    assert_eq!((learned[0], learned[1]), (0.7, (T0 + 4_000_000) as f64));
    // At 5 s, its call went at 4 s, as that pause ended.
    reply(
        &mut fx,
        "k",
        &learn(&args, &refused(1_000_000)).at(T0 + 5_000_000),
    );
    assert_eq!(fx.value("k").learned.unwrap()[0], 0.7 * 0.7);
}

/// A reported rate caps the limit at the margin; a limit reported spent
/// pauses until its reset; what the others report left caps what they
/// store.
#[test]
fn reported_rates_cap_and_spent_quotas_pause_one_limit() {
    let mut fx = fixture();
    let second = ["4", "bursty", "1000000", "0"];
    let two = |args: &Args| {
        let mut argv = args.to_vec();
        let now = argv.pop().unwrap();
        argv.extend(second.iter().map(|s| s.as_bytes().to_vec()));
        argv.push(now);
        argv
    };
    let args = Args::bursty("10", 1_000_000).at(T0);
    // Reported: 8/s for the first (capped at 8 × 0.97), 2 left of the
    // second's quota.
    let lesson = "0,1,,0.7,0.05,1000000,0.05,1000000,0.97,;8,,;,2,";
    fx.eval_raw(&["k"], &two(&learn(&args, lesson))).unwrap();
    let value = fx.value("k");
    assert_eq!(value.limits[0].permits_per_second, 8.0 * 0.97);
    // (1 stored, beside the one that goes when nothing is owed.)
    assert_eq!(value.limits[1].stored_permits, 1.0);
    // The second limit spent until 2 s from now.
    let spent = "0,0,,0.7,0.05,1000000,0.05,1000000,0.97,;,,;,0,2000000";
    fx.eval_raw(&["k"], &two(&learn(&args.clone().at(T0 + 1), spent)))
        .unwrap();
    let value = fx.value("k");
    assert_eq!(value.limits[1].next_free_micros, (T0 + 2_000_001) as f64);
    assert_eq!(value.limits[1].stored_permits, 0.0);
    assert!(
        value.limits[0].next_free_micros <= (T0 + 1) as f64,
        "{value:?}"
    );
}

/// A key that learned, called with another number of limits, keeps what it
/// learned: the factor for every limit, each cap by position.
#[test]
fn another_number_of_limits_keeps_what_was_learned() {
    let mut fx = fixture();
    let args = Args::bursty("10", 1_000_000).at(T0);
    // A refusal that pauses for a minute, so the key's TTL is a minute too
    // (with no pause it read as full at once, with a TTL of a few ms that a
    // loaded machine outran before the next call).
    let lesson = "1,0,60000000,0.5,0.05,1000000,0.05,1000000,1,;20,,";
    const PAUSED: f64 = (T0 + 60_000_000) as f64;
    reply(&mut fx, "k", &learn(&args, lesson));
    let mut argv = args.to_vec();
    let now = argv.pop().unwrap();
    argv.extend(["4", "bursty", "1000000", "0"].map(|s| s.as_bytes().to_vec()));
    argv.push(now);
    fx.eval_raw(&["k"], &argv).unwrap();
    let value = fx.value("k");
    assert_eq!(
        value.learned,
        Some(vec![0.5, PAUSED, PAUSED, 1.0, 20.0, f64::INFINITY])
    );
    let rates: Vec<f64> = value.limits.iter().map(|l| l.permits_per_second).collect();
    assert_eq!(rates, [5.0, 2.0]);
}
