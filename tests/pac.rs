//! Pointer authentication (aarch64): a native helper built with
//! `-mbranch-protection=pac-ret+leaf` signs its return addresses, on the
//! stack and in x30. Samples in it must keep their JIT caller: the walk
//! strips the code before it looks an address up, and never takes a signed
//! address for a miss. Run under `qemu-aarch64 -cpu max`, which implements
//! pointer authentication; on x86-64 there is nothing to strip.

use jitmap::{ExecutionManager, HeapConfig};
use jitmap_testkit::e2e::one_run;
use jitmap_testkit::frameless::{JitCaller, build_shared_object_with, load};
use jitmap_testkit::profile::{exact_stacks, sample_mixed, shown};

/// A helper that spends its time in a loop that calls a leaf: the helper
/// saves its signed x30 on the stack; the leaf keeps its signed x30 in the
/// register.
const HELPER_C: &str = r#"
#include <stdint.h>
__attribute__((noinline)) uint64_t pac_step(uint64_t x) {
    for (int i = 0; i < 64; i++) {
        __asm__ volatile("" : "+r"(x));
        x = x * 6364136223846793005ull + 1442695040888963407ull;
    }
    return x;
}
uint64_t pac_helper(uint64_t n) {
    uint64_t x = 1;
    for (uint64_t i = 0; i < n; i++) x = pac_step(x);
    return x;
}
"#;

#[test]
fn samples_in_signed_native_frames_keep_their_jit_caller() {
    if !cfg!(target_arch = "aarch64") {
        println!("skipped on x86-64: pointer authentication is aarch64's");
        return;
    }
    let _one = one_run();
    let dir = std::env::temp_dir().join(format!("jitmap-pac-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let object = build_shared_object_with(
        &dir,
        "pac_helper",
        HELPER_C,
        &["-mbranch-protection=pac-ret+leaf"],
    )
    .unwrap();
    let (_handle, helper) = load(&object, c"pac_helper").unwrap();

    let manager = ExecutionManager::new(8);
    let heap = manager
        .create_heap(HeapConfig {
            span: 1 << 20,
            ..HeapConfig::default()
        })
        .unwrap();
    let caller = JitCaller::publish(&heap, "pac_caller", helper).unwrap();
    assert_ne!(caller.call(10), 0);

    // The agent starts after the helper is loaded: its table has the
    // helper's rows.
    let profile = sample_mixed(&manager, 400, || {
        std::hint::black_box(caller.call(std::hint::black_box(5_000)));
    })
    .unwrap();
    let shown = shown(&profile, 8);
    let (in_helper, helper_exact) = exact_stacks(&profile, &["pac_helper", "pac_caller"]);
    let (in_step, step_exact) = exact_stacks(&profile, &["pac_step", "pac_helper", "pac_caller"]);
    println!(
        "pac_helper: {helper_exact} of {in_helper} exact; pac_step: {step_exact} of {in_step} exact; ends {:?}",
        profile.stack_ends
    );
    let (leaf, good) = (in_helper + in_step, helper_exact + step_exact);
    assert!(leaf >= 300, "{leaf} samples in the helper\n{shown}");
    assert!(in_helper > 0 && in_step > 0, "both frames sampled\n{shown}");
    assert!(good * 100 >= leaf * 99, "{good} of {leaf} exact\n{shown}");
}
