//! Comparing the windows a [`Plan`] chose, a chunk at a time: the expected results of a chunk
//! (from only the generator rows that fall in it, [`results_of_windows`]) against what the nodes
//! hold for it (read from its first window on: a node seeks there, see
//! [`crate::results::pages_from`]). Memory and time follow the windows checked, never the age
//! of the stream.

use std::net::SocketAddr;
use std::ops::{Range, RangeInclusive};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use weir_engine::operator::generator::Generator;
use weir_engine::operator::window::{WindowResult, WindowSpec};
use weir_engine::reference::results_of_windows;
use weir_engine::wire::StreamId;

use super::select::Plan;
use crate::client::Target;

/// Rows recomputed at most per chunk (about 100 bytes of expected results each at worst).
const CHUNK_ROWS: u64 = 8_000_000;

/// A check of one stream's results.
pub struct Check<'a> {
    pub t: &'a Target,
    /// The nodes that run the stream's tasks.
    pub serving: &'a [SocketAddr],
    pub stream: StreamId,
    pub w: WindowSpec,
    /// Every row the stream has taken: a generator and the offsets it produced, each.
    pub segments: Vec<(Generator, Range<u64>)>,
    /// Reads again before a mismatch counts (the sinks may still be writing the last windows).
    pub tries: u32,
    /// Mismatches printed at most.
    pub show: usize,
}

/// What a check found.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Windows compared.
    pub windows: u64,
    /// Results expected in them.
    pub want: u64,
    /// Results found in them.
    pub found: u64,
    /// Results that differ, are missing or are not expected (those outside the windows checked
    /// included).
    pub bad: u64,
    /// Generator rows recomputed.
    pub rows: u64,
}

impl Check<'_> {
    /// Compares the windows of `plan`, with a progress bar (on a terminal) over the rows to
    /// recompute; then checks that the nodes hold no result before `first`, the first window
    /// any row can fall in, nor, when `ended`, after `last`.
    pub fn run(&self, plan: &Plan, first: i64, last: i64, ended: bool) -> anyhow::Result<Outcome> {
        let mut ranges = Vec::new();
        if let Some(recent) = &plan.recent {
            ranges.extend(self.chunks(recent.clone()));
        }
        ranges.extend(plan.sampled.iter().map(|s| *s..=*s));
        let total: u64 = ranges.iter().map(|r| self.rows(r.clone())).sum();
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr_with_hz(4));
        if let Ok(style) = ProgressStyle::with_template("verify [{elapsed_precise}] {wide_bar} {percent}% eta {eta}") {
            bar.set_style(style);
        }
        let mut out = Outcome::default();
        for r in ranges {
            let rows = self.rows(r.clone());
            let want = results_of_windows(self.w, &self.segments, r.clone());
            let mut tries = 0;
            let (bad, found) = loop {
                let got = self.found(&r)?;
                let last = tries >= self.tries;
                let show = if last { self.show.saturating_sub(out.bad as usize) } else { 0 };
                let bad = bar.suspend(|| compare(&want, &got, show));
                if bad == 0 || last {
                    break (bad, got.len());
                }
                tries += 1;
                std::thread::sleep(Duration::from_secs(1));
            };
            out.windows += ((r.end() - r.start()) / self.w.slide_ms + 1) as u64;
            out.want += want.len() as u64;
            out.found += found as u64;
            out.bad += bad as u64;
            out.rows += rows;
            bar.inc(rows);
        }
        bar.finish_and_clear();
        out.bad += self.outside(first, last, ended)?;
        Ok(out)
    }

    /// `range` cut into chunks of at most [`CHUNK_ROWS`] rows (at least a window each), in
    /// order: the rows of a window differ along the stream (loads of different rates).
    fn chunks(&self, range: RangeInclusive<i64>) -> Vec<RangeInclusive<i64>> {
        let (mut out, slide) = (Vec::new(), self.w.slide_ms);
        let (mut lo, mut rows) = (*range.start(), 0u64);
        let mut at = lo;
        while at <= *range.end() {
            let more = self.rows(at..=at);
            if rows > 0 && rows + more > CHUNK_ROWS {
                out.push(lo..=at - slide);
                (lo, rows) = (at, 0);
            }
            rows += more;
            let Some(next) = at.checked_add(slide) else { break };
            at = next;
        }
        out.push(lo..=*range.end());
        out
    }

    /// Results the nodes hold in windows no row can be in: before `first`, and when the stream
    /// has `ended`, after `last` (each printed, up to `show`).
    #[allow(clippy::print_stdout)]
    fn outside(&self, first: i64, last: i64, ended: bool) -> anyhow::Result<u64> {
        let mut stray = Vec::new();
        for addr in self.serving {
            crate::results::pages_from(self.t, *addr, self.stream, None, |page| {
                stray.extend(page.iter().filter(|x| x.start < first).map(WindowResult::from));
                page.last().is_some_and(|x| x.start < first)
            })?;
            let after = last.checked_add(self.w.slide_ms).filter(|_| ended);
            if let Some(after) = after {
                crate::results::pages_from(self.t, *addr, self.stream, Some(after), |page| {
                    stray.extend(page.iter().filter(|x| x.start > last).map(WindowResult::from));
                    stray.len() < 1_000
                })?;
            }
        }
        for r in stray.iter().take(self.show) {
            println!("key {} window {}: expected nothing, found {}", r.key, r.start, row(r));
        }
        Ok(stray.len() as u64)
    }

    /// Rows that can fall in the windows starting in `r`.
    fn rows(&self, r: RangeInclusive<i64>) -> u64 {
        let end = r.end().saturating_add(self.w.size_ms);
        self.segments
            .iter()
            .map(|(g, have)| {
                let want = g.offsets_between(*r.start(), end);
                want.end.min(have.end).saturating_sub(want.start.max(have.start))
            })
            .sum()
    }

    /// The nodes' results of the windows starting in `r`, sorted by (key, window start).
    fn found(&self, r: &RangeInclusive<i64>) -> anyhow::Result<Vec<WindowResult>> {
        let mut out = Vec::new();
        for addr in self.serving {
            crate::results::pages_from(self.t, *addr, self.stream, Some(*r.start()), |page| {
                out.extend(page.iter().filter(|x| r.contains(&x.start)).map(WindowResult::from));
                page.last().is_none_or(|x| x.start <= *r.end())
            })?;
        }
        out.sort_by_key(|r| (r.key, r.start));
        Ok(out)
    }
}

fn row(r: &WindowResult) -> String {
    format!("count {} sum {} min {} max {}", r.count, r.sum, r.min, r.max)
}

/// Compares `want` with `got` (both sorted by key and window), printing the first `show_at_most`
/// differences; returns how many there are.
#[allow(clippy::print_stdout)]
pub fn compare(want: &[WindowResult], got: &[WindowResult], show_at_most: usize) -> usize {
    let (mut i, mut j, mut bad, mut shown) = (0, 0, 0usize, 0);
    let mut show = |what: String| {
        if shown < show_at_most {
            println!("{what}");
            shown += 1;
        }
    };
    while i < want.len() || j < got.len() {
        let order = match (want.get(i), got.get(j)) {
            (Some(w), Some(g)) => (w.key, w.start).cmp(&(g.key, g.start)),
            (Some(_), None) => std::cmp::Ordering::Less,
            _ => std::cmp::Ordering::Greater,
        };
        match order {
            std::cmp::Ordering::Less => {
                show(format!(
                    "key {} window {}: expected {}, found nothing",
                    want[i].key,
                    want[i].start,
                    row(&want[i])
                ));
                (i, bad) = (i + 1, bad + 1);
            }
            std::cmp::Ordering::Greater => {
                show(format!("key {} window {}: expected nothing, found {}", got[j].key, got[j].start, row(&got[j])));
                (j, bad) = (j + 1, bad + 1);
            }
            std::cmp::Ordering::Equal => {
                if want[i] != got[j] {
                    let (w, g) = (row(&want[i]), row(&got[j]));
                    show(format!("key {} window {}: expected {w}, found {g}", want[i].key, want[i].start));
                    bad += 1;
                }
                (i, j) = (i + 1, j + 1);
            }
        }
    }
    bad
}
