//! Channels between tasks. The task code sees only [`Inputs`] and [`Outputs`]; whether a channel
//! is a local crossbeam queue or frames over the transport is decided here.
//!
//! Invariants:
//! - Every queue is bounded. A sender never blocks its worker thread: a message that does not fit
//!   stays in the output's pending slot and the task stops producing until it drains.
//! - Remote channels use credits: the sender holds at most `remote_credits` frames the receiver has
//!   not consumed, so the receiving router always has room and never blocks on one channel while
//!   others share the connection. The sender starts with none; the receiving task grants its whole
//!   window first, so only the receiver's setting counts.
//! - A consumer that frees a slot in a full local queue wakes the producer's worker; a credit grant
//!   wakes it through the router. Idle workers park; nobody spins.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crossbeam_channel::{Sender, TrySendError};
use crossbeam_utils::sync::Unparker;
use weir_wire::msg::{Data, EndOfStream, Watermark, WindowResults};
use weir_wire::transport::{SendError, TransportSender};
use weir_wire::{Batch, EncodedFrame, Frame, FrameEncoder, NodeId, Seq, TaskId};

use super::protocol_wire::Run;

use crate::operator::window::WindowResult;

mod inputs;
pub(crate) use inputs::Input;
pub use inputs::Inputs;

/// Rows on a channel: an owned batch from a local task, or a received frame read in place.
#[derive(Debug)]
pub enum Rows {
    /// From a task on this node.
    Local(Batch),
    /// From another node: a validated `Data` frame, read without copying the columns.
    Remote(Frame),
}

impl Rows {
    /// Number of rows.
    pub fn len(&self) -> usize {
        match self {
            Rows::Local(b) => b.len(),
            Rows::Remote(f) => f.access::<Data>().map_or(0, |d| d.batch.len()),
        }
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Calls `f` for every row, in order.
    #[inline]
    pub fn for_each(&self, mut f: impl FnMut(i64, u64, f64)) {
        match self {
            Rows::Local(b) => {
                for ((t, k), v) in b.ts.iter().zip(&b.key).zip(&b.value) {
                    f(*t, *k, *v);
                }
            }
            Rows::Remote(frame) => {
                if let Some(b) = received(frame) {
                    for ((t, k), v) in b.ts_column().iter().zip(b.key_column()).zip(b.value_column()) {
                        f(t.to_native(), k.to_native(), v.to_native());
                    }
                }
            }
        }
    }
}

/// The rows of a received `Data` frame, read in place; `None`, logged, if the frame fails
/// validation (the transport validated it already, and validation is deterministic).
pub(crate) fn received(frame: &Frame) -> Option<&weir_wire::batch::ArchivedBatch> {
    match frame.access::<Data>() {
        Ok(d) => Some(&d.batch),
        Err(e) => {
            tracing::error!(error = %e, "received data frame failed validation twice");
            None
        }
    }
}

/// What travels on a channel.
#[derive(Debug)]
pub enum Msg {
    /// Rows (source → agg).
    Rows(Rows),
    /// Window results (agg → sink).
    Results(Vec<WindowResult>),
    /// The sender has sent every row with event time up to this (ms).
    Progress(i64),
    /// The sender is done; nothing follows.
    End,
    /// The checkpoint barrier: everything before it belongs to checkpoint `id`.
    Trigger {
        /// Checkpoint.
        id: weir_wire::CheckpointId,
        /// Transaction.
        trans: weir_wire::TransId,
        /// A savepoint: every task writes all its state (`TriggerKind::Savepoint`).
        savepoint: bool,
    },
}

/// The sending end of one channel.
pub(crate) enum Link {
    Local { tx: Sender<Msg>, wake: Unparker },
    Remote { node: NodeId, credits: Arc<AtomicU32>, seq: Seq, encoded: Option<EncodedFrame> },
}

pub(crate) struct Output {
    pub(crate) to: TaskId,
    pub(crate) link: Link,
    pending: VecDeque<Msg>,
    /// Messages queued on this channel so far: the next one's sequence number.
    pushed: u64,
}

impl Output {
    pub(crate) fn new(to: TaskId, link: Link) -> Self {
        Self { to, link, pending: VecDeque::new(), pushed: 0 }
    }
}

/// Network side of a task: its own encoder and handle to the transport.
pub(crate) struct Net {
    pub(crate) sender: TransportSender,
    pub(crate) encoder: FrameEncoder,
    /// The stream's run, which every frame names.
    pub(crate) run: Run,
}

/// A task's outgoing channels, in downstream order.
pub struct Outputs {
    from: TaskId,
    outs: Vec<Output>,
    net: Option<Net>,
}

impl std::fmt::Debug for Outputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outputs").field("from", &self.from).field("channels", &self.outs.len()).finish()
    }
}

/// Why an output failed for good.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// The receiving task is gone (its engine stopped).
    #[error("channel {from} -> {to} is closed")]
    Closed {
        /// Sender.
        from: TaskId,
        /// Receiver.
        to: TaskId,
    },
    /// A message could not be encoded for the network.
    #[error("channel {from} -> {to}: {cause}")]
    Encode {
        /// Sender.
        from: TaskId,
        /// Receiver.
        to: TaskId,
        /// Why.
        #[source]
        cause: EncodeError,
    },
}

/// Why a message could not be encoded for the network. Fatal for the channel: the same message
/// fails the same way.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// The frame encoder refused it (too large for a frame).
    #[error(transparent)]
    Frame(#[from] weir_wire::FrameError),
    /// Rows received from another node, sent on as they are.
    #[error("a received frame cannot be forwarded as is")]
    Received,
}

impl Outputs {
    pub(crate) fn new(from: TaskId, outs: Vec<Output>, net: Option<Net>) -> Self {
        Self { from, outs, net }
    }

    /// Number of downstream channels.
    pub fn len(&self) -> usize {
        self.outs.len()
    }

    /// Whether the task has no downstream (a sink).
    pub fn is_empty(&self) -> bool {
        self.outs.is_empty()
    }

    /// Queues `msg` on output `i` (delivered by [`Outputs::flush`]); returns its sequence number
    /// on that channel.
    pub fn push(&mut self, i: usize, msg: Msg) -> Seq {
        let o = &mut self.outs[i];
        o.pending.push_back(msg);
        o.pushed += 1;
        Seq(o.pushed - 1)
    }

    /// Queues a copy of a control message on every output.
    pub fn broadcast(&mut self, msg: impl Fn() -> Msg) {
        for i in 0..self.outs.len() {
            self.push(i, msg());
        }
    }

    /// The downstream task of output `i`.
    pub fn target(&self, i: usize) -> TaskId {
        self.outs[i].to
    }

    /// Whether everything queued has been delivered.
    pub fn is_drained(&self) -> bool {
        self.outs.iter().all(|o| o.pending.is_empty() && !matches!(o.link, Link::Remote { encoded: Some(_), .. }))
    }

    /// Delivers what it can. Ok(true) when nothing is left pending.
    pub fn flush(&mut self) -> Result<bool, ChannelError> {
        let from = self.from;
        for o in &mut self.outs {
            loop {
                match &mut o.link {
                    Link::Local { tx, wake } => {
                        let Some(m) = o.pending.pop_front() else { break };
                        match tx.try_send(m) {
                            Ok(()) => wake.unpark(),
                            Err(TrySendError::Full(m)) => {
                                o.pending.push_front(m);
                                wake.unpark(); // make sure the consumer is draining
                                break;
                            }
                            Err(TrySendError::Disconnected(_)) => return Err(ChannelError::Closed { from, to: o.to }),
                        }
                    }
                    Link::Remote { node, credits, seq, encoded } => {
                        let net = self.net.as_mut().expect("remote outputs have a network");
                        if encoded.is_none() {
                            let Some(m) = o.pending.pop_front() else { break };
                            let frame = encode(&mut net.encoder, net.run, from, o.to, *seq, m)
                                .map_err(|cause| ChannelError::Encode { from, to: o.to, cause })?;
                            *encoded = Some(frame);
                        }
                        if credits.load(Ordering::Acquire) == 0 {
                            break;
                        }
                        let frame = encoded.take().expect("encoded above");
                        match net.sender.try_send(*node, frame) {
                            Ok(()) => {
                                credits.fetch_sub(1, Ordering::AcqRel);
                                *seq = seq.next();
                            }
                            Err(SendError::Full(f)) => {
                                *encoded = Some(f);
                                break;
                            }
                            Err(_) => return Err(ChannelError::Closed { from, to: o.to }),
                        }
                    }
                }
            }
        }
        Ok(self.is_drained())
    }
}

fn encode(
    enc: &mut FrameEncoder,
    run: Run,
    from: TaskId,
    to: TaskId,
    seq: Seq,
    m: Msg,
) -> Result<EncodedFrame, EncodeError> {
    let Run { stream, epoch } = run;
    let r = match m {
        Msg::Rows(Rows::Local(batch)) => {
            let data = Data { stream, epoch, from, to, seq, batch };
            let r = enc.encode(&data);
            super::batch_pool::give(data.batch);
            r
        }
        Msg::Rows(Rows::Remote(_)) => return Err(EncodeError::Received),
        Msg::Progress(watermark_ms) => enc.encode(&Watermark { stream, epoch, from, to, seq, watermark_ms }),
        Msg::Results(rs) => {
            let mut w = WindowResults {
                stream,
                epoch,
                from,
                to,
                seq,
                key: Vec::with_capacity(rs.len()),
                start: Vec::with_capacity(rs.len()),
                count: Vec::with_capacity(rs.len()),
                sum: Vec::with_capacity(rs.len()),
                min: Vec::with_capacity(rs.len()),
                max: Vec::with_capacity(rs.len()),
            };
            for r in rs {
                w.key.push(r.key);
                w.start.push(r.start);
                w.count.push(r.count);
                w.sum.push(r.sum);
                w.min.push(r.min);
                w.max.push(r.max);
            }
            enc.encode(&w)
        }
        Msg::End => enc.encode(&EndOfStream { stream, epoch, from, to, seq }),
        Msg::Trigger { id, trans, savepoint } => enc.encode(&weir_wire::msg::CheckpointTrigger {
            stream,
            epoch,
            checkpoint: id,
            trans,
            from,
            to,
            seq,
            savepoint,
        }),
    };
    Ok(r?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local_inputs(n: usize, cap: usize) -> (Inputs, Vec<Sender<Msg>>) {
        let mut ins = Vec::new();
        let mut txs = Vec::new();
        for i in 0..n {
            let (tx, rx) = crossbeam_channel::bounded(cap);
            txs.push(tx);
            ins.push(Input {
                from: TaskId(i as u32),
                rx,
                wake_upstream: None,
                remote: None,
                ended: false,
                closed: false,
                paused: false,
                received: 0,
            });
        }
        (Inputs::new(TaskId(99), ins, cap, None), txs)
    }

    #[test]
    fn a_closed_input_is_held_back_until_reopened() {
        let (mut inp, txs) = local_inputs(2, 4);
        txs[0].send(Msg::Progress(1)).unwrap();
        txs[1].send(Msg::Progress(2)).unwrap();
        txs[1].send(Msg::Progress(3)).unwrap();
        inp.close(0);
        assert!(inp.is_closed(0));
        let got: Vec<usize> = std::iter::from_fn(|| inp.next_msg().map(|(i, _)| i)).collect();
        assert_eq!(got, vec![1, 1], "only the open input is read");
        inp.reopen(0);
        assert!(matches!(inp.next_msg(), Some((0, Msg::Progress(1)))));
        assert!(inp.next_msg().is_none());
    }

    #[test]
    fn a_paused_input_waits_and_a_checkpoint_reopen_does_not_unpause_it() {
        let (mut inp, txs) = local_inputs(2, 4);
        txs[0].send(Msg::Progress(1)).unwrap();
        txs[1].send(Msg::Progress(2)).unwrap();
        inp.pause(0, true);
        inp.close(1);
        inp.reopen_all();
        assert!(!inp.any_closed());
        let got: Vec<usize> = std::iter::from_fn(|| inp.next_msg().map(|(i, _)| i)).collect();
        assert_eq!(got, vec![1], "the paused input stays held through a checkpoint's reopen");
        inp.pause(0, false);
        assert!(matches!(inp.next_msg(), Some((0, Msg::Progress(1)))));
    }

    #[test]
    fn inputs_are_read_round_robin_and_end_individually() {
        let (mut inp, txs) = local_inputs(3, 8);
        for (i, tx) in txs.iter().enumerate() {
            tx.send(Msg::Progress(i as i64)).unwrap();
            tx.send(Msg::End).unwrap();
        }
        let order: Vec<usize> = std::iter::from_fn(|| inp.next_msg().map(|(i, _)| i)).collect();
        assert_eq!(order, vec![0, 1, 2, 0, 1, 2]);
        assert!(inp.all_ended());
    }
}
