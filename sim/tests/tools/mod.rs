//! Whether an end-to-end test can run its outside tool, shared by those tests.

use std::process::Command;

/// Whether this is CI (`CI=true`), where `.ci/run` installed every tool and no
/// end-to-end test may skip.
pub fn must_run() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// True when the spin functions and the demo (x86-64 code) can run here;
/// otherwise the test is skipped with the reason printed, or fails in CI.
pub fn runs_x86_64() -> bool {
    if cfg!(target_arch = "x86_64") {
        return true;
    }
    assert!(!must_run(), "CI must run the end-to-end tests on x86-64");
    println!("skipped: the spin functions are x86-64 code");
    false
}

/// True when `tool` runs here and the spin functions (x86-64 code) can. Otherwise
/// the test is skipped with the reason printed; with `CI=true` it fails instead,
/// because `.ci/run` installs every tool.
pub fn available(tool: &str) -> bool {
    if !runs_x86_64() {
        return false;
    }
    if Command::new(tool).arg("--version").output().is_err() {
        assert!(!must_run(), "{tool} is not installed; .ci/run installs it");
        println!("skipped: {tool} is not installed");
        return false;
    }
    true
}
