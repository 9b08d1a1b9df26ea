//! Ingest replication on the writer thread: a partition's primary ships its entries to
//! the partition's follower and acknowledges a client's append only once the follower has it
//! durably; a follower writes what its primaries ship and answers where its copy ends.
//!
//! Invariants:
//! - An append is acknowledged to its client only when it is durable on both nodes: the
//!   primary's sync, and the follower's answer ([`ReplicateAck::next`]) past its last version.
//!   Refusals (nothing stored) go out at once.
//! - The primary ships its entries in version order as soon as they are written (in the page
//!   cache: they survive a killed process), so the follower's sync runs beside the primary's
//!   group commit instead of after it; from where the follower's copy ends, and whatever goes
//!   wrong (a lost message, a follower that restarted, a refusal) it ships again from the
//!   follower's last answer, and the follower skips what it holds. So the copy is always a
//!   prefix of the primary's log.
//! - A follower whose copy holds more than the primary (the primary lost its disk, or its
//!   unsynced tail in a power loss: those entries were never acknowledged) is started afresh
//!   from the primary's log: the primary's log is the partition. So is a copy that holds
//!   *other* entries at versions the primary also has (the primary wrote new rows there after
//!   the loss): nothing counts on a copy (no acknowledgement released, no reader let further)
//!   until an answer shows it a prefix of the primary's log: it ends no further than this log
//!   did when the writer started (past that, it holds what an earlier run shipped and this log
//!   lost, whatever its last entry), and its chained checksum there (`ingest/chain.rs`, which
//!   stands for every entry below) equals the primary's at the same version (an earlier writer
//!   run may have written past the copy's end; as Raft's log matching). Each writer run, and
//!   each reset, is a new session: answers to an earlier one are ignored.
//! - With a control store, a copy that has not reached what was durable here within the
//!   in-sync lag is written out of the partition's in-sync set, and appends are then
//!   acknowledged on the primary's sync alone (`in_sync.rs`: only once the store says so);
//!   keeping up again, appends wait for it, and once it holds all they were acknowledged or
//!   read alone it is written back in. A copy that diverged or shrank is written out at once.
//!   Out of the set, the source reads all that is durable here; `readable` never goes back.
//! - A copy that ends before the primary's log begins (retention deleted the rest) starts again
//!   where the primary's log begins, taking the producers' counts from the primary's ledger.
//!
//! The network is behind [`ReplicaLink`], so tests run two writers over channels and the engine
//! runs them over its transport.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use weir_wire::msg::{ReplicaProducer, Replicate, ReplicateAck};
use weir_wire::{NodeId, StreamId, Version};

use super::in_sync::{InSyncSet, Membership, Standing};
use super::log::IngestLog;
use super::reader::LogReader;
use super::service::Appended;

mod follower;
mod in_sync;
use follower::Answer;

/// Bytes of entries in one [`Replicate`] at most (a frame holds 16 MiB).
const SHIP_BYTES: usize = 4 << 20;
/// Messages shipped and not yet answered, per partition.
const IN_FLIGHT: usize = 32;
/// Without an answer this long, the primary ships again from the follower's last answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest wait before an in-sync write that failed is tried again.
const RETRY: Duration = Duration::from_secs(2);
/// How often a primary asks a follower that has not answered yet where its copy ends.
const ASK_EVERY: Duration = Duration::from_millis(500);

/// How replication messages leave the writer (the engine: its transport, without blocking).
pub trait ReplicaLink: Send {
    /// Sends entries to a follower; `false` if they could not go now (the primary tries again).
    fn ship(&mut self, to: NodeId, msg: &Replicate) -> bool;
    /// Answers a primary; `false` if the answer could not go (the primary asks again).
    fn answer(&mut self, to: NodeId, msg: &ReplicateAck) -> bool;
}

/// A replication message for the writer, from the network.
#[derive(Debug)]
pub enum ReplicaInput {
    /// Entries from a partition's primary (this node keeps the copy).
    Entries {
        /// The primary.
        from: NodeId,
        /// What it shipped.
        msg: Replicate,
    },
    /// A follower's answer (this node is the partition's primary).
    Ack {
        /// The follower.
        from: NodeId,
        /// Its answer.
        msg: ReplicateAck,
    },
}

/// What a writer replicates: the follower of each partition whose primary it is, and how to
/// reach it. A writer without this keeps copies for others all the same.
pub struct Replication {
    /// Stream (named in every message).
    pub stream: StreamId,
    /// The node that keeps a copy of each partition this node is the primary of.
    pub followers: BTreeMap<u32, NodeId>,
    /// The network.
    pub link: Box<dyn ReplicaLink>,
    /// The partitions' in-sync sets in the control store (`None`: appends always wait for
    /// the follower).
    pub in_sync: Option<Box<dyn InSyncSet>>,
    /// How long a copy may take to reach what was durable here before it is written out of
    /// the set (`Duration::MAX`: only a lost copy is, and appends always wait for it).
    pub lag: Duration,
}

impl std::fmt::Debug for Replication {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replication").field("stream", &self.stream).field("followers", &self.followers).finish()
    }
}

/// One partition shipped to its follower.
struct Shipping<T> {
    follower: NodeId,
    /// This writer's session with the follower (a new one at each reset of its copy): answers
    /// to another are stale.
    session: u64,
    /// Where this log ended when the writer started: a copy past it at its first answer holds
    /// entries shipped by an earlier run that this log lost (whatever its chain says: the
    /// primary's chain there may be that of the lost entries too).
    started_at: Version,
    /// The copy holds what this log does not (see [`Replicator::answered`]): the next message
    /// starts it afresh, under a new session.
    diverged: bool,
    /// Where the follower's copy ends (durable), from its last answer; `None` until an answer
    /// of this session showed the copy to be a prefix of this log.
    acked: Option<Version>,
    /// Next version to ship, and a reader there (`None`: open one at `shipped`).
    shipped: Version,
    reader: Option<LogReader>,
    /// End versions of the messages shipped and not yet answered.
    in_flight: VecDeque<Version>,
    last_sent: Option<Instant>,
    last_heard: Instant,
    /// The producers as last sent (their count and how many had ended: a description or an end
    /// since then sends them again).
    facts_sent: Option<(usize, usize)>,
    /// Acknowledgements waiting for the follower: each with the version the copy must pass.
    held: VecDeque<(Appended<T>, Instant, Version)>,
    /// Its place in the partition's in-sync set.
    set: Membership,
}

impl<T> Shipping<T> {
    /// Ships again from `v`: what is in flight no longer counts, the producers go again.
    fn ship_from(&mut self, v: Version) {
        self.shipped = v;
        self.reader = None;
        self.in_flight.clear();
        self.facts_sent = None;
    }
}

/// The writer's replication state.
pub(super) struct Replicator<T> {
    stream: StreamId,
    link: Option<Box<dyn ReplicaLink>>,
    shipping: BTreeMap<u32, Shipping<T>>,
    /// Answers a follower owes, sent after the next sync.
    owed: Vec<Answer>,
    buf: Vec<u8>,
    in_sync: Option<Box<dyn InSyncSet>>,
    lag: Duration,
    /// The last in-sync request's number.
    seq: u64,
}

impl<T> Replicator<T> {
    pub(super) fn new(replication: Option<Replication>) -> Self {
        let (stream, link, followers, in_sync, lag) = match replication {
            Some(r) => (r.stream, Some(r.link), r.followers, r.in_sync, r.lag),
            None => (StreamId(0), None, BTreeMap::new(), None, Duration::ZERO),
        };
        let shipping = followers
            .into_iter()
            .map(|(p, follower)| {
                let s = Shipping {
                    follower,
                    session: new_session(p),
                    started_at: Version(0),
                    diverged: false,
                    acked: None,
                    shipped: Version(0),
                    reader: None,
                    in_flight: VecDeque::new(),
                    last_sent: None,
                    last_heard: Instant::now(),
                    facts_sent: None,
                    held: VecDeque::new(),
                    set: Membership::new(Instant::now()),
                };
                (p, s)
            })
            .collect();
        Self { stream, link, shipping, owed: Vec::new(), buf: Vec::new(), in_sync, lag, seq: 0 }
    }

    /// Readers of the partitions this writer ships see only what their followers hold.
    pub(super) fn start(&mut self, logs: &mut [IngestLog]) {
        for (p, s) in &mut self.shipping {
            if let Some(log) = logs.get_mut(*p as usize) {
                log.replicate();
                log.set_standing(if self.in_sync.is_some() { s.set.standing() } else { Standing::NoSet });
                s.started_at = log.next_version();
            }
        }
    }

    /// Whether timers run: something waits for a follower, or copies are owed an answer.
    pub(super) fn busy(&self) -> bool {
        !self.owed.is_empty()
            || self
                .shipping
                .values()
                .any(|s| s.acked.is_none() || !s.held.is_empty() || !s.in_flight.is_empty() || s.set.asking())
    }

    /// Whether copies kept for other nodes wait for a sync (at the writer's group commit, with
    /// its own appends).
    pub(super) fn owes(&self) -> bool {
        !self.owed.is_empty()
    }

    /// The writer stops: every acknowledgement still held for a follower becomes a refusal the
    /// producer may retry (the rows are durable here, not yet on the copy; sent again, they are
    /// acknowledged as duplicates once the copy has them).
    pub(super) fn abandon(&mut self) -> Vec<(Appended<T>, Instant)> {
        let held = self.shipping.values_mut().flat_map(|s| s.held.drain(..));
        held.map(|(mut a, taken, _)| {
            let reason = "the stream stopped on this node before its copy on another node had the rows".to_string();
            a.result = Err(super::service::AppendFailure::Refused { reason, retryable: true });
            (a, taken)
        })
        .collect()
    }

    /// A durable acknowledgement: released at once, or held until the follower has its rows.
    pub(super) fn hold(&mut self, a: Appended<T>, taken: Instant) -> Option<(Appended<T>, Instant)> {
        let need = match (&a.result, a.marker) {
            (Ok(Some((_, last))), _) => *last,
            (Ok(None), Some(at)) => at,
            _ => return Some((a, taken)),
        };
        let Some(s) = self.shipping.get_mut(&a.partition) else { return Some((a, taken)) };
        if !s.set.waits() || s.acked.is_some_and(|acked| acked > need) && s.held.is_empty() {
            return Some((a, taken));
        }
        s.held.push_back((a, taken, need));
        None
    }

    /// Takes a message from the network; returns the acknowledgements it releases.
    pub(super) fn input(&mut self, input: ReplicaInput, logs: &mut [IngestLog]) -> Vec<(Appended<T>, Instant)> {
        match input {
            ReplicaInput::Entries { from, msg } => {
                self.copy(from, msg, logs);
                Vec::new()
            }
            ReplicaInput::Ack { from, msg } => self.answered(from, msg, logs),
        }
    }

    /// A primary's side: the follower says where its copy ends.
    fn answered(&mut self, from: NodeId, msg: ReplicateAck, logs: &mut [IngestLog]) -> Vec<(Appended<T>, Instant)> {
        let Some(s) = self.shipping.get_mut(&msg.partition) else { return Vec::new() };
        if s.follower != from {
            return Vec::new();
        }
        if msg.session != s.session {
            return Vec::new(); // an answer to an earlier run, or from before a reset
        }
        s.last_heard = Instant::now();
        let log = &mut logs[msg.partition as usize];
        if s.acked.is_none() {
            // Nothing counts on the copy before it shows itself a prefix of this log: its chain
            // where it ends is this log's chain there (`ingest/chain.rs`), which stands for every
            // entry below. Else it holds entries this log never had or lost (an earlier run's
            // unsynced tail, in a power loss; the log of a primary whose copy this one was),
            // none acknowledged, and this log has, or will have, other rows at those versions:
            // the copy starts afresh.
            let Some(chain) = msg.chain.filter(|_| msg.error.is_empty()) else { return Vec::new() };
            let first = log.first_version();
            let prefix = if msg.next < first {
                true // all below this log: the next message starts the copy again at its start
            } else if msg.next == first {
                chain == log.first_chain() // empty, started at this log's start, or not
            } else if msg.next > s.started_at {
                false // shipped by an earlier run, past what this log held when this one began
            } else {
                match log.chain_ending_at(msg.next) {
                    Ok(ours) => ours == Some(chain),
                    // Cannot tell now: asked again.
                    Err(e) => {
                        tracing::warn!(partition = msg.partition, error = %e, "cannot read the log to check its copy");
                        return Vec::new();
                    }
                }
            };
            if !prefix {
                tracing::error!(partition = msg.partition, follower = %from, copy = %msg.next, log = %log.next_version(),
                    "the follower's copy holds entries this node's log does not: starting it afresh");
                s.diverged = true;
                s.set.copy_lost();
                // The copy starts afresh: the source reads no further than it already did.
                log.publish_replicated(log.first_version());
                s.session = next_session(s.session);
                return Vec::new();
            }
        }
        log.publish_replicated(msg.next);
        if !msg.error.is_empty() || s.acked.is_none() || msg.next > s.shipped {
            if !msg.error.is_empty() {
                tracing::debug!(partition = msg.partition, follower = %from, error = %msg.error, next = %msg.next, "ingest replica out of step");
            }
            // Ship from where the copy ends (or, for a copy past the primary's log, afresh).
            s.ship_from(msg.next.min(log.next_version()));
        }
        while s.in_flight.front().is_some_and(|end| *end <= msg.next) {
            s.in_flight.pop_front();
        }
        if s.acked.is_some_and(|acked| msg.next < acked) {
            // The copy lost what it had durably (its disk): it no longer holds every row.
            tracing::error!(partition = msg.partition, follower = %from, copy = %msg.next,
                "the follower's copy is shorter than it was: it leaves the in-sync set");
            s.set.copy_lost();
        }
        s.acked = Some(msg.next);
        let mut released = Vec::new();
        while s.held.front().is_some_and(|(_, _, need)| *need < msg.next) {
            let (a, taken, _) = s.held.pop_front().expect("front");
            released.push((a, taken));
        }
        released
    }

    /// Ships what was written since the last call, asks followers that never answered, ships
    /// again after a silence, and moves copies in and out of their in-sync sets; returns the
    /// acknowledgements a copy leaving its set releases.
    pub(super) fn pump(&mut self, logs: &mut [IngestLog]) -> Vec<(Appended<T>, Instant)> {
        let released = self.in_sync_step(logs);
        let Some(link) = self.link.as_mut() else { return released };
        for (&p, s) in &mut self.shipping {
            let log = &mut logs[p as usize];
            let now = Instant::now();
            let quiet = s.last_sent.is_none_or(|t| now - t >= ASK_EVERY);
            let Some(acked) = s.acked else {
                if s.diverged && quiet {
                    // Under a new session (answers to the old one are stale), the copy starts
                    // again, empty, at this log's start; its answer then shows it a prefix.
                    let first = log.first_version();
                    let msg = Replicate {
                        stream: self.stream,
                        partition: p,
                        at: first,
                        log_first: first,
                        log_first_chain: log.first_chain(),
                        reset: true,
                        entries: Vec::new(),
                        producers: producer_facts(log),
                        session: s.session,
                    };
                    // Lost, the next question's answer finds the copy as it was, and again.
                    if link.ship(s.follower, &msg) {
                        s.diverged = false;
                        s.last_sent = Some(now);
                    }
                } else if quiet {
                    link.ship(s.follower, &hello(self.stream, p, log, s.session));
                    s.last_sent = Some(now);
                }
                continue;
            };
            if !s.in_flight.is_empty() && now - s.last_heard >= ANSWER_TIMEOUT && quiet {
                // Lost on the way, or the follower restarted: again from its last answer.
                s.ship_from(acked.min(log.next_version()));
            }
            let written = log.next_version();
            if acked > written {
                // A copy past the primary's log (the primary lost what it had) starts afresh.
                tracing::error!(partition = p, follower = %s.follower, copy = %acked, log = %written,
                    "the follower's copy holds more than this node's log: starting it afresh");
                s.acked = None;
                s.diverged = true;
                s.set.copy_lost();
                log.publish_replicated(log.first_version());
                s.ship_from(log.first_version());
                continue;
            }
            let first = log.first_version();
            if s.shipped < first {
                // The copy ends before what the log still holds: it starts again at its start,
                // and takes the producers again (their counts cover what it will not hold).
                s.ship_from(first);
            }
            while s.shipped < written && s.in_flight.len() < IN_FLIGHT {
                self.buf.clear();
                // What was just written is shipped from memory; older entries are read back.
                let kept = log.take_unshipped(s.shipped, SHIP_BYTES, &mut self.buf);
                let end = match kept {
                    Some(end) => {
                        s.reader = None;
                        end
                    }
                    None => {
                        let reader = s.reader.get_or_insert_with(|| log.durable_reader(s.shipped));
                        match reader.read_entries(SHIP_BYTES, &mut self.buf) {
                            Ok(end) => end,
                            Err(e) => {
                                tracing::error!(partition = p, error = %e, "cannot read the ingest log to replicate it");
                                s.reader = None;
                                break;
                            }
                        }
                    }
                };
                if end == s.shipped {
                    break;
                }
                let facts = log.ledger_summary();
                let producers = if s.facts_sent != Some(facts) { producer_facts(log) } else { Vec::new() };
                let msg = Replicate {
                    stream: self.stream,
                    partition: p,
                    at: s.shipped,
                    log_first: first,
                    log_first_chain: log.first_chain(),
                    reset: false,
                    entries: std::mem::take(&mut self.buf),
                    producers,
                    session: s.session,
                };
                let sent = link.ship(s.follower, &msg);
                self.buf = msg.entries;
                if !sent {
                    s.reader = None; // the peer's queue is full or it is down: again later
                    break;
                }
                s.facts_sent = Some(facts);
                s.shipped = end;
                s.in_flight.push_back(end);
                s.last_sent = Some(now);
            }
        }
        released
    }
}

/// An empty [`Replicate`]: the follower answers where its copy ends.
fn hello(stream: StreamId, p: u32, log: &IngestLog, session: u64) -> Replicate {
    let first = log.first_version();
    Replicate {
        stream,
        partition: p,
        at: first,
        log_first: first,
        log_first_chain: log.first_chain(),
        reset: false,
        entries: Vec::new(),
        producers: Vec::new(),
        session,
    }
}

/// A session no earlier run of this writer used (the clock's nanoseconds, the partition in
/// the high bits): its followers' answers to an earlier run are told apart.
fn new_session(p: u32) -> u64 {
    let ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    ns ^ (u64::from(p) << 48)
}

/// The session after `s` (a reset of the copy).
fn next_session(s: u64) -> u64 {
    s.wrapping_add(1)
}

fn producer_facts(log: &IngestLog) -> Vec<ReplicaProducer> {
    log.producers()
        .into_iter()
        .map(|r| ReplicaProducer {
            producer: r.producer,
            description: r.description,
            first: r.first,
            ended: r.ended,
            rows: r.rows,
            batches: r.batches,
        })
        .collect()
}
