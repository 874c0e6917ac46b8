//! An unreachable Redis (a port nothing listens on: a real fault) is down
//! like any other time: the run starts on its fallback, unless
//! `--on-down closed`.

use super::*;

/// A Redis URL on a loopback port nothing listens on: bound, then let go.
fn closed_port_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("redis://127.0.0.1:{port}/")
}

#[test]
fn an_unreachable_redis_starts_on_the_fallback_unless_on_down_closed() {
    let _one = one_at_a_time();
    let url = closed_port_url();
    // local (the default): paced on its own limiter, one rate or per key.
    for args in [
        &["10/s", "--redis", url.as_str()][..],
        &["10/s", "--key", "1", "--redis", url.as_str()][..],
    ] {
        let start = Instant::now();
        let output = run(args, "a 1\na 2\na 3\na 4\na 5\n".as_bytes());
        let took = start.elapsed();
        assert!(output.status.success(), "{args:?}: {output:?}");
        assert_eq!(output.stdout, b"a 1\na 2\na 3\na 4\na 5\n");
        // Five at 10/s, exactly spaced: 0.4 s.
        assert!(took >= Duration::from_millis(350), "{args:?}: {took:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("does not answer"), "{stderr}");
    }
    // open: everything goes (at 1/s, five would take 4 s).
    let start = Instant::now();
    let output = run(
        &["1/s", "--redis", url.as_str(), "--on-down", "open"],
        lines(5).as_bytes(),
    );
    assert!(output.status.success(), "{output:?}");
    assert_eq!(String::from_utf8(output.stdout).unwrap(), lines(5));
    assert!(start.elapsed() < Duration::from_secs(3));
    // closed: it does not start.
    let output = run(
        &["10/s", "--redis", url.as_str(), "--on-down", "closed"],
        b"x\n",
    );
    assert_eq!(output.status.code(), Some(4), "{output:?}");
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("cannot use Redis at {url}")),
        "{stderr}"
    );
    // A password in the URL is not shown.
    let with_password = url.replace("redis://", "redis://:hunter2@");
    let output = run(
        &[
            "10/s",
            "--redis",
            with_password.as_str(),
            "--on-down",
            "closed",
        ],
        b"x\n",
    );
    assert_eq!(output.status.code(), Some(4), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

/// A Redis that answers and refuses paceline (a wrong password, no such
/// database) is no outage: the run does not start (status 4, the reason
/// on stderr, no password shown), whatever `--on-down` says, rather than
/// pacing on a limiter of its own until someone reads its stderr. The
/// right password runs.
#[test]
fn a_redis_that_refuses_paceline_stops_the_run_whatever_on_down_says() {
    let _one = one_at_a_time();
    let server = redis_server::RedisServer::start();
    let port = server.port();
    server.config_set("requirepass", "sekrit");
    for (url, why) in [
        (format!("redis://:nottheone@127.0.0.1:{port}/"), "auth"),
        (format!("redis://127.0.0.1:{port}/"), "auth"),
        (format!("redis://:sekrit@127.0.0.1:{port}/99"), "database"),
    ] {
        for on_down in ["local", "open", "closed"] {
            let output = run(
                &["10/s", "--redis", url.as_str(), "--on-down", on_down],
                b"x\n",
            );
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(4), "{url} {on_down}: {stderr}");
            assert!(output.stdout.is_empty(), "{url} {on_down}");
            assert!(!stderr.contains("does not answer"), "{stderr}");
            assert!(!stderr.contains("nottheone"), "a password shown: {stderr}");
            let said = match why {
                "auth" => ["auth", "Auth", "NOAUTH"]
                    .iter()
                    .any(|w| stderr.contains(w)),
                _ => stderr.contains("DB index"),
            };
            assert!(said, "{url} {on_down}: the reason is not said: {stderr}");
        }
    }
    let right = format!("redis://:sekrit@127.0.0.1:{port}/");
    let output = run(&["10/s", "--redis", right.as_str()], b"x\ny\n");
    assert!(output.status.success(), "{output:?}");
    assert_eq!(output.stdout, b"x\ny\n");
}
