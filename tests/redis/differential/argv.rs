//! A step's ARGV, and a sequence described for a failure's message.

use std::fmt::Write as _;

use super::calls::LearnArgs;
use super::sequence::{Encoding, Kind, Sequence, Step};
use paceline::core::{Lesson, MAX_MICROS};

fn push_f64(invocation: &mut redis::ScriptInvocation<'_>, value: f64, encoding: Encoding) {
    match encoding {
        _ if value.is_infinite() => invocation.arg("inf"),
        Encoding::RedisArg => invocation.arg(value),
        Encoding::Display => invocation.arg(value.to_string()),
    };
}

impl Sequence {
    /// `step`'s ARGV.
    pub fn arguments(&self, step: &Step, invocation: &mut redis::ScriptInvocation<'_>) {
        match &step.kind {
            Kind::Reserve {
                permits,
                held,
                timeout,
            } => {
                let plus = if *held { "+" } else { "" };
                invocation.arg(format!("{permits}{plus}"));
                match timeout {
                    None => invocation.arg("-1"),
                    Some(t) => invocation.arg(*t),
                };
            }
            Kind::Probe => {
                invocation.arg("probe").arg("-1");
            }
            Kind::Status => {
                invocation.arg("status").arg("-1");
            }
            Kind::Resume { debts } => {
                let debts: Vec<String> = debts.iter().map(u64::to_string).collect();
                invocation.arg("resume").arg(debts.join(","));
            }
            Kind::Cancel { id } => {
                invocation.arg("give_back").arg(*id);
            }
            Kind::Call { cost, timeout } => {
                let timeout = timeout.map_or(-1, |t| t as i64);
                invocation
                    .arg("call")
                    .arg(format!("{}:{timeout}", counts(cost)));
            }
            Kind::Settle {
                id,
                charged,
                actual,
            } => {
                invocation.arg("settle").arg(format!(
                    "{id}:{}:{}",
                    counts(charged),
                    counts(actual)
                ));
            }
            Kind::Keep { id } => {
                invocation.arg("keep").arg(*id);
            }
            Kind::Learn { lesson, args } => {
                invocation.arg("learn").arg(lesson_text(lesson, args));
            }
            Kind::Batch { requests } => {
                let text: Vec<String> = requests
                    .iter()
                    .map(|(permits, held, timeout)| {
                        let plus = if *held { "+" } else { "" };
                        match timeout {
                            None => format!("{permits}{plus}:-1"),
                            Some(t) => format!("{permits}{plus}:{}", t.min(&MAX_MICROS)),
                        }
                    })
                    .collect();
                invocation.arg("batch").arg(text.join(","));
            }
        }
        for (limit, &rate) in self.config.iter().zip(&step.rates) {
            let (policy, micros, cold_factor) = limit.argv();
            push_f64(invocation, rate, self.encoding);
            invocation.arg(policy).arg(micros);
            push_f64(invocation, cold_factor, self.encoding);
        }
        invocation.arg(step.now);
    }

    pub fn describe(&self) -> String {
        let mut text = format!(
            "seed {} ({:#x}), limits {:?}, numbers as {:?}\nsteps:\n",
            self.seed, self.seed, self.config, self.encoding
        );
        for (i, (step, expected)) in self.steps.iter().zip(&self.expected).enumerate() {
            let _ = writeln!(
                text,
                "  {i:>3}: {step:?} -> core {:?} (wrote: {})",
                expected.reply, expected.wrote
            );
        }
        text
    }
}

fn counts(cost: &[u32]) -> String {
    let counts: Vec<String> = cost.iter().map(u32::to_string).collect();
    counts.join(",")
}

/// A lesson and its constants as the script reads them (see the protocol,
/// Learn), written independently of the crate's own writer.
fn lesson_text(lesson: &Lesson, args: &LearnArgs) -> String {
    let some = |value: Option<u64>| match value {
        Some(v) => v.min(MAX_MICROS).to_string(),
        None => String::new(),
    };
    let mut text = format!(
        "{},{},{},{},{},{},{},{},{},{}",
        u8::from(lesson.throttled),
        u8::from(lesson.success),
        some(lesson.retry_after_micros),
        args.decrease,
        args.increase,
        args.interval_micros,
        args.floor,
        args.pause_micros,
        args.margin,
        some(lesson.sent_ago_micros),
    );
    for reported in &lesson.limits {
        let rate = reported.rate.map(|r| format!("{r:e}")).unwrap_or_default();
        let remaining = reported
            .remaining
            .map(|r| r.to_string())
            .unwrap_or_default();
        let _ = write!(text, ";{rate},{remaining},{}", some(reported.reset_micros));
    }
    text
}
