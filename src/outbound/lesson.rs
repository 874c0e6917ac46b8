//! What a limiter makes of an upstream's answer: a [`Feedback`] read as a
//! [`Lesson`] for its limits, matched by name.

use super::{Feedback, Quota, Upstream};
use crate::core::{Learning, Lesson, Reported, micros};

impl Upstream {
    /// `feedback` in the limits' terms (each limit takes the quota of its
    /// name, the first unnamed limit the unnamed quota), and the learning to
    /// learn it under: the limiter's, except that an answer reporting the rate
    /// of every limit lowers nothing (see [`outbound`](super)).
    pub(crate) fn lesson(&self, feedback: &Feedback) -> (Lesson, Learning) {
        let first_unnamed = self.names.iter().position(Option::is_none);
        let limits = self
            .names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let quota = match name {
                    Some(name) => feedback.quota(Some(name)),
                    None if first_unnamed == Some(i) => feedback.quota(None),
                    None => None,
                };
                quota.map(reported).unwrap_or_default()
            })
            .collect();
        let lesson = Lesson {
            throttled: feedback.is_throttled(),
            success: (200..300).contains(&feedback.status()),
            retry_after_micros: feedback.retry_after().map(micros),
            sent_ago_micros: None,
            limits,
        };
        let reported = lesson.limits.iter().all(|r| r.rate.is_some());
        let learning = if !lesson.limits.is_empty() && reported {
            self.learning.decrease(1.0)
        } else {
            self.learning
        };
        (lesson, learning)
    }
}

/// The slowest rate a report sets: one a day. A quota of less (one in a window
/// of 2^64 s) would keep every caller waiting for years, where a `Retry-After`
/// or a reset pauses them a day at most.
const SLOWEST_REPORTED: f64 = 1.0 / 86_400.0;

/// What a quota says of its limit: its rate when the upstream gave both its
/// quota and its window (at least one a day), what is left, and when it
/// resets.
fn reported(quota: &Quota) -> Reported {
    let rate = match (quota.limit, quota.window) {
        (Some(limit), Some(window)) if limit > 0 && !window.is_zero() => {
            Some((limit as f64 / window.as_secs_f64()).max(SLOWEST_REPORTED))
        }
        _ => None,
    };
    Reported {
        rate,
        remaining: quota.remaining,
        reset_micros: quota.reset.map(micros),
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;

    fn upstream(names: &[Option<&str>]) -> Upstream {
        Upstream {
            learning: Default::default(),
            names: names.iter().map(|n| n.map(Box::from)).collect(),
        }
    }

    #[test]
    fn each_limit_takes_the_quota_of_its_name() {
        let headers: [(&str, &[u8]); 3] = [
            (
                "RateLimit-Policy",
                b"\"requests\";q=50;w=1, \"tokens\";q=3000;w=1",
            ),
            ("RateLimit", b"\"requests\";r=49;t=1, \"tokens\";r=0;t=2"),
            ("Retry-After", b"2"),
        ];
        let feedback = Feedback::from_headers(429, headers, SystemTime::UNIX_EPOCH);
        let (lesson, learning) = upstream(&[Some("requests"), Some("tokens")]).lesson(&feedback);
        assert!(lesson.throttled && !lesson.success);
        assert_eq!(lesson.retry_after_micros, Some(2_000_000));
        let requests = Reported {
            rate: Some(50.0),
            remaining: Some(49),
            reset_micros: Some(1_000_000),
        };
        let tokens = Reported {
            rate: Some(3000.0),
            remaining: Some(0),
            reset_micros: Some(2_000_000),
        };
        assert_eq!(lesson.limits, [requests, tokens]);
        // Every limit's rate reported: a refusal lowers nothing.
        assert_eq!(learning, Learning::default().decrease(1.0));
        // Unnamed limits take nothing named; a limit the upstream does not
        // report learns nothing from it.
        let (lesson, learning) = upstream(&[None, Some("bytes")]).lesson(&feedback);
        assert_eq!(lesson.limits, [Reported::default(), Reported::default()]);
        assert_eq!(learning, Learning::default());
    }

    #[test]
    fn the_first_unnamed_limit_takes_the_unnamed_quota() {
        let headers: [(&str, &[u8]); 3] = [
            ("X-RateLimit-Limit", b"100"),
            ("X-RateLimit-Remaining", b"7"),
            ("X-RateLimit-Reset", b"0.5"),
        ];
        let feedback = Feedback::from_headers(200, headers, SystemTime::UNIX_EPOCH);
        let (lesson, _) = upstream(&[Some("tokens"), None, None]).lesson(&feedback);
        assert!(lesson.success);
        let unnamed = Reported {
            rate: None,
            remaining: Some(7),
            reset_micros: Some(500_000),
        };
        assert_eq!(
            lesson.limits,
            [Reported::default(), unnamed, Reported::default()]
        );
    }

    #[test]
    fn a_2xx_status_is_a_success() {
        let lesson = |status| upstream(&[None]).lesson(&Feedback::new(status)).0;
        for status in [200, 201, 204, 299] {
            assert!(lesson(status).success, "{status}");
        }
        for status in [0, 100, 199, 300, 429, 503] {
            assert!(!lesson(status).success, "{status}");
        }
    }
}
