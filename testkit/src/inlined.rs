//! A native function that spends its time in helpers the compiler inlines
//! into it: what a profiler must name by the function that ran, not by the
//! innermost inlined helper (the agent's naming test). The testkit is built
//! optimized, with debug info that records the inlining.

/// One step: a multiply the compiler inlines, behind `black_box`, itself
/// inlined.
#[inline(always)]
fn mix(x: u64, i: u64) -> u64 {
    std::hint::black_box(x.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i)
}

/// `rounds` steps of [`mix`]; never inlined into its callers.
///
/// ```
/// assert_ne!(jitmap_testkit::inlined::spin(3), 0);
/// ```
#[inline(never)]
pub extern "C" fn spin(rounds: u64) -> u64 {
    let mut x = 1;
    for i in 0..rounds {
        x = mix(x, i);
    }
    x
}
