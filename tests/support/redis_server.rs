//! A throwaway `redis-server` for integration tests.
//!
//! [`RedisServer::start`] runs a private server on a free loopback port, with
//! no persistence and its working directory in a fresh temporary directory,
//! and waits until it answers. Dropping the value kills the server and removes
//! the directory. Tests can also crash it ([`RedisServer::kill`]), freeze it
//! ([`RedisServer::stop`], [`RedisServer::cont`]) or bring it back, empty, on
//! the same port ([`RedisServer::restart`]).

use std::collections::BTreeSet;
use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The server binary, looked up on `PATH`: `redis-server`, or what
/// `PACELINE_REDIS_SERVER` names (`valkey-server`, say).
fn binary() -> String {
    std::env::var("PACELINE_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

/// How long a starting server may take to answer.
const START_TIMEOUT: Duration = Duration::from_secs(5);

/// Fresh ports tried by [`RedisServer::start`] (another process may grab the
/// port between our probe and the server's bind).
const START_ATTEMPTS: usize = 3;

/// Timeout for each connection attempt and reply while polling.
const POLL_TIMEOUT: Duration = Duration::from_millis(250);

const NOT_INSTALLED: &str = "the Redis server was not found on PATH. The Redis tests need a \
     local Redis server (the version `paceline::redis::MIN_REDIS_VERSION` names, or newer): run \
     them with the README's test command, which installs it.";

/// A private `redis-server` process, killed on drop.
pub struct RedisServer {
    child: Option<Child>,
    pid: u32,
    port: u16,
    dir: PathBuf,
    extra_args: Vec<String>,
}

impl RedisServer {
    /// Starts a server on a free loopback port and waits until it answers.
    ///
    /// Panics (with what went wrong) if no server could be started.
    pub fn start() -> RedisServer {
        Self::start_with(&[], free_port)
    }

    /// Starts a server with extra command-line arguments, on a port chosen
    /// by `pick_port` (e.g. [`free_cluster_port`]).
    pub fn start_with(extra_args: &[&str], pick_port: fn() -> u16) -> RedisServer {
        let extra_args: Vec<String> = extra_args.iter().map(|a| a.to_string()).collect();
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            let port = pick_port();
            let dir = fresh_dir(port);
            match launch(port, &dir, &extra_args) {
                Ok(child) => {
                    return RedisServer {
                        pid: child.id(),
                        child: Some(child),
                        port,
                        dir,
                        extra_args,
                    };
                }
                Err(failure) => {
                    failures.push(failure);
                    let _ = fs::remove_dir_all(&dir);
                }
            }
        }
        panic!(
            "could not start {} after {START_ATTEMPTS} attempts: {failures:?}",
            binary()
        );
    }

    /// `redis://127.0.0.1:<port>/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The TCP port the server listens on (the same across [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process id of the current (or last) server process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// A client for this server (connects lazily).
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("a valid redis URL")
    }

    /// A fresh synchronous connection. Panics if the server does not answer.
    pub fn connection(&self) -> redis::Connection {
        self.client()
            .get_connection_with_timeout(START_TIMEOUT)
            .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", self.url()))
    }

    /// The EVALSHA calls this server counted since it started (or since
    /// the last `CONFIG RESETSTAT`).
    pub fn evalsha_calls(&self) -> u64 {
        self.calls_of(&["evalsha"])
    }

    /// The scripts this server ran (EVALSHA and EVAL calls), counted so.
    pub fn script_calls(&self) -> u64 {
        self.calls_of(&["evalsha", "eval"])
    }

    /// The calls of `commands` this server counted, all together.
    fn calls_of(&self, commands: &[&str]) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.connection())
            .unwrap();
        info.lines()
            .filter_map(|line| {
                let (command, rest) = line.strip_prefix("cmdstat_")?.split_once(":calls=")?;
                commands.contains(&command).then_some(())?;
                rest.split(',').next()?.parse::<u64>().ok()
            })
            .sum()
    }

    /// `CONFIG SET name value`, on a connection of its own.
    pub fn config_set(&self, name: &str, value: &str) {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query(&mut self.connection())
            .unwrap_or_else(|e| panic!("CONFIG SET {name} {value}: {e}"));
    }

    /// Whether the server process is still alive (it may be stopped).
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Crashes the server: SIGKILL, then reaps it. Everything in it is lost.
    /// Does nothing if it is not running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill(); // SIGKILL; also ends a stopped process
            let _ = child.wait();
        }
    }

    /// Freezes the server (SIGSTOP): connections stay open but nothing is
    /// answered until [`cont`](Self::cont).
    pub fn stop(&self) {
        self.signal("-STOP");
    }

    /// Resumes a server frozen by [`stop`](Self::stop) (SIGCONT).
    pub fn cont(&self) {
        self.signal("-CONT");
    }

    /// Kills the server (if running) and starts a new, empty one on the same
    /// port, waiting until it answers. Existing connections are broken.
    pub fn restart(&mut self) {
        self.kill();
        // The old socket may linger briefly; keep trying the same port.
        let deadline = Instant::now() + START_TIMEOUT;
        let mut failures = Vec::new();
        loop {
            match launch(self.port, &self.dir, &self.extra_args) {
                Ok(child) => {
                    self.pid = child.id();
                    self.child = Some(child);
                    return;
                }
                Err(failure) => {
                    failures.push(failure);
                    if Instant::now() >= deadline {
                        panic!(
                            "could not restart {} on port {}: {failures:?}",
                            binary(),
                            self.port
                        );
                    }
                    sleep(Duration::from_millis(50));
                }
            }
        }
    }

    fn signal(&self, signal: &str) {
        assert!(self.child.is_some(), "the server is not running");
        let status = Command::new("kill")
            .arg(signal)
            .arg(self.pid.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("cannot run `kill {signal} {}`: {e}", self.pid));
        assert!(
            status.success(),
            "`kill {signal} {}` failed: {status}",
            self.pid
        );
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A port that was free a moment ago (bind port 0, read it, let it go)
/// and that no test of this process was handed before. A server killed
/// to be restarted leaves its port free for a while: without the second
/// rule, a test starting meanwhile could take it, and the first test's
/// clients, and its restart, would then reach the other test's server.
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local address").port();
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
        if handed_out.insert(port) {
            return port;
        }
    }
}

/// A free port whose cluster bus port (port + 10000) is free too.
pub fn free_cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port <= u16::MAX - 10_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// A new, empty directory under the system's temporary directory.
fn fresh_dir(port: u16) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "paceline-redis-{}-{port}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    dir
}

/// Spawns a server on `port` and waits until *it* (not some other process on
/// that port) answers; on failure the process is reaped and the reason returned.
fn launch(port: u16, dir: &Path, extra_args: &[String]) -> Result<Child, String> {
    let binary = binary();
    let mut child = Command::new(&binary)
        .arg("--port")
        .arg(port.to_string())
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .args(extra_args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                panic!("{NOT_INSTALLED}");
            }
            panic!("cannot run {binary}: {e}");
        });
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                return Err(format!(
                    "{binary} on port {port} exited at start ({status}); port taken?"
                ));
            }
            Ok(None) => {}
            Err(e) => return Err(format!("cannot watch {binary}: {e}")),
        }
        if answers(port, child.id()) {
            check_version(port);
            return Ok(child);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "{binary} on port {port} did not answer within {START_TIMEOUT:?}"
            ));
        }
        sleep(Duration::from_millis(20));
    }
}

/// Checks, once per test run, that the server is a version the crate
/// supports (`paceline::redis::MIN_REDIS_VERSION` or newer; Valkey reports
/// the Redis version it is compatible with).
fn check_version(port: u16) {
    static CHECKED: std::sync::Once = std::sync::Once::new();
    CHECKED.call_once(|| {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
        let mut con = client.get_connection_with_timeout(START_TIMEOUT).unwrap();
        let info: String = redis::cmd("INFO").arg("server").query(&mut con).unwrap();
        let version = info
            .lines()
            .find_map(|line| line.strip_prefix("redis_version:"))
            .unwrap_or("0.0")
            .trim()
            .to_owned();
        let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        let needed = paceline::redis::MIN_REDIS_VERSION;
        assert!(
            found >= needed,
            "{} reports Redis {version}; the crate supports {}.{} or newer",
            binary(),
            needed.0,
            needed.1
        );
    });
}

/// Whether the server on `port` answers PING and is the process `pid`.
fn answers(port: u16, pid: u32) -> bool {
    let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}/")) else {
        return false;
    };
    let Ok(mut con) = client.get_connection_with_timeout(POLL_TIMEOUT) else {
        return false;
    };
    if con.set_read_timeout(Some(POLL_TIMEOUT)).is_err()
        || con.set_write_timeout(Some(POLL_TIMEOUT)).is_err()
    {
        return false;
    }
    let pong: redis::RedisResult<String> = redis::cmd("PING").query(&mut con);
    if !matches!(pong.as_deref(), Ok("PONG")) {
        return false;
    }
    let info: redis::RedisResult<String> = redis::cmd("INFO").arg("server").query(&mut con);
    let expected = format!("process_id:{pid}");
    info.is_ok_and(|info| info.lines().any(|line| line.trim() == expected))
}
