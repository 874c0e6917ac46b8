//! Learning an upstream's limit in the core's [`Limits`]: refusals lower
//! the rate once per episode and pause without a burst after, successes
//! raise it slowly, reported rates and spent quotas clamp it.

use std::time::Duration;

use paceline::core::{Bursty, Learning, Lesson, Limits, Policy, Reported, State};

const SECOND: u64 = 1_000_000;

fn limits(rates: &[f64]) -> Limits {
    let states = rates
        .iter()
        .map(|&rate| {
            State::full(Policy::Bursty(Bursty::new(Duration::from_secs(1))), rate, 0).unwrap()
        })
        .collect();
    Limits::new(states).unwrap()
}

fn throttled(retry_after: Option<u64>) -> Lesson {
    Lesson {
        throttled: true,
        retry_after_micros: retry_after,
        ..Lesson::default()
    }
}

fn success() -> Lesson {
    Lesson {
        success: true,
        ..Lesson::default()
    }
}

fn rate(limits: &Limits, i: usize) -> f64 {
    limits.states()[i].permits_per_second()
}

/// A refusal multiplies every limit's rate by `decrease` and pauses them
/// until its `Retry-After`, dropping what they stored: after the pause the
/// callers go one (lowered) interval apart, with no burst.
#[test]
fn a_refusal_lowers_the_rate_and_pauses_without_a_burst_after() {
    let learning = Learning::default();
    let mut limits = limits(&[100.0, 1_000.0]);
    limits.learn(&throttled(Some(2 * SECOND)), SECOND, &learning);
    assert_eq!((rate(&limits, 0), rate(&limits, 1)), (70.0, 700.0));
    assert_eq!(limits.learned_factor(), 0.7);
    // Nothing before the end of the pause...
    assert_eq!(limits.reserve(1, SECOND, false).wait_micros, 2 * SECOND);
    // ...and from it, one interval of 70/s apart, though the limits were
    // full before the refusal.
    let interval = (1e6_f64 / 70.0).round() as u64;
    let next = limits.reserve(1, 3 * SECOND, false);
    assert!(next.wait_micros.abs_diff(interval) <= 1, "{next:?}");
}

/// Refusals that come back while the pause is in force were sent before
/// anyone knew: they lower nothing more (a later `Retry-After` still
/// lengthens the pause). One after the pause lowers again, down to the
/// floor.
#[test]
fn refusals_lower_the_rate_once_per_pause_down_to_the_floor() {
    let learning = Learning::default().floor(0.4);
    let mut limits = limits(&[100.0]);
    limits.learn(&throttled(Some(SECOND)), 0, &learning);
    limits.learn(&throttled(Some(3 * SECOND)), SECOND / 2, &learning);
    limits.learn(&throttled(None), SECOND, &learning);
    assert_eq!(limits.learned_factor(), 0.7);
    assert_eq!(
        limits.states()[0].next_free_micros(),
        SECOND / 2 + 3 * SECOND
    );
    limits.learn(&throttled(None), 4 * SECOND, &learning);
    assert_eq!(limits.learned_factor(), 0.7 * 0.7);
    limits.learn(&throttled(None), 6 * SECOND, &learning);
    assert_eq!(limits.learned_factor(), 0.4);
    assert_eq!(rate(&limits, 0), 40.0);
}

/// A refusal of a call that went before the last pause ended was sent
/// before anyone knew, however late it comes back: it lowers nothing
/// (still pausing). One whose call went at the pause's end, or after,
/// lowers again; so does one whose call's age is not known, past the
/// pause (as before calls said when they went).
#[test]
fn a_late_refusal_of_a_call_sent_before_the_pause_ended_lowers_nothing() {
    let learning = Learning::default();
    let sent_ago = |ago: u64| Lesson {
        sent_ago_micros: Some(ago),
        ..throttled(Some(SECOND))
    };
    let mut limits = limits(&[100.0]);
    limits.learn(&throttled(Some(SECOND)), 0, &learning);
    // At 3 s, sent at 0.5 s (in flight when the first came back) and at
    // 0.9 s: both before the pause ended at 1 s.
    limits.learn(&sent_ago(5 * SECOND / 2), 3 * SECOND, &learning);
    limits.learn(&sent_ago(21 * SECOND / 10), 3 * SECOND, &learning);
    assert_eq!(limits.learned_factor(), 0.7);
    // ...yet each paused: the last until 4 s.
    assert_eq!(limits.states()[0].next_free_micros(), 4 * SECOND);
    // Sent as the last pause ended (4 s), refused at 5 s: lowered.
    limits.learn(&sent_ago(SECOND), 5 * SECOND, &learning);
    assert_eq!(limits.learned_factor(), 0.7 * 0.7);
    // Sent long ago, as far as the clock goes back: before every pause.
    limits.learn(&sent_ago(u64::MAX), 7 * SECOND, &learning);
    assert_eq!(limits.learned_factor(), 0.7 * 0.7);
    // Not said, once the pause that one started has ended (8 s): as if
    // it went as it is learned.
    limits.learn(&throttled(None), 8 * SECOND, &learning);
    assert_eq!(limits.learned_factor(), 0.7 * 0.7 * 0.7);
}

/// Successes after the pause raise the rate by `increase` of the
/// configured rate, at most once per `interval`, up to the configured
/// rate and no further.
#[test]
fn successes_raise_the_rate_slowly_up_to_the_configured_one() {
    let learning = Learning::default().increase(0.2);
    let mut limits = limits(&[100.0]);
    limits.learn(&throttled(Some(SECOND)), 0, &learning);
    // During the pause, and within a second of its end: nothing.
    limits.learn(&success(), SECOND / 2, &learning);
    limits.learn(&success(), SECOND + SECOND / 2, &learning);
    assert_eq!(limits.learned_factor(), 0.7);
    limits.learn(&success(), 2 * SECOND, &learning);
    assert!((limits.learned_factor() - 0.9).abs() < 1e-12);
    limits.learn(&success(), 2 * SECOND + SECOND / 2, &learning);
    assert!((limits.learned_factor() - 0.9).abs() < 1e-12);
    limits.learn(&success(), 3 * SECOND, &learning);
    limits.learn(&success(), 5 * SECOND, &learning);
    assert_eq!(limits.learned_factor(), 1.0);
    assert_eq!(rate(&limits, 0), 100.0);
}

/// A rate the upstream reports lowers that limit to `margin` of it, never
/// raises it above the configured rate; a configured rate set later is
/// still capped by it.
#[test]
fn a_reported_rate_caps_its_limit_under_the_margin() {
    let learning = Learning::default();
    let mut limits = limits(&[100.0, 6_000.0]);
    let reported = Lesson {
        success: true,
        limits: vec![
            Reported {
                rate: Some(50.0),
                ..Reported::default()
            },
            Reported {
                rate: Some(10_000.0),
                ..Reported::default()
            },
        ],
        ..Lesson::default()
    };
    limits.learn(&reported, 0, &learning);
    assert_eq!((rate(&limits, 0), rate(&limits, 1)), (50.0 * 0.97, 6_000.0));
    limits.set_rate(Some(0), 200.0, SECOND).unwrap();
    assert_eq!(rate(&limits, 0), 50.0 * 0.97);
    limits.set_rate(Some(0), 10.0, SECOND).unwrap();
    assert_eq!(rate(&limits, 0), 10.0);
}

/// A margin in its range, (0, 1], so small that a reported rate times it
/// rounds to zero caps the limit at the slowest rate there is, as the
/// script does through Redis. The capped rate was 0, which no limit takes:
/// the cap was dropped, and both limits kept their configured 1 000/s and
/// 6 000/s where the upstream allowed one call a day.
#[test]
fn a_cap_that_underflows_is_the_slowest_rate_not_none() {
    let learning = Learning::default().margin(5e-324);
    let mut limits = limits(&[1_000.0, 6_000.0]);
    let one_a_day = Reported {
        rate: Some(1.0 / 86_400.0),
        ..Reported::default()
    };
    let reported = Lesson {
        success: true,
        limits: vec![one_a_day; 2],
        ..Lesson::default()
    };
    limits.learn(&reported, 0, &learning);
    for i in 0..2 {
        assert_eq!(rate(&limits, i), 5e-324, "limit {i}");
    }
    // The next request waits as long as a limiter ever does.
    assert_eq!(limits.reserve(1, 0, false).wait_micros, 0);
    assert_eq!(limits.reserve(1, 0, false).wait_micros, 1 << 53);
}
/// A limit the upstream says is spent waits for its reset, the others do
/// not pause; one with a few left keeps no more than that stored.
#[test]
fn a_spent_quota_pauses_its_limit_until_the_reset() {
    let learning = Learning::default();
    let mut limits = limits(&[100.0, 6_000.0]);
    let lesson = Lesson {
        success: true,
        limits: vec![
            Reported {
                remaining: Some(3),
                ..Reported::default()
            },
            Reported {
                remaining: Some(0),
                reset_micros: Some(SECOND / 4),
                ..Reported::default()
            },
        ],
        ..Lesson::default()
    };
    limits.learn(&lesson, SECOND, &learning);
    assert_eq!(limits.learned_factor(), 1.0);
    let states = limits.states();
    assert_eq!(states[1].next_free_micros(), SECOND + SECOND / 4);
    assert_eq!(states[0].next_free_micros(), SECOND);
    let next = limits.reserve(1, SECOND, false);
    assert_eq!((next.wait_micros, next.bound_by), (SECOND / 4, Some(1)));
}

/// What an upstream says is left caps what the limits store, and a settle
/// or a give-back after it does not undo the cap: while the log holds
/// anything the cap is logged, and the replay caps at the same place.
#[test]
fn a_cap_on_what_is_left_survives_a_settle_and_a_give_back() {
    use paceline::Cost;
    let left = |remaining| Lesson {
        success: true,
        limits: vec![Reported {
            remaining: Some(remaining),
            ..Reported::default()
        }],
        ..Lesson::default()
    };
    let at_once = |limits: &mut Limits, now| {
        let mut n = 0;
        while limits.reserve(1, now, false).wait_micros == 0 {
            n += 1;
        }
        n
    };
    // Settled: 10 stored, a call of 1 open, the upstream says 2 are left.
    let mut settled = limits(&[10.0]);
    let call = settled.open(&Cost::from(1), 0, u64::MAX).unwrap();
    settled.learn(&left(2), 10, &Learning::default());
    settled.settle(call.id.unwrap(), &Cost::from(1), &Cost::from(1), 20);
    settled.keep(call.id.unwrap(), 20);
    // The 2 left: one stored, and the one that goes when nothing is owed.
    assert_eq!(at_once(&mut settled, 20), 2);
    // Given back: a request waits for the first of two limits while the
    // second stores 7; the upstream says the second has 2 left; the
    // request is given back (it leaves nothing to give back then).
    let mut given = limits(&[1.0, 10.0]);
    given.reserve(2, 0, false);
    let waiting = given.reserve(1, 0, true);
    assert!(waiting.wait_micros > 0);
    let second_left = Lesson {
        success: true,
        limits: vec![
            Reported::default(),
            Reported {
                remaining: Some(2),
                ..Reported::default()
            },
        ],
        ..Lesson::default()
    };
    given.learn(&second_left, 10, &Learning::default());
    given.give_back(waiting.id.unwrap(), 20);
    let stored = given.states()[1].stored_permits();
    assert!(stored <= 1.0 + 1e-6, "the second limit stores {stored}");
    // A cap that takes nothing away is logged all the same: the open call
    // settles exactly, and the replay caps where the lesson came. Had the
    // call cost 1 in the first place, 9 would have been stored when the
    // upstream said 7 were left: 6 stored and the one when nothing is owed
    // (10 before caps were logged, the cap not replayed).
    let mut kept = limits(&[10.0]);
    let call = kept.open(&Cost::from(5), 0, u64::MAX).unwrap();
    kept.learn(&left(7), 10, &Learning::default());
    assert!(kept.settle(call.id.unwrap(), &Cost::from(5), &Cost::from(1), 20));
    kept.keep(call.id.unwrap(), 20);
    assert_eq!(at_once(&mut kept, 20), 7);
}

/// Two limits of 1/s: the first stores up to 1, the second up to 10.
fn slow_second() -> Limits {
    let burst = |seconds| Policy::Bursty(Bursty::new(Duration::from_secs(seconds)));
    let states = vec![
        State::full(burst(1), 1.0, 0).unwrap(),
        State::full(burst(10), 1.0, 0).unwrap(),
    ];
    Limits::new(states).unwrap()
}

/// The upstream says the second of two limits has `remaining` left.
fn second_left(remaining: u64) -> Lesson {
    Lesson {
        success: true,
        limits: vec![
            Reported::default(),
            Reported {
                remaining: Some(remaining),
                ..Reported::default()
            },
        ],
        ..Lesson::default()
    }
}

/// How many requests of `cost` go at once at `now` (up to 100).
fn at_once_of(limits: &mut Limits, cost: &paceline::Cost, now: u64) -> usize {
    (0..100)
        .take_while(|_| {
            let granted = limits.open(cost, now, 0);
            if let Some(id) = granted.and_then(|g| g.id) {
                limits.keep(id, now);
            }
            granted.is_some()
        })
        .count()
}

/// A cap that took nothing away when the upstream said it, because a
/// request made before had taken more, still binds once that request is
/// given back: the limits then hold what they would had it never been made
/// and the upstream said the same at the same moment. (Before caps were
/// logged, the give-back replayed the log without it, and the second limit
/// stored 2.5 more than the upstream had said were left.)
#[test]
fn a_cap_that_took_nothing_away_survives_a_give_back_of_an_earlier_request() {
    use paceline::Cost;
    let mut limits = slow_second();
    // The first limit owes a second; the second stores 8.
    limits.reserve(2, 0, false);
    // A held reservation waits for the first; the second, charged then,
    // stores 4 after it.
    let held = limits.reserve(5, 0, true);
    assert_eq!(held.wait_micros, SECOND);
    // Half a second in, the upstream says the second has 6 left (5 stored
    // beside the one when nothing is owed): it stores 4, so the cap takes
    // nothing away.
    limits.learn(&second_left(6), SECOND / 2, &Learning::default());
    assert!(limits.give_back(held.id.unwrap(), SECOND / 2));
    // Without the reservation the second would have stored 8.5 when the
    // upstream said 6 were left: 5, then another half second's worth, and
    // the one that goes when nothing is owed.
    let mut twin = slow_second();
    twin.reserve(2, 0, false);
    twin.learn(&second_left(6), SECOND / 2, &Learning::default());
    assert_eq!(limits.states(), twin.states());
    let second_only = Cost::each([0, 1]);
    assert_eq!(at_once_of(&mut limits, &second_only, SECOND), 6);
}

/// A settle after a cap that took permits away is exact: the call's
/// estimate is replaced by what it cost and the log replayed, the cap at
/// its place, so what the estimate over-counted on another limit is given
/// back. (Before caps were logged, the cap emptied the log, and the settle
/// gave nothing back: the first limit stayed 19 s in debt.)
#[test]
fn a_settle_after_a_cap_that_took_permits_away_is_exact() {
    use paceline::Cost;
    let mut limits = slow_second();
    // Estimated at 20 of the first (19 s of debt) and 1 of the second.
    let call = limits.open(&Cost::each([20, 1]), 0, u64::MAX).unwrap();
    assert_eq!(limits.states()[0].next_free_micros(), 19 * SECOND);
    // The second stores 9; the upstream says 2 are left: 1 stored, beside
    // the one when nothing is owed.
    limits.learn(&second_left(2), 10, &Learning::default());
    assert_eq!(limits.states()[1].stored_permits(), 1.0);
    // It cost 1 of each.
    let id = call.id.unwrap();
    assert!(limits.settle(id, &Cost::each([20, 1]), &Cost::each([1, 1]), 20));
    limits.keep(id, 20);
    let mut twin = slow_second();
    let kept = twin.open(&Cost::each([1, 1]), 0, u64::MAX).unwrap();
    twin.keep(kept.id.unwrap(), 0);
    twin.learn(&second_left(2), 10, &Learning::default());
    assert_eq!(limits.states(), twin.states());
    // Nothing owed: the next request goes at once.
    assert_eq!(limits.reserve(1, 20, false).wait_micros, 0);
}

/// What an upstream says is left is how many go at once: `n` left stores
/// `n - 1` beside the one that goes when nothing is owed (`n + 1` went).
/// One that says a limit has nothing left, with no reset to wait for,
/// caps what it stores at nothing: one goes, as after "1 left" (its answer
/// teaches the rest). A `remaining` of 0 once capped nothing, and the
/// limit's whole burst went (9 at once where "1 left" let 2).
#[test]
fn nothing_left_without_a_reset_stores_nothing() {
    let at_once = |remaining| {
        let burst = Policy::Bursty(Bursty::new(Duration::from_secs(1)));
        let mut limits = Limits::new(vec![State::full(burst, 10.0, 0).unwrap()]).unwrap();
        let lesson = Lesson {
            success: true,
            limits: vec![Reported {
                remaining: Some(remaining),
                ..Reported::default()
            }],
            ..Lesson::default()
        };
        limits.learn(&lesson, 0, &Learning::default());
        at_once_of(&mut limits, &paceline::Cost::each([1]), 0)
    };
    assert_eq!(
        (at_once(5), at_once(2), at_once(1), at_once(0)),
        (5, 2, 1, 1)
    );
}
