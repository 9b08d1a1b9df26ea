//! The receiving ends of a task's channels ([`Inputs`]): taking messages in turn from the
//! channels not held back, and granting credits back to remote senders as frames are consumed.

use crossbeam_channel::Receiver;
use crossbeam_utils::sync::Unparker;
use weir_wire::msg::Credit;
use weir_wire::{NodeId, Seq, TaskId};

use super::{Msg, Net};

/// The receiving end of one channel.
pub(crate) struct Input {
    pub(crate) from: TaskId,
    pub(crate) rx: Receiver<Msg>,
    /// Local channel: the producer's worker, woken when a full queue gets room.
    pub(crate) wake_upstream: Option<Unparker>,
    /// Remote channel: the producer's node, and consumed frames not yet granted back.
    pub(crate) remote: Option<(NodeId, u32)>,
    pub(crate) ended: bool,
    /// Held back (checkpoint alignment): its messages wait in its queue.
    pub(crate) closed: bool,
    /// Held back for running ahead in event time (`alignment.rs`): its messages wait too.
    pub(crate) paused: bool,
    /// Messages taken so far: the next expected sequence number.
    pub(crate) received: u64,
}

/// A task's incoming channels, in upstream order.
pub struct Inputs {
    to: TaskId,
    ins: Vec<Input>,
    next: usize,
    grant_every: u32,
    net: Option<Net>,
}

impl std::fmt::Debug for Inputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inputs").field("to", &self.to).field("channels", &self.ins.len()).finish()
    }
}

impl Inputs {
    pub(crate) fn new(to: TaskId, ins: Vec<Input>, capacity: usize, net: Option<Net>) -> Self {
        let grant_every = (capacity as u32 / 2).max(1);
        Self { to, ins, next: 0, grant_every, net }
    }

    /// The task these inputs feed.
    pub(crate) fn task(&self) -> TaskId {
        self.to
    }

    /// Messages waiting in every input queue.
    pub fn queued(&self) -> usize {
        self.ins.iter().map(|i| i.rx.len()).sum()
    }

    /// Number of upstream channels.
    pub fn len(&self) -> usize {
        self.ins.len()
    }

    /// Whether the task has no upstream (a source).
    pub fn is_empty(&self) -> bool {
        self.ins.is_empty()
    }

    /// Holds input `i` back: its messages stay queued (and push back on its upstream) until
    /// [`Inputs::reopen`]. Alignment closes the input of each upstream whose barrier arrived.
    pub fn close(&mut self, i: usize) {
        self.ins[i].closed = true;
    }

    /// Takes input `i` again.
    pub fn reopen(&mut self, i: usize) {
        self.ins[i].closed = false;
    }

    /// Takes every input again.
    pub fn reopen_all(&mut self) {
        self.ins.iter_mut().for_each(|i| i.closed = false);
    }

    /// Whether input `i` is held back.
    pub fn is_closed(&self, i: usize) -> bool {
        self.ins[i].closed
    }

    /// Whether any input is held back for a checkpoint.
    pub fn any_closed(&self) -> bool {
        self.ins.iter().any(|i| i.closed)
    }

    /// Holds input `i` back for running ahead in event time, or takes it again: apart from
    /// checkpoint alignment's [`Inputs::close`], so neither undoes the other.
    pub(crate) fn pause(&mut self, i: usize, paused: bool) {
        self.ins[i].paused = paused;
    }

    /// The upstream task of input `i`.
    pub fn source_of(&self, i: usize) -> TaskId {
        self.ins[i].from
    }

    /// The index of the input from `upstream`.
    pub fn index_of(&self, upstream: TaskId) -> Option<usize> {
        self.ins.iter().position(|i| i.from == upstream)
    }

    /// The sequence number the next message on input `i` will have.
    pub fn next_seq(&self, i: usize) -> Seq {
        Seq(self.ins[i].received)
    }

    /// Whether every upstream has ended.
    pub fn all_ended(&self) -> bool {
        self.ins.iter().all(|i| i.ended)
    }

    /// Sends the credits input `i` has accumulated. If the transport queue is full they stay
    /// accumulated and [`Inputs::retry_grants`] sends them later.
    fn grant(&mut self, i: usize) {
        let input = &mut self.ins[i];
        let Some((node, consumed)) = &mut input.remote else { return };
        if let Some(net) = self.net.as_mut()
            && let Ok(f) = net.encoder.encode(&Credit {
                stream: net.run.stream,
                epoch: net.run.epoch,
                from: input.from,
                to: self.to,
                credits: *consumed,
            })
            && net.sender.try_send(*node, f).is_ok()
        {
            *consumed = 0;
        }
    }

    /// Sends grants that could not go out before. A sender waiting for credit has at least
    /// `grant_every` frames consumed here, so this is what unblocks it.
    pub fn retry_grants(&mut self) {
        for i in 0..self.ins.len() {
            if self.ins[i].remote.is_some_and(|(_, c)| c >= self.grant_every) {
                self.grant(i);
            }
        }
    }

    /// The next message from any upstream, round robin: `(input index, message)`.
    pub fn next_msg(&mut self) -> Option<(usize, Msg)> {
        let n = self.ins.len();
        for k in 0..n {
            let i = (self.next + k) % n;
            let input = &mut self.ins[i];
            if input.ended || input.closed || input.paused {
                continue;
            }
            let Ok(m) = input.rx.try_recv() else { continue };
            input.received += 1;
            self.next = (i + 1) % n;
            if matches!(m, Msg::End) {
                input.ended = true;
            }
            if let Some(w) = &input.wake_upstream
                && input.rx.capacity().is_some_and(|c| input.rx.len() + 1 == c)
            {
                w.unpark();
            }
            if let Some((_, consumed)) = &mut input.remote {
                *consumed += 1;
                if *consumed >= self.grant_every {
                    self.grant(i);
                }
            }
            return Some((i, m));
        }
        None
    }
}
