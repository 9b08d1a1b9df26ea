//! Connection messages: handshake, liveness, close.

use super::*;

archived! {
    /// First frame of a connection, from the dialing side.
    pub struct Hello {
        /// The cluster this node belongs to; a mismatch refuses the connection.
        pub cluster: String,
        /// The dialer's node id.
        pub node: NodeId,
        /// The dialer's protocol version (also in every frame header).
        pub protocol_version: u8,
        /// The dialer's process incarnation (0: a client, not a member): an older process of a
        /// node is refused (see `TransportConfig::incarnation`).
        pub incarnation: u64,
        /// Random challenge for the accepting side to prove the secret over.
        pub nonce: [u8; NONCE_LEN],
        /// Empty for a member (it proves the cluster secret); otherwise the name of the client
        /// credential it proves (see `role::client_key`).
        pub client: String,
    }
}

archived! {
    /// The accepting side's answer to [`Hello`]: its identity, its own challenge, and its proof
    /// (over both nonces, both identities and both incarnations, keyed as the dialer's `Hello`
    /// asked: the cluster secret or the client's key).
    pub struct Challenge {
        /// The acceptor's node id.
        pub node: NodeId,
        /// The acceptor's protocol version.
        pub protocol_version: u8,
        /// The acceptor's incarnation (0: not a member).
        pub incarnation: u64,
        /// Random challenge for the dialer to prove the secret over.
        pub nonce: [u8; NONCE_LEN],
        /// HMAC-SHA256 over both nonces and identities, keyed by the cluster secret.
        pub proof: [u8; NONCE_LEN],
    }
}

archived! {
    /// The dialer's proof of the cluster secret (or its client key).
    pub struct Auth {
        /// HMAC-SHA256 over both nonces and identities, keyed by the cluster secret.
        pub proof: [u8; NONCE_LEN],
    }
}

archived! {
    /// The acceptor checked the dialer's proof: the connection carries traffic from here on.
    pub struct Welcome {
        /// The role the dialer was granted (`member`, `read`, `ingest`, `admin`).
        pub role: String,
    }
}

archived! {
    /// Liveness and task summary, sent periodically on every connection.
    pub struct Heartbeat {
        /// Sender.
        pub node: NodeId,
        /// Sender's wall clock (ms since the epoch), for lag diagnostics only.
        pub sent_at_ms: u64,
        /// Per-task checkpoint summary (the seed's heartbeat content); empty on plain links.
        pub tasks: Vec<TaskHeartbeat>,
    }
}

archived! {
    /// One task's checkpoint summary inside a [`Heartbeat`].
    pub struct TaskHeartbeat {
        /// Stream.
        pub stream: StreamId,
        /// The run of the stream the task belongs to.
        pub epoch: Epoch,
        /// Task.
        pub task: TaskId,
        /// Latest checkpoint this task committed.
        pub latest: Option<CheckpointId>,
        /// Source offset of that checkpoint.
        pub latest_version: Version,
        /// When it committed (ms since the epoch; 0: not known, as for a restored checkpoint).
        pub latest_ts_ms: u64,
        /// Checkpoint in progress, if any.
        pub active: Option<CheckpointId>,
        /// Last failed checkpoint, if any.
        pub failed: Option<CheckpointId>,
    }
}

archived! {
    /// Why a connection is closed.
    pub enum CloseCode {
        /// Orderly shutdown.
        Shutdown,
        /// The peer belongs to another cluster.
        ClusterMismatch,
        /// The peer speaks another protocol version.
        VersionMismatch,
        /// The peer could not prove the cluster secret.
        AuthFailed,
        /// The peer sent a frame that failed to decode or validate.
        BadFrame,
        /// Nothing was heard from the peer within the dead-peer timeout.
        Timeout,
        /// The peer sent a message that is not allowed at this point (e.g. data before auth).
        ProtocolViolation,
        /// Another connection to the same node replaced this one.
        Replaced,
        /// The member is an older process of a node that a newer one has replaced.
        Stale,
        /// The connection's role may not send this message kind (fatal for the request).
        Forbidden,
        /// Too many connections are handshaking (from this address or in all): retry later.
        Busy,
    }
}

archived! {
    /// Last frame on a connection: why it closes.
    pub struct Close {
        /// Machine-readable reason.
        pub code: CloseCode,
        /// Human-readable detail.
        pub message: String,
    }
}
