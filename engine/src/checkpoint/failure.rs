//! Why a checkpoint failed: [`TaskFailure`], a task's own reason (in its report), and
//! [`CheckpointFailure`], the coordinator's (in `CoordAction::Finished` and the reset it sends
//! the tasks). A failed checkpoint never fails the stream: the next one starts afresh.
//! `is_retryable` says whether its cause is expected to pass (a timeout, a lost node, a store
//! that did not answer) or to come back until something is repaired (a damaged object).
//!
//! On the wire these travel as their text; a report from another node comes back as
//! [`TaskFailure::Reported`].

use weir_wire::{CheckpointId, NodeId, Seq, TaskId};

use super::CheckpointError;

/// Why a task failed its part of a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TaskFailure {
    /// Capturing its state failed.
    #[error("snapshot failed: {0}")]
    Snapshot(CheckpointError),
    /// Making its snapshot durable in the store failed.
    #[error("upload failed: {0}")]
    Upload(CheckpointError),
    /// An upstream it asked for a lost barrier is in a newer checkpoint already.
    #[error("upstream {from} moved on to checkpoint {id}: {active} is over")]
    Overtaken {
        /// The upstream.
        from: TaskId,
        /// The checkpoint it is in.
        id: CheckpointId,
        /// This task's checkpoint.
        active: CheckpointId,
    },
    /// An upstream it asked for a lost barrier is not in the checkpoint.
    #[error("upstream {from} is not in checkpoint {id}")]
    NotUpstream {
        /// The upstream.
        from: TaskId,
        /// The checkpoint.
        id: CheckpointId,
    },
    /// An upstream sent its barrier, but data before it never arrived here.
    #[error("{}", gap_text(*from, *trigger_seq, *next))]
    TriggerGap {
        /// The upstream.
        from: TaskId,
        /// The frame that carried the barrier.
        trigger_seq: Seq,
        /// The frame expected next here (`None`: unknown).
        next: Option<Seq>,
    },
    /// The reason a task on another node reported (its text crossed the wire).
    #[error("{reason}")]
    Reported {
        /// What it said.
        reason: String,
    },
}

fn gap_text(from: TaskId, trigger_seq: Seq, next: Option<Seq>) -> String {
    match next {
        Some(next) => {
            format!(
                "trigger from {from} was frame {trigger_seq} but frame {next} is next here: data before it is missing"
            )
        }
        None => format!("trigger from {from}: the channel's position here is unknown"),
    }
}

impl TaskFailure {
    /// Whether a later checkpoint may pass where this one failed.
    pub fn is_retryable(&self) -> bool {
        match self {
            TaskFailure::Snapshot(e) | TaskFailure::Upload(e) => e.is_retryable(),
            _ => true,
        }
    }
}

/// Why the coordinator failed a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointFailure {
    /// A task reported its failure.
    #[error("{task} failed: {failure}")]
    Task {
        /// The task.
        task: TaskId,
        /// Its reason.
        failure: TaskFailure,
    },
    /// A source could not take part (not restored yet, or failed).
    #[error("source {task} refused checkpoint {id}: {answer}")]
    SourceRefused {
        /// The source.
        task: TaskId,
        /// The checkpoint.
        id: CheckpointId,
        /// Its answer.
        answer: String,
    },
    /// Not every task reported within the checkpoint timeout.
    #[error("timed out after {after_ms} ms")]
    TimedOut {
        /// Since the checkpoint started.
        after_ms: u64,
    },
    /// A node of the stream was lost during the checkpoint.
    #[error("node {node} was lost")]
    NodeLost {
        /// The node.
        node: NodeId,
    },
    /// A node of the stream was down when the checkpoint was due.
    #[error("node {node} is down")]
    NodeDown {
        /// The node.
        node: NodeId,
    },
    /// Writing the commit record failed.
    #[error("writing the commit record failed: {reason}")]
    CommitWrite {
        /// Why.
        reason: String,
    },
    /// Writing the commit record did not answer in time: it may still land.
    #[error("writing the commit record: no answer within {after_ms} ms")]
    CommitUnanswered {
        /// The limit.
        after_ms: u64,
    },
    /// A task cannot restore the checkpoint the stream restored: the stream goes back to an
    /// older one.
    #[error("task {task} cannot restore checkpoint {id}")]
    CannotRestore {
        /// The task.
        task: TaskId,
        /// The checkpoint.
        id: CheckpointId,
    },
}

impl CheckpointFailure {
    /// Whether the next checkpoint may pass where this one failed.
    pub fn is_retryable(&self) -> bool {
        match self {
            CheckpointFailure::Task { failure, .. } => failure.is_retryable(),
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_read_as_before_and_say_whether_they_may_pass() {
        let upload = TaskFailure::Upload(CheckpointError::Store {
            op: "put",
            key: "1/chk-3/t2".into(),
            reason: "checksum mismatch".into(),
            retryable: false,
        });
        let f = CheckpointFailure::Task { task: TaskId(2), failure: upload };
        assert_eq!(f.to_string(), "t2 failed: upload failed: store put 1/chk-3/t2: checksum mismatch");
        assert!(!f.is_retryable());
        let gap = TaskFailure::TriggerGap { from: TaskId(1), trigger_seq: Seq(5), next: Some(Seq(3)) };
        assert_eq!(
            gap.to_string(),
            "trigger from t1 was frame #5 but frame #3 is next here: data before it is missing"
        );
        assert!(CheckpointFailure::TimedOut { after_ms: 60_000 }.is_retryable());
        assert_eq!(CheckpointFailure::NodeLost { node: NodeId(3) }.to_string(), "node n3 was lost");
    }
}
