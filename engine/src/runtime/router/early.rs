//! Frames from peers for a stream that has not attached to this node yet: the stream starts on
//! its nodes one after the other, and a peer where it runs already may grant credits, send a
//! restore point's consequences or protocol messages before it runs here. They wait here, in
//! order, and reach the stream when it attaches.
//!
//! Invariants (peers are authenticated members, but what they send is bounded all the same): at
//! most [`MAX_FRAMES`] frames and [`MAX_BYTES`] bytes wait, over every stream; a frame waits at
//! most [`MAX_WAIT`]; a frame that does not fit or expires is dropped, and its stream is marked
//! lost: it fails as it attaches (a lost credit grant or end of stream would otherwise leave it
//! waiting for ever); frames for a stream that has run here and detached are not kept.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use weir_wire::{Frame, NodeId, StreamId};

/// Frames kept at most, over every stream.
pub(super) const MAX_FRAMES: usize = 4096;
/// Bytes of frames kept at most, over every stream.
pub(super) const MAX_BYTES: usize = 64 << 20;
/// How long a frame waits at most for its stream.
pub(super) const MAX_WAIT: Duration = Duration::from_secs(30);

/// The waiting frames, by stream.
#[derive(Default)]
pub(super) struct Early {
    waiting: BTreeMap<StreamId, VecDeque<(Instant, NodeId, Frame)>>,
    frames: usize,
    bytes: usize,
    /// Streams that ran here and detached: what comes for them now is stale.
    gone: BTreeSet<StreamId>,
    /// Streams a frame was dropped for.
    lost: BTreeSet<StreamId>,
}

impl Early {
    /// Keeps `frame` from `from` for `stream` (or drops it, see the invariants).
    pub(super) fn hold(&mut self, stream: StreamId, from: NodeId, frame: Frame, now: Instant) {
        self.expire(now);
        if self.gone.contains(&stream) {
            return tracing::debug!(%stream, %from, "frame for a stream that stopped here");
        }
        if self.frames >= MAX_FRAMES || self.bytes + frame.payload_len() > MAX_BYTES {
            return self.lose(stream, from, "too many frames wait for streams not running here");
        }
        self.frames += 1;
        self.bytes += frame.payload_len();
        self.waiting.entry(stream).or_default().push_back((now, from, frame));
    }

    /// The frames that waited for `stream`, in arrival order (it attaches now); `Err` when
    /// one was dropped.
    pub(super) fn take(&mut self, stream: StreamId, now: Instant) -> Result<Vec<(NodeId, Frame)>, ()> {
        self.expire(now);
        self.gone.remove(&stream);
        let frames = self.waiting.remove(&stream).unwrap_or_default();
        self.frames -= frames.len();
        self.bytes -= frames.iter().map(|(_, _, f)| f.payload_len()).sum::<usize>();
        if self.lost.remove(&stream) {
            return Err(());
        }
        Ok(frames.into_iter().map(|(_, n, f)| (n, f)).collect())
    }

    /// A frame for `stream` is dropped: the stream is lost (warned once).
    fn lose(&mut self, stream: StreamId, from: NodeId, why: &str) {
        if self.lost.insert(stream) {
            tracing::warn!(%stream, %from, "frame for a stream not running here dropped: {why}");
        }
    }

    /// `stream` detached: frames for it are stale from now on.
    pub(super) fn gone(&mut self, stream: StreamId) {
        self.gone.insert(stream);
    }

    /// Drops what waited longer than [`MAX_WAIT`] (a look at the oldest frame of each stream).
    fn expire(&mut self, now: Instant) {
        let (frames, bytes, lost) = (&mut self.frames, &mut self.bytes, &mut self.lost);
        self.waiting.retain(|stream, q| {
            while q.front().is_some_and(|(at, _, _)| now.duration_since(*at) > MAX_WAIT) {
                let (_, from, f) = q.pop_front().expect("a front");
                *frames -= 1;
                *bytes -= f.payload_len();
                if lost.insert(*stream) {
                    tracing::warn!(%stream, %from, "frame for a stream that did not start here in time dropped");
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

    fn credit(stream: u64, credits: u32) -> Frame {
        let msg = Credit { stream: StreamId(stream), from: TaskId(1), to: TaskId(2), credits };
        let f = FrameEncoder::new().encode(&msg).unwrap();
        weir_wire::frame::decode_one(f.as_bytes(), 1 << 20).unwrap()
    }

    fn credits(frames: &[(NodeId, Frame)]) -> Vec<u32> {
        frames.iter().map(|(_, f)| f.access::<Credit>().unwrap().credits.to_native()).collect()
    }

    #[test]
    fn frames_wait_for_their_stream_in_order_and_reach_it_once() {
        let (mut e, now) = (Early::default(), Instant::now());
        e.hold(StreamId(1), NodeId(2), credit(1, 10), now);
        e.hold(StreamId(2), NodeId(2), credit(2, 20), now);
        e.hold(StreamId(1), NodeId(3), credit(1, 11), now);
        let got = e.take(StreamId(1), now).unwrap();
        assert_eq!(credits(&got), [10, 11]);
        assert_eq!(got.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [NodeId(2), NodeId(3)]);
        assert!(e.take(StreamId(1), now).unwrap().is_empty());
        assert_eq!(credits(&e.take(StreamId(2), now).unwrap()), [20]);
        assert_eq!((e.frames, e.bytes), (0, 0));
    }

    #[test]
    fn frames_past_the_bounds_or_the_wait_are_dropped_and_their_stream_is_lost() {
        let (mut e, now) = (Early::default(), Instant::now());
        for i in 0..MAX_FRAMES + 10 {
            e.hold(StreamId(1), NodeId(2), credit(1, i as u32), now);
        }
        assert_eq!(e.frames, MAX_FRAMES);
        e.hold(StreamId(4), NodeId(2), credit(4, 1), now);
        let later = now + MAX_WAIT + Duration::from_secs(1);
        e.hold(StreamId(2), NodeId(2), credit(2, 1), later);
        e.hold(StreamId(5), NodeId(2), credit(5, 1), now);
        assert!(e.take(StreamId(1), later).is_err(), "over the bound");
        assert!(e.take(StreamId(4), later).is_err(), "no room");
        assert!(e.take(StreamId(5), later + MAX_WAIT).is_err(), "expired");
        assert_eq!(credits(&e.take(StreamId(2), later).unwrap()), [1]);
        assert_eq!((e.frames, e.bytes), (0, 0));
    }

    #[test]
    fn frames_for_a_stream_that_stopped_here_are_not_kept() {
        let (mut e, later) = (Early::default(), Instant::now());
        e.gone(StreamId(3));
        e.hold(StreamId(3), NodeId(2), credit(3, 1), later);
        assert_eq!(e.frames, 0, "a stream that stopped here keeps nothing");
    }
}
