//! The election under faults, deterministically: candidates with clocks that run at different
//! rates step at random, pause (a stopped process, or `SIGSTOP`), are cut off from the store
//! (every call fails) and lose replies to calls the store applied, on the in-process store with
//! the simulation's clock. Invariants, checked after every event: at no moment do two
//! candidates act as leader, a fenced write lands only for the candidate the store names, and a
//! live candidate leads again within a few TTLs of the faults' end.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::test_store::{Link, Linked};
use super::*;

const TTL: Duration = Duration::from_secs(2);

struct Candidate {
    election: Election,
    /// Its clock's rate against the store's (within the election's 10 % margin).
    rate: f64,
    link: Arc<Mutex<Link>>,
    paused: bool,
}

/// Fault kinds seen in one run: pauses, cuts, lost replies, takeovers.
#[derive(Debug, Default)]
struct Counts {
    pauses: u32,
    cuts: u32,
    lost_replies: u32,
    takeovers: u32,
}

fn run(seed: u64, counts: &mut Counts) {
    let mut rng = StdRng::seed_from_u64(seed);
    let clock = ManualClock::default();
    let store = Arc::new(MemControl::with_clock(clock.clone()));
    let base = Instant::now();
    let key = "/weir/sim/leader";
    let mut cs: Vec<Candidate> = (0..3)
        .map(|i| Candidate {
            election: Election::new(key, format!("node-{i}"), TTL),
            rate: rng.random_range(0.95..1.05),
            link: Arc::new(Mutex::new(Link::Up)),
            paused: false,
        })
        .collect();
    let mut elapsed = Duration::ZERO;
    let local = |c: &Candidate, t: Duration| base + t.mul_f64(c.rate);
    let mut last_leader: Option<usize> = None;
    let mut led_after_faults = false;
    let steps = 600;
    for n in 0..steps {
        let faults_over = n >= steps - 60;
        let d = Duration::from_millis(rng.random_range(50..400));
        clock.advance(d);
        elapsed += d;
        let i = rng.random_range(0..cs.len());
        if !faults_over && rng.random_bool(0.05) {
            // A fault starts or ends for candidate i.
            let c = &mut cs[i];
            match rng.random_range(0..3) {
                0 => {
                    c.paused = !c.paused;
                    counts.pauses += u32::from(c.paused);
                }
                1 => {
                    let mut l = c.link.lock().unwrap();
                    *l = if *l == Link::Cut { Link::Up } else { Link::Cut };
                    counts.cuts += u32::from(*l == Link::Cut);
                }
                _ => {
                    let mut l = c.link.lock().unwrap();
                    *l = if *l == Link::LosesReplies { Link::Up } else { Link::LosesReplies };
                    counts.lost_replies += u32::from(*l == Link::LosesReplies);
                }
            }
        }
        if faults_over {
            cs.iter_mut().for_each(|c| {
                c.paused = false;
                *c.link.lock().unwrap() = Link::Up;
            });
        }
        if !cs[i].paused {
            let now = local(&cs[i], elapsed);
            let view = Linked::new(store.clone(), cs[i].link.clone());
            let _ = cs[i].election.step(&view, now);
        }
        // At most one acts as leader now, each by its own clock.
        let leading: Vec<usize> = (0..cs.len()).filter(|&j| cs[j].election.leads(local(&cs[j], elapsed))).collect();
        assert!(leading.len() <= 1, "seed {seed}, step {n}: {leading:?} lead at once");
        led_after_faults |= faults_over && !leading.is_empty();
        if let Some(&l) = leading.first() {
            counts.takeovers += u32::from(last_leader.is_some_and(|p| p != l));
            last_leader = Some(l);
            // Its fenced write lands; every other candidate's fence, if it still holds one, fails.
            let w = "/weir/sim/placement";
            let fence = cs[l].election.fence().expect("a leader has a fence");
            let put = Op::Put { key: w.into(), value: vec![l as u8], lease: None };
            assert!(
                store.txn(&[fence], std::slice::from_ref(&put)).unwrap().succeeded,
                "seed {seed}: the leader's write"
            );
            for (j, c) in cs.iter().enumerate().filter(|(j, _)| *j != l) {
                if let Some(f) = c.election.fence() {
                    assert!(
                        !store.txn(&[f], std::slice::from_ref(&put)).unwrap().succeeded,
                        "seed {seed}: node-{j} wrote beside node-{l}"
                    );
                }
            }
        }
    }
    assert!(led_after_faults, "seed {seed}: nobody led in the 60 steps after the faults ended");
}

#[test]
fn no_two_candidates_lead_at_once_under_pauses_cuts_lost_replies_and_clock_rates() {
    let mut counts = Counts::default();
    for seed in 0..200 {
        run(seed, &mut counts);
    }
    // Every fault kind happened, and leadership moved.
    assert!(counts.pauses > 0 && counts.cuts > 0 && counts.lost_replies > 0 && counts.takeovers > 0, "{counts:?}");
}
