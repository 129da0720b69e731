//! Whether an end-to-end test can run its outside tool, shared by those tests.

use std::process::Command;

/// True when `tool` runs here and the spin functions (x86-64 code) can. Otherwise
/// the test is skipped with the reason printed; with `CI=true` it fails instead,
/// because `.ci/run` installs every tool.
pub fn available(tool: &str) -> bool {
    let must_run = std::env::var("CI").is_ok_and(|v| v == "true");
    if !cfg!(target_arch = "x86_64") {
        assert!(
            !must_run,
            "CI must run the {tool} end-to-end test on x86-64"
        );
        println!("skipped: the spin functions are x86-64 code");
        return false;
    }
    if Command::new(tool).arg("--version").output().is_err() {
        assert!(!must_run, "{tool} is not installed; .ci/run installs it");
        println!("skipped: {tool} is not installed");
        return false;
    }
    true
}
