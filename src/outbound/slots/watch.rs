//! The watch: one thread that looks at a key's slots when a slot kept for
//! a waiter is due to be taken, so that a waiter that is not polled in time
//! (parked, or forgotten) holds up the others for that moment, not for
//! ever, even if no other call comes to look. Started the first time a slot is kept for a
//! waiter; it sleeps while nothing is due. It needs no async runtime, and
//! no timer of one.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Instant;

/// What the watch runs when it is due: the next time it is due, if any.
pub(super) type Job = Box<dyn FnMut() -> Option<Instant> + Send>;

/// A job and when it is due; `seq` orders jobs due at the same instant.
struct Due {
    at: Instant,
    seq: u64,
    job: Job,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// The jobs, soonest first, and the count that numbers them.
#[derive(Default)]
struct Jobs {
    due: BinaryHeap<Reverse<Due>>,
    seq: u64,
}

struct Watch {
    jobs: Mutex<Jobs>,
    /// Signalled when a job comes that is due before every other.
    sooner: Condvar,
}

impl Watch {
    fn jobs(&self) -> MutexGuard<'_, Jobs> {
        self.jobs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn add(&self, at: Instant, job: Job) {
        let mut jobs = self.jobs();
        let soonest = jobs.due.peek().is_none_or(|Reverse(next)| at < next.at);
        jobs.seq += 1;
        let seq = jobs.seq;
        jobs.due.push(Reverse(Due { at, seq, job }));
        drop(jobs);
        if soonest {
            self.sooner.notify_one();
        }
    }

    /// Runs each job when it is due (outside the lock), and again when it
    /// says, for ever.
    fn run(&self) {
        let mut jobs = self.jobs();
        loop {
            let now = Instant::now();
            let Some(Reverse(next)) = jobs.due.peek() else {
                jobs = self
                    .sooner
                    .wait(jobs)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            };
            if next.at > now {
                let wait = next.at - now;
                jobs = match self.sooner.wait_timeout(jobs, wait) {
                    Ok((jobs, _)) => jobs,
                    Err(poisoned) => poisoned.into_inner().0,
                };
                continue;
            }
            let Some(Reverse(mut due)) = jobs.due.pop() else {
                continue;
            };
            drop(jobs);
            // A job that panics (in a key's own `Hash`, `Eq` or `Drop`) is
            // dropped, and the watch goes on for every other; so does a job
            // done whose key panics as it is dropped.
            let again = catch_unwind(AssertUnwindSafe(|| (due.job)())).unwrap_or(None);
            let due = match again {
                Some(at) => {
                    due.at = at;
                    Some(due)
                }
                None => {
                    let _ = catch_unwind(AssertUnwindSafe(move || drop(due)));
                    None
                }
            };
            jobs = self.jobs();
            if let Some(due) = due {
                jobs.due.push(Reverse(due));
            }
        }
    }
}

/// The process's watch, started at its first use; `None` if its thread
/// could not be started.
fn watch() -> Option<&'static Watch> {
    static WATCH: OnceLock<Option<&'static Watch>> = OnceLock::new();
    *WATCH.get_or_init(|| {
        let watch: &'static Watch = Box::leak(Box::new(Watch {
            jobs: Mutex::new(Jobs::default()),
            sooner: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("paceline-slots".to_owned())
            .spawn(move || watch.run())
            .ok()
            .map(|_| watch)
    })
}

/// Runs `job` at `at` (and again when it says) on the watch's thread;
/// `false` if the thread could not be started.
pub(super) fn at(at: Instant, job: Job) -> bool {
    match watch() {
        Some(watch) => {
            watch.add(at, job);
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// What a caller's key may do when dropped.
    struct PanicsWhenDropped;

    impl Drop for PanicsWhenDropped {
        fn drop(&mut self) {
            panic!("a key's own Drop panicked");
        }
    }

    /// A job done whose key panics as the job is dropped leaves the watch
    /// running for every other job: the watch's thread died with it, and
    /// no slot kept for a parked waiter was freed by the watch again (in
    /// the whole process) unless another call came to look.
    #[test]
    fn a_job_whose_key_panics_when_dropped_leaves_the_watch_running() {
        let key = PanicsWhenDropped;
        let job = move || {
            std::hint::black_box(&key);
            None
        };
        assert!(at(Instant::now(), Box::new(job)));
        let (sender, ran) = mpsc::channel();
        let next = move || {
            let _ = sender.send(());
            None
        };
        assert!(at(Instant::now(), Box::new(next)));
        assert!(
            ran.recv_timeout(Duration::from_secs(60)).is_ok(),
            "the watch no longer runs its jobs"
        );
    }
}
