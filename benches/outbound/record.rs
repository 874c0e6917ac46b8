//! What a worker of the outbound benchmark reports of each logical call,
//! one line each, and how the parent reads it back.

use std::fmt::Write as _;

/// A logical call as the worker reports it, on one line of stdout:
/// `call START_US END_US ATTEMPTS OUTCOME STATUS TOKENS`, times in
/// microseconds since the common start; `OUTCOME` is `ok` (a 200), `http`
/// (another final answer), `late` (the deadline came first) or `err`;
/// `STATUS` the last answer's (0 if none).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Record {
    pub start_us: i64,
    pub end_us: i64,
    pub attempts: u32,
    pub outcome: Outcome,
    pub status: u16,
    pub tokens: u64,
}

/// How a logical call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Http,
    Late,
    Err,
}

impl Outcome {
    fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Http => "http",
            Outcome::Late => "late",
            Outcome::Err => "err",
        }
    }
}

impl Record {
    /// Appends its line to `out`.
    pub fn write(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "call {} {} {} {} {} {}",
            self.start_us,
            self.end_us,
            self.attempts,
            self.outcome.name(),
            self.status,
            self.tokens
        );
    }

    /// A line [`write`](Self::write) wrote; `None` for any other.
    pub fn parse(line: &str) -> Option<Record> {
        let mut fields = line.strip_prefix("call ")?.split(' ');
        let mut next = || fields.next();
        let start_us = next()?.parse().ok()?;
        let end_us = next()?.parse().ok()?;
        let attempts = next()?.parse().ok()?;
        let outcome = match next()? {
            "ok" => Outcome::Ok,
            "http" => Outcome::Http,
            "late" => Outcome::Late,
            "err" => Outcome::Err,
            _ => return None,
        };
        let status = next()?.parse().ok()?;
        let tokens = next()?.parse().ok()?;
        Some(Record {
            start_us,
            end_us,
            attempts,
            outcome,
            status,
            tokens,
        })
    }
}
