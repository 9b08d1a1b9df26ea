use std::collections::HashMap;

use super::*;

#[test]
fn the_table_agrees_with_a_hash_map_through_growth_and_collisions() {
    let mut t = SlotMap::default();
    let mut want: HashMap<u64, (u64, f64)> = HashMap::new();
    let mut x = 7u64;
    for i in 0..50_000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Few distinct keys early (updates), more later (growth); some share their probe
        // start: the same low bits of `order_of`.
        let key = if i < 1000 { x % 50 } else { x % 20_000 };
        let v = (x % 1000) as f64;
        t.add(order_of(key), key, v);
        let e = want.entry(key).or_insert((0, f64::NEG_INFINITY));
        e.0 += 1;
        e.1 = e.1.max(v);
    }
    assert_eq!(t.len(), want.len());
    for (k, (count, max)) in &want {
        let a = t.get(*k).expect("present");
        assert_eq!((a.count, a.max), (*count, *max), "key {k}");
    }
    assert_eq!(t.iter().count(), want.len());
    assert!(t.get(1 << 40).is_none());
    assert!(t.slots.len().is_power_of_two() && t.len * 4 <= t.slots.len() * 3);
}

#[test]
fn slots_hold_keys_almost_in_order_and_a_presized_table_does_not_grow() {
    let mut t = SlotMap::with_capacity(1000);
    let n = t.slots.len();
    for k in 0..1000u64 {
        t.insert(k, Acc { count: 1, ..Acc::default() });
    }
    assert_eq!(t.slots.len(), n, "no growth");
    let mut lazy = SlotMap::expecting(1000);
    assert!(lazy.slots.is_empty(), "nothing allocated before the first insert");
    lazy.insert(1, Acc { count: 1, ..Acc::default() });
    assert_eq!(lazy.slots.len(), n, "the first allocation has room for what was expected");
    let order: Vec<u64> = t.iter().map(|(k, _)| order_of(k) << SHARD_BITS).collect();
    let inversions = order.windows(2).filter(|w| w[0] > w[1]).count();
    assert!(inversions < 250, "{inversions} descents among 1,000 slots");
}

#[test]
fn small_tables_stay_a_quarter_full_and_large_ones_half_full() {
    let mut t = SlotMap::default();
    for k in 0..5_000u64 {
        t.add(order_of(k), k, 1.0);
        let slots = t.slots.len();
        let limit = if slots <= QUARTER_UP_TO { slots / 4 } else { slots / 2 };
        assert!(t.len() <= limit, "{} entries in {slots} slots", t.len());
        // Grown only when full: the table half its size could not have held them.
        assert!(slots == FIRST || t.len() > room(slots / 2), "{} entries in {slots} slots", t.len());
    }
    for n in [0, 1, 2, 3, 255, 256, 257, 300, 1_024, 1_025, 100_000] {
        let slots = slots_for(n);
        assert!(slots.is_power_of_two() && room(slots) >= n, "{n} entries: {slots} slots");
        assert!(slots == FIRST || room(slots / 2) < n, "{n} entries: {slots} slots is not the least");
    }
}

#[test]
fn insert_replaces_and_a_slot_is_one_cache_line() {
    let mut t = SlotMap::default();
    let a = Acc { count: 3, sum_fx: 9, min: 1.0, max: 2.0 };
    t.insert(5, a);
    t.insert(5, Acc { count: 4, ..a });
    assert_eq!((t.len(), t.get(5).map(|a| a.count)), (1, Some(4)));
    assert_eq!(std::mem::size_of::<Slot>(), 64);
    assert!(SlotMap::default().get(5).is_none());
}

#[test]
fn writes_are_stamped_with_the_epoch_and_iter_since_sees_only_later_ones() {
    let mut t = SlotMap::default();
    (0..100u64).for_each(|k| t.add(order_of(k), k, 1.0));
    t.set_epoch(3);
    (50..150u64).for_each(|k| t.add(order_of(k), k, 1.0)); // 50 updated, 50 new
    t.insert(7, Acc { count: 9, ..Acc::default() });
    let mut since: Vec<u64> = t.iter_since(0).map(|(k, _)| k).collect();
    since.sort_unstable();
    let mut want: Vec<u64> = (50..150).collect();
    want.insert(0, 7);
    assert_eq!(since, want);
    assert_eq!(t.iter_since(3).count(), 0, "nothing above the table's epoch");
    assert_eq!(t.stamped(), 101, "written at epoch 3");
    // Growth keeps each slot's epoch.
    (1000..5000u64).for_each(|k| t.add(order_of(k), k, 1.0));
    assert_eq!(t.iter_since(0).count(), 101 + 4000);
    assert_eq!(t.iter().count(), 4150);
    assert_eq!(t.stamped(), 4101, "through growth");
    t.set_epoch(4);
    assert_eq!(t.stamped(), 0);
}

/// Keys of shard 0 whose probes start at `first` of a table of 32 slots.
fn keys_starting_at(first: std::ops::RangeInclusive<usize>, n: usize) -> Vec<u64> {
    (0u64..)
        .filter(|&k| {
            let h = order_of(k);
            (h >> (64 - SHARD_BITS)) == 0 && first.contains(&(((h << SHARD_BITS) >> (64 - 5)) as usize))
        })
        .take(n)
        .collect()
}

#[test]
fn a_drained_table_whose_probes_wrap_round_its_end_sorts_into_key_order() {
    // A table of 32 slots: 6 keys whose probes start in the last two slots run on past the end
    // into slots 0.., where keys whose probes start there are displaced after them.
    let mut t = SlotMap::with_capacity(8);
    assert_eq!(t.slots.len(), 32);
    let tail = keys_starting_at(30..=31, 6);
    let head = keys_starting_at(0..=1, 2);
    for (i, &k) in tail.iter().chain(&head).enumerate() {
        t.add(order_of(k), k, i as f64);
    }
    // The end of the table wrapped: a key of the tail sits in slot 0.
    assert!(tail.contains(&t.slots[0].key) && t.slots[0].acc.count == 1);
    let mut out = Vec::new();
    t.drain_into(&mut out);
    assert_eq!((out.len(), t.slots.len()), (8, 32), "held without growing");
    assert!(t.slots.iter().all(|s| s.acc.count == 0), "every slot emptied");
    // The wrapped keys go last, so only local disorder is left.
    let (front, back) = out.split_at(2);
    assert!(front.iter().all(|e| head.contains(&e.1)), "the keys starting at the front first: {front:?}");
    assert!(back.iter().all(|e| tail.contains(&e.1)));
    sort_drained(&mut out);
    let mut want: Vec<u64> = tail.iter().chain(&head).map(|&k| order_of(k)).collect();
    want.sort_unstable();
    assert_eq!(out.iter().map(|e| e.0).collect::<Vec<_>>(), want);
}

#[test]
fn entries_far_out_of_order_are_sorted_too() {
    let acc = Acc { count: 1, sum_fx: 0, min: 0.0, max: 0.0 };
    // Reversed: every entry out of place by up to all the others (past the insertion budget).
    let mut v: Vec<(u64, u64, Acc)> = (0..1000u64).rev().map(|h| (h, h, acc)).collect();
    sort_drained(&mut v);
    assert!(v.windows(2).all(|w| w[0].0 < w[1].0));
    // A few out of place: sorted by insertion.
    let mut v: Vec<(u64, u64, Acc)> = (0..1000u64).map(|h| (h ^ 1, h, acc)).collect();
    sort_drained(&mut v);
    assert_eq!(v.iter().map(|e| e.0).collect::<Vec<_>>(), (0..1000).collect::<Vec<_>>());
}
