//! Bad arguments, and values that are not this limiter's: every one an
//! error that writes nothing.

use super::*;
use crate::support::limiter_state::{ENTRY_COUNT, ENTRY_ID, ENTRY_MOMENT, LEARNED, LimitState};

/// A well-formed id that gives nothing back.
const AN_ID: u64 = 12;

#[test]
fn bad_arguments_are_errors_and_write_nothing() {
    let mut fx = fixture();
    let good = Args::bursty("5", 1_000_000).at(T0);
    let warm = Args::warming_up("5", 1_000_000, "3").at(T0);
    let mut cases: Vec<Vec<Vec<u8>>> = vec![];
    for permits in [
        "-1", "0", "1.5", "abc", "", "nan", "inf", "1e17", "0+", "1++", "PROBE", "probe ",
        "Cancel", "resumed",
    ] {
        cases.push(good.clone().permits(permits).to_vec());
    }
    for timeout in ["-2", "0.5", "x", "nan", "-inf", ""] {
        cases.push(good.clone().timeout(timeout).to_vec());
        cases.push(good.clone().probe().timeout(timeout).to_vec());
        cases.push(good.clone().status().timeout(timeout).to_vec());
    }
    for debt in [
        "-1", "1.5", "x", "nan", "inf", "-inf", "", "1,2", "1,", ",1",
    ] {
        cases.push(good.clone().resume(debt).to_vec());
    }
    // An id is a whole number below 2^53, as a reply gave it.
    for id in [
        "-1",
        "1.5",
        "x",
        "nan",
        "inf",
        "",
        "9007199254740992",
        "1e300",
        "1,2",
    ] {
        cases.push(good.clone().cancel(id).to_vec());
    }
    for rate in ["0", "-0", "-1", "nan", "-inf", "abc", ""] {
        cases.push(good.clone().rate(rate).to_vec());
        cases.push(warm.clone().rate(rate).to_vec());
    }
    for policy in ["unknown", "BURSTY", ""] {
        cases.push(
            Args {
                policy: policy.into(),
                ..good.clone()
            }
            .to_vec(),
        );
    }
    for micros in ["-1", "1.5", "inf", "nan", "x"] {
        cases.push(
            Args {
                policy_micros: micros.into(),
                ..good.clone()
            }
            .to_vec(),
        );
        cases.push(
            Args {
                policy_micros: micros.into(),
                ..warm.clone()
            }
            .to_vec(),
        );
    }
    for cold_factor in ["0.5", "0", "-3", "nan", "inf", "abc", ""] {
        cases.push(
            Args {
                cold_factor: cold_factor.into(),
                ..warm.clone()
            }
            .to_vec(),
        );
    }
    for now in ["abc", "-1", "1.5", "1e17", "inf"] {
        cases.push(
            Args {
                now: Some(now.into()),
                ..good.clone()
            }
            .to_vec(),
        );
    }
    // Missing or extra arguments: 2 + 4 per limit, and the clock.
    let full = good.to_vec();
    cases.push(vec![]);
    cases.push(full[..5].to_vec());
    cases.push(full[..1].to_vec());
    cases.push(full[..2].to_vec());
    let mut extra = full.clone();
    extra.push("8".into());
    cases.push(extra);
    // Seventeen limits: one too many.
    let mut seventeen = full[..2].to_vec();
    for _ in 0..17 {
        seventeen.extend(full[2..6].iter().cloned());
    }
    cases.push(seventeen);
    // Several limits: each checked, a resume carries one debt each.
    let mut two = full[..6].to_vec();
    two.extend(full[2..].iter().cloned());
    for (at, bad) in [(6, "0"), (7, "fast"), (8, "-1"), (1, "1,2,3")] {
        let mut case = two.clone();
        if at == 1 {
            case[0] = b"resume".to_vec();
        }
        case[at] = bad.into();
        cases.push(case);
    }
    let mut one_debt = two.clone();
    one_debt[0] = b"resume".to_vec();
    one_debt[1] = b"7".to_vec();
    cases.push(one_debt);
    // Batches.
    for batch in ["", "1:x", "0:-1", "1:-1,,2", "1:-1*0", "1:-1*", "-1:0"] {
        let mut case = full.clone();
        case[0] = b"batch".to_vec();
        case[1] = batch.into();
        cases.push(case);
    }

    // An existing key must not change either.
    assert_eq!(fx.run("existing", &good), 0);
    fx.persist("existing");
    let dump = fx.dump("existing");

    for argv in &cases {
        let args = show(argv);
        let error = fx.run_err(&["k"], argv);
        assert!(error.contains("ERR paceline:"), "{args}: {error}");
        assert!(!fx.exists("k"), "{args} wrote the key");
        let error = fx.run_err(&["existing"], argv);
        assert!(error.contains("ERR paceline:"), "{args}: {error}");
        assert_eq!(fx.dump("existing"), dump, "{args} changed the key");
        assert_eq!(fx.pttl("existing"), -1, "{args} set a TTL");
    }

    // Wrong number of keys.
    for keys in [&[][..], &["k", "k2"][..]] {
        let error = fx.run_err(keys, &full);
        assert!(error.contains("paceline:"), "{keys:?}: {error}");
    }
    assert!(!fx.exists("k") && !fx.exists("k2"));

    // The same arguments, valid, do work (the cases above fail for their one
    // bad value, not for something else).
    assert_eq!(fx.run("k", &good), 0);
    assert_eq!(fx.run("w", &warm), 0);
    assert_eq!(fx.call("k", &good.clone().cancel(AN_ID)).first, 0);
    assert_eq!(fx.run("k", &good.clone().resume(0)), 0);
    assert_eq!(fx.run("k", &good.clone().probe().timeout(0)), 0);
    let mut resume_two = two.clone();
    resume_two[0] = b"resume".to_vec();
    resume_two[1] = b"0,7".to_vec();
    assert_eq!(fx.eval_raw(&["k2"], &resume_two).unwrap(), Value::Int(7));
}

/// One call in every mode, on the same configuration.
fn every_mode(args: &Args) -> Vec<Args> {
    vec![
        args.clone(),
        args.clone().permits(7),
        args.clone().held(),
        args.clone().timeout(0),
        args.clone().timeout(MAX_MICROS),
        args.clone().status(),
        args.clone().probe(),
        args.clone().resume(0),
        args.clone().resume(1_000_000),
        args.clone().cancel(AN_ID),
        args.clone().permits("call").timeout("1:-1"),
        args.clone()
            .permits("settle")
            .timeout(format!("{AN_ID}:1:2")),
        args.clone().permits("keep").timeout(AN_ID),
        args.clone()
            .permits("learn")
            .timeout(super::calls::LEARN_429),
    ]
}

#[test]
fn a_corrupted_log_is_an_error_and_left_untouched() {
    let mut fx = fixture();
    let args = Args::bursty("5", 0).at(T0);
    // A real log: three held reservations that wait.
    assert_eq!(fx.run("src", &args), 0);
    let ids: Vec<u64> = (0..3)
        .map(|_| fx.call("src", &args.clone().held()).id())
        .collect();
    let log = fx.value("src");
    assert_eq!(log.logged(), Some(3));
    let raw = fx.raw("src");
    assert_eq!(log.encode(), raw);
    let set = |value: &mut Vec<u8>, at: usize, x: f64| {
        value[at..at + 8].copy_from_slice(&x.to_le_bytes());
    };

    // Its head, its base and its first request are read by every mode.
    let mut every: Vec<(String, Vec<u8>)> = vec![];
    for (name, at, x) in [
        ("shape NaN", 4, f64::NAN),
        ("a shape past its range", 4, 1.0 + 2.0 * LEARNED),
        (
            "learned, but the size says not",
            4,
            1.0 + 3.0 * 32.0 + LEARNED,
        ),
        ("2 logged requests (the size says 3)", 4, 1.0 + 64.0),
        ("no limits", 4, 96.0),
        ("next_id -1", 20, -1.0),
        ("next_id 1.5", 20, 1.5),
        ("next_id past 2^53", 20, (MAX_MICROS + 2) as f64),
        ("17 dead requests", 84, 17.0),
        ("a dead request more than the size says", 84, 1.0),
        ("dead requests 0.5", 84, 0.5),
        ("the base's stored permits NaN", 92, f64::NAN),
        ("the base's ticket 0.5", 100, 0.5),
        ("the base's fraction 2^20", 108, 1_048_576.0),
        ("the first request's id 1.5", 116, 1.5),
        ("the first request's id past next_id", 116, (T0 + 10) as f64),
        ("the first request's count 0.5", 124, 0.5),
        (
            "the first request's count below -2^53",
            124,
            -(MAX_MICROS as f64) - 2.0,
        ),
        ("the first request's now 0.5", 132, 0.5),
        ("the first request's moment 0.5", 140, 0.5),
        ("the first request's moment before its now", 140, 0.0),
    ] {
        let mut value = raw.clone();
        set(&mut value, at, x);
        every.push((name.into(), value));
    }
    every.push(("one byte long".into(), [&raw[..], &[0]].concat()));
    every.push(("no requests' bytes".into(), raw[..116].to_vec()));
    // The others are read by a give-back.
    let mut cancels: Vec<(&str, Vec<u8>)> = vec![];
    let mut swapped = log.clone();
    swapped.log.swap(1, 2);
    cancels.push(("ids not rising", swapped.encode()));
    let mut nan = log.clone();
    nan.log[2][ENTRY_COUNT] = f64::NAN;
    cancels.push(("permits NaN", nan.encode()));
    let mut moment = log.clone();
    moment.log[1][ENTRY_MOMENT] = 0.5;
    cancels.push(("a moment 0.5", moment.encode()));
    let mut resume = log.clone();
    resume.log[1][ENTRY_ID] = -3.0; // a resume of limit 2, of one
    cancels.push(("a resume of no limit", resume.encode()));
    for (name, id, count) in [
        ("a cap of no limit", -103.0, 3.0), // of limit 2, of one
        ("an id between a resume's and a cap's", -101.0, 3.0),
        ("a cap of -1", -102.0, -1.0),
        ("a cap of 1.5", -102.0, 1.5),
    ] {
        let mut cap = log.clone();
        cap.log[2][ENTRY_ID] = id;
        cap.log[2][ENTRY_COUNT] = count;
        cancels.push((name, cap.encode()));
    }
    let mut plain_open = log.clone();
    plain_open.log[2][ENTRY_ID] = -1.0;
    plain_open.log[2][ENTRY_COUNT] = -2.0;
    cancels.push(("open without an id", plain_open.encode()));

    let cancel = args.clone().cancel(ids[1]);
    for (i, (name, value)) in every.iter().enumerate() {
        let key = format!("every{i}");
        fx.set_bytes(&key, value);
        for mode in every_mode(&args).into_iter().chain([cancel.clone()]) {
            let error = fx.run_err(&[&key], &mode.to_vec());
            assert_unrecognised(&error, &format!("{name}, {mode:?}"));
            assert_eq!(fx.raw(&key), *value, "{name}, {mode:?}: the value changed");
        }
    }
    for (i, (name, value)) in cancels.iter().enumerate() {
        let key = format!("cancels{i}");
        fx.set_bytes(&key, value);
        let error = fx.run_err(&[&key], &cancel.to_vec());
        assert_unrecognised(&error, name);
        assert_eq!(fx.raw(&key), *value, "{name}: the value changed");
    }
    // The log itself, copied as it is, gives back.
    fx.set_bytes("copy", &raw);
    assert_eq!(fx.run("copy", &cancel), 1);
    // So does one holding a lesson's cap on what is left, however large,
    // or none.
    for (i, left) in [2f64.powi(60), 0.0].into_iter().enumerate() {
        let mut cap = log.clone();
        cap.log[2][ENTRY_ID] = -102.0;
        cap.log[2][ENTRY_COUNT] = left;
        fx.set_bytes(&format!("cap{i}"), &cap.encode());
        assert_eq!(fx.run(&format!("cap{i}"), &cancel), 1, "a cap of {left}");
    }
}

#[test]
fn key_of_another_type_is_an_error_and_kept() {
    let mut fx = fixture();
    let _: i64 = redis::cmd("HSET")
        .arg("h")
        .arg("owner")
        .arg("someone")
        .query(&mut fx.con)
        .unwrap();
    let _: i64 = redis::cmd("RPUSH")
        .arg("l")
        .arg("item")
        .query(&mut fx.con)
        .unwrap();
    for key in ["h", "l"] {
        let dump = fx.dump(key);
        for args in every_mode(&Args::bursty("5", 1_000_000).at(T0)) {
            let error = fx.run_err(&[key], &args.to_vec());
            assert!(error.contains("WRONGTYPE"), "{args:?}: {error}");
        }
        assert_eq!(fx.dump(key), dump, "{key} was changed");
        assert_eq!(fx.pttl(key), -1);
    }
}

/// A change that makes a valid state invalid.
type Corruption = fn(&mut Stored);

/// Changes that make a valid value invalid.
const CORRUPTIONS: &[(&str, Corruption)] = &[
    ("next 1.5", |v| v.limits[0].next_free_micros = 1.5),
    ("next -1", |v| v.limits[0].next_free_micros = -1.0),
    ("next 2^53 + 2", |v| {
        v.limits[0].next_free_micros = (MAX_MICROS + 2) as f64
    }),
    ("next inf", |v| v.limits[0].next_free_micros = f64::INFINITY),
    ("next nan", |v| v.limits[0].next_free_micros = f64::NAN),
    ("stored -5", |v| v.limits[0].stored_permits = -5.0),
    ("stored nan", |v| v.limits[0].stored_permits = f64::NAN),
    ("stored inf", |v| v.limits[0].stored_permits = f64::INFINITY),
    ("stored above max", |v| v.limits[0].stored_permits = 6.0),
    ("rate 0", |v| v.limits[0].permits_per_second = 0.0),
    ("rate -0", |v| v.limits[0].permits_per_second = -0.0),
    ("rate -1", |v| v.limits[0].permits_per_second = -1.0),
    ("rate nan", |v| v.limits[0].permits_per_second = f64::NAN),
    ("rate -inf", |v| {
        v.limits[0].permits_per_second = f64::NEG_INFINITY
    }),
    ("max inf", |v| v.limits[0].max_permits = f64::INFINITY),
    ("max -1", |v| v.limits[0].max_permits = -1.0),
    ("max nan", |v| v.limits[0].max_permits = f64::NAN),
    ("stored above a lower max", |v| {
        v.limits[0].max_permits = 4.0;
        v.limits[0].stored_permits = 4.5;
    }),
    ("fraction 2^20", |v| {
        v.limits[0].next_free_fraction = 1_048_576.0
    }),
    ("fraction -1", |v| v.limits[0].next_free_fraction = -1.0),
    ("fraction 0.5", |v| v.limits[0].next_free_fraction = 0.5),
    ("fraction nan", |v| {
        v.limits[0].next_free_fraction = f64::NAN
    }),
    ("expires -1", |v| v.expires_micros = -1.0),
    ("expires inf", |v| v.expires_micros = f64::INFINITY),
    ("expires nan", |v| v.expires_micros = f64::NAN),
    ("last_now 1.5", |v| v.last_now_micros = 1.5),
    ("last_now -1", |v| v.last_now_micros = -1.0),
    ("last_now nan", |v| v.last_now_micros = f64::NAN),
    ("last_now inf", |v| v.last_now_micros = f64::INFINITY),
    ("last_now 2^53 + 2", |v| {
        v.last_now_micros = (MAX_MICROS + 2) as f64
    }),
    // A clock more than 2^52 µs ahead of the reading (T0), where time
    // would stand still so close to where it saturates that tickets no
    // longer limit: no server's clock stepped back from there.
    ("last_now 2^53", |v| v.last_now_micros = MAX_MICROS as f64),
    ("last_now 2^53 - 1", |v| {
        v.last_now_micros = (MAX_MICROS - 1) as f64
    }),
    ("last_now 2^52 + 1 ahead", |v| {
        v.last_now_micros = (T0 + MAX_MICROS / 2 + 1) as f64
    }),
    ("next_id -1", |v| v.next_id = -1.0),
    ("next_id 0.5", |v| v.next_id = 0.5),
    ("a second limit's rate 0", |v| {
        let mut second = v.limits[0];
        second.permits_per_second = 0.0;
        v.limits.push(second);
    }),
    ("learned factor 0", |v| {
        v.learned = Some(vec![0.0, 0.0, 0.0, 1.0, 5.0])
    }),
    ("learned factor 1.5", |v| {
        v.learned = Some(vec![1.5, 0.0, 0.0, 1.0, 5.0])
    }),
    ("learned factor nan", |v| {
        v.learned = Some(vec![f64::NAN, 0.0, 0.0, 1.0, 5.0])
    }),
    ("learned pause 0.5", |v| {
        v.learned = Some(vec![0.5, 0.5, 0.0, 1.0, 5.0])
    }),
    ("learned rise 2^53 + 2", |v| {
        v.learned = Some(vec![0.5, 0.0, (MAX_MICROS + 2) as f64, 1.0, 5.0])
    }),
    ("learned margin 0", |v| {
        v.learned = Some(vec![0.5, 0.0, 0.0, 0.0, 5.0])
    }),
    ("learned cap 0", |v| {
        v.learned = Some(vec![0.5, 0.0, 0.0, 1.0, 0.0])
    }),
    ("learned cap nan", |v| {
        v.learned = Some(vec![0.5, 0.0, 0.0, 1.0, f64::NAN])
    }),
];

/// A valid value with 10 s of debt at T0.
fn valid_value() -> Stored {
    Stored {
        expires_micros: (T0 + 60_000_000) as f64,
        last_now_micros: T0 as f64,
        next_id: 0.0,
        limits: vec![LimitState {
            stored_permits: 0.0,
            next_free_micros: (T0 + 10_000_000) as f64,
            next_free_fraction: 12_345.0,
            permits_per_second: 5.0,
            max_permits: 5.0,
        }],
        moment_micros: T0 as f64,
        bound: -1.0,
        learned: None,
        base: Vec::new(),
        log: Vec::new(),
        dead: Vec::new(),
    }
}

/// The same corruptions of one limit's state (or of the TTL's end), in a
/// value of two limits, for either limit, read by two limits: the script
/// reads two limits at the rates in force on a path of its own.
#[test]
fn a_corrupted_limit_of_two_is_an_error_and_left_untouched() {
    let mut fx = fixture();
    let one = Args::bursty("5", 1_000_000).at(T0);
    // (Two limits: the same one twice, before the clock.)
    let two = |args: &Args| {
        let mut argv = args.to_vec();
        let limit = argv[2..6].to_vec();
        argv.splice(6..6, limit);
        argv
    };
    let mut valid = valid_value();
    valid.limits.push(valid.limits[0]);
    fx.set_bytes("valid", &valid.encode());
    assert!(fx.eval_raw(&["valid"], &two(&one)).is_ok());
    let mut cases = Vec::new();
    for (name, corrupt) in CORRUPTIONS {
        let mut value = valid_value();
        corrupt(&mut value);
        if value.limits.len() != 1 || value.learned.is_some() {
            continue;
        }
        for i in 0..2 {
            let mut case = value.clone();
            case.limits.insert(1 - i, valid.limits[0]);
            cases.push((format!("{name}, limit {i}"), case.encode()));
        }
    }
    for (i, (name, value)) in cases.iter().enumerate() {
        let key = format!("c{i}");
        fx.set_bytes(&key, value);
        let dump = fx.dump(&key);
        for mode in [
            one.clone(),
            one.clone().permits(7),
            one.clone().timeout(0),
            one.clone().timeout(MAX_MICROS),
            one.clone().held(),
            one.clone().status(),
        ] {
            let error = fx.run_err(&[&key], &two(&mode));
            assert_unrecognised(&error, &format!("{name}, {mode:?}"));
            assert_eq!(fx.dump(&key), dump, "{name}, {mode:?}: the key changed");
        }
    }
}

#[test]
fn unrecognised_values_are_an_error_in_every_mode_and_left_untouched() {
    let mut fx = fixture();
    let args = Args::bursty("5", 1_000_000).at(T0);
    // Sanity: the valid value is read as is (10 s of debt).
    let valid = valid_value().encode();
    fx.set_bytes("valid", &valid);
    assert_eq!(fx.wait("valid", &args), 10_000_000);

    let mut other_marker = valid.clone();
    other_marker[..4].copy_from_slice(b"PLV1");
    let mut version_2 = valid.clone();
    version_2[3] = b'2';
    // The formats of the crate before this one: the same state, 76 bytes
    // after the marker `thr2` (or `thr1`), and 40 without one.
    let mut thr2 = b"thr2".to_vec();
    for x in [
        0.0,
        (T0 + 10_000_000) as f64,
        5.0,
        5.0,
        (T0 + 60_000_000) as f64,
    ] {
        thr2.extend(x.to_le_bytes());
    }
    for x in [T0 as f64, 0.0, 0.0, (T0 + 10_000_000) as f64] {
        thr2.extend(x.to_le_bytes());
    }
    let mut thr1 = thr2.clone();
    thr1[..4].copy_from_slice(b"thr1");
    let v0 = thr2[4..44].to_vec();
    let mut cases: Vec<(String, Vec<u8>)> = vec![
        ("someone else's string".into(), b"garbage".to_vec()),
        ("empty".into(), vec![]),
        ("one byte".into(), vec![0]),
        ("one byte short".into(), valid[..VALUE_LEN - 1].to_vec()),
        ("one byte long".into(), [&valid[..], &[0]].concat()),
        ("84 bytes of text".into(), vec![b'7'; VALUE_LEN]),
        ("marker PLV1".into(), other_marker),
        ("marker plv2".into(), version_2),
        ("a thr2 value".into(), thr2),
        ("a thr1 value".into(), thr1),
        ("a first-format value".into(), v0),
        (
            "the fields without the marker".into(),
            [&valid[4..], &[0; 4]].concat(),
        ),
    ];
    for (name, corrupt) in CORRUPTIONS {
        let mut value = valid_value();
        corrupt(&mut value);
        cases.push(((*name).into(), value.encode()));
    }
    for (i, (name, value)) in cases.iter().enumerate() {
        let key = format!("c{i}");
        fx.set_bytes(&key, value);
        fx.pexpire(&key, 100_000);
        let dump = fx.dump(&key);
        for mode in every_mode(&args) {
            let error = fx.run_err(&[&key], &mode.to_vec());
            assert_unrecognised(&error, &format!("{name}, {mode:?}"));
            // The size, not the key: the crate's words name the key whole
            // (a key's bytes do not survive an error reply).
            assert!(
                error.contains("the key holds")
                    && error.contains(&format!("({} bytes)", value.len()))
                    && !error.contains(&format!("key {key}")),
                "{name}: {error}"
            );
            assert_eq!(fx.raw(&key), *value, "{name}, {mode:?}: the value changed");
            assert_eq!(fx.dump(&key), dump, "{name}, {mode:?}: the key changed");
        }
        let pttl = fx.pttl(&key);
        assert!((90_000..=100_000).contains(&pttl), "{name}: PTTL {pttl}");
    }
}

/// A log whose base (the states before its first request) stores more
/// than its limit's max_permits is not this limiter's, whichever limit:
/// every mode refuses it and leaves it untouched. (A give-back charged the
/// log again from it and wrote a limit holding 1e300 permits; the next
/// call found that value unrecognised.)
#[test]
fn a_log_base_storing_more_than_its_limit_holds_is_an_error() {
    let mut fx = fixture();
    // Limits of 5 and of 2 permits stored at most.
    let one = Args::bursty("5", 1_000_000).at(T0);
    let two = |args: &Args| {
        let mut argv = args.to_vec();
        let limit: Vec<Vec<u8>> = ["1", "bursty", "2000000", "0"]
            .iter()
            .map(|x| x.as_bytes().to_vec())
            .collect();
        argv.splice(6..6, limit);
        argv
    };
    let mut cases = Vec::new();
    for limits in [1, 2] {
        let key = format!("src{limits}");
        let argv = |args: &Args| {
            if limits == 1 {
                args.to_vec()
            } else {
                two(args)
            }
        };
        // The burst spent, then a held reservation that waits: a log.
        fx.eval_raw(&[&key], &argv(&one.clone().permits(6)))
            .unwrap();
        fx.eval_raw(&[&key], &argv(&one.clone().held())).unwrap();
        let log = fx.value(&key);
        assert_eq!(log.logged(), Some(1), "{limits} limits");
        let id = log.log[0][ENTRY_ID] as u64;
        // (The log as it is gives back.)
        fx.set_bytes("copy", &log.encode());
        let back = fx.eval_raw(&["copy"], &argv(&one.clone().cancel(id)));
        assert_eq!(back, Ok(Value::Int(1)), "{limits} limits");
        // (The second limit's 2.5 is within the first's 5.)
        let second = [(1, 2.5), (1, 1e300)];
        let extra = if limits == 2 { &second[..] } else { &[] };
        for &(limit, stored) in [(0, 5.5), (0, 1e300)].iter().chain(extra) {
            let mut value = log.clone();
            value.base[limit][0] = stored;
            let name = format!("{limits} limits, limit {limit}'s base storing {stored}");
            cases.push((name, value.encode(), id, limits));
        }
    }
    for (i, (name, value, id, limits)) in cases.iter().enumerate() {
        let key = format!("c{i}");
        fx.set_bytes(&key, value);
        // (With two limits, those whose ARGV[2] counts for one are left
        // out: refused for their arguments first.)
        let modes = every_mode(&one).into_iter().chain([one.clone().cancel(id)]);
        let counted = |mode: &Args| ["resume", "call", "settle"].contains(&&*mode.permits);
        for mode in modes.filter(|mode| *limits == 1 || !counted(mode)) {
            let argv = if *limits == 1 {
                mode.to_vec()
            } else {
                two(&mode)
            };
            let error = fx.run_err(&[&key], &argv);
            assert_unrecognised(&error, &format!("{name}, {mode:?}"));
            assert_eq!(fx.raw(&key), *value, "{name}, {mode:?}: the value changed");
        }
    }
}
