//! Data-plane messages: ingest, rows, watermarks, window results, end of stream, credit.

use super::*;

archived! {
    /// Rows sent to a node's ingest log (`weir load`).
    pub struct Ingest {
        /// Target stream.
        pub stream: StreamId,
        /// Target partition (one source task each).
        pub partition: u32,
        /// Client's request id, echoed in the ack.
        pub request: u64,
        /// The producer (`weir load` picks a random id per run): appends are idempotent per
        /// producer and partition.
        pub producer: u64,
        /// The producer's batches on this partition count from 0 without gaps: a batch sent
        /// again is acknowledged with its original versions, never stored twice; a gap is refused.
        pub seq: u64,
        /// The rows.
        pub batch: Batch,
        /// After the rows, the partition goes idle: no row sent later has an earlier event time
        /// (ms) than this that counts as on time (a finished `weir load` says so). The node
        /// appends a watermark marker for it, and the partition stops holding back the stream's
        /// watermark.
        pub idle_watermark_ms: Option<i64>,
        /// With the producer's first batch on the partition (`seq` 0): what the producer says of
        /// itself, kept with the partition's log for as long as the log is (`weir load`: the
        /// parameters its rows are a pure function of, for `weir verify`). Ignored on other batches.
        pub description: Option<Vec<u8>>,
    }
}

archived! {
    /// Result of an [`Ingest`].
    pub enum IngestOutcome {
        /// The rows are durable under the node's policy, at versions `first..=last`.
        Durable {
            /// Version of the first row.
            first: Version,
            /// Version of the last row.
            last: Version,
            /// The rows had been stored before (the batch was sent again).
            duplicate: bool,
        },
        /// An [`Ingest`] without rows: its idle watermark is durable, as a marker at `at`.
        Marked {
            /// The marker's version.
            at: Version,
        },
        /// The rows were not stored: the partition's source does not run on this node (it
        /// moved, or the node runs no task now). Sending again may succeed on the node it runs
        /// on; the cluster's status says which.
        NotHere {
            /// Why.
            reason: String,
        },
        /// The rows were not stored.
        Rejected {
            /// Why.
            reason: String,
            /// Whether sending again may succeed.
            retryable: bool,
        },
    }
}

archived! {
    /// Acknowledges an [`Ingest`] once its rows are durable (or refuses it).
    pub struct IngestAck {
        /// Stream.
        pub stream: StreamId,
        /// Partition.
        pub partition: u32,
        /// The request this answers.
        pub request: u64,
        /// What happened.
        pub outcome: IngestOutcome,
    }
}

archived! {
    /// A batch on a channel between two tasks.
    pub struct Data {
        /// Stream.
        pub stream: StreamId,
        /// The stream's run: a node takes it only into the run at this epoch.
        pub epoch: Epoch,
        /// Sending task.
        pub from: TaskId,
        /// Receiving task.
        pub to: TaskId,
        /// Per-channel sequence number (shared with watermarks and triggers on that channel).
        pub seq: Seq,
        /// The rows.
        pub batch: Batch,
    }
}

archived! {
    /// Event-time progress of an upstream on a channel.
    pub struct Watermark {
        /// Stream.
        pub stream: StreamId,
        /// The stream's run: a node takes it only into the run at this epoch.
        pub epoch: Epoch,
        /// Sending task.
        pub from: TaskId,
        /// Receiving task.
        pub to: TaskId,
        /// Per-channel sequence number.
        pub seq: Seq,
        /// No row with a smaller event time (ms) follows on this channel.
        pub watermark_ms: i64,
    }
}

archived! {
    /// Window results from an agg task to a sink task (columnar).
    pub struct WindowResults {
        /// Stream.
        pub stream: StreamId,
        /// The stream's run: a node takes it only into the run at this epoch.
        pub epoch: Epoch,
        /// Sending agg.
        pub from: TaskId,
        /// Receiving sink.
        pub to: TaskId,
        /// Per-channel sequence number.
        pub seq: Seq,
        /// Series keys.
        pub key: Vec<u64>,
        /// Window starts (ms).
        pub start: Vec<i64>,
        /// Row counts.
        pub count: Vec<u64>,
        /// Sums.
        pub sum: Vec<f64>,
        /// Minimums.
        pub min: Vec<f64>,
        /// Maximums.
        pub max: Vec<f64>,
    }
}

impl ArchivedWindowResults {
    /// All columns must have the same length.
    pub fn check_columns(&self) -> Result<(), super::CheckError> {
        let n = self.key.len();
        let lens = [n, self.start.len(), self.count.len(), self.sum.len(), self.min.len(), self.max.len()];
        if lens.iter().all(|l| *l == n) {
            Ok(())
        } else {
            Err(super::CheckError::Columns {
                what: "window result (key, start, count, sum, min, max)",
                lens: lens.to_vec(),
            })
        }
    }
}

archived! {
    /// The upstream task has sent everything: its channel ends here.
    pub struct EndOfStream {
        /// Stream.
        pub stream: StreamId,
        /// The stream's run: a node takes it only into the run at this epoch.
        pub epoch: Epoch,
        /// Sending task.
        pub from: TaskId,
        /// Receiving task.
        pub to: TaskId,
        /// Per-channel sequence number.
        pub seq: Seq,
    }
}

archived! {
    /// Receiver → sender of a remote channel: room for `credits` more frames (credit-based flow
    /// control, so one slow channel never blocks a connection that others share).
    pub struct Credit {
        /// Stream.
        pub stream: StreamId,
        /// The stream's run: a node takes it only into the run at this epoch.
        pub epoch: Epoch,
        /// Sending task of the channel (who gets the credit).
        pub from: TaskId,
        /// Receiving task of the channel.
        pub to: TaskId,
        /// Frames granted.
        pub credits: u32,
    }
}
