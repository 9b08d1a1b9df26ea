//! [`SpecError`]: what is wrong with a stream's spec (its shape, window or generator). Always
//! fatal: the same spec fails the same way again, so a caller reports it and does not retry.

/// A stream spec that cannot run, with the values at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    /// A level with no task.
    #[error(
        "partitions, agg_parallelism and sink_parallelism must be at least 1 (got {partitions}, {aggs} and {sinks})"
    )]
    Parallelism {
        /// Source partitions.
        partitions: u32,
        /// Aggs.
        aggs: u32,
        /// Sinks.
        sinks: u32,
    },
    /// More tasks than a stream may have.
    #[error("partitions, aggs and sinks add up to more than {max} tasks (got {partitions}, {aggs} and {sinks})", max = crate::spec::MAX_TASKS)]
    TooManyTasks {
        /// Source partitions.
        partitions: u32,
        /// Aggs.
        aggs: u32,
        /// Sinks.
        sinks: u32,
    },
    /// A first agg task id among the sources' (or with no room for the ids after it).
    #[error(
        "first_agg_task must be at least partitions ({partitions}), with room for the aggs' and sinks' ids (got {first})"
    )]
    FirstAggTask {
        /// The first agg's id.
        first: u32,
        /// Source partitions.
        partitions: u32,
    },
    /// Rows per batch out of range.
    #[error("batch_rows must be between 1 and 1048576 (got {0})")]
    BatchRows(usize),
    /// A negative watermark delay.
    #[error("watermark_delay_ms must not be negative (got {0})")]
    WatermarkDelay(i64),
    /// A window of no length or no slide.
    #[error("window: size and slide must be positive (got size {size_ms} ms, slide {slide_ms} ms)")]
    WindowNotPositive {
        /// Size (ms).
        size_ms: i64,
        /// Slide (ms).
        slide_ms: i64,
    },
    /// A window whose size is not a whole number of slides.
    #[error("window: size {size_ms} ms must be a multiple of the slide {slide_ms} ms")]
    WindowNotMultiple {
        /// Size (ms).
        size_ms: i64,
        /// Slide (ms).
        slide_ms: i64,
    },
    /// A generator without keys or rows.
    #[error("generator: keys and rows_per_ms must be positive (got {keys} and {rows_per_ms})")]
    GeneratorEmpty {
        /// Keys.
        keys: u64,
        /// Rows per millisecond.
        rows_per_ms: u64,
    },
    /// A generator's disorder out of range.
    #[error(
        "generator: out_of_order must be in 0..=1 and max_disorder_ms >= 0 (got {out_of_order} and {max_disorder_ms})"
    )]
    GeneratorDisorder {
        /// Fraction of rows out of order.
        out_of_order: f64,
        /// How far back (ms).
        max_disorder_ms: i64,
    },
    /// A generator rate of 0.
    #[error("generator rate must be positive (omit it for full speed)")]
    ZeroRate,
}

impl SpecError {
    /// Never: a spec fails the same way every time.
    pub fn is_retryable(&self) -> bool {
        false
    }
}
