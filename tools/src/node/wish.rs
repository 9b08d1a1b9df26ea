//! What the catalog asks of one stream on a node, running or paused ([`Wish`]), shared by the
//! node's catalog loop (`streams.rs`, which sets it from each catalog it takes in) and the
//! stream's supervisor (`stream.rs`, which switches its run to match and says what it runs).
//!
//! A run switches as [`Switch`] decides. A pause is taken by the node that coordinates the
//! stream's checkpoints: it takes a savepoint, then ends its run and starts a paused one
//! at a newer epoch, which ends the other nodes' runs (a peer in a later run); they read the
//! catalog again before they start their next, so they start paused too. A node that sees the
//! pause and no coordinator switch within [`PAUSE_ALONE`] pauses on its own (its tasks restore
//! the last commit when resumed, exactly as after a failure). A resume needs no checkpoint:
//! every node switches as soon as it sees it. A switch is no failure: it does not count against
//! the restart strategy.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use weir_engine::cluster::RunEnd;
use weir_engine::runtime::Engine;
use weir_engine::wire::CheckpointId;
use weir_engine::wire::msg::{CheckpointOutcome, CheckpointStats};

/// How long a node that does not coordinate the stream waits for the coordinator's pause
/// before it pauses on its own.
pub(super) const PAUSE_ALONE: Duration = Duration::from_secs(15);

/// How long the final checkpoint of a pause may take before the stream pauses without it.
pub(super) const FINAL_CHECKPOINT: Duration = Duration::from_secs(10);

/// What the stream's supervisor runs now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Now {
    /// No run (starting, between runs, idle, fenced).
    Nothing = 0,
    /// A run with its tasks.
    Running = 1,
    /// A paused run.
    Paused = 2,
}

/// What the catalog asks of a stream here, and what its supervisor runs.
#[derive(Debug)]
pub(super) struct Wish {
    paused: AtomicBool,
    /// The supervisor asks for a catalog read now.
    refresh: AtomicBool,
    /// Catalog reads asked for and taken in, counted.
    reads: AtomicU64,
    /// Changes of `paused`, counted.
    changes: AtomicU64,
    now: AtomicU8,
}

impl Wish {
    pub fn new(paused: bool) -> Self {
        Wish {
            paused: AtomicBool::new(paused),
            refresh: AtomicBool::new(false),
            reads: AtomicU64::new(0),
            changes: AtomicU64::new(0),
            now: AtomicU8::new(Now::Nothing as u8),
        }
    }

    /// Whether the catalog pauses the stream.
    pub fn paused(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }

    /// The catalog pauses the stream or not: whether that changed.
    pub fn set_paused(&self, paused: bool) -> bool {
        let changed = self.paused.swap(paused, Ordering::AcqRel) != paused;
        if changed {
            self.changes.fetch_add(1, Ordering::AcqRel);
        }
        changed
    }

    /// How often `paused` changed.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// A catalog read that began after [`Wish::wants_read`] said so was taken in (after
    /// [`Wish::set_paused`]).
    pub fn read(&self) {
        self.reads.fetch_add(1, Ordering::AcqRel);
    }

    /// Whether the supervisor asked for a read (the request is taken).
    pub fn wants_read(&self) -> bool {
        self.refresh.swap(false, Ordering::AcqRel)
    }

    /// Asks for a catalog read and waits at most `limit` for it: whether one came.
    pub fn reread(&self, limit: Duration) -> bool {
        let before = self.reads.load(Ordering::Acquire);
        self.refresh.store(true, Ordering::Release);
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if self.reads.load(Ordering::Acquire) > before {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    pub fn set_now(&self, now: Now) {
        self.now.store(now as u8, Ordering::Release);
    }

    pub fn now(&self) -> Now {
        match self.now.load(Ordering::Acquire) {
            1 => Now::Running,
            2 => Now::Paused,
            _ => Now::Nothing,
        }
    }
}

/// The switch of one run to the other kind, as the supervisor's watch polls it.
pub(super) struct Switch {
    /// The run's kind.
    paused: bool,
    /// The wish's changes when the run started.
    changes: u64,
    /// Since when the wish asks for the other kind.
    seen: Option<Instant>,
    /// The final checkpoint asked for: until when it may take, and the last commit before it.
    checkpoint: Option<(Instant, Option<CheckpointId>)>,
}

impl Switch {
    /// The switch of `engine`'s run, which started under `wish` as it is now.
    pub fn new(engine: &Engine, wish: &Wish) -> Self {
        Switch { paused: engine.is_paused(), changes: wish.changes(), seen: None, checkpoint: None }
    }

    /// Whether the run ends now for a switch (polled often; it never blocks): a resume at once; a
    /// pause on the coordinator's node once the final checkpoint committed or ran out of time,
    /// on the others after [`PAUSE_ALONE`] (a peer's paused run ends theirs first).
    pub fn poll(&mut self, engine: &Engine, wish: &Wish, stream: &str) -> Option<RunEnd> {
        if wish.paused() == self.paused {
            (self.seen, self.checkpoint) = (None, None);
            return None;
        }
        let seen = *self.seen.get_or_insert_with(Instant::now);
        let switch = Some(RunEnd::Switched { newer: None });
        if !wish.paused() {
            return switch;
        }
        if !engine.coordinates() {
            if seen.elapsed() < PAUSE_ALONE {
                return None;
            }
            tracing::warn!(stream, "no paused run of the coordinator's node seen: pausing without it");
            return switch;
        }
        match self.checkpoint {
            None => {
                let before = committed(engine);
                if let Err(e) = engine.take_savepoint() {
                    tracing::warn!(stream, error = %e, "pausing without a final checkpoint: it could not start");
                    return switch;
                }
                self.checkpoint = Some((Instant::now() + FINAL_CHECKPOINT, before));
                None
            }
            Some((until, before)) => {
                if let Some(c) = savepoint(engine).filter(|c| Some(*c) > before) {
                    tracing::info!(stream, checkpoint = c.0, "the savepoint before the pause committed");
                    return switch;
                }
                if Instant::now() >= until {
                    let limit = humantime::format_duration(FINAL_CHECKPOINT);
                    tracing::warn!(stream, "pausing without a final checkpoint: none committed within {limit}");
                    return switch;
                }
                None
            }
        }
    }

    /// How the run that ended as `ended` counts: one a peer's later run ended is a switch when
    /// the catalog, read again now, changed during the run or asks for the other kind, or when it
    /// was a paused run (which loses nothing); anything else is as it ended.
    pub fn ended(&self, ended: RunEnd, wish: &Wish) -> RunEnd {
        if !matches!(ended, RunEnd::Failed { newer: Some(_), .. }) {
            return ended;
        }
        if !wish.reread(Duration::from_secs(2)) {
            tracing::debug!("no catalog read within 2s: the stream's state is the last one read");
        }
        classify(ended, self.paused, wish.paused(), wish.changes() != self.changes)
    }
}

/// [`Switch::ended`]'s decision: `ended` of a run of kind `run_paused`, the catalog now asking
/// for `wish_paused`, `changed` since the run started.
fn classify(ended: RunEnd, run_paused: bool, wish_paused: bool, changed: bool) -> RunEnd {
    match ended {
        RunEnd::Failed { newer: Some(newer), .. } if run_paused || changed || wish_paused != run_paused => {
            RunEnd::Switched { newer: Some(newer) }
        }
        other => other,
    }
}

/// The newest checkpoint the coordinator's node has seen commit.
fn committed(engine: &Engine) -> Option<CheckpointId> {
    newest(engine, |_| true)
}

/// The newest savepoint the coordinator's node has seen commit.
fn savepoint(engine: &Engine) -> Option<CheckpointId> {
    newest(engine, |c| c.savepoint)
}

fn newest(engine: &Engine, f: impl Fn(&CheckpointStats) -> bool) -> Option<CheckpointId> {
    let status = engine.status();
    status.checkpoints.iter().filter(|c| c.outcome == CheckpointOutcome::Committed && f(c)).map(|c| c.checkpoint).max()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_a_peers_later_run_ended_is_a_switch_only_when_the_catalog_says_so_or_it_was_paused() {
        let superseded = || RunEnd::Failed { why: "node 1 runs a later run".into(), newer: Some(7) };
        let switch = RunEnd::Switched { newer: Some(7) };
        // A running run ended by a peer's pause, whether the catalog shows it yet or changed twice.
        assert_eq!(classify(superseded(), false, true, true), switch);
        assert_eq!(classify(superseded(), false, false, true), switch, "paused and resumed meanwhile");
        // A paused run ended by a later run loses nothing, whatever ended it.
        assert_eq!(classify(superseded(), true, true, false), switch);
        // A running run ended by a peer's failure, the catalog unchanged: a failure.
        assert_eq!(classify(superseded(), false, false, false), superseded());
        // Anything but a later run is as it ended.
        let lost = RunEnd::Failed { why: "node 2 lost".into(), newer: None };
        assert_eq!(classify(lost.clone(), false, true, true), lost);
        assert_eq!(classify(RunEnd::Signal, true, false, true), RunEnd::Signal);
    }

    #[test]
    fn a_reread_waits_for_the_next_catalog_read() {
        let wish = std::sync::Arc::new(Wish::new(false));
        assert!(!wish.reread(Duration::from_millis(30)), "nobody read the catalog");
        assert!(wish.wants_read(), "the request stays until taken");
        assert!(!wish.wants_read());
        let reader = wish.clone();
        let t = std::thread::spawn(move || {
            while !reader.wants_read() {
                std::thread::sleep(Duration::from_millis(1));
            }
            reader.set_paused(true);
            reader.read();
        });
        assert!(wish.reread(Duration::from_secs(30)));
        assert!(wish.paused());
        t.join().unwrap();
    }
}
