//! The distributed limiter: one rate shared by every process that uses the
//! same Redis key.
//!
//! A [`RateLimiter`](crate::RateLimiter) or
//! [`KeyedRateLimiter`](crate::KeyedRateLimiter) built with
//! [`redis`](crate::Builder::redis) runs the crate's one algorithm as a Lua
//! script inside Redis (`lua/`, a line-by-line mirror of the in-process
//! arithmetic, for one limit or several), on Redis's clock, in one round
//! trip per reservation; its methods are every limiter's, the calls that
//! never sleep returning futures. Its state is one key (84 bytes for one
//! limit, more while reservations wait to be given back; see "Key names"
//! below), so a single server and Redis Cluster work alike. The key expires
//! only once an idle limiter would have refilled anyway, so expiry is
//! invisible (a missing key: see the table below). `docs/redis-protocol.md`
//! specifies what the script takes, replies and stores.
//!
//! A [`RedisBackend`] does the I/O: its connection, its health and its
//! probe, and the connection options ([`RedisBackend::builder`]). Build one
//! per process and give it to every limiter: building a limiter does no
//! I/O.
//!
//! ```no_run
//! use paceline::RateLimiter;
//! use paceline::redis::{Fallback, RedisBackend};
//!
//! // A program with no async runtime at all:
//! let client = paceline::redis::Client::open("redis://127.0.0.1:6379/")?;
//! let backend = RedisBackend::builder(client).build_blocking()?;
//! let limiter = RateLimiter::builder()
//!     .permits_per_second(5.0)
//!     .redis(&backend, "batch")
//!     .fallback(Fallback::FailClosed)
//!     .build()?;
//! for _item in 0..10 {
//!     limiter.acquire_blocking(1)?;
//!     // process it
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Fallbacks
//!
//! Every call waits at most
//! [`response_timeout`](RedisBackendBuilder::response_timeout) for Redis
//! (default 200 ms), so it returns within it plus scheduling slack. When
//! Redis is unreachable, too slow or failing, the limiter switches at once
//! to its [`Fallback`]: limit in this process at `rate × local_fraction`
//! ([`Fallback::Local`], the default; set `.local_fraction(1.0 / N)` when N
//! processes share the key), grant, or refuse. It probes Redis in the
//! background and switches back as soon as its script works again on a
//! fresh connection (the [`Fallback`] docs say how). A limiter can be built
//! while Redis is down: it starts on its fallback (`.require_connection(true)`
//! makes building the backend fail instead); a Redis that answers and
//! refuses it (a wrong password, user or database) fails the build either
//! way. Dropping an `acquire` gives its reservation back, in Redis too.
//! `cargo run --example distributed --features redis` shows three
//! instances sharing one rate (on `REDIS_URL`, or a private `redis-server`
//! it starts).
//!
//! # When Redis fails
//!
//! | What happens | What callers get | Back on Redis |
//! |---|---|---|
//! | Server killed, restarted, or refusing connections | the fallback, at once | when the probe's script works on a fresh connection |
//! | Server hung (stopped process) or connection silently dead (peer gone, no reset) | the fallback after `response_timeout`; a reply that comes later has its reservation given back | the probe opens a new connection, which replaces the dead one (about one probe interval) |
//! | Script refused: out of memory under `noeviction`, `READONLY` replica after a failover, `LOADING`, `BUSY`, `MASTERDOWN` | the fallback; one switch, no flapping | when the script's write succeeds |
//! | The key holds someone else's data (another type, or a string not in the limiter's format) | `Error::Backend` whatever the fallback; the data is left untouched | when the key is deleted or the limiter renamed |
//! | The key vanishes (evicted, `FLUSHALL`, a failover to a replica that never got it) | a limiter idle for long: one full burst (bursty) or cold (warming-up) | at once |
//! | The server's clock steps back / forward | time stands still for the key until the clock catches up / the step reads as idle time (at most one burst) | at once |
//! | A process served from its fallback and then never called again | — | its keys' debt is carried into Redis in the background as soon as its backend sees Redis again (within about one probe interval), so other processes see it |
//! | More keys than `max_keys` during one outage (or more known debts than that) | the fallback drops the keys nearest to full; new keys open no earlier than the latest dropped ticket, and a debt that does not fit is kept per hash bucket: errs towards limiting | keys called within the dropped debt's span are charged up to it once (by the first of its callers; the others wait for it) |
//! | Two outages in a row | the second opens each key from the debt Redis reports after the first one's carry-back, not from a stale local debt | as above |
//! | One Redis Cluster node down or hung | the fallback for the limiters and keys in that node's slots only, whether each limiter has a backend of its own or they share a `RedisBackend` or a keyed limiter. The first call that finds the node down marks its slot; the probe then marks the node's other slots from the slot map, so their calls do not each wait for `response_timeout` (but see "Cluster client timeouts" below) | when the script works on that node (probed there only, so other nodes' outages do not hold it back) |
//!
//! What crosses a switch follows one rule, for the single and the keyed
//! limiter alike: each permit granted is counted once in the schedule that
//! later callers of every process see.
//!
//! - **Into the fallback**, a key opens with no stored permits (a
//!   warming-up limit with all of them: cold, as a key Redis never saw)
//!   and with the debt Redis last reported for it, so a saturated key
//!   stays saturated.
//!   A snapshot reads that debt too, without opening the key.
//! - **Back to Redis**, a key the fallback served is carried back before any
//!   call of it reaches Redis again: one resume call adds what the fallback
//!   granted beyond the debt the key opened at (scaled by `local_fraction`;
//!   what Redis granted meanwhile, to a round trip sent before the switch,
//!   is Redis's own) and drops the permits the key's bursty limits had
//!   stored (a warming-up limit keeps its own: they slow it down, and
//!   without them a cold key would run warm); if Redis
//!   then owes less than that debt and the resume (it lost the key during
//!   the outage: a restart, a flush, a failover; or a give-back queued on
//!   a hung server ran late), the debt goes back too, as the fallback's
//!   callers wait behind it. Callers of that key wait for it,
//!   within their `response_timeout` in all; one whose time runs out is
//!   served by the fallback, which forgets the key only once its debt is in
//!   Redis. A try's timeout counts from its call (the time it waited for
//!   the carry-back is taken off it), whether Redis or the fallback then
//!   serves it. A background task, started when the backend recovers, carries
//!   the keys nobody calls. Under `Fallback::FailOpen` the resume carries no
//!   debt but still drops the bursty limits' stored permits, so nothing
//!   bursts after an outage.
//! - **Where it cannot be known** (a reply lost with its connection, a
//!   give-back that cannot be delivered, keys, debts and late grants beyond
//!   `max_keys`), the limiter errs towards limiting: a reservation may stay
//!   charged or be carried back twice, a key may open later than it had to,
//!   never granted twice by it.
//! - **The exception: a key the fallback dropped at `max_keys`.** Its
//!   debt is gone with it (that is the cap's point: a flood of keys during
//!   an outage costs no more memory), so it never reaches Redis: this
//!   process charges any key called before the dropped ticket up to it
//!   (beyond the debt Redis had reported for it, which goes back too if
//!   Redis lost the key meanwhile, as for a carry-back), but other
//!   processes do not know of it and may grant the dropped key's permits
//!   again, up to what this fallback granted it (at its
//!   `local_fraction`). [`Stats::dropped_unfinished`](crate::Stats) counts
//!   those keys; a `max_keys` above the keys active in one outage avoids it.
//!
//! The tests stage each row (every script refusal among them) and moment on
//! a real server, and check every sliding window of every key against the
//! rate, the burst and the fallbacks' allowance while a server is killed,
//! stopped, filled up and demoted at seeded moments under two processes.
//!
//! # Hot keys
//!
//! Redis runs one script at a time, so one key serves at most one script
//! call per ~7 µs of server time, however many clients call it. A process
//! therefore *coalesces* a key's reservations
//! ([`coalesce`](RedisBackendBuilder::coalesce), on by default, states the
//! promise): a lone caller goes at once; callers arriving while a round trip
//! of the key is in flight go together in one script call (up to 256) when
//! it ends, or once 64 wait (at most two batches in flight; a caller finding
//! 1 024 waiting goes alone). On one hot key, 256 tasks of one process
//! reserve about 5× as many permits per second as with `coalesce(false)`
//! (BENCHMARKS.md: a median of 5.24×, from 4.83× to 6.07×).
//!
//! # Running Redis for this
//!
//! - **Eviction.** Use `maxmemory-policy noeviction` or a `volatile-*`
//!   policy. Limiter keys always carry a TTL, so `volatile-ttl` and
//!   `volatile-lru` can evict them under memory pressure (one full burst, as
//!   in the table); `noeviction` never drops them: when memory is full,
//!   writes fail and the limiters serve from their fallbacks until memory is
//!   freed. Prefer it (or a separate instance) when a burst after memory
//!   pressure is not acceptable.
//! - **Persistence and failover.** The state is a few bytes per key, written
//!   on every reservation. A replica promoted by a failover has the state as
//!   far as replication had carried it: a lagging replica grants again what
//!   the lost writes had charged (at most the lag's worth of permits, or a
//!   burst for a key it never received). Persistence matters only across a
//!   restart of a lone server: without it, every key restarts idle (but
//!   one a fallback held, which gets back the debt that process knew).
//! - **Clocks.** The script uses the server's `TIME`, a wall clock, and never
//!   lets it run backwards: a step backwards holds keys still until the clock
//!   catches up, so each reservation meanwhile waits from the same moment
//!   and callers who wait in turn slow down (a step of 10 s at 5/s with no
//!   burst lets about 10 permits through in those 10 s, not 50; never more
//!   than the rate), and a step forwards reads as idle time (at most a
//!   burst). Where you can, synchronise time by slewing
//!   rather than stepping.
//! - **Cluster** (feature `redis-cluster`, which turns on the client's
//!   cluster support). Each limiter is one key, so limiters spread over the
//!   slots. Health is kept per node (the table's last row), and a cluster
//!   that refuses every connection is down as a whole.
//! - **Cluster client timeouts.** Build the `ClusterClient` with a
//!   `connection_timeout` below the limiter's `response_timeout` (the
//!   client's default is 1 s). A cluster connection reconnecting to a node
//!   that accepts connections but does not answer (a hung process) holds
//!   every request, to every node, until it gives up on that node; with the
//!   default, limiters on healthy nodes can stay on their fallbacks for as
//!   long as the node hangs (a process that starts while it hangs, for one).
//! - **Key names.** A limiter named `name` uses the Redis key
//!   `paceline:v1:name`, and a keyed limiter's key `key` uses
//!   `paceline:v1:name:key`: `paceline` is the prefix a backend's builder
//!   can change with `key_prefix`. `\` and `:` are escaped in the name
//!   (`\\`, `\:`), and `\`, `{`, `}` in the key (`\\`, `\(`, `\)`). No two
//!   (limiter, key) pairs share a Redis key, and no client's key text picks
//!   its cluster slot; braces in a *name* are kept, so `{tenant-7}` puts a
//!   limiter and all its keys in one slot on purpose. The slots of a
//!   [`Limit::concurrent`](crate::Limit::concurrent) live beside each key,
//!   in `{key}\slots` (`key\slots` where the key has a hash tag): in its
//!   slot, and no limiter's key (see [`outbound`](crate::outbound)). A name
//!   with a `}` but no hash tag (`a}b`) gets `key\slots` too, in another
//!   slot, which is safe on one server (the slots script touches that one
//!   key); on a cluster such a name cannot hold calls in flight (refused
//!   when built: the slots' node would be taken for the key's).
//! - **Upgrading.** `v1` is the version of the key layout and of the values
//!   under it, which carry a format marker (`plv1`). A later layout takes
//!   another version, so processes of two versions share no state: each
//!   starts full on its own keys (one burst), and the other's expire on
//!   their own; upgrade the processes sharing a limiter together. A value
//!   without the marker is not the limiter's: its calls fail with
//!   `Error::Backend`, "holds a value this limiter does not recognise", and
//!   it is left untouched.
//!

mod backend;
mod background;
mod builder;
mod coalesce;
mod connection;
mod failover;
mod fallback;
mod health;
mod leases;
mod limiter;
mod naming;
mod reply;
mod round_trip;
mod runtime;
mod script;
mod shared;
mod slots;

pub use builder::{DEFAULT_PROBE_INTERVAL, DEFAULT_RESPONSE_TIMEOUT};
pub use fallback::Fallback;
pub use leases::DEFAULT_SLOT_TTL;
pub use limiter::Redis;
pub use naming::DEFAULT_KEY_PREFIX;

/// The oldest Redis these limiters support, as (major, minor): Redis 7.0
/// or newer, and Valkey (which reports the Redis version it is compatible
/// with: 7.2 for Valkey 7.2 and 8). The test suite checks every server it
/// starts against this; it runs on Redis 7.0, and has passed on Valkey 8.
pub const MIN_REDIS_VERSION: (u32, u32) = (7, 0);
pub(crate) use reply::Stored;
pub(crate) use script::ScriptArgs;
pub use shared::{RedisBackend, RedisBackendBuilder};

/// The Redis client crate these limiters are built on, so that code using
/// them needs no version of its own to match: `paceline::redis::Client`
/// (and `ClusterClient`, with the `redis-cluster` feature) for the clients,
/// the whole crate here for the rest.
pub use ::redis;
pub use ::redis::Client;
#[cfg(feature = "redis-cluster")]
pub use ::redis::cluster::ClusterClient;
