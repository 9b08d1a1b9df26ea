//! Fixed-point sums: every value that enters a sum is rounded to a multiple of 2^-32 and added
//! as an integer, so a sum does not depend on the order its rows arrived in.

/// Fixed-point scale of sums.
pub(crate) const FX_SCALE: f64 = 4_294_967_296.0; // 2^32

/// 2^52: below it in magnitude, every f64 has an exact integer part and fraction (the bound of
/// `sys::trunc_below_2_52`).
#[cfg(test)]
pub(crate) const EXACT_INT: f64 = 4_503_599_627_370_496.0;

/// `v` in fixed point, rounded half away from zero; the defined rounding of every value that
/// enters a sum.
#[inline]
pub fn to_fixed(v: f64) -> i128 {
    let x = v * FX_SCALE;
    // Values below 2^20: truncation to i64 is one instruction (without the saturation `as`
    // adds: `weir-e2e agg` 15.0 / 21.1 against 15.5 / 22.2 ns per row at 5,000 / 100,000 keys,
    // three runs each), and `x - t` is exact, so the result is `round`'s without its libm call
    // and the software f64 → i128 conversion (together 14 % of the engine's CPU at 10,000 keys,
    // `perf` in issue 11).
    if let Some(t) = crate::sys::trunc_below_2_52(x) {
        let frac = x - t as f64;
        // Without branches: the fraction of a random value is above a half as often as not,
        // and a branch on it was mispredicted every other row (`perf annotate` of `weir-e2e agg`).
        let r = t + i64::from(frac >= 0.5) - i64::from(frac <= -0.5);
        return i128::from(r);
    }
    to_fixed_large(x)
}

/// Values from 2^20 up (`x` at least 2^52 in magnitude), NaN and infinities; out of line, so
/// the common path stays short.
///
/// From 2^52 on, an f64 is a whole number, so rounding is the identity: below 2^63 (values
/// below about 2.1 billion: counters, byte counts) the hardware's i64 conversion is exact and
/// all that is needed, instead of libm's `round` and the software f64 → i128 conversion, which
/// larger values still take (docs/benchmarks.md, `cargo bench -p weir-bench --bench engine --
/// to_fixed`).
#[cold] // for the layout of the common path; values of millions take it at full speed too
#[inline(never)]
fn to_fixed_large(x: f64) -> i128 {
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    if x.abs() < TWO_63 {
        return i128::from(x as i64);
    }
    // `as` saturates (and maps NaN to 0), which keeps the operator total on any input.
    x.round() as i128
}

/// A fixed-point sum back to f64.
#[inline]
pub fn from_fixed(s: i128) -> f64 {
    s as f64 / FX_SCALE
}
