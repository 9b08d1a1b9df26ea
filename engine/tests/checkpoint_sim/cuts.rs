//! Aggs that cut their inputs instead of holding them (`Hold::Cut`), as the engine's aggs
//! with replay snapshots do: what the simulator keeps per cut input, the capture at the cuts,
//! and the release of what the rows past a cut sent.

use std::collections::BTreeMap;

use super::world::{Item, Model, World};

/// An agg's input taken on past its barrier: what the
/// rows past the cut added to the model, which the capture leaves out, and the rows they sent,
/// which go downstream only behind the agg's barrier (the engine's agg holds back their
/// progress, so no window fires on them before its snapshot).
#[derive(Clone, Debug, Default)]
pub struct Cut {
    pub consumed: u64,
    pub forwarded: Vec<u64>,
    pub ranks: BTreeMap<(usize, usize), u64>,
    pub withheld: Vec<(usize, Item)>,
}

impl World {
    /// Task `t`'s model at its inputs' cuts.
    pub fn at_cuts(&self, t: usize) -> Model {
        let mut m = self.models[t].clone();
        for (i, c) in self.cuts[t].iter().enumerate() {
            let Some(c) = c else { continue };
            m.consumed[i] -= c.consumed;
            m.forwarded.iter_mut().zip(&c.forwarded).for_each(|(f, d)| *f -= d);
            for (k, d) in &c.ranks {
                *m.ranks.get_mut(k).expect("counted") -= d;
            }
        }
        m.ranks.retain(|_, n| *n > 0);
        m
    }

    /// Ends task `t`'s cut of input `i` (`None`: every input's): what it withheld goes out.
    pub fn release(&mut self, t: usize, i: Option<usize>) {
        let inputs: Vec<usize> = match i {
            Some(i) => vec![i],
            None => (0..self.cuts[t].len()).collect(),
        };
        for i in inputs {
            if let Some(c) = self.cuts[t][i].take() {
                for (to, item) in c.withheld {
                    self.push(t, to, item);
                }
            }
        }
    }
}
