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

/// Checks a profile of a thread that ran [`spin`]: `stacks` are its stacks
/// (frames innermost first, with their counts) of `samples` in all. Each
/// stack's chain is its innermost frame that is not marked
/// [`INLINED`](jitmap::agent::INLINED), with the inlined frames inside it.
///
/// - At least 90% of the samples are in `spin`'s chains.
/// - Above `spin` in a chain is only what the compiler inlined into it:
///   `mix`, and the core functions that it and the loop's range iteration
///   call (`wrapping_mul`, `Range::next` down to `u64::lt`).
/// - `mix (inlined)` is in at least 10% of them.
/// - `mix` and `wrapping_mul`, which exist only inlined into `spin`, never
///   name a frame alone.
///
/// Returns the chains and their counts, for a report. Panics on a failed
/// check, with the chains.
pub fn check_profile<'a>(
    stacks: impl IntoIterator<Item = (Vec<&'a str>, u64)>,
    samples: u64,
) -> std::collections::BTreeMap<String, u64> {
    let inlined = jitmap::agent::INLINED;
    let mut functions = std::collections::BTreeMap::<String, u64>::new();
    let mut chains = std::collections::BTreeMap::<String, u64>::new();
    for (frames, count) in stacks {
        let Some(function) = frames.iter().position(|f| !f.ends_with(inlined)) else {
            continue;
        };
        *functions.entry(frames[function].to_owned()).or_default() += count;
        *chains.entry(frames[..=function].join(";")).or_default() += count;
    }
    let spin = "jitmap_testkit::inlined::spin";
    let in_spin = functions.get(spin).copied().unwrap_or(0);
    assert!(
        in_spin * 10 >= samples * 9,
        "{in_spin} of {samples} in spin: {functions:#?}"
    );
    let mix = format!("jitmap_testkit::inlined::mix{inlined}");
    let mut with_mix = 0;
    for (chain, count) in &chains {
        let Some(above) = chain.strip_suffix(spin) else {
            continue;
        };
        for helper in above.split(';').filter(|h| !h.is_empty()) {
            let name = helper.strip_suffix(inlined).unwrap();
            assert!(
                helper == mix || name.starts_with("core::") || name.starts_with('<'),
                "{helper} in {chain}"
            );
        }
        if above.split(';').any(|h| h == mix) {
            with_mix += count;
        }
    }
    if cfg!(target_arch = "aarch64") {
        // rustc's aarch64 code for the loop carries no line of `mix`: every
        // instruction's row names `spin` (0 of 497 samples under qemu), so
        // there is no inlined frame to find.
        println!("aarch64: {with_mix} of {in_spin} samples with an inlined `mix` (not checked)");
    } else {
        assert!(
            with_mix * 10 >= in_spin,
            "{with_mix} of {in_spin} with mix: {chains:#?}"
        );
    }
    for helper in ["jitmap_testkit::inlined::mix", "wrapping_mul"] {
        assert!(
            !functions.keys().any(|name| name.ends_with(helper)),
            "{helper} named a frame alone: {functions:#?}"
        );
    }
    chains
}
