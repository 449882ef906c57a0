//! Queue settings kept where a lost store cannot reach them (SPEC 2.2, "Places that survive the store";
//! issue 29). A Redis restarted empty, flushed, or failed over to an empty replica loses every queue's
//! settings with its members; a queue first entered again would be made with the defaults, and a paused
//! queue would admit at once. So every instance keeps the last settings (and epoch) it saw of each queue
//! in its own data directory, and the Redis store makes a lost queue again with those, not the defaults.
//!
//! The copy follows the store: it is updated whenever this instance writes or reads a queue's settings
//! (an admin PUT, the admin view, the scheduler's preview, and [`super::QueueStore::keep_settings`]'s
//! sweep, which catches what other instances changed: it reads every queue again when the store-wide
//! settings version moved, which every settings write and delete bumps, and every five minutes
//! regardless), and a queue deleted or forgotten on purpose is dropped from it. The file is rewritten whole (a temporary file renamed over it) only when something
//! changed: settings change rarely, and a few hundred queues' settings are a few tens of kilobytes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use rankgate_core::queue::{QueueName, QueueSettings};
use serde::{Deserialize, Serialize};

/// File name of the kept settings inside the data directory.
pub const KEPT_SETTINGS_FILE: &str = "kept-queue-settings.json";

/// One queue's kept settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Kept {
    /// The settings as last seen.
    pub settings: QueueSettings,
    /// The epoch they were seen in (0 until one was read).
    pub epoch: u64,
    /// Configured by an admin PUT (the queue is made again as configured, so it is not forgotten idle).
    pub managed: bool,
    /// The scheduled opening (`opensAt`, ms), if any: a lost queue whose opening is still ahead is
    /// scheduled again (with a fresh seed: the old one, and its commitment, were lost with the store).
    #[serde(default)]
    pub opens_at_ms: Option<i64>,
    /// That opening's `drawBeaconRound`, if it names one: scheduled again with it.
    #[serde(default)]
    pub beacon_round: Option<u64>,
}

/// Every queue's kept settings, in memory and (once [`KeptSettings::persist_in`] named a directory) on disk.
#[derive(Debug, Default)]
pub struct KeptSettings {
    state: Mutex<KeptState>,
}

#[derive(Debug, Default)]
struct KeptState {
    queues: BTreeMap<String, Kept>,
    file: Option<PathBuf>,
}

/// What [`KeptSettings::observe`] learnt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// Nothing new, or a change of settings.
    Same,
    /// The queue's epoch is not the one kept: the store lost the queue since (or another instance deleted
    /// and made it again). Carries the epoch that was kept.
    EpochChanged(u64),
}

impl KeptSettings {
    /// Loads `dir`'s kept settings (if any) under what is already kept in memory, and writes every later
    /// change there. A file that does not parse is set aside (`.json.damaged`) and reported, not fatal: the
    /// copy is a safety net. An I/O failure (the directory cannot be read or written) is an error.
    pub fn persist_in(&self, dir: &Path) -> std::io::Result<()> {
        let path = dir.join(KEPT_SETTINGS_FILE);
        let mut state = self.state.lock();
        match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<BTreeMap<String, Kept>>(&bytes) {
                Ok(loaded) => {
                    for (queue, kept) in loaded {
                        state.queues.entry(queue).or_insert(kept);
                    }
                }
                Err(e) => {
                    // A damaged copy is set aside (for whoever investigates) and the start goes on with
                    // what the store holds: the copy is a safety net, not the source of truth.
                    let aside = path.with_extension("json.damaged");
                    tracing::warn!(error = %e, file = %path.display(), aside = %aside.display(), "the kept queue settings could not be read; set aside");
                    std::fs::rename(&path, &aside)?;
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        state.file = Some(path);
        write(&state)
    }

    /// The kept settings of `queue`, if any.
    #[must_use]
    pub fn get(&self, queue: &QueueName) -> Option<Kept> {
        self.state.lock().queues.get(queue.as_str()).cloned()
    }

    /// Records `settings` of `queue` as read or written now, in `epoch` when the read said (`None`: keep
    /// the kept epoch). `managed`: `Some` when the read said.
    pub fn observe(
        &self,
        queue: &QueueName,
        settings: &QueueSettings,
        epoch: Option<u64>,
        managed: Option<bool>,
    ) -> Observed {
        let mut state = self.state.lock();
        let previous = state.queues.get(queue.as_str()).cloned();
        let mut next = previous.clone().unwrap_or(Kept {
            settings: settings.clone(),
            epoch: 0,
            managed: false,
            opens_at_ms: None,
            beacon_round: None,
        });
        let mut observed = Observed::Same;
        next.settings = settings.clone();
        if let Some(epoch) = epoch {
            if next.epoch != 0 && next.epoch != epoch {
                observed = Observed::EpochChanged(next.epoch);
            }
            next.epoch = epoch;
        }
        if let Some(managed) = managed {
            next.managed = managed;
        }
        if previous.as_ref() != Some(&next) {
            state.queues.insert(queue.as_str().to_owned(), next);
            if let Err(e) = write(&state) {
                tracing::warn!(error = %e, "could not write the kept queue settings");
            }
        }
        observed
    }

    /// Records `queue`'s scheduled opening (`None`: cleared). Only queues already kept are changed: an
    /// opening is scheduled through an admin write, which kept the queue first.
    pub fn observe_opening(&self, queue: &QueueName, opens_at_ms: Option<i64>) {
        let mut state = self.state.lock();
        let Some(kept) = state.queues.get_mut(queue.as_str()) else {
            return;
        };
        if kept.opens_at_ms != opens_at_ms {
            kept.opens_at_ms = opens_at_ms;
            if let Err(e) = write(&state) {
                tracing::warn!(error = %e, "could not write the kept queue settings");
            }
        }
    }

    /// Records the `drawBeaconRound` of `queue`'s scheduled opening (`None`: none). Only queues already
    /// kept are changed, as for [`KeptSettings::observe_opening`].
    pub fn observe_beacon_round(&self, queue: &QueueName, round: Option<u64>) {
        let mut state = self.state.lock();
        let Some(kept) = state.queues.get_mut(queue.as_str()) else {
            return;
        };
        if kept.beacon_round != round {
            kept.beacon_round = round;
            if let Err(e) = write(&state) {
                tracing::warn!(error = %e, "could not write the kept queue settings");
            }
        }
    }

    /// Keeps only the queues `keep` says yes to (the store lists the others no more: deleted or forgotten
    /// by some instance).
    pub fn retain(&self, mut keep: impl FnMut(&str) -> bool) {
        let mut state = self.state.lock();
        let before = state.queues.len();
        state.queues.retain(|queue, _| keep(queue));
        if state.queues.len() != before {
            if let Err(e) = write(&state) {
                tracing::warn!(error = %e, "could not write the kept queue settings");
            }
        }
    }

    /// Forgets `queue` (deleted or forgotten on purpose: it must not come back configured).
    pub fn forget(&self, queue: &QueueName) {
        let mut state = self.state.lock();
        if state.queues.remove(queue.as_str()).is_some() {
            if let Err(e) = write(&state) {
                tracing::warn!(error = %e, "could not write the kept queue settings");
            }
        }
    }
}

/// Writes the whole copy: a temporary file beside it, then renamed over it, so a crash leaves the old
/// copy or the new one, never half of one.
fn write(state: &KeptState) -> std::io::Result<()> {
    let Some(path) = &state.file else {
        return Ok(());
    };
    let temporary = path.with_extension("json.tmp");
    let bytes = serde_json::to_vec_pretty(&state.queues).map_err(std::io::Error::other)?;
    std::fs::write(&temporary, bytes)?;
    std::fs::rename(&temporary, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_settings_survive_a_restart_and_tell_a_changed_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let queue = QueueName::parse("sale").unwrap();
        let paused = QueueSettings {
            paused: true,
            admit_per_second: 0.5,
            ..QueueSettings::default()
        };
        let kept = KeptSettings::default();
        kept.persist_in(dir.path()).unwrap();
        assert_eq!(kept.observe(&queue, &paused, Some(7), Some(true)), Observed::Same);
        let again = KeptSettings::default();
        again.persist_in(dir.path()).unwrap();
        let read = again.get(&queue).unwrap();
        assert_eq!(
            (read.settings, read.epoch, read.managed),
            (paused.clone(), 7, true)
        );
        assert_eq!(
            again.observe(&queue, &paused, Some(9), None),
            Observed::EpochChanged(7)
        );
        assert_eq!(again.observe(&queue, &paused, None, None), Observed::Same);
        again.forget(&queue);
        let third = KeptSettings::default();
        third.persist_in(dir.path()).unwrap();
        assert!(third.get(&queue).is_none());
    }

    #[test]
    fn a_damaged_copy_is_set_aside_and_the_start_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(KEPT_SETTINGS_FILE), b"{\"sale\": {\x01garbage").unwrap();
        let kept = KeptSettings::default();
        kept.persist_in(dir.path()).unwrap();
        assert!(kept.get(&QueueName::parse("sale").unwrap()).is_none());
        assert!(dir.path().join("kept-queue-settings.json.damaged").exists());
        let written: BTreeMap<String, Kept> =
            serde_json::from_slice(&std::fs::read(dir.path().join(KEPT_SETTINGS_FILE)).unwrap()).unwrap();
        assert!(written.is_empty(), "a fresh copy replaces it");
    }
}
