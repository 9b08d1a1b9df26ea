//! Missing triggers: a task that waited past its timeout for an upstream's trigger asks that
//! upstream (`RetrieveTrigger`); the upstream answers with where the trigger went on the channel,
//! and the task injects it only when every frame before it is already here (otherwise data is
//! missing and the checkpoint fails).

use weir_wire::msg::TriggerRspCode;
use weir_wire::{CheckpointId, Seq, TaskId, TransId};

use super::{Discard, TaskAction, TaskMachine};
use crate::checkpoint::TaskFailure;

impl TaskMachine {
    pub(super) fn retrieve(&mut self, from: TaskId, id: CheckpointId) -> Vec<TaskAction> {
        let Some(i) = self.downstream_index(from) else { return self.discard(Discard::Misdirected) };
        let not_over = self.latest.is_none_or(|l| id > l) && self.failed.is_none_or(|f| id > f);
        let (code, id, trans, seq) = match &self.active {
            Some(a) if a.id == id => match a.dispatched[i] {
                Some(seq) => (TriggerRspCode::Success, id, a.trans, seq),
                None => (TriggerRspCode::InProgress, id, a.trans, Seq(0)),
            },
            // Not there yet (this task is behind, or its request is on the way): "in progress",
            // and the downstream asks again at its next timeout.
            Some(a) if a.id < id && not_over => (TriggerRspCode::InProgress, id, TransId(0), Seq(0)),
            None if not_over => (TriggerRspCode::InProgress, id, TransId(0), Seq(0)),
            // A real mismatch: `id` is over here (completed, failed, or overtaken by a newer one).
            Some(a) => (TriggerRspCode::Invalid, a.id, a.trans, Seq(0)),
            None => (TriggerRspCode::Invalid, id, TransId(0), Seq(0)),
        };
        vec![TaskAction::SendTriggerRsp { to: from, id, trans, code, trigger_seq: seq }]
    }

    pub(super) fn trigger_rsp(
        &mut self,
        from: TaskId,
        id: CheckpointId,
        trans: TransId,
        code: TriggerRspCode,
        trigger_seq: Seq,
        next_seq: Option<Seq>,
    ) -> Vec<TaskAction> {
        let Some(i) = self.upstream_index(from) else { return self.discard(Discard::Misdirected) };
        let Some(a) = self.active.as_ref() else { return self.discard(Discard::Invalid) };
        if a.triggers[i] {
            return self.discard(Discard::Invalid); // the retrieve crossed the barrier
        }
        if code == TriggerRspCode::Invalid && id > a.id {
            // The upstream is in a newer checkpoint (its answer names it): this one is over,
            // and its end did not reach this task.
            let active = a.id;
            return self.fail(TaskFailure::Overtaken { from, id, active });
        }
        if a.id != id {
            return self.discard(Discard::Invalid);
        }
        match code {
            TriggerRspCode::InProgress => Vec::new(),
            TriggerRspCode::Invalid => self.fail(TaskFailure::NotUpstream { from, id }),
            // Injecting is safe only if everything before the trigger on that channel is here.
            TriggerRspCode::Success if next_seq == Some(trigger_seq) => {
                self.injected += 1;
                let mut out = vec![TaskAction::InjectTrigger { from }];
                out.extend(self.trigger(from, id, trans));
                out
            }
            TriggerRspCode::Success => self.fail(TaskFailure::TriggerGap { from, trigger_seq, next: next_seq }),
        }
    }
}
