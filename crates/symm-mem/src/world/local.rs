//! The host side of a single-process world: the ranks are threads of this process and meet in a
//! [`LocalGroup`] (a mutex and a condition variable) for all-gathers and barriers, under the same
//! rules as the multi-process rendezvous: a timeout names the missing ranks, a rank that drops its
//! `World` while others wait for it fails them at once, and any failure poisons the group.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::WorldError;

#[derive(Debug)]
pub(crate) struct LocalGroup {
    size: usize,
    timeout: Duration,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Debug)]
struct State {
    /// Completed collectives.
    generation: u64,
    slots: Vec<Option<Vec<u8>>>,
    /// The last completed collective's contributions, by rank.
    last: Arc<Vec<Vec<u8>>>,
    departed: Vec<bool>,
    failed: Option<String>,
}

impl LocalGroup {
    pub(crate) fn new(size: usize, timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            size,
            timeout,
            state: Mutex::new(State {
                generation: 0,
                slots: vec![None; size],
                last: Arc::new(Vec::new()),
                departed: vec![false; size],
                failed: None,
            }),
            changed: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A rank that panicked while holding the lock left the state consistent (no step here can
        // panic half-way), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every rank's `bytes`, indexed by rank, once all `size` ranks have called it.
    pub(crate) fn all_gather(
        &self,
        rank: usize,
        during: &str,
        bytes: &[u8],
    ) -> Result<Arc<Vec<Vec<u8>>>, WorldError> {
        let mut st = self.lock();
        if let Some(reason) = &st.failed {
            return Err(WorldError::Poisoned {
                rank,
                reason: reason.clone(),
            });
        }
        st.slots[rank] = Some(bytes.to_vec());
        if st.slots.iter().all(Option::is_some) {
            st.last = Arc::new(st.slots.iter_mut().map(|s| s.take().unwrap()).collect());
            st.generation += 1;
            self.changed.notify_all();
            return Ok(st.last.clone());
        }
        let generation = st.generation;
        let start = Instant::now();
        loop {
            if st.generation != generation {
                return Ok(st.last.clone());
            }
            if let Some(reason) = &st.failed {
                return Err(WorldError::Aborted {
                    rank,
                    during: during.into(),
                    reason: reason.clone(),
                });
            }
            let waited = start.elapsed();
            let missing: Vec<usize> = (0..self.size).filter(|&r| st.slots[r].is_none()).collect();
            let failure = if let Some(&peer) = missing.iter().find(|&&r| st.departed[r]) {
                Some(WorldError::PeerLost {
                    rank,
                    peer,
                    during: during.into(),
                })
            } else if waited >= self.timeout {
                Some(WorldError::Timeout {
                    rank,
                    during: during.into(),
                    missing,
                    waited,
                })
            } else {
                None
            };
            if let Some(failure) = failure {
                st.failed = Some(failure.to_string());
                self.changed.notify_all();
                return Err(failure);
            }
            st = self
                .changed
                .wait_timeout(st, self.timeout - waited)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// `rank` will call no more collectives (its `World` is dropped).
    pub(crate) fn depart(&self, rank: usize) {
        self.lock().departed[rank] = true;
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_gather_returns_every_rank_in_order_many_times() {
        let group = LocalGroup::new(4, Duration::from_secs(10));
        std::thread::scope(|s| {
            for rank in 0..4 {
                let group = &group;
                s.spawn(move || {
                    for round in 0..200u8 {
                        let all = group
                            .all_gather(rank, "test", &[rank as u8, round])
                            .unwrap();
                        let want: Vec<Vec<u8>> = (0..4).map(|r| vec![r, round]).collect();
                        assert_eq!(*all, want);
                    }
                });
            }
        });
    }

    #[test]
    fn a_missing_rank_times_out_and_poisons_the_group() {
        let group = LocalGroup::new(3, Duration::from_millis(100));
        let err = std::thread::scope(|s| {
            let waiter = s.spawn(|| group.all_gather(1, "test", &[]).unwrap_err());
            let err = group.all_gather(0, "test", &[]).unwrap_err();
            (err, waiter.join().unwrap())
        });
        let timeouts: Vec<_> = [&err.0, &err.1]
            .into_iter()
            .filter_map(|e| match e {
                WorldError::Timeout { missing, .. } => Some(missing.clone()),
                _ => None,
            })
            .collect();
        // One of the two notices first; the other is told.
        assert_eq!(timeouts, [vec![2]], "{err:?}");
        assert!(matches!(
            group.all_gather(2, "later", &[]),
            Err(WorldError::Poisoned { rank: 2, .. })
        ));
    }

    #[test]
    fn a_departed_rank_fails_its_waiters_at_once() {
        let group = LocalGroup::new(2, Duration::from_secs(60));
        let start = Instant::now();
        let err = std::thread::scope(|s| {
            let waiter = s.spawn(|| group.all_gather(0, "test", &[]));
            std::thread::sleep(Duration::from_millis(20));
            group.depart(1);
            waiter.join().unwrap().unwrap_err()
        });
        assert!(
            matches!(
                err,
                WorldError::PeerLost {
                    rank: 0,
                    peer: 1,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(start.elapsed() < Duration::from_secs(5));
    }
}
