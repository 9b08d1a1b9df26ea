//! Deterministic simulation of the checkpoint protocol, running the engine's own drivers
//! ([`TaskDriver`], [`CoordDriver`]) through the simulator's implementation of their effect
//! traits (`fx.rs`): one seeded scheduler, model tasks on FIFO data channels (`world.rs`), and a
//! faulty in-memory store that holds snapshots, commit records and the id record through the real
//! codecs.
//!
//! Faults: control messages delayed, reordered, duplicated and lost; data items lost or
//! duplicated on channels between nodes (caught by the sequence check, which restarts the stream
//! from the last commit, as the engine does); crashes of everything, sometimes losing the commit
//! records (the tasks then restore the consensus); the coordinator crashing alone, also right
//! after writing a commit record; store puts that fail, that fail after storing, and store calls
//! that never answer; failed snapshots and uploads; a node partitioned away and back. Half the
//! seeds keep the commit point and ids in a control store (the engine's `ControlCommits`, as on
//! etcd; `control.rs`) whose transactions fail, or land with their answer lost, and whose reads
//! fail; the coordinator moves to another node now and then, and the deposed one's writes must
//! be refused. Topologies
//! mix fixed and shuffle dispatch, levels of one task, and sources that end.
//!
//! Invariants, checked as the run goes: every visible commit is a consistent cut; nothing commits
//! without a successful report from every task; checkpoint ids only grow and no (id, transaction)
//! pair is used twice; no checkpoint starts on an id the store has not reserved; a task told to
//! reset a checkpoint never checkpoints it (or an older one) again; every restore point is a
//! committed checkpoint; no snapshot a commit names is deleted; once faults stop a checkpoint
//! commits within bounded time (or the stream ends), and in quiet moments no task is left
//! checkpointing. At the end: every commit in the store restores, and the sinks' results equal
//! what a reference computes from every source row exactly once, however many crashes happened.
//!
//! `WEIR_SIM_SEEDS=N` runs N seeds per test shard (default 5,000, four shards: 20,000 seeds);
//! `WEIR_SIM_SEED=S` replays seed S alone (a failure prints the seed and the steps before it).

mod checks;
mod control;
mod cuts;
mod damage;
mod faults;
mod fx;
mod sim;
mod store;
mod world;

use weir_engine::backup::commit::decode_commit;
use weir_engine::checkpoint::CoordInput;
use weir_engine::wire::NodeId;

use sim::Sim;
use world::{Model, Stats, snapshot_key};

pub const TRIGGER_TIMEOUT: u64 = 2_000;
/// Bounded queues, as in the engine: a producer waits while its channel holds this many items.
pub const CAP: usize = 16;
pub const READY_RESEND: u64 = 500;
/// The coordinator, as an endpoint of control messages (tasks are 0..n).
pub const COORD: usize = usize::MAX;

/// What one seed's run ended with.
struct Outcome {
    commits: usize,
    stats: Stats,
}

fn run(seed: u64) -> Outcome {
    let mut sim = Sim::new(seed);
    let fault_steps = 3_000 + sim.w.borrow_mut().rng.below(3_000);
    for _ in 0..fault_steps {
        sim.step();
    }
    // Faults stop: a checkpoint must commit within bounded simulated time, or the stream end.
    {
        let mut w = sim.w.borrow_mut();
        w.faults_off();
        w.quiet_since = Some(w.now);
        if w.partition_until.take().is_some() {
            drop(w);
            sim.coord_input(CoordInput::NodeUp { node: NodeId(2) });
        }
    }
    let cfg = sim.coord_cfg.clone();
    let bound = 4 * (cfg.interval_ms + cfg.timeout_ms) + TRIGGER_TIMEOUT;
    let (quiet, committed) = (sim.now(), sim.w.borrow().commits.len());
    while sim.w.borrow().commits.len() < committed + 2 && !sim.all_finished() {
        assert!(sim.now() - quiet <= bound, "no commit within {bound} ms after faults stopped\n{}", sim.describe());
        sim.step();
    }
    // Then the stream runs to its end.
    let quiet = sim.now();
    while !sim.all_finished() {
        assert!(sim.now() - quiet <= 600_000, "the stream did not end\n{}", sim.describe());
        sim.step();
    }
    // Exactly once: every row's result, as if nothing had failed.
    let want = sim.reference();
    let w = sim.w.borrow();
    if w.results != want {
        let missing = want.keys().filter(|k| !w.results.contains_key(k)).count();
        let wrong = want.iter().filter(|(k, v)| w.results.get(k).is_some_and(|g| g != *v)).count();
        panic!("results differ from the reference: {missing} missing, {wrong} wrong\n{}", sim.describe());
    }
    // Every commit left in the store restores: its record decodes and every task's state is there.
    for key in w.store.keys("1/checkpoints/") {
        let r = decode_commit(&key, &w.store.peek(&key).unwrap()).expect("a stored commit record decodes");
        if r.restore_point().is_some() {
            w.check_consistent(&r);
        }
    }
    let mut stats = w.stats;
    let (puts, visible, _) = w.store.counts();
    stats.put_failures = puts;
    stats.visible_despite_error = visible;
    if let Some(c) = &w.control {
        (stats.control_txn_cut, stats.control_txn_lost, stats.control_reads_failed) = c.store.counts();
    }
    stats.ended_streams = 1;
    Outcome { commits: w.commits.len(), stats }
}

fn run_seed(seed: u64) -> Result<Outcome, String> {
    std::panic::catch_unwind(|| run(seed)).map_err(|e| {
        e.downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    })
}

fn shard(index: u64) {
    if let Ok(seed) = std::env::var("WEIR_SIM_SEED") {
        if index == 0 {
            let seed: u64 = seed.parse().expect("WEIR_SIM_SEED is a number");
            if let Err(e) = run_seed(seed) {
                panic!("seed {seed} failed: {e}");
            }
        }
        return;
    }
    let per_shard: u64 = std::env::var("WEIR_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(5_000);
    let mut commits = 0;
    for i in 0..per_shard {
        let seed = index * 1_000_000_007 + i;
        match run_seed(seed) {
            Ok(o) => commits += o.commits,
            Err(e) => panic!(
                "seed {seed} failed (replay: WEIR_SIM_SEED={seed} cargo nextest run --release -p weir-engine --test checkpoint_sim): {e}"
            ),
        }
    }
    assert!(commits as u64 >= 2 * per_shard, "{commits} commits over {per_shard} seeds");
}

#[test]
fn simulated_seeds_shard_0() {
    shard(0);
}

#[test]
fn simulated_seeds_shard_1() {
    shard(1);
}

#[test]
fn simulated_seeds_shard_2() {
    shard(2);
}

#[test]
fn simulated_seeds_shard_3() {
    shard(3);
}

#[test]
fn a_seed_replays_exactly() {
    let run = |seed| {
        let mut sim = Sim::new(seed);
        for _ in 0..2_000 {
            sim.step();
        }
        let w = sim.w.borrow();
        (w.now, w.commits.iter().map(|c| c.id).collect::<Vec<_>>(), w.trace.iter().cloned().collect::<Vec<_>>())
    };
    assert_eq!(run(42), run(42));
}

#[test]
fn the_checker_catches_an_inconsistent_commit() {
    // Corrupt one committed snapshot: the consistency check must fail.
    let mut sim = Sim::new(7);
    {
        let mut w = sim.w.borrow_mut();
        w.faults_off();
    }
    while sim.w.borrow().commits.is_empty() {
        sim.step();
    }
    let w = sim.w.borrow();
    let record = w.commits[0].clone();
    let agg = w.topo.sources;
    let key = snapshot_key(agg, record.id);
    let (mut m, v) = Model::decode(&w.store.peek(&key).unwrap()).unwrap();
    m.consumed[0] += 1;
    weir_engine::backup::Store::delete(&*w.store, &key).unwrap();
    w.store.set_faults(false);
    weir_engine::backup::Store::put(&*w.store, &key, &m.encode(v)).unwrap();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.check_consistent(&record)));
    assert!(caught.is_err(), "an inconsistent cut went unnoticed");
}

#[test]
fn the_simulation_really_goes_through_faults() {
    let mut t = Stats::default();
    let mut commits = 0;
    for seed in 0..200 {
        let o = run_seed(900_000 + seed).unwrap_or_else(|e| panic!("seed {}: {e}", 900_000 + seed));
        commits += o.commits;
        t.add(&o.stats);
    }
    assert!(commits > 400, "{commits} commits");
    assert!(t.steps > 600_000, "{t:?}");
    for (what, n) in [
        ("restarts", t.restarts),
        ("lost messages", t.lost),
        ("duplicates", t.duplicated),
        ("failed checkpoints", t.failed_checkpoints),
        ("retrieve requests", t.retrieves),
        ("injected triggers", t.injected),
        ("discarded inputs", t.discarded),
        ("upload failures", t.upload_failures),
        ("snapshot failures", t.snapshot_failures),
        ("lost commit records", t.records_lost),
        ("consensus restores", t.consensus_restores),
        ("starts from nothing written down", t.fresh_records),
        ("lost data", t.data_lost),
        ("duplicated data", t.data_duplicated),
        ("detected gaps", t.gaps_detected),
        ("coordinator crashes", t.coordinator_crashes),
        ("crashes right after a commit write", t.crashes_after_commit_write),
        ("store calls that never answer", t.store_hangs),
        ("failed puts", t.put_failures),
        ("puts stored despite an error", t.visible_despite_error),
        ("failed id records", t.id_record_failures),
        ("failed commit writes", t.commit_write_failures),
        ("partitions", t.partitions),
        ("failed restores", t.restore_failures),
        ("source refusals", t.refusals),
        ("streams run to their end", t.ended_streams),
        ("inputs cut instead of held", t.cut_inputs),
        ("control transactions failed unapplied", t.control_txn_cut),
        ("control transactions applied, their answer lost", t.control_txn_lost),
        ("control reads failed", t.control_reads_failed),
        ("deposed coordinators' writes fenced", t.fenced_writes),
        ("rows taken past a cut", t.rows_past_cuts),
    ] {
        assert!(n > 0, "no {what} in 200 seeds: {t:?}");
    }
}

/// Snapshots damaged everywhere at restarts (`damage.rs`): the stream goes back to an older
/// commit, or halts and every node restarts and goes back together; results stay exact (every
/// seed checks them).
#[test]
fn damaged_snapshots_take_the_stream_back_together_and_results_stay_exact() {
    let mut t = Stats::default();
    for i in 0..1_500 {
        let seed = 7_000_000_000 + i;
        let o = run_seed(seed).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        t.add(&o.stats);
    }
    for (what, n) in [
        ("snapshots damaged everywhere", t.damaged_snapshots),
        ("fallback records", t.fallbacks),
        ("halts followed by a restart of every node", t.halts),
    ] {
        assert!(n > 0, "no {what} in 1,500 seeds: {t:?}");
    }
}
