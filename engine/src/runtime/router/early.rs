//! Frames from peers for a run of a stream that has not attached to this node yet: a stream
//! starts on its nodes one after the other, and a peer where the run has started may grant
//! credits, send a restore point's consequences or protocol messages before it runs here. They
//! wait here, in order, and reach the run when it attaches.
//!
//! Invariants (peers are authenticated members, but what they send is bounded all the same): at
//! most [`MAX_FRAMES`] frames and [`MAX_BYTES`] bytes wait, over every stream, and at most half
//! of each from one peer (a member that floods cannot crowd out the others); a frame waits at
//! most [`MAX_WAIT`]; a frame that does not fit or expires is dropped, and its run is marked
//! lost: it fails as it attaches (a lost credit grant or end of stream would otherwise leave it
//! waiting for ever). Frames of a run that attached here and detached, or of an earlier run, are
//! not kept: they are stale.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use weir_wire::{Epoch, Frame, NodeId, StreamId};

use super::super::protocol_wire::Run;

/// Frames kept at most, over every stream.
pub(super) const MAX_FRAMES: usize = 4096;
/// Bytes of frames kept at most, over every stream.
pub(super) const MAX_BYTES: usize = 64 << 20;
/// Frames kept at most from one peer.
const PEER_FRAMES: usize = MAX_FRAMES / 2;
/// Bytes of frames kept at most from one peer.
const PEER_BYTES: usize = MAX_BYTES / 2;
/// How long a frame waits at most for its stream.
pub(super) const MAX_WAIT: Duration = Duration::from_secs(30);

/// Runs remembered as lost, at most (past it the first in (stream, epoch) order is forgotten:
/// only a member that sends frames of thousands of runs nobody starts gets there).
const MAX_LOST: usize = 4096;

/// Marks `run` lost; whether it was not already.
fn mark_lost(lost: &mut BTreeSet<Run>, run: Run) -> bool {
    let new = lost.insert(run);
    if lost.len() > MAX_LOST {
        lost.pop_first();
    }
    new
}

/// A frame of `bytes` from `from` waits no more.
fn release(peers: &mut BTreeMap<NodeId, (usize, usize)>, from: NodeId, bytes: usize) {
    if let Some((frames, b)) = peers.get_mut(&from) {
        *frames -= 1;
        *b -= bytes;
        if *frames == 0 {
            peers.remove(&from);
        }
    }
}

/// The waiting frames, by run.
#[derive(Default)]
pub(super) struct Early {
    waiting: BTreeMap<Run, VecDeque<(Instant, NodeId, Frame)>>,
    frames: usize,
    bytes: usize,
    /// Per peer: the frames and bytes of it that wait.
    from: BTreeMap<NodeId, (usize, usize)>,
    /// Per stream, the latest run that attached here: frames of it or of earlier runs are stale.
    ran: BTreeMap<StreamId, Epoch>,
    /// Runs a frame was dropped for.
    lost: BTreeSet<Run>,
}

impl Early {
    /// Keeps `frame` from `from` for `run` (or drops it, see the invariants).
    pub(super) fn hold(&mut self, run: Run, from: NodeId, frame: Frame, now: Instant) {
        self.expire(now);
        if self.ran.get(&run.stream).is_some_and(|e| run.epoch <= *e) {
            let (stream, epoch) = (run.stream, run.epoch);
            return tracing::debug!(%stream, %epoch, %from, "frame of a run that has ended here");
        }
        let len = frame.payload_len();
        if self.frames >= MAX_FRAMES || self.bytes + len > MAX_BYTES {
            return self.lose(run, from, "too many frames wait for streams not running here");
        }
        let (peer_frames, peer_bytes) = self.from.get(&from).copied().unwrap_or_default();
        if peer_frames >= PEER_FRAMES || peer_bytes + len > PEER_BYTES {
            return self.lose(run, from, "its sender has half of what may wait for streams not running here");
        }
        self.frames += 1;
        self.bytes += len;
        self.from.insert(from, (peer_frames + 1, peer_bytes + len));
        self.waiting.entry(run).or_default().push_back((now, from, frame));
    }

    /// The frames that waited for `run`, in arrival order (it attaches now); `Err` when one was
    /// dropped. Frames of its stream's earlier runs are dropped; a later run's stay.
    pub(super) fn take(&mut self, run: Run, now: Instant) -> Result<Vec<(NodeId, Frame)>, ()> {
        self.expire(now);
        self.ran.insert(run.stream, run.epoch);
        let stale: Vec<Run> =
            self.waiting.keys().filter(|r| r.stream == run.stream && r.epoch < run.epoch).copied().collect();
        for r in stale {
            self.remove(r);
        }
        self.lost.retain(|r| r.stream != run.stream || r.epoch > run.epoch || *r == run);
        let frames = self.remove(run);
        if self.lost.remove(&run) {
            return Err(());
        }
        Ok(frames.into_iter().map(|(_, n, f)| (n, f)).collect())
    }

    /// Drops what waits for runs of `stream` below `epoch`: a later run exists, and this node
    /// attaches none of them.
    pub(super) fn forget_below(&mut self, stream: StreamId, epoch: Epoch) {
        let stale: Vec<Run> = self.waiting.keys().filter(|r| r.stream == stream && r.epoch < epoch).copied().collect();
        for r in stale {
            self.remove(r);
        }
    }

    /// `from` says `run` failed on it before the run attached here: it fails as it attaches
    /// (nothing if it ran here already).
    pub(super) fn fail(&mut self, run: Run, from: NodeId, reason: &str) {
        if self.ran.get(&run.stream).is_some_and(|e| run.epoch <= *e) {
            return;
        }
        if mark_lost(&mut self.lost, run) {
            let (stream, epoch) = (run.stream, run.epoch);
            tracing::warn!(%stream, %epoch, %from, %reason, "a run failed on another node before it started here");
        }
    }

    /// The newest run of `stream` later than `than` that frames from a node `heeded` wait for.
    pub(super) fn newer(&self, stream: StreamId, than: Epoch, heeded: impl Fn(NodeId) -> bool) -> Option<Epoch> {
        let later = self.waiting.iter().filter(|(r, _)| r.stream == stream && r.epoch > than);
        later.filter(|(_, q)| q.iter().any(|(_, n, _)| heeded(*n))).map(|(r, _)| r.epoch).max()
    }

    fn remove(&mut self, run: Run) -> VecDeque<(Instant, NodeId, Frame)> {
        let frames = self.waiting.remove(&run).unwrap_or_default();
        frames.iter().for_each(|(_, from, f)| {
            self.frames -= 1;
            self.bytes -= f.payload_len();
            release(&mut self.from, *from, f.payload_len());
        });
        frames
    }

    /// A frame for `run` is dropped: the run is lost (warned once).
    fn lose(&mut self, run: Run, from: NodeId, why: &str) {
        if mark_lost(&mut self.lost, run) {
            let (stream, epoch) = (run.stream, run.epoch);
            tracing::warn!(%stream, %epoch, %from, "frame for a stream not running here dropped: {why}");
        }
    }

    /// Drops what waited longer than [`MAX_WAIT`] (a look at the oldest frame of each run).
    fn expire(&mut self, now: Instant) {
        let (frames, bytes, lost, peers) = (&mut self.frames, &mut self.bytes, &mut self.lost, &mut self.from);
        self.waiting.retain(|run, q| {
            while q.front().is_some_and(|(at, _, _)| now.duration_since(*at) > MAX_WAIT) {
                let (_, from, f) = q.pop_front().expect("a front");
                *frames -= 1;
                *bytes -= f.payload_len();
                release(peers, from, f.payload_len());
                if mark_lost(lost, *run) {
                    let (stream, epoch) = (run.stream, run.epoch);
                    tracing::warn!(%stream, %epoch, %from, "frame for a stream that did not start here in time dropped");
                }
            }
            !q.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use weir_wire::msg::Credit;
    use weir_wire::{FrameEncoder, TaskId};

    use super::*;

    fn run(stream: u64, epoch: u64) -> Run {
        Run { stream: StreamId(stream), epoch: Epoch(epoch) }
    }

    fn credit(r: Run, credits: u32) -> Frame {
        let msg = Credit { stream: r.stream, epoch: r.epoch, from: TaskId(1), to: TaskId(2), credits };
        let f = FrameEncoder::new().encode(&msg).unwrap();
        weir_wire::frame::decode_one(f.as_bytes(), 1 << 20).unwrap()
    }

    fn credits(frames: &[(NodeId, Frame)]) -> Vec<u32> {
        frames.iter().map(|(_, f)| f.access::<Credit>().unwrap().credits.to_native()).collect()
    }

    #[test]
    fn frames_wait_for_their_stream_in_order_and_reach_it_once() {
        let (mut e, now) = (Early::default(), Instant::now());
        let (a, b) = (run(1, 0), run(2, 0));
        e.hold(a, NodeId(2), credit(a, 10), now);
        e.hold(b, NodeId(2), credit(b, 20), now);
        e.hold(a, NodeId(3), credit(a, 11), now);
        let got = e.take(a, now).unwrap();
        assert_eq!(credits(&got), [10, 11]);
        assert_eq!(got.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [NodeId(2), NodeId(3)]);
        assert!(e.take(a, now).unwrap().is_empty());
        assert_eq!(credits(&e.take(b, now).unwrap()), [20]);
        assert_eq!((e.frames, e.bytes), (0, 0));
    }

    #[test]
    fn frames_past_the_bounds_or_the_wait_are_dropped_and_their_stream_is_lost() {
        let (mut e, now) = (Early::default(), Instant::now());
        for i in 0..MAX_FRAMES + 10 {
            let from = NodeId(2 + (i % 2) as u32);
            e.hold(run(1, 0), from, credit(run(1, 0), i as u32), now);
        }
        assert_eq!(e.frames, MAX_FRAMES);
        e.hold(run(4, 0), NodeId(2), credit(run(4, 0), 1), now);
        let later = now + MAX_WAIT + Duration::from_secs(1);
        e.hold(run(2, 0), NodeId(2), credit(run(2, 0), 1), later);
        e.hold(run(5, 0), NodeId(2), credit(run(5, 0), 1), now);
        assert!(e.take(run(1, 0), later).is_err(), "over the bound");
        assert!(e.take(run(4, 0), later).is_err(), "no room");
        assert!(e.take(run(5, 0), later + MAX_WAIT).is_err(), "expired");
        assert_eq!(credits(&e.take(run(2, 0), later).unwrap()), [1]);
        assert_eq!((e.frames, e.bytes), (0, 0));
    }

    #[test]
    fn a_later_run_seen_frees_what_earlier_runs_held_and_a_failed_run_fails_as_it_attaches() {
        let (mut e, now) = (Early::default(), Instant::now());
        e.hold(run(3, 4), NodeId(2), credit(run(3, 4), 4), now);
        e.hold(run(3, 6), NodeId(2), credit(run(3, 6), 6), now);
        e.hold(run(8, 1), NodeId(2), credit(run(8, 1), 1), now);
        e.forget_below(StreamId(3), Epoch(5));
        assert_eq!(e.frames, 2, "only the earlier run of that stream goes");
        assert_eq!(credits(&e.take(run(3, 6), now).unwrap()), [6]);
        // Another node's run failed before it started here: it fails as it attaches.
        e.fail(run(8, 2), NodeId(2), "gap");
        assert!(e.take(run(8, 2), now).is_err());
        // Not a run that attached here already.
        e.fail(run(3, 6), NodeId(2), "gap");
        assert!(e.take(run(3, 7), now).is_ok());
    }

    #[test]
    fn frames_of_a_run_that_ended_here_or_of_an_earlier_run_are_not_kept() {
        let (mut e, now) = (Early::default(), Instant::now());
        assert!(e.take(run(3, 5), now).unwrap().is_empty());
        e.hold(run(3, 5), NodeId(2), credit(run(3, 5), 1), now);
        e.hold(run(3, 4), NodeId(2), credit(run(3, 4), 1), now);
        assert_eq!(e.frames, 0, "a run that attached here, or an earlier one, keeps nothing");
        // A later run's frames wait; when it attaches, an earlier run's that waited are dropped.
        e.hold(run(3, 7), NodeId(2), credit(run(3, 7), 7), now);
        e.hold(run(3, 6), NodeId(2), credit(run(3, 6), 6), now);
        assert_eq!(e.newer(StreamId(3), Epoch(5), |_| true), Some(Epoch(7)));
        assert_eq!(e.newer(StreamId(3), Epoch(5), |n| n != NodeId(2)), None, "only a peer of the stream's says");
        assert_eq!(credits(&e.take(run(3, 7), now).unwrap()), [7]);
        assert_eq!((e.frames, e.newer(StreamId(3), Epoch(5), |_| true)), (0, None));
    }

    #[test]
    fn a_peer_that_floods_fills_its_half_and_leaves_room_for_the_others() {
        let (mut e, now) = (Early::default(), Instant::now());
        for i in 0..MAX_FRAMES {
            e.hold(run(1, 0), NodeId(2), credit(run(1, 0), i as u32), now);
        }
        assert_eq!(e.frames, PEER_FRAMES);
        e.hold(run(2, 0), NodeId(3), credit(run(2, 0), 7), now);
        assert!(e.take(run(1, 0), now).is_err(), "the flooding peer's run is lost");
        assert_eq!(credits(&e.take(run(2, 0), now).unwrap()), [7], "another peer's frame waited");
        assert!(e.from.is_empty() && (e.frames, e.bytes) == (0, 0));
        // Its share is free again once its frames are gone.
        e.hold(run(3, 0), NodeId(2), credit(run(3, 0), 1), now);
        assert_eq!(credits(&e.take(run(3, 0), now).unwrap()), [1]);
    }

    #[test]
    fn a_lost_frame_fails_only_its_own_run() {
        let (mut e, now) = (Early::default(), Instant::now());
        let later = now + MAX_WAIT + Duration::from_secs(1);
        e.hold(run(1, 1), NodeId(2), credit(run(1, 1), 1), now);
        e.hold(run(1, 2), NodeId(2), credit(run(1, 2), 2), later);
        assert_eq!(credits(&e.take(run(1, 2), later).unwrap()), [2], "run 1 expired, not run 2");
    }
}
