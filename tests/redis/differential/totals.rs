//! The running totals of a differential run, for its summary line and for
//! the check that the sequences exercised every outcome.

use super::sequence::{Expect, Kind, Step};

/// Running totals for the summary line.
#[derive(Debug, Default)]
pub struct Totals {
    pub sequences: u64,
    pub limits: [u64; 3],
    pub reserves: u64,
    pub tries_granted: u64,
    pub tries_refused: u64,
    pub probes: u64,
    pub resumes: u64,
    pub statuses: u64,
    pub batches: u64,
    pub given_back: u64,
    pub given_nothing: u64,
    pub calls: u64,
    pub calls_refused: u64,
    pub settled_exactly: u64,
    pub settled_after: u64,
    pub kept: u64,
    pub learned: u64,
    pub rate_changes: u64,
    pub backward_steps: u64,
    pub caps_logged: u64,
    pub caps_replayed: u64,
    pub field_checks: u64,
    pub fractional_states: u64,
    pub logs_checked: u64,
    pub full_logs: u64,
    pub ttls_set: u64,
    pub ttls_kept: u64,
}

impl Totals {
    pub fn count(&mut self, step: &Step, reply: &Expect) {
        match (&step.kind, reply) {
            (Kind::Reserve { timeout: None, .. }, _) => self.reserves += 1,
            (Kind::Reserve { .. }, Expect::Refused { .. }) => self.tries_refused += 1,
            (Kind::Reserve { .. }, _) => self.tries_granted += 1,
            (Kind::Probe, _) => self.probes += 1,
            (Kind::Resume { .. }, _) => self.resumes += 1,
            (Kind::Status, _) => self.statuses += 1,
            (Kind::Batch { .. }, _) => self.batches += 1,
            (Kind::Cancel { .. }, Expect::Int(1)) => self.given_back += 1,
            (Kind::Cancel { .. }, _) => self.given_nothing += 1,
            (Kind::Call { .. }, Expect::Refused { .. }) => self.calls_refused += 1,
            (Kind::Call { .. }, _) => self.calls += 1,
            (Kind::Settle { .. }, Expect::Int(1)) => self.settled_exactly += 1,
            (Kind::Settle { .. }, _) => self.settled_after += 1,
            (Kind::Keep { .. }, Expect::Int(1)) => self.kept += 1,
            (Kind::Keep { .. }, _) => {}
            (Kind::Learn { .. }, _) => self.learned += 1,
        }
    }
}
