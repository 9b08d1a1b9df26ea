//! [`EngineError`]: why an engine could not start or stopped, retryable or fatal.

use super::task::TaskError;

/// Errors of the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The spec or config is wrong (fatal).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The stream's spec is wrong (fatal).
    #[error("invalid stream spec: {0}")]
    Spec(#[from] crate::spec::SpecError),
    /// A store could not be opened (retryable once the cause is fixed).
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    /// The ingest log could not be opened.
    #[error(transparent)]
    Log(#[from] crate::ingest::LogError),
    /// The transport could not start.
    #[error(transparent)]
    Transport(#[from] weir_wire::transport::TransportError),
    /// A task failed.
    #[error(transparent)]
    Task(#[from] TaskError),
    /// The remote store could not be read at start (retryable once it is back).
    #[error("remote store: {0}")]
    Store(String),
    /// The stream's checkpoint ids and commit point could not be read or claimed (retryable
    /// when the store says so; [`EngineError::is_control`] says whether the control store
    /// refused or failed).
    #[error("the checkpoint ids and last commit: {0}")]
    Point(#[from] crate::backup::commit_point::PointError),
    /// A checkpoint request could not be served (not the coordinator, no checkpoints).
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// A worker thread panicked (fatal: its tasks' state is gone with it).
    #[error("worker {worker} panicked")]
    WorkerPanicked {
        /// The worker's index.
        worker: usize,
    },
    /// The engine stopped because of a fault (lost data on a channel, a protocol violation).
    #[error("engine failed: {0}")]
    Failed(String),
    /// A thread could not be started.
    #[error("cannot start a thread: {0}")]
    Thread(std::io::Error),
    /// The data directory could not be made (retryable once the cause is fixed).
    #[error("data directory {path}: {source}")]
    DataDir {
        /// The directory.
        path: std::path::PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl EngineError {
    /// Whether the control store (etcd) failed for a while or refused the run (its lease or
    /// placement changed as it started): a start that fails so may succeed at once, whatever
    /// the config.
    pub fn is_control(&self) -> bool {
        use crate::backup::commit_point::PointError;
        match self {
            EngineError::Point(PointError::Fenced { .. }) => true,
            EngineError::Point(PointError::Control(e)) => e.is_retryable(),
            _ => false,
        }
    }

    /// Whether restarting may help (it does for I/O; not for configuration or a panic).
    pub fn is_retryable(&self) -> bool {
        match self {
            EngineError::Config(_) | EngineError::Spec(_) | EngineError::WorkerPanicked { .. } => false,
            EngineError::Checkpoint(e) => e.is_retryable(),
            EngineError::Point(e) => e.is_retryable(),
            EngineError::Task(TaskError::Checkpoint(e)) => e.is_retryable(),
            _ => true,
        }
    }
}
