//! Changing the rates of every key in a shard.

use super::*;
use crate::core::InvalidRate;

impl<K: Hash + Eq + Clone> Table<K> {
    /// Sets every key's limits to `rates` at `now`, as
    /// [`Limits::set_rate`] does for one key (a limit already at its rate
    /// is left as it is; the log of a key whose rates change empties: what
    /// waits then gives nothing back, erring towards limiting). The rates
    /// are valid, one per limit.
    pub(in crate::keyed) fn set_rates(
        &mut self,
        rates: &[f64],
        now: u64,
    ) -> Result<(), InvalidRate> {
        // Each word's state under the old configuration, at the new rate...
        let mut states = self.word_states(now);
        for (_, state) in &mut states {
            if state.permits_per_second() != rates[0] {
                state.set_rate(rates[0], now)?;
            }
        }
        self.template.set_rates(rates, now)?;
        for entry in self.limits.values_mut() {
            entry.limits.set_rates(rates, now)?;
        }
        self.sweep_period = sweep_period(&self.template);
        // ... as a word under the new configuration where it fits.
        self.rehold(states, now);
        Ok(())
    }
}
