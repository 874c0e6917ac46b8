//! The limiter the arguments describe: one rate or one per key, in this
//! process or shared through Redis; and how a record's key is found.

use std::sync::Arc;
use std::time::{Duration, Instant};

use paceline::Local;
use paceline::{Error, KeyedLimiter, Limit, Limiter};

use crate::args::{Args, Failure, OnDown};
use crate::key::Key;

/// The clock of the command line's local limiters: the standard library's
/// monotonic clock, which needs no calibration at start (a pipeline
/// stage starts often and copies little).
///
/// A builder given this clock never makes the library's own (see
/// `Builder::clock`), so a run that never waits never calibrates one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StdClock(Instant);

impl StdClock {
    /// A clock that reads zero now.
    pub(crate) fn start() -> StdClock {
        StdClock(Instant::now())
    }
}

impl paceline::clock::Clock for StdClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }

    fn sleep_blocking(&self, duration: Duration) {
        std::thread::sleep(duration);
    }

    fn sleep(&self, duration: Duration) -> paceline::clock::Sleep {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// The limiter: one rate, or one per key; here or through Redis.
pub(crate) enum Pacer {
    One(Arc<dyn Limiter>),
    Keyed(Arc<dyn KeyedLimiter<Key>>),
}

impl Pacer {
    /// Reserves `permits` (of `key`): the wait, or `None` if it would
    /// exceed `max_wait` (nothing reserved).
    pub(crate) async fn reserve(
        &self,
        key: Option<&Key>,
        permits: u32,
        max_wait: Option<Duration>,
    ) -> Result<Option<Duration>, Error> {
        match self {
            Pacer::One(limiter) => match max_wait {
                None => limiter.reserve(permits).await.map(Some),
                Some(max) => limiter.try_reserve(permits, max).await,
            },
            Pacer::Keyed(limiter) => {
                let none = Key::default();
                let key = key.unwrap_or(&none);
                match max_wait {
                    None => limiter.reserve(key, permits).await.map(Some),
                    Some(max) => limiter.try_reserve(key, permits, max).await,
                }
            }
        }
    }
}

/// One rate in this process, on [`StdClock`].
pub(crate) fn local(limits: Vec<Limit>) -> Result<paceline::RateLimiter<Local, StdClock>, Failure> {
    let mut builder = paceline::RateLimiter::builder().clock(StdClock::start());
    for limit in limits {
        builder = builder.limit(limit);
    }
    builder.build().map_err(usage)
}

/// The limiter of a run that is not a plain copy in this process.
pub(crate) async fn pacer(args: &Args, limits: Vec<Limit>, keyed: bool) -> Result<Pacer, Failure> {
    let Some(url) = &args.redis else {
        return Ok(if keyed {
            let mut builder = paceline::KeyedRateLimiter::<Key>::builder()
                .clock(StdClock::start())
                .max_keys(args.max_keys);
            for limit in limits {
                builder = builder.limit(limit);
            }
            Pacer::Keyed(Arc::new(builder.build().map_err(usage)?))
        } else {
            Pacer::One(Arc::new(local(limits)?))
        });
    };
    use paceline::redis::{Client, Fallback, RedisBackend};
    let shown = without_credentials(url);
    let client = Client::open(url.as_str())
        .map_err(|e| Failure::Usage(format!("bad Redis URL {shown:?}: {e}")))?;
    let url = shown;
    // Unreachable at the start is down as any other time: the run starts
    // on its fallback, and goes over to Redis once it answers; but with
    // --on-down closed, it does not start. A Redis that answers and
    // refuses this client (a wrong password, user or database) is no
    // outage: the run does not start, whatever --on-down says.
    let closed = args.on_down == OnDown::Closed;
    let backend = RedisBackend::builder(client)
        .require_connection(closed)
        .build()
        .await
        .map_err(|e| {
            Failure::Limiter(match closed {
                true => format!("cannot use Redis at {url} (--on-down closed): {e}"),
                false => format!("Redis at {url} refuses this client: {e}"),
            })
        })?;
    let fallback = match args.on_down {
        OnDown::Local => Fallback::Local,
        OnDown::Open => Fallback::FailOpen,
        OnDown::Closed => Fallback::FailClosed,
    };
    if backend.stats().degraded {
        let meanwhile = match args.on_down {
            OnDown::Local => "pacing on a limiter of its own (--on-down local)",
            OnDown::Open | OnDown::Closed => "letting every record through (--on-down open)",
        };
        say!("paceline: Redis at {url} does not answer: {meanwhile} until it does");
    }
    Ok(if keyed {
        let mut builder = paceline::KeyedRateLimiter::<Key>::builder().max_keys(args.max_keys);
        for limit in limits {
            builder = builder.limit(limit);
        }
        let builder = builder
            .redis(&backend, &args.name)
            .fallback(fallback)
            .local_fraction(args.local_fraction);
        Pacer::Keyed(Arc::new(builder.build().map_err(usage)?))
    } else {
        let mut builder = paceline::RateLimiter::builder();
        for limit in limits {
            builder = builder.limit(limit);
        }
        let builder = builder
            .redis(&backend, &args.name)
            .fallback(fallback)
            .local_fraction(args.local_fraction);
        Pacer::One(Arc::new(builder.build().map_err(usage)?))
    })
}

/// `url` without the user name and password it may carry, for messages.
fn without_credentials(url: &str) -> String {
    let Some(scheme) = url.find("://") else {
        return url.to_owned();
    };
    let (scheme, rest) = url.split_at(scheme + 3);
    match rest.rfind('@') {
        None => url.to_owned(),
        Some(at) if !rest[..at].contains('/') => format!("{scheme}{}", &rest[at + 1..]),
        // An `@` past a `/`: a password with a `/` in it (unescaped, so the
        // URL does not parse), or an `@` in the path. Either way, all before
        // it is hidden.
        Some(at) => format!("{scheme}…@{}", &rest[at + 1..]),
    }
}

pub(crate) fn usage(error: Error) -> Failure {
    Failure::Usage(error.to_string())
}

#[cfg(test)]
mod tests {
    use super::without_credentials;

    #[test]
    fn messages_show_no_password() {
        for (url, shown) in [
            ("redis://127.0.0.1:6379/", "redis://127.0.0.1:6379/"),
            ("redis://:secret@host:6379/0", "redis://host:6379/0"),
            ("rediss://user:p@ss@host/", "rediss://host/"),
            ("redis://host/key@x", "redis://…@x"),
            ("redis://user:pa/ss@host/", "redis://…@host/"),
            ("redis://user:p@s/s@host/", "redis://…@host/"),
            ("redis://:p?a#ss@host:6379/0", "redis://host:6379/0"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(without_credentials(url), shown);
        }
    }
}
