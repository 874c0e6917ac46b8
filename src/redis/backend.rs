//! What a Redis limiter talks through: the target, the connection in use,
//! its health, and the runtime its I/O runs on.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use super::connection::{Connection, Link, Target, refuses_client};
use super::health::{Health, Zone};
use super::runtime::RuntimeRef;
use super::script::{self, Call, Kept, ScriptArgs};
use super::slots::SlotMap;
use crate::Error;
use crate::core::{Bursty, Policy};
use crate::error::BackendError;

/// The key a backend probes before any limiter has failed on it: outside
/// the `paceline:` prefix, so that it can be no limiter's.
const BACKEND_PROBE_KEY: &str = "paceline-probe";

/// A Redis key and what the script needs with it: where a call goes, and
/// where the probe runs the script (on a cluster, that key's node).
#[derive(Clone)]
pub(crate) struct ProbeTarget {
    pub(crate) key: Arc<str>,
    pub(crate) script_args: Arc<ScriptArgs>,
    /// Who hears of its late grants (see [`Late`]).
    pub(crate) late: Option<Weak<dyn Late>>,
}

/// A limiter that hears of the reservations granted in Redis after their
/// callers stopped waiting (the response timeout passed, or the caller was
/// dropped) that cannot be given back (no id: not held, or not waiting).
/// Their charges stay in Redis; a caller served meanwhile by the fallback
/// was served twice, so the carry-back must not add the fallback's charge
/// for it again: their own charge counts as carried, and the debt Redis
/// reported with them as known.
pub(crate) trait Late: Send + Sync {
    fn late(&self, key: &str, kept: Kept);
    /// A round trip of `key` whose caller stopped waiting is awaited in the
    /// background (`pending`), or is no more (its late grant, if any, told).
    fn awaited(&self, key: &str, pending: bool);
}

/// A round trip awaited in the background after its caller stopped
/// waiting, known to its limiter until this drops ([`Late::awaited`]).
pub(crate) struct Awaited {
    late: Weak<dyn Late>,
    key: Arc<str>,
}

impl Drop for Awaited {
    fn drop(&mut self) {
        if let Some(late) = self.late.upgrade() {
            late.awaited(&self.key, false);
        }
    }
}

impl ProbeTarget {
    /// Tells the key's limiter of late grants that stay charged.
    pub(crate) fn note_late(&self, kept: Kept) {
        if let Some(late) = self.late.as_ref().and_then(Weak::upgrade) {
            late.late(&self.key, kept);
        }
    }

    /// Tells the key's limiter that a round trip of the key is awaited in
    /// the background, until the returned guard drops.
    pub(crate) fn awaited(&self) -> Option<Awaited> {
        let weak = self.late.as_ref()?;
        weak.upgrade()?.awaited(&self.key, true);
        Some(Awaited {
            late: Weak::clone(weak),
            key: Arc::clone(&self.key),
        })
    }

    /// The backend's own probe key, with arguments that describe an idle
    /// limiter (its probe writes a missing key with a TTL of a few ms).
    pub(crate) fn backend() -> ProbeTarget {
        ProbeTarget {
            key: BACKEND_PROBE_KEY.into(),
            script_args: Arc::new(ScriptArgs::new(&[(Policy::Bursty(Bursty::default()), 1.0)])),
            late: None,
        }
    }
}

/// How long the probe waits for a fresh connection to a cluster, at least:
/// such a connection waits for every node, each up to the client's
/// connection timeout (1 s unless set), so one hung node, however
/// unrelated, makes it slower than a response timeout.
const CLUSTER_PROBE_CONNECT: Duration = Duration::from_secs(10);

/// One target, one connection, one health state (one zone per hash slot on
/// a cluster, see [`Health`]), one probe, one runtime, shared by every
/// limiter made from it.
pub(crate) struct Backend {
    pub(crate) target: Target,
    pub(crate) link: Link,
    pub(crate) health: Health,
    pub(crate) runtime: RuntimeRef,
    /// The options it was built with (checked).
    pub(crate) options: Connecting,
    /// What the probe runs the script on. Zones are marked down and up
    /// under this lock, in step with the targets.
    probes: Mutex<Probes>,
    /// The limiters told when zones come back (those that served from
    /// their fallback), by address: each leaves as it drops
    /// ([`forget_recovery`](Self::forget_recovery)), so that its memory,
    /// which its entry would hold, goes with it.
    recovering: Mutex<HashMap<usize, Weak<dyn Recover>>>,
}

/// A backend's options: what its builder's setters set, and what the
/// backend built keeps (checked).
#[derive(Debug, Clone)]
pub(crate) struct Connecting {
    pub(crate) response_timeout: Duration,
    pub(crate) probe_interval: Duration,
    pub(crate) require_connection: bool,
    /// Whether a key's reservations that meet a round trip in flight go
    /// together (see `coalesce`).
    pub(crate) coalesce: bool,
    /// What every Redis key of its limiters starts with, before the `:`.
    pub(crate) key_prefix: String,
}

impl Default for Connecting {
    fn default() -> Self {
        Connecting {
            response_timeout: super::DEFAULT_RESPONSE_TIMEOUT,
            probe_interval: super::DEFAULT_PROBE_INTERVAL,
            require_connection: false,
            coalesce: true,
            key_prefix: super::DEFAULT_KEY_PREFIX.to_owned(),
        }
    }
}

impl Connecting {
    /// When a call made now stops waiting for Redis: `response_timeout`
    /// from now, or for a timeout too long to add (`Duration::MAX`: no
    /// timeout) far enough ahead that it never comes, as Tokio's timers do.
    pub(crate) fn response_deadline(&self) -> tokio::time::Instant {
        let now = tokio::time::Instant::now();
        now.checked_add(self.response_timeout)
            .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365 * 30))
    }

    /// Checks the options.
    pub(crate) fn check(&self) -> Result<(), Error> {
        for (what, value) in [
            ("response_timeout", self.response_timeout),
            ("probe_interval", self.probe_interval),
        ] {
            if value.is_zero() {
                return Err(Error::InvalidArgument(format!(
                    "{what} must be more than zero"
                )));
            }
        }
        super::naming::check_prefix(&self.key_prefix)
    }
}

/// A limiter told when part of Redis comes back, so that what its fallback
/// holds goes back to Redis whether or not it is called again.
pub(crate) trait Recover: Send + Sync {
    /// Some zone is up again. Must not block (spawn the work).
    fn recovered(&self);
}

/// The probe's work: a target for each zone a call found down, and the
/// slots marked down only because their node's other slots were.
#[derive(Default)]
struct Probes {
    running: bool,
    targets: BTreeMap<Zone, ProbeTarget>,
    widened: BTreeSet<u16>,
}

/// How much of the backend a failure takes down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// All of it: there is no connection at all.
    Backend,
    /// The zone of the failing call's key: the whole backend on a single
    /// server, the key's node on a cluster.
    Key,
}

/// One group of zones the probe tests with one script call: a node's
/// slots, or a zone on its own.
struct Group {
    zones: Vec<Zone>,
    target: Option<ProbeTarget>,
}

impl Backend {
    /// A backend on `target` with the options of `connecting` (checked).
    pub(crate) fn new(target: Target, runtime: RuntimeRef, connecting: &Connecting) -> Backend {
        let cluster = target.is_cluster();
        Backend {
            target,
            link: Link::default(),
            health: Health::new(cluster),
            runtime,
            options: connecting.clone(),
            probes: Mutex::default(),
            recovering: Mutex::default(),
        }
    }

    fn recovering(&self) -> MutexGuard<'_, HashMap<usize, Weak<dyn Recover>>> {
        self.recovering
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Tells `limiter` of every recovery from now on, until it is dropped
    /// (which calls [`forget_recovery`](Self::forget_recovery)).
    pub(crate) fn on_recovery(&self, limiter: Weak<dyn Recover>) {
        let address = limiter.as_ptr().cast::<()>() as usize;
        self.recovering().insert(address, limiter);
    }

    /// Forgets the limiter at `address`, being dropped.
    pub(crate) fn forget_recovery(&self, address: *const ()) {
        self.recovering().remove(&(address as usize));
    }

    /// Tells the limiters that asked that zones came back.
    fn tell_recovered(&self) {
        let limiters: Vec<Arc<dyn Recover>> = self
            .recovering()
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for limiter in limiters {
            limiter.recovered();
        }
    }

    /// The first attempt to reach Redis: a fresh connection and the
    /// script's probe on it, on `target`. On failure the backend starts
    /// degraded (its probe running), or, when `require` is set, the failure
    /// is returned.
    pub(crate) async fn start(
        self: &Arc<Self>,
        require: bool,
        target: ProbeTarget,
    ) -> Result<(), Error> {
        let (failure, scope) = match self.target.connect(self.options.response_timeout).await {
            Ok(mut connection) => match self.run_probe(&mut connection, &target).await {
                Ok(()) => {
                    self.link.replace(connection);
                    return Ok(());
                }
                // The cluster answers, but not on this key's node: the
                // connection serves the others.
                Err(failure) => {
                    if self.health.is_cluster() {
                        self.link.replace(connection);
                    }
                    (failure, Scope::Key)
                }
            },
            Err(failure) => (failure, Scope::Backend),
        };
        if require || refuses_client(&failure, scope == Scope::Backend) {
            return Err(Error::Backend(failure));
        }
        self.degrade(&failure, target, scope);
        Ok(())
    }

    /// Marks the zone `scope` names down after `failure` (once: later
    /// failures there change nothing), so that its calls serve from their
    /// fallbacks, and has the probe test it with the script on `target`'s key.
    pub(crate) fn degrade(
        self: &Arc<Self>,
        failure: &BackendError,
        target: ProbeTarget,
        scope: Scope,
    ) {
        let zone = match scope {
            Scope::Backend => Zone::All,
            Scope::Key => self.health.zone_of(&target.key),
        };
        self.health.set_last_error(&failure.to_string());
        let mut probes = self.probes();
        let first = !self.health.any_down();
        if !self.health.mark_down(zone) {
            return;
        }
        if first {
            tracing::warn!(
                target = %self.target.describe(),
                key = %target.key,
                error = %failure,
                "Redis is unavailable; limiters serve from their fallbacks until the script works again"
            );
        } else {
            tracing::debug!(key = %target.key, error = %failure, "one more part of Redis is unavailable");
        }
        probes.targets.insert(zone, target);
        if !probes.running {
            probes.running = true;
            self.spawn(probe(Arc::downgrade(self)));
        }
    }

    fn probes(&self) -> MutexGuard<'_, Probes> {
        self.probes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The script's probe mode on `connection`, bounded by the response
    /// timeout (it writes: a server that refuses writes fails it). A call
    /// the script rejects for the key's data is not an outage.
    async fn run_probe(
        &self,
        connection: &mut Connection,
        target: &ProbeTarget,
    ) -> Result<(), BackendError> {
        let probe = script::invoke::<super::reply::Reply>(
            connection,
            &target.key,
            &Call::Probe,
            &target.script_args,
        );
        match tokio::time::timeout(self.options.response_timeout, probe).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) if script::is_data_error(&e) => Ok(()),
            Ok(Err(e)) => Err(BackendError::new(format!(
                "the probe's script failed on key {}",
                target.key
            ))
            .with_source(e)),
            Err(_) => Err(BackendError::new(format!(
                "the probe's script did not answer within {:?} (key {})",
                self.options.response_timeout, target.key
            ))
            .with_timeout(true)),
        }
    }

    /// One round of the probe: a fresh connection, then the script once per
    /// group of zones that are down ([`groups`](Self::groups)). Every group
    /// whose script works comes back, and the connection then replaces the
    /// one in use.
    async fn probe_round(&self) {
        let targets = self.probes().targets.clone();
        let bound = if self.target.is_cluster() {
            self.options.response_timeout.max(CLUSTER_PROBE_CONNECT)
        } else {
            self.options.response_timeout
        };
        let connection = match self.target.connect(bound).await {
            Ok(connection) => connection,
            Err(failure) => {
                self.health.set_last_error(&failure.to_string());
                // A cluster that refuses every connection is down as a
                // whole. (One that is slow to connect may have one node
                // hung and the others fine: that stays per node.)
                let refused = self.health.is_cluster() && !failure.is_timeout();
                if let Some(target) = targets.values().next().filter(|_| refused) {
                    let mut probes = self.probes();
                    if self.health.mark_down(Zone::All) {
                        probes.targets.insert(Zone::All, target.clone());
                    }
                }
                return;
            }
        };
        let groups = self.groups(&connection, &targets).await;
        let probing = groups.iter().filter_map(|group| {
            let target = group.target.as_ref()?;
            let mut connection = connection.clone();
            Some(async move { (group, self.run_probe(&mut connection, target).await) })
        });
        let mut recovered = Vec::new();
        let mut narrowed = Vec::new();
        for (group, result) in futures::future::join_all(probing).await {
            match result {
                Ok(()) => recovered.push(group),
                // A cluster that could not be reached at all is reached
                // again: from now on its nodes are down or up one by one,
                // starting with the node of the key the script failed on.
                Err(e) if self.health.is_cluster() && group.zones == [Zone::All] => {
                    self.health.set_last_error(&e.to_string());
                    narrowed.extend(group.target.clone());
                }
                Err(e) => self.health.set_last_error(&e.to_string()),
            }
        }
        let recoveries = self.health.zone_recoveries();
        if !recovered.is_empty() || !narrowed.is_empty() {
            self.link.replace(connection);
        }
        {
            let mut probes = self.probes();
            for target in &narrowed {
                let zone = self.health.zone_of(&target.key);
                self.health.mark_down(zone);
                probes.targets.entry(zone).or_insert_with(|| target.clone());
                probes.targets.remove(&Zone::All);
                self.health.mark_up_all(&[Zone::All]);
            }
            for group in recovered {
                for zone in &group.zones {
                    probes.targets.remove(zone);
                    if let Zone::Slot(slot) = zone {
                        probes.widened.remove(slot);
                    }
                }
                self.health.mark_up_all(&group.zones);
                if self.health.is_cluster() {
                    tracing::info!(
                        target = %self.target.describe(),
                        key = %group.target.as_ref().map_or("", |t| &t.key),
                        slots = group.zones.len(),
                        "the limiters' script works again on this key's node; its slots are back on Redis"
                    );
                }
            }
            // Slots marked down with a node that no longer shows a failing
            // key (the slot map changed, or could not be read): back.
            let released: Vec<Zone> = groups
                .iter()
                .filter(|g| g.target.is_none())
                .flat_map(|g| &g.zones)
                .filter(|zone| matches!(zone, Zone::Slot(slot) if probes.widened.remove(slot)))
                .copied()
                .collect();
            self.health.mark_up_all(&released);
        }
        if !narrowed.is_empty() {
            self.widen_now().await;
        }
        // Only now: a failing node's other slots, which read as up until
        // widen_now marks them, would otherwise be sent carry-backs that
        // hang on it (and, on a cluster connection, hold other calls).
        if self.health.zone_recoveries() != recoveries {
            self.tell_recovered();
        }
    }

    /// The zones that are down, grouped for the probe: the whole backend on
    /// its own; on a cluster, each node's slots together (marking the rest
    /// of a failing node's slots down too), or each slot on its own when
    /// the slot map cannot be read.
    async fn groups(
        &self,
        connection: &Connection,
        targets: &BTreeMap<Zone, ProbeTarget>,
    ) -> Vec<Group> {
        let mut groups = Vec::new();
        if let Some(target) = targets.get(&Zone::All) {
            groups.push(Group {
                zones: vec![Zone::All],
                target: Some(target.clone()),
            });
        }
        // Empty on a single server.
        let down = self.health.down_slots();
        if down.is_empty() {
            return groups;
        }
        let alone = |slot| Group {
            zones: vec![Zone::Slot(slot)],
            target: targets.get(&Zone::Slot(slot)).cloned(),
        };
        let Some(map) = self.slot_map(connection).await else {
            groups.extend(down.into_iter().map(alone));
            return groups;
        };
        let mut by_node: BTreeMap<Option<usize>, Vec<u16>> = BTreeMap::new();
        for slot in down {
            by_node.entry(map.owner(slot)).or_default().push(slot);
        }
        let mut probes = self.probes();
        for (node, slots) in by_node {
            let target = slots
                .iter()
                .find_map(|slot| targets.get(&Zone::Slot(*slot)).cloned());
            match (node, &target) {
                (Some(node), Some(_)) => {
                    // The node is failing: all of its slots are down.
                    let all = map.slots_of(node);
                    for slot in &all {
                        if self.health.mark_down(Zone::Slot(*slot)) {
                            probes.widened.insert(*slot);
                        }
                    }
                    groups.push(Group {
                        zones: all.into_iter().map(Zone::Slot).collect(),
                        target,
                    });
                }
                (None, _) => groups.extend(slots.into_iter().map(alone)),
                (Some(_), None) => groups.push(Group {
                    zones: slots.into_iter().map(Zone::Slot).collect(),
                    target: None,
                }),
            }
        }
        groups
    }

    /// The cluster's slot map, read from a node (up to three tries, each
    /// within the response timeout); `None` if none answers, or on a single
    /// server. `CLUSTER SLOTS` is deprecated since Redis 7.0 but still
    /// served, and `CLUSTER SHARDS` says nothing more this needs (which node
    /// owns each slot).
    async fn slot_map(&self, connection: &Connection) -> Option<SlotMap> {
        for _ in 0..3 {
            let asked = connection.ask_any_node(redis::cmd("CLUSTER").arg("SLOTS").clone());
            match tokio::time::timeout(self.options.response_timeout, asked).await {
                // A single server: there is no slot map to read.
                Ok(None) => return None,
                Ok(Some(Ok(reply))) => {
                    if let Some(map) = SlotMap::parse(&reply) {
                        return Some(map);
                    }
                }
                Ok(Some(Err(_))) | Err(_) => {}
            }
        }
        None
    }

    /// Whether the probe has nothing left to do; if so it ends (under the
    /// lock, so that a zone marked down meanwhile starts a new one), and
    /// slots marked down only with their node come back.
    fn probe_done(&self) -> bool {
        let mut probes = self.probes();
        if !probes.targets.is_empty() {
            return false;
        }
        let widened: Vec<Zone> = std::mem::take(&mut probes.widened)
            .into_iter()
            .map(Zone::Slot)
            .collect();
        let back = self.health.mark_up_all(&widened);
        probes.running = false;
        drop(probes);
        if back > 0 {
            self.tell_recovered();
        }
        true
    }

    /// Right after a cluster call failed: reads the slot map on the
    /// connection in use and marks the failing node's other slots down, so
    /// that their calls do not each wait for a timeout first.
    async fn widen_now(&self) {
        let Some(connection) = self.connection().filter(|_| self.health.is_cluster()) else {
            return;
        };
        let targets = self.probes().targets.clone();
        self.groups(&connection, &targets).await;
    }

    /// The connection calls use, or `None` if none has worked yet.
    pub(crate) fn connection(&self) -> Option<Connection> {
        self.link.get()
    }
}

/// Probes every `probe_interval` ([`Backend::probe_round`]) until every
/// zone that is down works again, or the backend is dropped (with its last
/// limiter and handle).
async fn probe(backend: Weak<Backend>) {
    if let Some(backend) = backend.upgrade() {
        backend.widen_now().await;
    }
    loop {
        let Some(interval) = backend.upgrade().map(|b| b.options.probe_interval) else {
            return;
        };
        tokio::time::sleep(interval).await;
        let Some(backend) = backend.upgrade() else {
            return;
        };
        backend.probe_round().await;
        if backend.probe_done() {
            if !backend.health.any_down() {
                tracing::info!(
                    target = %backend.target.describe(),
                    "the limiters' script works again; back on Redis"
                );
            }
            return;
        }
    }
}
