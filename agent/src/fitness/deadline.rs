//! The fitness probes under a deadline: each probe runs on a thread of its own, and one that has
//! not answered by the round's deadline is [`Probed::TimedOut`] (a `probe_timeout` problem)
//! instead of freezing the gate. It owns which probe threads exist.
//!
//! A probe blocked in the kernel (statvfs of an NFS mount whose server is gone, a hard mount)
//! cannot be cancelled: its thread lives until the call returns, which may be never. So a probe
//! still hung from an earlier round is waited on again, never started a second time: at most one
//! thread per distinct probe ([`ProbeKey`]) exists at any time, and the probes are fixed by the
//! [`Requirements`] (a statvfs and a write per watched directory, the memory read, one lookup
//! per required tool), so hung threads are bounded by that count however long the mount hangs.
//!
//! Plain threads rather than `spawn_blocking`: a tokio runtime waits for its blocking tasks when
//! it shuts down, so one hung probe would keep the agent from exiting, and each would hold a
//! place in the runtime's blocking pool for good.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::probe::{HostProbes, Probes};
use super::{DirFacts, Facts, Probed, Requirements};

/// One probe, as the threads are counted: the same directory watched in two roles is one
/// statvfs and one write, not two (two write probes of one directory at once would also race
/// for its probe file).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum ProbeKey {
    FreeSpace(PathBuf),
    Write(PathBuf),
    Memory,
    Tool(String),
}

/// What one probe answered.
#[derive(Debug, Clone)]
enum Answer {
    FreeSpace(Result<u64, String>),
    Write(Result<(), String>),
    Memory(Option<u64>),
    Tool(Option<PathBuf>),
}

/// Runs the probes of one set of [`Requirements`], round after round, each bounded by
/// [`Requirements::deadline`].
pub(crate) struct Prober {
    required: Requirements,
    probes: Arc<dyn Probes>,
    /// The probes that did not answer by an earlier round's deadline and may still: their
    /// threads are alive, so they are waited on again instead of started anew.
    hung: HashMap<ProbeKey, oneshot::Receiver<Answer>>,
}

impl std::fmt::Debug for Prober {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prober")
            .field("required", &self.required)
            .field("hung", &self.hung.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Prober {
    /// Probes the host itself.
    pub(crate) fn host(required: Requirements) -> Prober {
        Prober::new(required, Arc::new(HostProbes))
    }

    /// Probes through `probes` (a test injects one that hangs).
    pub(crate) fn new(required: Requirements, probes: Arc<dyn Probes>) -> Prober {
        Prober {
            required,
            probes,
            hung: HashMap::new(),
        }
    }

    /// What is judged against.
    pub(crate) fn required(&self) -> &Requirements {
        &self.required
    }

    /// How many probe threads did not answer by their deadline and are still waited on.
    #[cfg(test)]
    pub(crate) fn hung(&self) -> usize {
        self.hung.len()
    }

    /// Measures everything the requirements name, answering by [`Requirements::deadline`]
    /// after the call whatever the probes do. An error only when a probe thread cannot be
    /// started or died without answering (no judgement can be made of that round).
    pub(crate) async fn measure(&mut self) -> std::io::Result<Facts> {
        let deadline = Instant::now() + self.required.deadline;
        let mut waiting = Vec::new();
        let mut failed = None;
        for key in self.keys() {
            let still_hung = self.hung.remove(&key).and_then(|mut pending| {
                // Still hung: its thread is alive; wait on it, start no second one. Answered
                // since the last round (an answer as old as that round is not today's) or gone:
                // probe afresh.
                matches!(pending.try_recv(), Err(oneshot::error::TryRecvError::Empty))
                    .then_some(pending)
            });
            let pending = match still_hung {
                Some(pending) => pending,
                None => match self.start(&key) {
                    Ok(pending) => pending,
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                },
            };
            waiting.push((key, pending));
        }
        if let Some(e) = failed {
            // The threads started are tracked, so none is started twice next round.
            self.hung.extend(waiting);
            return Err(e);
        }
        let mut answers = HashMap::new();
        let mut died = None;
        for (key, mut pending) in waiting {
            // One deadline for the round: every probe runs at once, so the round takes at most
            // the deadline, not the deadline per probe.
            match tokio::time::timeout_at(deadline, &mut pending).await {
                Ok(Ok(answer)) => {
                    answers.insert(key, answer);
                }
                Ok(Err(_)) => died = Some(key),
                Err(_elapsed) => {
                    self.hung.insert(key, pending);
                }
            }
        }
        if let Some(key) = died {
            return Err(std::io::Error::other(format!(
                "the fitness probe {key:?} stopped without answering"
            )));
        }
        Ok(self.facts(&answers))
    }

    /// Every distinct probe of the requirements.
    fn keys(&self) -> Vec<ProbeKey> {
        let mut keys = Vec::new();
        let mut add = |key: ProbeKey| {
            if !keys.contains(&key) {
                keys.push(key);
            }
        };
        for dir in &self.required.dirs {
            add(ProbeKey::FreeSpace(dir.path.clone()));
            add(ProbeKey::Write(dir.path.clone()));
        }
        // Nothing to judge without a policy's memory_max: nothing to read.
        if self.required.memory.is_some() {
            add(ProbeKey::Memory);
        }
        for tool in &self.required.tools {
            add(ProbeKey::Tool(tool.clone()));
        }
        keys
    }

    /// Starts `key`'s probe on a thread of its own.
    fn start(&self, key: &ProbeKey) -> std::io::Result<oneshot::Receiver<Answer>> {
        let (answer, pending) = oneshot::channel();
        let probes = Arc::clone(&self.probes);
        let key = key.clone();
        let path: OsString = self.required.path.clone();
        std::thread::Builder::new()
            .name("rm-fitness-probe".to_owned())
            .spawn(move || {
                let measured = match key {
                    ProbeKey::FreeSpace(dir) => Answer::FreeSpace(probes.free_bytes(&dir)),
                    ProbeKey::Write(dir) => Answer::Write(probes.write(&dir)),
                    ProbeKey::Memory => Answer::Memory(probes.mem_available()),
                    ProbeKey::Tool(tool) => Answer::Tool(probes.find_tool(&tool, &path)),
                };
                // The round may have stopped waiting (and a later one begun afresh): an
                // answer nobody takes is dropped.
                let _ = answer.send(measured);
            })?;
        Ok(pending)
    }

    /// The facts in the order of the requirements; a probe without an answer timed out.
    fn facts(&self, answers: &HashMap<ProbeKey, Answer>) -> Facts {
        // An answer is shared by the requirements that name the same probe.
        let take = |key: ProbeKey| answers.get(&key).cloned();
        Facts {
            dirs: self
                .required
                .dirs
                .iter()
                .map(|dir| DirFacts {
                    free: match take(ProbeKey::FreeSpace(dir.path.clone())) {
                        Some(Answer::FreeSpace(free)) => Probed::Answered(free),
                        _ => Probed::TimedOut,
                    },
                    write: match take(ProbeKey::Write(dir.path.clone())) {
                        Some(Answer::Write(write)) => Probed::Answered(write),
                        _ => Probed::TimedOut,
                    },
                })
                .collect(),
            mem_available: if self.required.memory.is_none() {
                Probed::Answered(None)
            } else {
                match take(ProbeKey::Memory) {
                    Some(Answer::Memory(available)) => Probed::Answered(available),
                    _ => Probed::TimedOut,
                }
            },
            tools: self
                .required
                .tools
                .iter()
                .map(|tool| match take(ProbeKey::Tool(tool.clone())) {
                    Some(Answer::Tool(found)) => Probed::Answered(found),
                    _ => Probed::TimedOut,
                })
                .collect(),
        }
    }
}
