//! The property of replay points, on the agg's own code ([`WindowAgg`] and [`AggReplay`]):
//! random rows from several upstreams, random checkpoints, a random choice at each of which
//! windows are written and which named, crashes restored from random checkpoints (some taken
//! during a replay, which resume it), rows sent in another order after each restore: every
//! result emitted is the uninterrupted run's, and together they are all of them. Snapshots are
//! kept in memory, or written through the task's chain of state files ([`WindowChain`]: a full
//! file or a delta, RocksDB SST files read back by the loader) with some uploads failing (their
//! snapshot not accepted into the chain, and not restorable).

use std::collections::BTreeMap;
use std::path::PathBuf;

use proptest::prelude::*;

use super::AggReplay;
use crate::backup::ReplayPoint;
use crate::operator::window::{Acc, WindowAgg, WindowResult, WindowSpec};
use crate::runtime::checkpointing::agg_snapshot::choose;
use crate::state::{TaskStore, WindowChain, load_window_state};
use weir_wire::CheckpointId;

/// Where snapshots go.
enum Storage {
    Memory,
    /// A chain of state files under a directory, one snapshot directory per checkpoint.
    Files {
        root: tempfile::TempDir,
        chain: WindowChain,
    },
}

/// splitmix64: the test's choices, from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

type Row = (i64, u64, f64);

/// A checkpoint as the store would hold it.
struct Snapshot {
    id: u64,
    /// Its directory of state files (else its entries and windows, below).
    dir: Option<PathBuf>,
    entries: Vec<(i64, u64, Acc)>,
    windows: Vec<i64>,
    progress: Vec<Option<i64>>,
    counters: (u64, u64),
    cursor: usize,
    point: ReplayPoint,
    /// The results the sink held at the checkpoint.
    results: BTreeMap<(u64, i64), WindowResult>,
}

/// The agg and what feeds it: rows of each upstream sent from `sent[i]` on, `seen[i]` the
/// largest event time sent.
struct Run<'a> {
    agg: WindowAgg,
    replay: AggReplay,
    sent: Vec<usize>,
    seen: Vec<Option<i64>>,
    rows: &'a [Vec<Row>],
    /// Where messages end, when they are fixed (one upstream with late rows: which rows are
    /// late depends on where progress comes between them).
    ends: Option<&'a [usize]>,
}

impl Run<'_> {
    /// Sends one message of up to `n` rows from upstream `i` (or its fixed one), then its
    /// progress.
    fn send(&mut self, i: usize, n: usize) {
        let n = match self.ends {
            Some(ends) => ends.iter().find(|e| **e > self.sent[i]).map_or(0, |e| e - self.sent[i]),
            None => n,
        };
        let rows = &self.rows[i][self.sent[i]..(self.sent[i] + n).min(self.rows[i].len())];
        if rows.is_empty() {
            return;
        }
        let again = self.replay.take(i, rows.len() as u64) as usize;
        for (k, &(t, key, v)) in rows.iter().enumerate() {
            if k < again { self.agg.replay_add(t, key, v) } else { self.agg.add(t, key, v) }
        }
        if again > 0 && !self.replay.replaying() {
            self.agg.hold(false);
        }
        self.sent[i] += rows.len();
        let max = rows.iter().map(|r| r.0).max().expect("not empty");
        self.seen[i] = Some(self.seen[i].map_or(max, |m| m.max(max)));
        self.agg.observe(i, self.seen[i].expect("set"));
    }

    fn emit(&mut self, max: usize, out: &mut Vec<WindowResult>) {
        self.agg.emit_fired(max, |r| out.push(r)).unwrap();
    }

    /// Checkpoint `id`, with windows born before a random cutoff written (the engine's
    /// choice, with the budget's cutoff replaced by a random one at or after it); `None` when
    /// its upload failed.
    fn checkpoint(&mut self, id: u64, rng: &mut Rng, storage: &mut Storage) -> Option<Snapshot> {
        let pick = |least: u64| least + rng.below(id + 1 - least);
        let choice = choose(&mut self.agg, &mut self.replay, id, false, false, pick).expect("a choice");
        let point = choice.point.expect("replay snapshots");
        let mut frozen = self.agg.snapshot_state();
        let windows = frozen.windows.iter().map(|w| w.0).collect();
        let (mut dir, mut entries) = (None, Vec::new());
        match storage {
            Storage::Memory => entries = frozen.entries().collect(),
            Storage::Files { root, chain } => {
                let d = root.path().join(format!("chk-{id}"));
                let w = chain.write(&mut frozen, CheckpointId(id), &d).expect("written");
                if rng.below(4) == 0 {
                    return None; // the upload failed: the chain stays as it was
                }
                chain.accept(w);
                dir = Some(d);
            }
        }
        Some(Snapshot {
            id,
            dir,
            entries,
            windows,
            progress: frozen.progress.clone(),
            counters: (frozen.rows, frozen.late_rows),
            cursor: frozen.cursor,
            point,
            results: BTreeMap::new(),
        })
    }
}

fn restore<'a>(
    s: &Snapshot,
    spec: WindowSpec,
    delay: i64,
    rows: &'a [Vec<Row>],
    ends: Option<&'a [usize]>,
    storage: &mut Storage,
) -> Run<'a> {
    let ups = rows.len();
    let mut agg = WindowAgg::new(spec, delay, ups);
    match (&s.dir, storage) {
        (Some(dir), Storage::Files { root, chain }) => {
            let store = TaskStore::open_from_state_files(dir, &root.path().join("db")).unwrap();
            assert!(load_window_state(&store, &mut agg).unwrap());
            agg.set_restored(s.point.from.0, &s.point.written, &s.point.partial);
            chain.restored(dir, crate::backup::MANIFEST_FORMAT, &agg.written_windows()).unwrap();
        }
        _ => {
            agg.restore(s.entries.iter().copied(), &s.progress, s.counters.1, s.counters.0).unwrap();
            agg.reopen(&s.windows, s.cursor);
            agg.set_restored(s.point.from.0, &s.point.written, &s.point.partial);
        }
    }
    agg.set_checkpoint(s.id);
    let mut replay = AggReplay::new(true, ups, None);
    replay.restore_replay(s.id, &s.point).unwrap();
    agg.hold(replay.replaying());
    // Each upstream sends again from the point's start (routing is the identity here).
    let sent = s.point.taken.iter().map(|(a, _)| *a as usize).collect();
    Run { agg, replay, sent, seen: s.progress.clone(), rows, ends }
}

/// Rows of `ups` upstreams, mostly in event-time order. With one upstream some are late; with
/// more, none lags its upstream's progress by more than `delay` (whether a row is late would
/// depend on how the upstreams interleave, which a restore changes).
fn rows_of(rng: &mut Rng, ups: usize, delay: i64) -> Vec<Vec<Row>> {
    let lag = if ups == 1 { 30 } else { delay as u64 + 1 };
    (0..ups)
        .map(|_| {
            let (n, mut t) = (rng.below(300) as usize, rng.below(20) as i64);
            (0..n)
                .map(|_| {
                    t += rng.below(4) as i64;
                    // Now and then a row behind: late for some windows.
                    let ts = t - if rng.below(10) == 0 { rng.below(lag) as i64 } else { 0 };
                    (ts, rng.below(6), (rng.below(2000) as f64 - 1000.0) / 8.0)
                })
                .collect()
        })
        .collect()
}

fn check(seed: u64, files: bool) -> Result<(), TestCaseError> {
    let mut rng = Rng(seed);
    let mut storage = match files {
        true => Storage::Files { root: tempfile::tempdir().unwrap(), chain: WindowChain::new() },
        false => Storage::Memory,
    };
    let ups = 1 + rng.below(3) as usize;
    let slide = 1 + rng.below(12) as i64;
    let spec = WindowSpec::hopping(slide * (1 + rng.below(4) as i64), slide);
    let delay = rng.below(6) as i64;
    let rows = rows_of(&mut rng, ups, delay);
    let total: usize = rows.iter().map(Vec::len).sum();
    let ends: Option<Vec<usize>> = (ups == 1).then(|| {
        let mut at = 0;
        std::iter::from_fn(|| {
            (at < rows[0].len()).then(|| {
                at += 1 + rng.below(25) as usize;
                at
            })
        })
        .collect()
    });
    let fresh = || Run {
        agg: WindowAgg::new(spec, delay, ups),
        replay: AggReplay::new(true, ups, None),
        sent: vec![0; ups],
        seen: vec![None; ups],
        rows: &rows,
        ends: ends.as_deref(),
    };

    // The uninterrupted run.
    let mut whole = fresh();
    let mut want = Vec::new();
    for (i, up) in rows.iter().enumerate() {
        while whole.sent[i] < up.len() {
            whole.send(i, 1 + rng.below(25) as usize);
        }
    }
    (0..ups).for_each(|i| whole.agg.observe(i, i64::MAX));
    whole.emit(usize::MAX, &mut want);
    let want: BTreeMap<(u64, i64), WindowResult> = want.into_iter().map(|r| ((r.key, r.start), r)).collect();

    // Runs that crash and restore from a random checkpoint taken so far.
    let mut snaps: Vec<Snapshot> = Vec::new();
    let mut got: BTreeMap<(u64, i64), WindowResult> = BTreeMap::new();
    let mut run = fresh();
    let (mut id, crashes) = (0, rng.below(4));
    for crash in 0..=crashes {
        let steps = if crash == crashes { usize::MAX } else { rng.below(40) as usize };
        let mut step = 0;
        while step < steps && (0..ups).any(|i| run.sent[i] < rows[i].len()) {
            let i = rng.below(ups as u64) as usize;
            run.send(i, 1 + rng.below(25) as usize);
            let mut out = Vec::new();
            run.emit(1 + rng.below(30) as usize, &mut out);
            for r in out {
                prop_assert_eq!(Some(&r), want.get(&(r.key, r.start)), "seed {}: a result differs", seed);
                got.insert((r.key, r.start), r);
            }
            if rng.below(5) == 0 {
                id += 1;
                if let Some(mut snap) = run.checkpoint(id, &mut rng, &mut storage) {
                    snap.results = got.clone();
                    snaps.push(snap);
                }
            }
            step += 1;
        }
        if crash < crashes && !snaps.is_empty() {
            // The sink goes back to the checkpoint's results too.
            let s = &snaps[rng.below(snaps.len() as u64) as usize];
            run = restore(s, spec, delay, &rows, ends.as_deref(), &mut storage);
            got = s.results.clone();
        }
    }
    (0..ups).for_each(|i| run.agg.observe(i, i64::MAX));
    let mut out = Vec::new();
    run.emit(usize::MAX, &mut out);
    for r in out {
        prop_assert_eq!(Some(&r), want.get(&(r.key, r.start)), "seed {}: a result differs", seed);
        got.insert((r.key, r.start), r);
    }
    prop_assert_eq!(got.len(), want.len(), "seed {}: {} rows, {} checkpoints", seed, total, snaps.len());
    prop_assert_eq!((run.agg.rows(), run.agg.late_rows()), (whole.agg.rows(), whole.agg.late_rows()));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn restores_of_random_checkpoints_with_random_windows_written_end_with_the_same_results(seed in any::<u64>()) {
        check(seed, false)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn the_same_through_chains_of_state_files_with_failed_uploads(seed in any::<u64>()) {
        check(seed, true)?;
    }
}
