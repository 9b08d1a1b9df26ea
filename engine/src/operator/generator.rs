//! The deterministic generator source: row `o` of partition `p` is a pure function of
//! `(seed, p, o)`, so a source restored to offset `o` replays exactly what it produced before.

use weir_wire::Batch;

/// Settings of the generator.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GeneratorSpec {
    /// Seed of everything random.
    pub seed: u64,
    /// Distinct series keys (`0..keys`).
    pub keys: u64,
    /// Event time of offset 0 (ms).
    pub ts_start: i64,
    /// Rows per millisecond of event time, per partition.
    pub rows_per_ms: u64,
    /// Fraction of rows whose event time is moved back (out of order), 0.0..=1.0.
    pub out_of_order: f64,
    /// How far back an out-of-order row goes, at most (ms).
    pub max_disorder_ms: i64,
}

impl Default for GeneratorSpec {
    fn default() -> Self {
        Self {
            seed: 42,
            keys: 10_000,
            ts_start: 1_700_000_000_000,
            rows_per_ms: 1_000,
            out_of_order: 0.0,
            max_disorder_ms: 0,
        }
    }
}

impl GeneratorSpec {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), crate::spec::SpecError> {
        let (keys, rows_per_ms) = (self.keys, self.rows_per_ms);
        if keys == 0 || rows_per_ms == 0 {
            return Err(crate::spec::SpecError::GeneratorEmpty { keys, rows_per_ms });
        }
        let (out_of_order, max_disorder_ms) = (self.out_of_order, self.max_disorder_ms);
        if !(0.0..=1.0).contains(&out_of_order) || max_disorder_ms < 0 {
            return Err(crate::spec::SpecError::GeneratorDisorder { out_of_order, max_disorder_ms });
        }
        Ok(())
    }
}

#[inline]
fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Division of any u64 by a divisor fixed in advance, by multiplications: `m` is `ceil(2^128 /
/// d)`, with which `a / d` is the top of `m·a` (a 192-bit product) and `a % d` the top of the
/// low 128 bits times `d`, exactly for every 64-bit `a` (Lemire, Kaser and Kurz, "Faster
/// remainder by direct computation", 2019).
///
/// Why: a row took two hardware divisions (the key and the millisecond), and the generator is
/// about a third of what a row costs a source and an agg together at 10,000 keys (`weir-e2e agg`).
#[derive(Clone, Copy, Debug)]
struct Divisor {
    d: u64,
    /// `ceil(2^128 / d)`, and 0 for `d` = 1 (where it would be 2^128).
    m: u128,
}

impl Divisor {
    fn new(d: u64) -> Self {
        assert!(d > 0, "a divisor of 0");
        Divisor { d, m: (u128::MAX / u128::from(d)).wrapping_add(1) }
    }

    /// The high 128 bits of `x · y` (x of 128 bits, y of 64).
    #[inline]
    fn high(x: u128, y: u64) -> u128 {
        let low = (x as u64 as u128 * y as u128) >> 64;
        ((x >> 64) * y as u128 + low) >> 64
    }

    #[inline]
    fn rem(self, a: u64) -> u64 {
        // For d = 1, m = 0 gives 0, the remainder.
        Self::high(self.m.wrapping_mul(u128::from(a)), self.d) as u64
    }

    #[inline]
    fn div(self, a: u64) -> u64 {
        if self.m == 0 { a } else { Self::high(self.m, a) as u64 }
    }
}

/// The generator of one partition.
#[derive(Clone, Debug)]
pub struct Generator {
    spec: GeneratorSpec,
    base: u64,
    ooo_threshold: u64,
    keys: Divisor,
    rows_per_ms: Divisor,
}

impl Generator {
    /// The generator of `partition`. Panics on a spec [`GeneratorSpec::validate`] refuses for
    /// zero keys or rows.
    pub fn new(spec: GeneratorSpec, partition: u32) -> Self {
        let base = splitmix(spec.seed ^ ((partition as u64) << 40).wrapping_mul(0x2545_F491_4F6C_DD1D));
        let ooo_threshold = (spec.out_of_order * u32::MAX as f64) as u64;
        let (keys, rows_per_ms) = (Divisor::new(spec.keys), Divisor::new(spec.rows_per_ms));
        Self { spec, base, ooo_threshold, keys, rows_per_ms }
    }

    /// Row at `offset`: (ts, key, value).
    #[inline]
    pub fn row(&self, offset: u64) -> (i64, u64, f64) {
        let h = splitmix(self.base ^ offset);
        let key = self.keys.rem(h);
        let mut ts = self.spec.ts_start + self.rows_per_ms.div(offset) as i64;
        if self.ooo_threshold > 0 && (h >> 32) < self.ooo_threshold && self.spec.max_disorder_ms > 0 {
            ts -= 1 + ((h >> 8) % self.spec.max_disorder_ms as u64) as i64;
        }
        let value = (h >> 11) as f64 * (1000.0 / (1u64 << 53) as f64);
        (ts, key, value)
    }

    /// Appends rows `offset..offset + rows` to `batch`; returns the largest event time among them.
    pub fn fill(&self, offset: u64, rows: usize, batch: &mut Batch) -> i64 {
        let mut max_ts = i64::MIN;
        for o in offset..offset + rows as u64 {
            let (ts, key, value) = self.row(o);
            max_ts = max_ts.max(ts);
            batch.push(ts, key, value);
        }
        max_ts
    }

    /// Offsets that hold every row with an event time in `from_ts..to_ts` (and maybe rows just
    /// outside it): event time grows with the offset, and a row moved back out of order moves
    /// back at most `max_disorder_ms`. A reader of a time range computes only these rows.
    pub fn offsets_between(&self, from_ts: i64, to_ts: i64) -> std::ops::Range<u64> {
        let at = |ts: i64| {
            u64::try_from(ts.saturating_sub(self.spec.ts_start)).unwrap_or(0).saturating_mul(self.spec.rows_per_ms)
        };
        at(from_ts)..at(to_ts.saturating_add(self.spec.max_disorder_ms.max(0)))
    }

    /// Smallest event time any row can have.
    pub fn min_ts(&self) -> i64 {
        if self.ooo_threshold > 0 {
            self.spec.ts_start.saturating_sub(self.spec.max_disorder_ms)
        } else {
            self.spec.ts_start
        }
    }

    /// Largest event time any row at or before `offset` can have (progress after `offset` rows).
    pub fn max_ts_before(&self, offset: u64) -> i64 {
        self.spec.ts_start + (offset.saturating_sub(1) / self.spec.rows_per_ms) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offsets_of_a_time_range_hold_every_row_in_it() {
        for spec in [
            GeneratorSpec { rows_per_ms: 7, ..GeneratorSpec::default() },
            GeneratorSpec { rows_per_ms: 3, out_of_order: 0.3, max_disorder_ms: 20, ..GeneratorSpec::default() },
        ] {
            let g = Generator::new(spec, 1);
            for (from, to) in [(spec.ts_start - 5, spec.ts_start + 3), (spec.ts_start + 40, spec.ts_start + 95)] {
                let range = g.offsets_between(from, to);
                for o in 0..2_000 {
                    let ts = g.row(o).0;
                    assert!(ts >= g.min_ts());
                    if (from..to).contains(&ts) {
                        assert!(range.contains(&o), "{spec:?}: row {o} at {ts} outside {range:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn replay_from_any_offset_gives_the_same_rows() {
        let spec = GeneratorSpec { out_of_order: 0.2, max_disorder_ms: 50, ..GeneratorSpec::default() };
        let g = Generator::new(spec, 3);
        let mut whole = Batch::default();
        g.fill(0, 10_000, &mut whole);
        let mut tail = Batch::default();
        g.fill(6_789, 3_211, &mut tail);
        assert_eq!(&whole.ts[6_789..], &tail.ts[..]);
        assert_eq!(&whole.key[6_789..], &tail.key[..]);
        assert_eq!(&whole.value[6_789..], &tail.value[..]);
        // Partitions differ.
        let mut other = Batch::default();
        Generator::new(spec, 4).fill(0, 100, &mut other);
        assert_ne!(other.key, whole.key[..100].to_vec());
    }

    #[test]
    fn division_by_multiplication_equals_division() {
        let divisors = [1, 2, 3, 7, 10, 1_000, 10_000, 4_000_000, 20_000_000, 1 << 32, (1 << 32) + 1]
            .into_iter()
            .chain([(1 << 63) - 1, 1 << 63, (1 << 63) + 1, u64::MAX - 1, u64::MAX]);
        let mut h = 0x9E37_79B9_7F4A_7C15u64;
        for d in divisors {
            let div = Divisor::new(d);
            let edges = [0, 1, d - 1, d, d.wrapping_add(1), u64::MAX - 1, u64::MAX];
            let multiples = (1..1_000u64).flat_map(|k| {
                let m = d.saturating_mul(k);
                [m - 1, m, m.saturating_add(1)]
            });
            let random = (0..100_000).map(|_| {
                h = splitmix(h);
                h >> (h % 64)
            });
            for a in edges.into_iter().chain(multiples).chain(random) {
                assert_eq!(div.rem(a), a % d, "{a} % {d}");
                assert_eq!(div.div(a), a / d, "{a} / {d}");
            }
        }
    }

    #[test]
    fn keys_values_and_disorder_stay_in_range() {
        let spec = GeneratorSpec { keys: 50, out_of_order: 0.3, max_disorder_ms: 20, ..GeneratorSpec::default() };
        let g = Generator::new(spec, 0);
        let mut late = 0;
        for o in 0..100_000u64 {
            let (ts, key, value) = g.row(o);
            let nominal = spec.ts_start + (o / spec.rows_per_ms) as i64;
            assert!(key < 50 && (0.0..1000.0).contains(&value));
            assert!(ts <= nominal && ts >= nominal - 20);
            late += (ts < nominal) as u32;
            assert!(ts <= g.max_ts_before(o + 1));
        }
        assert!((25_000..35_000).contains(&late), "{late} out-of-order rows of 100000 at 30%");
    }
}
