//! The order of one partition's acknowledged batches: each batch's versions lie after those of
//! every batch with a lower sequence number and before those of every higher one, in whatever
//! order the acknowledgements arrive (a batch sent again is acknowledged with its original
//! versions, maybe after later batches' acks). Only the batches next to those still in flight
//! are kept, so it holds about as many entries as batches are in flight.

use std::collections::BTreeMap;

/// The acknowledged batches of one partition that a later acknowledgement is checked against.
#[derive(Debug, Default)]
pub struct Order {
    seqs: BTreeMap<u64, (u64, u64)>,
}

impl Order {
    /// Batch `seq` was acknowledged as stored at `first..=last`: an error if that breaks the order.
    pub fn acked(&mut self, seq: u64, first: u64, last: u64) -> Result<(), String> {
        if let Some((s, (_, before))) = self.seqs.range(..seq).next_back()
            && *before >= first
        {
            return Err(format!("batch {seq} stored at {first}..={last}, not after batch {s} (up to {before})"));
        }
        if let Some((s, (after, _))) = self.seqs.range(seq + 1..).next()
            && *after <= last
        {
            return Err(format!("batch {seq} stored at {first}..={last}, not before batch {s} (from {after})"));
        }
        if let Some(old) = self.seqs.insert(seq, (first, last))
            && old != (first, last)
        {
            return Err(format!("batch {seq} stored at {first}..={last}, and before at {}..={}", old.0, old.1));
        }
        Ok(())
    }

    /// No batch below `seq` can be acknowledged again (none is in flight): forgets them but the
    /// nearest, which the next ones are checked against.
    pub fn forget_below(&mut self, seq: u64) {
        let Some(&keep) = self.seqs.range(..seq).next_back().map(|(s, _)| s) else { return };
        self.seqs = self.seqs.split_off(&keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_in_any_order_pass_and_versions_out_of_seq_order_do_not() {
        let mut o = Order::default();
        o.acked(1, 1000, 1999).unwrap();
        o.acked(3, 3000, 3999).unwrap();
        // A batch sent again, acknowledged after later ones, with its original versions.
        o.acked(2, 2000, 2999).unwrap();
        o.acked(2, 2000, 2999).unwrap();
        assert!(o.acked(4, 3500, 4499).unwrap_err().contains("not after batch 3"));
        assert!(o.acked(0, 500, 1000).unwrap_err().contains("not before batch 1"));
        assert!(o.acked(2, 2100, 2999).unwrap_err().contains("and before at 2000..=2999"));
        o.forget_below(3);
        assert_eq!(o.seqs.keys().copied().collect::<Vec<_>>(), [2, 3]);
        assert!(o.acked(4, 2500, 2600).is_err(), "checked against the nearest kept batch");
    }
}
