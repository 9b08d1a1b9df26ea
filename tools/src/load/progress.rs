//! The live line of `weir load` on a terminal (`indicatif`): events sent and acknowledged, the
//! rate, and the last second's ack-latency p99. Hidden when stderr is not a terminal.

use std::sync::atomic::Ordering;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::driver::Counters;

pub struct Bar {
    bar: ProgressBar,
    /// Events or milliseconds the bar counts to.
    by_events: bool,
}

impl Bar {
    /// A bar to `events`, or to the end of `duration`.
    pub fn new(events: Option<u64>, duration: Option<Duration>) -> Self {
        let (len, by_events) = match (events, duration) {
            (Some(n), _) => (n, true),
            (None, Some(d)) => (d.as_millis() as u64, false),
            (None, None) => (0, false),
        };
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr_with_hz(4));
        let style = ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {msg}")
            .expect("valid template")
            .progress_chars("=> ");
        bar.set_style(style);
        Self { bar, by_events }
    }

    /// Shows the counters now.
    pub fn update(&self, c: &Counters, acked: u64, elapsed: Duration, p99_us: u64) {
        let sent = c.sent_rows.load(Ordering::Relaxed);
        let rate = acked as f64 / elapsed.as_secs_f64().max(1e-3);
        let retries = c.retries.load(Ordering::Relaxed) + c.reconnects.load(Ordering::Relaxed);
        self.bar.set_position(if self.by_events { acked } else { elapsed.as_millis() as u64 });
        self.bar.set_message(format!(
            "sent {} acked {} ({}/s) ack p99 {:.1} ms{}",
            human(sent as f64),
            human(acked as f64),
            human(rate),
            p99_us as f64 / 1000.0,
            if retries > 0 { format!(", {retries} retries") } else { String::new() }
        ));
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// `12.3M`, `450k`, `999`.
pub fn human(n: f64) -> String {
    if n >= 1e9 {
        format!("{:.2}G", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.2}M", n / 1e6)
    } else if n >= 1e4 {
        format!("{:.1}k", n / 1e3)
    } else {
        format!("{n:.0}")
    }
}
