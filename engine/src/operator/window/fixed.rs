//! Fixed-point sums: every value that enters a sum is rounded to a multiple of 2^-32 and added
//! as an integer, so a sum does not depend on the order its rows arrived in.

/// Fixed-point scale of sums.
pub(crate) const FX_SCALE: f64 = 4_294_967_296.0; // 2^32

/// 2^52: from it on, every f64 is a whole number.
#[cfg(test)]
pub(crate) const EXACT_INT: f64 = 4_503_599_627_370_496.0;

/// The largest f64 below a half (0.5 - 2^-54).
const BELOW_HALF: f64 = 0.499_999_999_999_999_94;

/// `v` in fixed point, rounded half away from zero; the defined rounding of every value that
/// enters a sum.
///
/// Values below about 2.1·10^9 in magnitude (`x` below 2^63) take one addition and one
/// truncation: `trunc(x + copysign(BELOW_HALF, x))` is `round(x)` there. Why, with `x` at
/// least 0 (the negative side mirrors it), `n` its whole part and `u` its ulp:
/// - a fraction below a half is at most `0.5 - u`, so the sum is at most `n + 1 - u - 2^-54`:
///   more than half a spacing below `n + 1`, it cannot round up to it (below a quarter the sum
///   stays below 0.75 anyway);
/// - a fraction of a half or more makes the sum at least `n + 1 - 2^-54`, which rounds to
///   `n + 1` (at 1 it is the tie, which goes to the even 1.0; above 1 the spacing is wider),
///   and below `n + 1.5`;
/// - from 2^52 on `x` is whole and `BELOW_HALF` less than half its spacing: the sum rounds back
///   to `x`.
///
/// `the_fast_fixed_point_conversion_rounds_exactly_as_round_does` checks it against `round` on
/// these edges and on a million random bit patterns.
///
/// Why not the obvious ways: `round` (a libm call) and the software f64 → i128 conversion cost 14 %
/// of the engine's CPU at 10,000 keys (`perf`); a range check, a truncation, the fraction and two
/// comparisons form a chain of dependent instructions the agg's row waits for.
#[inline]
pub fn to_fixed(v: f64) -> i128 {
    let x = v * FX_SCALE;
    match crate::sys::truncate(x + BELOW_HALF.copysign(x)) {
        i64::MIN => to_fixed_large(x),
        t => i128::from(t),
    }
}

/// Values of about 2.1·10^9 and more (`x` from 2^63 in magnitude, where every f64 is whole),
/// NaN and infinities; out of line, so the common path stays short.
#[cold]
#[inline(never)]
fn to_fixed_large(x: f64) -> i128 {
    // `as` saturates (and maps NaN to 0), which keeps the operator total on any input.
    x.round() as i128
}

/// A fixed-point sum back to f64.
#[inline]
pub fn from_fixed(s: i128) -> f64 {
    s as f64 / FX_SCALE
}
