//! SIGINT and SIGTERM end a run in order: the records whose moment has
//! come are out, none still waiting is written, no command starts and
//! those running are sent the signal (their whole process groups) and
//! waited for, the summary is printed, and paceline ends by the signal (a
//! shell reports 130 or 143).

use std::os::unix::process::{CommandExt, ExitStatusExt};

use super::*;

/// Starts paceline with `args`, writes `input` and keeps its stdin open;
/// once its first line is out, sends `signal`: the lines it wrote in all,
/// how it ended, its stderr, and how long it took after the signal.
fn signalled(
    args: &[&str],
    input: &[u8],
    signal: i32,
) -> (Vec<String>, std::process::ExitStatus, String, Duration) {
    let mut child = paceline(args).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input).unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: a plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
    let sent = Instant::now();
    let mut lines = vec![first.trim_end().to_owned()];
    lines.extend(stdout.lines().map(Result::unwrap));
    let status = child.wait().unwrap();
    let took = sent.elapsed();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    drop(stdin);
    (lines, status, stderr, took)
}

#[test]
fn a_signal_ends_the_run_after_what_is_due_and_before_what_is_not() {
    let _one = one_at_a_time();
    for args in [&["2/s", "--json"][..], &["2/s", "--json", "--key", "1"][..]] {
        for (signal, input) in [
            // Waiting for the second record's moment.
            (libc::SIGINT, &b"a 1\na 2\na 3\n"[..]),
            // Waiting for input (stdin stays open).
            (libc::SIGTERM, &b"a 1\n"[..]),
        ] {
            let (lines, status, stderr, took) = signalled(args, input, signal);
            let case = format!("{args:?}, signal {signal}");
            assert_eq!(lines, ["a 1"], "{case}");
            assert_eq!(status.signal(), Some(signal), "{case}: {status:?}");
            assert!(took < Duration::from_secs(2), "{case}: took {took:?}");
            assert!(stderr.contains("\"records\":1,"), "{case}: {stderr}");
        }
    }
}

/// The summary's `waited` counts the records out that waited, not those a
/// signal left waiting: at 12/min the first record goes at once, the
/// others wait 5 and 10 s, and SIGTERM comes first. Before: 'records 1,
/// waited 1' (the plain copy: the group it slept for) and 'records 1,
/// waited 2' (per key: every record reserved with a wait).
#[test]
fn the_summary_counts_no_record_a_signal_left_waiting_as_waited() {
    let _one = one_at_a_time();
    for args in [
        &["12/min", "--json"][..],
        &["12/min", "--json", "--key", "1"][..],
        &[
            "12/min",
            "--json",
            "--",
            "sh",
            "-c",
            "echo \"$1\"",
            "sh",
            "{}",
        ][..],
    ] {
        let (lines, status, stderr, _) = signalled(args, b"a 1\na 2\na 3\n", libc::SIGTERM);
        assert_eq!(lines, ["a 1"], "{args:?}");
        assert_eq!(status.signal(), Some(libc::SIGTERM), "{args:?}");
        assert!(stderr.contains("\"records\":1,"), "{args:?}: {stderr}");
        assert!(stderr.contains("\"waited\":0,"), "{args:?}: {stderr}");
    }
}

#[test]
fn after_a_signal_no_command_starts_and_those_running_end() {
    let _one = one_at_a_time();
    // The first record's command runs 0.3 s, ignoring the signal (passed
    // on to it): it is waited for. The second's moment (0.5 s) comes
    // after the signal (0.1 s): it never starts.
    let (lines, status, stderr, _) = signalled(
        &[
            "2/s",
            "--json",
            "--",
            "sh",
            "-c",
            "trap '' TERM; echo started; sleep 0.3; echo \"$1\"",
            "sh",
            "{}",
        ],
        b"first\nsecond\n",
        libc::SIGTERM,
    );
    assert_eq!(lines, ["started", "first"]);
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    assert!(stderr.contains("\"commands\":1,"), "{stderr}");
}

/// Waiting for a command that runs on (it ignores the first signal), the
/// run ends at a second signal, the command killed first.
#[test]
fn a_second_signal_ends_the_run_at_once() {
    let pid_file = temp_path("second-signal.pid");
    let _ = std::fs::remove_file(&pid_file);
    let mut child = paceline(&[
        "10/s",
        "--",
        "sh",
        "-c",
        "trap '' TERM; echo $$ > \"$1\"; exec sleep 60 > /dev/null",
        "sh",
        pid_file.to_str().unwrap(),
    ])
    .spawn()
    .unwrap();
    let stdin = child.stdin.take().unwrap();
    let kill = |child: &Child| {
        // SAFETY: a plain kill(2) of our own child.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    };
    (&stdin).write_all(b"x\n").unwrap();
    // The command runs, ignoring SIGTERM, once it has written its pid.
    let start = Instant::now();
    while !std::fs::read_to_string(&pid_file).is_ok_and(|pid| pid.ends_with('\n'))
        && start.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    kill(&child);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        child.try_wait().unwrap().is_none(),
        "it did not wait for its command"
    );
    kill(&child);
    let sent = Instant::now();
    let status = child.wait().unwrap();
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "{:?}",
        sent.elapsed()
    );
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    drop(stdin);
    let sleep = pid_in(&pid_file);
    let _ = std::fs::remove_file(&pid_file);
    if !process_ends_within(sleep, Duration::from_secs(5)) {
        // SAFETY: a plain kill(2), of the test's own sleep.
        unsafe { libc::kill(sleep, libc::SIGKILL) };
        panic!("the command ({sleep}) outlived paceline's second signal");
    }
}

/// The signal paceline catches (sent to it alone here, not to its process
/// group as a terminal's Ctrl-C is) is passed on to each running command's
/// whole process group: a process a command started gets it too, and the
/// run ends by the signal once the commands have ended.
#[test]
fn a_signal_reaches_what_the_running_commands_started() {
    let _one = one_at_a_time();
    let dir = temp_path("signal-groups");
    std::fs::create_dir_all(&dir).unwrap();
    let prefix = format!("{}/{{}}", dir.display());
    // The command (a shell, which does not simply run its last program in
    // its place) starts a shell that notes SIGINT in a file and ends. It
    // sleeps a second at a time: a signal that comes as it starts a sleep
    // (forked, not yet that program) is lost to the sleep, not to it.
    let noted = "trap 'echo INT > \"$1.noted\"; exit 130' INT; echo $$ > \"$1.pid\"; \
                 echo started; while :; do sleep 1; done; echo never";
    let mut child = paceline(&[
        "100/s",
        "-j",
        "2",
        "--json",
        "--",
        "sh",
        "-c",
        "sh -c \"$1\" sh \"$2\"; echo \"the inner shell ended: $?\"",
        "sh",
        noted,
        &prefix,
    ])
    .spawn()
    .unwrap();
    let stdin = child.stdin.take().unwrap();
    (&stdin).write_all(b"a\nb\n").unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    for _ in 0..2 {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line, "started\n");
    }
    let stdout = read_all(stdout);
    let stderr = read_all(child.stderr.take().unwrap());
    let shells = || ["a", "b"].map(|record| dir.join(format!("{record}.pid")));
    let kill_shells = || {
        for path in shells() {
            let shell = pid_in(&path);
            // SAFETY: getpgid(2) and kill(2) of the test's own shell, and
            // of its group if that is not this test's (as it is where the
            // command does not lead a group of its own).
            unsafe {
                let group = libc::getpgid(shell);
                match group > 0 && group != libc::getpgid(0) {
                    true => libc::kill(-group, libc::SIGKILL),
                    false => libc::kill(shell, libc::SIGKILL),
                };
            }
        }
    };
    // SAFETY: a plain kill(2) of our own child, not of its group.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let status = exits_within(
        &mut child,
        Duration::from_secs(20),
        "paceline, after SIGINT",
        kill_shells,
    );
    drop(stdin);
    for record in ["a", "b"] {
        let noted = dir.join(format!("{record}.noted"));
        let start = Instant::now();
        while !noted.exists() && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if !noted.exists() {
            kill_shells();
            panic!("record {record}: the command's shell never got SIGINT");
        }
        assert_eq!(std::fs::read_to_string(&noted).unwrap(), "INT\n");
        let shell = pid_in(&dir.join(format!("{record}.pid")));
        assert!(process_ends_within(shell, Duration::from_secs(5)));
    }
    let bound = Duration::from_secs(10);
    let stdout = stdout.recv_timeout(bound).expect("stdout still open");
    let stderr = stderr.recv_timeout(bound).expect("stderr still open");
    assert_eq!(status.signal(), Some(libc::SIGINT), "{status:?}: {stderr}");
    assert!(!stdout.contains("never"), "{stdout}");
    assert!(stderr.contains("\"commands\":2,"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A signal that comes once the input is over, while only a command
/// runs, still ends the run by it, once the command has ended.
#[test]
fn a_signal_after_the_input_ends_the_run_by_it_too() {
    let mut child = paceline(&["10/s", "--", "sh", "-c", "exec sleep 0.5 > /dev/null"])
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"x\n").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: a plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
}

/// The state letter of process `pid` (`R`, `S`, `T` when stopped, ...),
/// if it is there.
fn state_of(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The state follows the name, which is in parentheses.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Whether `pid`'s state satisfies `wanted` within `bound`.
fn state_within(pid: i32, bound: Duration, wanted: impl Fn(Option<char>) -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < bound {
        if wanted(state_of(pid)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// What a terminal does to its foreground group reaches the commands,
/// which lead groups of their own: a stop (Ctrl-Z) stops them with
/// paceline, the continue after it continues them, and a hangup reaches
/// them and ends paceline by it, as a quit (Ctrl-\\) does, as when they
/// shared its group. Each
/// signal is sent to paceline alone. (The command execs its sleep: a shell
/// that forks one as the stop comes waits for its stopped child in a state
/// of its own, not the stopped one.)
#[test]
fn a_stop_a_continue_and_a_hangup_or_a_quit_reach_the_commands() {
    let _one = one_at_a_time();
    if state_of(std::process::id() as i32).is_none() {
        return; // no /proc to read states from
    }
    for ending in [libc::SIGHUP, libc::SIGQUIT] {
        stop_continue_and_end(ending);
    }
}

fn stop_continue_and_end(ending: libc::c_int) {
    let dir = temp_path(&format!("signal-stop-{ending}"));
    std::fs::create_dir_all(&dir).unwrap();
    let prefix = format!("{}/{{}}", dir.display());
    let mut command = paceline(&[
        "100/s",
        "--",
        "sh",
        "-c",
        "echo $$ > \"$1.pid\"; echo started; exec sleep 60",
        "sh",
        &prefix,
    ]);
    // paceline leads a group of its own, whose parent (this test) is in
    // another group of the session, as under a shell: a group with no such
    // parent is orphaned, and the system drops a stop sent to it.
    command.stderr(Stdio::null()).process_group(0);
    // SAFETY: setrlimit(2) only, between fork and exec: a quit ends
    // paceline with no core dump left behind.
    let no_core = || {
        let none = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        match unsafe { libc::setrlimit(libc::RLIMIT_CORE, &none) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    };
    let mut child = unsafe { command.pre_exec(no_core) }.spawn().unwrap();
    let stdin = child.stdin.take().unwrap();
    (&stdin).write_all(b"a\n").unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "started\n");
    let paceline_pid = child.id() as i32;
    let shell = pid_in(&dir.join("a.pid"));
    // paceline notes a command's group as soon as the command is started:
    // a stop that came in between would not reach it (it would run on
    // until the continue). Time for that note, on a loaded machine too.
    std::thread::sleep(Duration::from_millis(500));
    let kill_shell = || {
        // SAFETY: kill(2) of the test's own shell.
        unsafe { libc::kill(shell, libc::SIGKILL) };
    };
    let signal = |signal| {
        // SAFETY: a plain kill(2) of our own child, not of its group.
        assert_eq!(unsafe { libc::kill(paceline_pid, signal) }, 0);
    };
    let bound = Duration::from_secs(10);
    signal(libc::SIGTSTP);
    let stopped = |state: Option<char>| state == Some('T');
    let both_stopped =
        state_within(paceline_pid, bound, stopped) && state_within(shell, bound, stopped);
    let when_stopped = (state_of(paceline_pid), state_of(shell));
    signal(libc::SIGCONT);
    let running = |state: Option<char>| state.is_some_and(|s| s != 'T');
    let both_running =
        state_within(paceline_pid, bound, running) && state_within(shell, bound, running);
    let when_running = (state_of(paceline_pid), state_of(shell));
    signal(ending);
    let status = exits_within(
        &mut child,
        Duration::from_secs(20),
        &format!("paceline, after signal {ending}"),
        kill_shell,
    );
    let shell_ended = process_ends_within(shell, Duration::from_secs(5));
    if !shell_ended {
        kill_shell();
    }
    drop(stdin);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        both_stopped,
        "after SIGTSTP, (paceline, its command): {when_stopped:?}"
    );
    assert!(
        both_running,
        "after SIGCONT, (paceline, its command): {when_running:?}"
    );
    assert_eq!(status.signal(), Some(ending), "{status:?}");
    assert!(
        shell_ended,
        "the command outlived paceline's signal {ending}"
    );
}

/// paceline with `args`, `signal` ignored from its start (as a parent
/// that asks to outlive its terminal leaves SIGHUP, and a shell without
/// job control SIGINT and SIGQUIT for a command run with `&`).
fn ignoring(args: &[&str], signal: libc::c_int) -> Child {
    let mut command = paceline(args);
    // SAFETY: signal(2) only, between fork and exec.
    let ignore = move || match unsafe { libc::signal(signal, libc::SIG_IGN) } {
        libc::SIG_ERR => Err(std::io::Error::last_os_error()),
        _ => Ok(()),
    };
    unsafe { command.pre_exec(ignore) }.spawn().unwrap()
}

/// Runs `args` (a command per record, writing each) over three records,
/// `signal` ignored from the start and sent once the first is out: the
/// lines out and how paceline ended. A signal ignored on entry stays
/// ignored, as it did before paceline caught it: the run goes on to its
/// end.
fn ignored_signal_sent(args: &[&str], signal: libc::c_int) -> (String, std::process::ExitStatus) {
    let mut child = ignoring(args, signal);
    child.stdin.take().unwrap().write_all(b"a\nb\nc\n").unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    let rest = read_all(stdout);
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: a plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
    let pid = child.id() as i32;
    let status = exits_within(
        &mut child,
        Duration::from_secs(20),
        &format!("paceline, signal {signal} ignored from its start, then sent"),
        || {
            // A stopped paceline: let the kill below end it.
            // SAFETY: kill(2) of our own child.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        },
    );
    let rest = rest
        .recv_timeout(Duration::from_secs(10))
        .expect("stdout still open");
    (first + &rest, status)
}

/// A hangup (the terminal closed) ignored from the start (a run meant to
/// outlive its terminal) stays ignored, by paceline and by its commands,
/// which inherit that; so a quit a shell without job control leaves
/// ignored for a job run with `&`. The run goes on to its end.
#[test]
fn a_hangup_or_a_quit_ignored_from_the_start_stays_ignored_with_commands() {
    let _one = one_at_a_time();
    for signal in [libc::SIGHUP, libc::SIGQUIT] {
        let (lines, status) = ignored_signal_sent(&["2/s", "--", "echo", "{}"], signal);
        assert_eq!(
            status.code(),
            Some(0),
            "signal {signal}: {status:?}: {lines:?}"
        );
        assert_eq!(lines, "a\nb\nc\n", "signal {signal}");
    }
}

/// A stop (SIGTSTP) ignored from the start stays ignored: paceline does
/// not stop, nor do its commands.
#[test]
fn a_stop_ignored_from_the_start_does_not_stop_paceline() {
    let _one = one_at_a_time();
    let (lines, status) = ignored_signal_sent(&["2/s", "--", "echo", "{}"], libc::SIGTSTP);
    assert_eq!(status.code(), Some(0), "{status:?}: {lines:?}");
    assert_eq!(lines, "a\nb\nc\n");
}

/// SIGINT ignored from the start (`paceline ... &` in a script: the shell
/// leaves SIGINT and SIGQUIT ignored for it, so that a Ctrl-C meant for
/// the script's foreground does not end it) stays ignored, in the plain
/// copy too.
#[test]
fn an_interrupt_ignored_from_the_start_stays_ignored() {
    let _one = one_at_a_time();
    for args in [&["2/s"][..], &["2/s", "--", "echo", "{}"][..]] {
        let (lines, status) = ignored_signal_sent(args, libc::SIGINT);
        assert_eq!(status.code(), Some(0), "{args:?}: {status:?}: {lines:?}");
        assert_eq!(lines, "a\nb\nc\n", "{args:?}");
    }
}

/// paceline in an orphaned process group (a session of its own: started
/// by a daemon, `setsid`, a container's init) gets a stop: the system
/// drops a stop's default action there, so paceline does not stop; nor
/// are its commands stopped, which nothing would then continue: the run
/// goes on to its end, as when they shared paceline's group.
#[test]
fn a_stop_in_an_orphaned_group_does_not_leave_the_commands_stopped() {
    let _one = one_at_a_time();
    let mut command = paceline(&[
        "10/s",
        "--",
        "sh",
        "-c",
        "echo started; sleep 2; echo \"$1\"",
        "sh",
        "{}",
    ]);
    // SAFETY: setsid(2) only, between fork and exec: paceline leads a
    // session (and a group) of its own, which has no parent in it: an
    // orphaned group.
    let own_session = || match unsafe { libc::setsid() } {
        -1 => Err(std::io::Error::last_os_error()),
        _ => Ok(()),
    };
    let mut child = unsafe { command.pre_exec(own_session) }.spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"a\n").unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "started\n");
    let rest = read_all(stdout);
    // SAFETY: a plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTSTP) }, 0);
    // The command sleeps 2 s: stopped, it never ends. (paceline killed,
    // its stopped commands are in an orphaned group: the kernel hangs
    // them up and continues them.)
    let status = exits_within(
        &mut child,
        Duration::from_secs(20),
        "paceline in an orphaned group, after SIGTSTP",
        || {},
    );
    let rest = rest
        .recv_timeout(Duration::from_secs(10))
        .expect("stdout still open");
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert_eq!(rest, "a\n");
}

/// A signal ends the run before the next record is reserved, in the
/// middle of what one read brought too. Through a Redis that answers each
/// call 2 ms late, 5 000 records read at once that go without waiting
/// (the rate, and a quota's stored permits) took 10 s to reserve, and all
/// of them went out after the signal, seen only once they were.
#[test]
fn a_signal_ends_the_run_inside_what_one_read_brought() {
    let _one = one_at_a_time();
    let server = redis_server::RedisServer::start();
    let proxy = slow_proxy(server.port(), Duration::from_millis(2));
    let url = format!("redis://127.0.0.1:{proxy}/");
    let input = "a\n".repeat(5_000);
    for (i, mode) in [&["--key", "1"][..], &["--limit", "1e6/h"][..]]
        .into_iter()
        .enumerate()
    {
        let name = format!("inside-a-read-{i}");
        let mut args = vec!["1e9/s", "--redis", url.as_str(), "--name", &name];
        args.extend_from_slice(mode);
        let mut child = paceline(&args).spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input.as_bytes()).unwrap();
        let stdout = read_all(child.stdout.take().unwrap());
        std::thread::sleep(Duration::from_millis(500));
        // SAFETY: a plain kill(2) of our own child.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
        let status = child.wait().unwrap();
        drop(stdin);
        let out = stdout.recv().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGTERM), "{mode:?}: {status:?}");
        assert!(
            out.len() < input.len(),
            "{mode:?}: all {} records went out after the signal",
            out.len() / 2
        );
        assert!(
            input.starts_with(&out),
            "{mode:?}: not a prefix of the input"
        );
    }
}
