//! The tiered JIT simulator: every scenario, on both backends, in both map
//! versions and in W^X mode, runs clean and does what its name says; bad
//! input is refused.

use std::process::Command;
use std::time::Duration;

use jitmap::{MapVersion, MemoryMode};
use jitmap_sim::tiered::{self, Backend, RunConfig, SCENARIOS, Scenario};

const SIM: &str = env!("CARGO_BIN_EXE_jitmap-sim");

/// The runs take both cores; they go one at a time.
fn one_run() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn every_scenario_runs_clean_on_cranelift_in_each_map_and_in_wx() {
    every_scenario_runs_clean(Backend::Cranelift);
}

#[test]
fn every_scenario_runs_clean_on_iced_in_each_map_and_in_wx() {
    every_scenario_runs_clean(Backend::Iced);
}

fn every_scenario_runs_clean(backend: Backend) {
    if backend == Backend::Iced && !cfg!(target_arch = "x86_64") {
        println!("skipped on aarch64: the iced backend emits x86-64 code");
        return;
    }
    // One process runs one agent at a time: the runs go one after another.
    let _one = one_run();
    for name in SCENARIOS {
        let scenario: Scenario = name.parse().unwrap();
        if !cfg!(target_arch = "x86_64") && matches!(scenario, Scenario::Large | Scenario::Mixed) {
            // Their megabyte methods take Cranelift minutes under emulation
            // (the main job's `mixed` run on aarch64 is in issue 59's note).
            println!("skipped on aarch64 under qemu-user: {name} compiles megabyte methods");
            continue;
        }
        // On aarch64 under qemu-user, flip mode stands in for W^X: qemu
        // runs stale translations of code rewritten through W^X's second
        // view at a reused address (docs/guide/checked.md).
        let protected = if cfg!(target_arch = "x86_64") {
            MemoryMode::WriteXorExecute
        } else {
            MemoryMode::FlipOnPublish
        };
        let configs = [
            (MapVersion::V1, MemoryMode::Rwx),
            (MapVersion::V2, MemoryMode::Rwx),
            (MapVersion::V2, protected),
        ];
        // Startup's 4,000 Cranelift methods take about 45 s per run under
        // qemu-user: aarch64 runs it in v2 only (the other scenarios, and
        // the main job in issue 59's note, run every configuration there).
        let configs = if !cfg!(target_arch = "x86_64") && scenario == Scenario::Startup {
            println!("aarch64 under qemu-user: startup runs in v2 RWX only");
            &configs[1..2]
        } else {
            &configs[..]
        };
        for &(version, mode) in configs {
            // Each run lasts half a second and then until its events have
            // happened (`until_events`): its main group loaded (startup's
            // 4,000 methods, large's six large ones, mixed's two), a tier-up,
            // and the scenario's aborts, unloads and de-optimizations. A
            // loaded machine or a slow backend (Cranelift takes about 20
            // times iced's time per method) makes a run longer, not wrong.
            let config = RunConfig {
                scenario,
                backend,
                duration: Duration::from_millis(500),
                seed: 3,
                version,
                mode,
                threads: 2,
                hz: 2000,
                serve: None,
                // A loaded machine makes the run longer, not wrong.
                until_events: true,
            };
            let r = tiered::run(config, None, &|_| {}).unwrap();
            let what = format!("{name} {backend} {version} {mode:?}: {}", r.text());
            assert_eq!(r.wrong, 0, "{what}");
            assert_eq!(r.backend, backend.to_string());
            // Every published compilation was timed and measured, at its tier.
            assert_eq!(r.compile[0].compilations, r.tier0 + r.deopts, "{what}");
            assert_eq!(r.compile[1].compilations, r.tier_ups, "{what}");
            assert!(
                r.compile[0].p50_us > 0.0 && r.compile[1].p50_us > 0.0,
                "{what}"
            );
            assert!(r.results_checked > 1000 && r.lookups > 1000, "{what}");
            assert!(r.samples > 100 && r.frames_checked > 100, "{what}");
            assert!(r.tier_ups > 0 && r.frees >= r.tier_ups, "{what}");
            assert_eq!(r.publishes, r.tier0 + r.tier_ups + r.deopts, "{what}");
            assert_eq!(
                r.aborts > 0,
                matches!(scenario, Scenario::Abort | Scenario::Mixed),
                "{what}"
            );
            assert_eq!(
                r.unloads > 0,
                matches!(scenario, Scenario::Unload | Scenario::Mixed),
                "{what}"
            );
            assert_eq!(
                r.deopts > 0,
                matches!(scenario, Scenario::Steady | Scenario::Mixed),
                "{what}"
            );
            // Every large method (a megabyte or more at tier 0) compiled:
            // six in `large`, two in `mixed`. (They tier up and are freed as
            // the next ones compile, so the peak live bytes do not add up.)
            let tier0_bytes = r.compile[0].bytes_per_method * r.compile[0].compilations as f64;
            if scenario == Scenario::Large {
                assert!(tier0_bytes > f64::from(6 << 20), "{what}");
            }
            if scenario == Scenario::Mixed {
                assert!(tier0_bytes > f64::from(2 << 20), "{what}");
            }
            if scenario == Scenario::Startup {
                assert_eq!(r.tier0, 4000, "{what}");
            }
        }
    }
}

#[test]
fn bad_input_is_refused_with_a_reason() {
    let run = |args: &[&str]| Command::new(SIM).args(args).output().unwrap();
    let out = run(&["run", "--scenario", "warmup"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown scenario \"warmup\"; the scenarios are: startup, steady, large, unload, abort, mixed"),
        "{err}"
    );
    for (args, needle) in [
        (
            &["run", "--threads", "0"][..],
            "invalid value '0' for '--threads <THREADS>': must be a whole number of threads in 1..=64, not `0`",
        ),
        (
            &["run", "--seconds", "0"][..],
            "invalid value '0' for '--seconds <SECONDS>': must be a number of seconds in (0, 3600], not 0",
        ),
        (
            &["run", "--seconds", "nan"][..],
            "invalid value 'nan' for '--seconds <SECONDS>': must be a number of seconds in (0, 3600], not NaN",
        ),
        (
            &["run", "--hz", "0"][..],
            "invalid value '0' for '--hz <HZ>': must be a whole number of samples per second in 1..=100000, not `0`",
        ),
        (
            &["run", "--hz", "200000"][..],
            "invalid value '200000' for '--hz <HZ>': must be a whole number of samples per second in 1..=100000, not `200000`",
        ),
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn the_json_report_has_its_stable_keys() {
    let _one = one_run();
    let dir = std::env::temp_dir().join(format!("jitmap-run-{}", std::process::id()));
    // The default scenario, `mixed`, compiles megabyte methods, which take
    // Cranelift minutes under emulation: on aarch64 (qemu-user) `unload`
    // runs instead, which has every count but aborts.
    let scenario = if cfg!(target_arch = "x86_64") {
        "mixed"
    } else {
        "unload"
    };
    let out = Command::new(SIM)
        .args([
            "run",
            "--scenario",
            scenario,
            "--seconds",
            "6",
            "--until-events",
            "--json",
            "--out",
            dir.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["scenario"], scenario);
    assert_eq!(v["wrong"], 0);
    let aborts = (scenario == "mixed").then_some("aborts");
    for key in [
        "results_checked",
        "lookups",
        "samples",
        "tier_ups",
        "frees",
        "unloads",
    ]
    .into_iter()
    .chain(aborts)
    {
        assert!(v[key].as_u64().is_some_and(|n| n > 0), "{key}: {v}");
    }
    for file in [
        "report.txt",
        "stacks.folded",
        "flamegraph.svg",
        "profile.pb.gz",
    ] {
        assert!(dir.join(file).is_file(), "{file}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
