//! `jitmap inspect` against live spin hosts (this test binary run as
//! `jitmap-sim spin`'s host, see `host/mod.rs`): every answer is checked
//! against the host's perf map, while it is still and while it churns.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod host;

const JITMAP: &str = env!("CARGO_BIN_EXE_jitmap");

/// Runs the tests, or, started as a host, the host.
fn main() {
    host::main(&[
        (
            "a_still_host_is_resolved_exactly_and_listed_whole",
            a_still_host_is_resolved_exactly_and_listed_whole,
        ),
        (
            "a_churning_host_is_never_misnamed",
            a_churning_host_is_never_misnamed,
        ),
        (
            "bad_input_exits_2_with_a_reason",
            bad_input_exits_2_with_a_reason,
        ),
        (
            "a_wasmtime_guest_is_resolved_to_its_functions",
            a_wasmtime_guest_is_resolved_to_its_functions,
        ),
        (
            "a_stripped_host_is_found_by_its_descriptor_section",
            a_stripped_host_is_found_by_its_descriptor_section,
        ),
        (
            "a_cranelift_hosts_stubs_are_listed_by_kind_and_owner",
            a_cranelift_hosts_stubs_are_listed_by_kind_and_owner,
        ),
    ]);
}

/// A child process killed when dropped.
struct Host {
    child: Child,
    dir: PathBuf,
}

impl Host {
    fn spawn(name: &str, args: &[&str]) -> Self {
        Self::spawn_with(name, |_| host::spin(args))
    }

    /// A host `command` makes, given the host's own directory, with its
    /// perf map there.
    fn spawn_with(name: &str, command: impl FnOnce(&Path) -> Command) -> Self {
        let dir =
            std::env::temp_dir().join(format!("jitmap-inspect-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let child = command(&dir)
            .env("JITMAP_PERF", "map")
            .env("JITMAP_PERF_DIR", &dir)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        Self { child, dir }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The perf map's entries, once it has at least `n`: (start, size, name).
    fn perf_map(&self, n: usize) -> Vec<(u64, u64, String)> {
        self.perf_map_where(n, |name| name.ends_with(|c: char| c.is_ascii_digit()))
    }

    /// The same, of the entries whose name `keep` keeps.
    fn perf_map_where(&self, n: usize, keep: impl Fn(&str) -> bool) -> Vec<(u64, u64, String)> {
        let path = self.dir.join(format!("perf-{}.map", self.pid()));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut entries = read_perf_map(&path);
            entries.retain(|(_, _, name)| keep(name));
            if entries.len() >= n {
                return entries;
            }
            assert!(
                Instant::now() < deadline,
                "perf map {path:?} has {entries:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn read_perf_map(path: &Path) -> Vec<(u64, u64, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ' ');
            let start = u64::from_str_radix(f.next()?, 16).ok()?;
            let size = u64::from_str_radix(f.next()?, 16).ok()?;
            Some((start, size, f.next()?.to_string()))
        })
        .collect()
}

fn inspect(args: &[String]) -> (Output, serde_json::Value) {
    let out = Command::new(JITMAP)
        .arg("inspect")
        .args(args)
        .output()
        .unwrap();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out, json)
}

fn ip_args(pid: i32, ips: &[u64]) -> Vec<String> {
    let mut args = vec!["--pid".to_string(), pid.to_string(), "--json".to_string()];
    for ip in ips {
        args.push("--ip".into());
        args.push(format!("{ip:#x}"));
    }
    args
}

fn a_still_host_is_resolved_exactly_and_listed_whole() {
    if !jitmap_testkit::e2e::runs_x86_64() {
        return;
    }
    let host = Host::spawn("still", &["--functions", "32", "--seconds", "60"]);
    let entries = host.perf_map(32);
    assert_eq!(entries.len(), 32);
    let ips: Vec<u64> = entries
        .iter()
        .flat_map(|&(s, n, _)| [s, s + n / 2, s + n - 1])
        .collect();
    let (out, json) = inspect(&ip_args(host.pid(), &ips));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers = json["answers"].as_array().unwrap();
    assert_eq!(answers.len(), 96);
    for (i, (a, ip)) in answers.iter().zip(&ips).enumerate() {
        let (start, size, name) = &entries[i / 3];
        assert_eq!(a["ip"], *ip);
        assert_eq!(a["kind"], "method", "{a}");
        assert_eq!(
            (&a["start"], &a["size"]),
            (&(*start).into(), &(*size).into())
        );
        assert_eq!(a["name"], name.as_str());
        assert_eq!(a["offset"], ip - start);
    }
    // Reads per lookup, all in one range map and one v2 heap: the managers,
    // the map's sequence, five level entries, one fragment, the heap's
    // trailer, at most two start words, one read of end words, the prefix,
    // the header, the name, and the two sequences again.
    assert!(json["reads_max"].as_u64().unwrap() <= 17, "{json}");
    assert!(json["reads_mean"].as_f64().unwrap() >= 14.0, "{json}");

    // One past each function's end is padding: nothing, and exit status 1.
    let past: Vec<u64> = entries.iter().map(|&(s, n, _)| s + n).collect();
    let (out, json) = inspect(&ip_args(host.pid(), &past));
    assert_eq!(out.status.code(), Some(1));
    for a in json["answers"].as_array().unwrap() {
        assert_eq!(a["kind"], "nothing", "{a}");
    }

    let (out, json) = inspect(&[
        "--pid".into(),
        host.pid().to_string(),
        "--list".into(),
        "--json".into(),
    ]);
    assert!(out.status.success());
    let sections = json["sections"].as_array().unwrap();
    assert_eq!(sections.len(), 1, "{json}");
    assert_eq!(sections[0]["kind"], "heap");
    let mut listed: Vec<(u64, u64, String)> = sections[0]["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["start"].as_u64().unwrap(),
                b["size"].as_u64().unwrap(),
                b["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    listed.sort();
    let mut want = entries.clone();
    want.sort();
    assert_eq!(listed, want);
    // The text listing times no lookup it was not asked for: no ns/lookup.
    let (out, _) = inspect(&["--pid".into(), host.pid().to_string(), "--list".into()]);
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("lookups=")).unwrap();
    assert!(!line.contains("ns/lookup"), "{line}");
    assert!(line.contains("reads/lookup mean="), "{line}");
}

fn a_churning_host_is_never_misnamed() {
    if !jitmap_testkit::e2e::runs_x86_64() {
        return;
    }
    let host = Host::spawn(
        "churn",
        &[
            "--functions",
            "32",
            "--seconds",
            "60",
            "--churn",
            "--unique-names",
        ],
    );
    host.perf_map(32);
    let (mut methods, mut unknown, mut nothing, mut rounds, mut retries) = (0, 0, 0, 0, 0);
    let deadline = Instant::now() + Duration::from_secs(4);
    while Instant::now() < deadline {
        let entries = host.perf_map(32);
        // The latest placements: most are live, some already moved or freed.
        let recent = &entries[entries.len().saturating_sub(96)..];
        let ips: Vec<u64> = recent
            .iter()
            .flat_map(|&(s, n, _)| [s, s + n / 2, s + n - 1])
            .collect();
        let (out, json) = inspect(&ip_args(host.pid(), &ips));
        assert!(matches!(out.status.code(), Some(0 | 1)), "{out:?}");
        retries += json["retries"].as_u64().unwrap();
        // Every placement the child published is in its perf map by now
        // (a load event goes out before its code is visible, a move's just
        // after, under the same heap lock; both are flushed soon).
        std::thread::sleep(Duration::from_millis(100));
        let published: HashSet<(u64, u64, String)> = host.perf_map(32).into_iter().collect();
        for a in json["answers"].as_array().unwrap() {
            match a["kind"].as_str().unwrap() {
                "method" => {
                    let (start, size, ip) = (
                        a["start"].as_u64().unwrap(),
                        a["size"].as_u64().unwrap(),
                        a["ip"].as_u64().unwrap(),
                    );
                    let name = a["name"].as_str().unwrap().to_string();
                    assert!(
                        published.contains(&(start, size, name)),
                        "an answer no placement ever had: {a}"
                    );
                    assert!(start <= ip && ip < start + size, "{a}");
                    methods += 1;
                }
                "unknown" => unknown += 1,
                "nothing" => nothing += 1,
                other => panic!("{other}: {a}"),
            }
        }
        rounds += 1;
    }
    assert!(
        host_alive(&host),
        "the host must churn through the whole test"
    );
    eprintln!(
        "rounds={rounds} methods={methods} nothing={nothing} unknown={unknown} retries={retries}"
    );
    assert!(rounds >= 3);
    assert!(
        methods > (methods + nothing + unknown) / 4,
        "{methods} {nothing} {unknown}"
    );
}

/// A host stripped of its symbol tables (`strip`, as `strip = true` and
/// distribution packages do) is still found, by the section that holds its
/// descriptor alone, and its methods are named exactly.
fn a_stripped_host_is_found_by_its_descriptor_section() {
    if !jitmap_testkit::e2e::runs_x86_64() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("jitmap-inspect-strip-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let stripped = host::stripped(&dir);
    let host = Host::spawn_with("stripped", |_| {
        let mut command = Command::new(&stripped);
        host::as_host(&mut command, "spin").args(["--functions", "8", "--seconds", "60"]);
        command
    });
    let entries = host.perf_map(8);
    // Replaced on disk, as a package upgrade leaves a running host: the
    // reader reads the very file mapped, not what its path names now.
    std::fs::remove_file(&stripped).unwrap();
    std::fs::write(&stripped, b"not the host").unwrap();
    let ips: Vec<u64> = entries.iter().map(|&(s, n, _)| s + n / 2).collect();
    let (out, json) = inspect(&ip_args(host.pid(), &ips));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers = json["answers"].as_array().unwrap();
    assert_eq!(answers.len(), 8);
    for (a, (start, size, name)) in answers.iter().zip(&entries) {
        assert_eq!(a["kind"], "method", "{a}");
        assert_eq!(a["start"], *start);
        assert_eq!(a["offset"], size / 2);
        assert_eq!(a["name"], name.as_str());
    }
    drop(host);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The Cranelift demo's trampolines (`jitmap_cranelift::TRAMPOLINE`, kind 1) are
/// listed with their kind's name and owner, as the module named them, not
/// as a bare number.
fn a_cranelift_hosts_stubs_are_listed_by_kind_and_owner() {
    if !jitmap_testkit::e2e::runs_x86_64() {
        return;
    }
    let host = Host::spawn_with("cranelift-stubs", |dir| {
        let mut command = Command::new(host::executable());
        host::as_host(&mut command, "profile").args(["--backend", "cranelift", "--seconds", "60"]);
        command.arg("--out").arg(dir.join("profile"));
        command
    });
    let list = |json: bool| {
        let mut args = vec!["--pid".to_string(), host.pid().to_string(), "--list".into()];
        if json {
            args.push("--json".into());
        }
        inspect(&args)
    };
    // The demo's functions and their trampolines are published together.
    host.perf_map_where(1, |_| true);
    let deadline = Instant::now() + Duration::from_secs(60);
    let stubs = loop {
        let (out, json) = list(true);
        assert!(out.status.success(), "{out:?}");
        let stubs: Vec<(u64, String, String)> = json["sections"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| s["blocks"].as_array().unwrap())
            .filter(|b| b["kind"] == "stub")
            .map(|b| {
                (
                    b["stub_kind"].as_u64().unwrap(),
                    b["stub_name"].as_str().unwrap_or("(none)").to_owned(),
                    b["stub_owner"].as_str().unwrap_or("(none)").to_owned(),
                )
            })
            .collect();
        if !stubs.is_empty() || Instant::now() > deadline {
            break stubs;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let kind = 1;
    let want = (kind, "trampoline".to_owned(), "jitmap-cranelift".to_owned());
    assert!(!stubs.is_empty(), "the demo published no trampoline");
    assert_eq!(stubs, vec![want; stubs.len()]);
    let (out, _) = list(false);
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("stub kind")).collect();
    assert_eq!(lines.len(), stubs.len(), "{text}");
    for line in lines {
        assert!(
            line.contains(&format!(
                "stub kind {kind}: trampoline (jitmap-cranelift) start "
            )),
            "{line}"
        );
    }
}

fn host_alive(host: &Host) -> bool {
    Path::new(&format!("/proc/{}/maps", host.pid())).exists()
}

fn bad_input_exits_2_with_a_reason() {
    let (out, _) = inspect(&["--pid".into(), "999999999".into()]);
    assert_eq!(out.status.code(), Some(2));
    // The same words as `jitmap profile`'s.
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no process 999999999"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let (out, _) = inspect(&["--pid".into(), sleeper.id().to_string()]);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("defines jitmap_descriptor"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let (out, _) = inspect(&["--pid".into(), "1".into(), "--ip".into(), "0xzz".into()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an address"));
}

/// A wasmtime host's guest (jitmap_wasmtime::demo), registered as an image:
/// its perf map lists the guest's functions and wasmtime's trampolines, and
/// `inspect` names every first and last byte of them from outside.
fn a_wasmtime_guest_is_resolved_to_its_functions() {
    let host = Host::spawn_with("wasm", |dir| {
        let out = dir.join("profile");
        let mut command = Command::new(host::executable());
        // wasmtime writes its jitdump into the working directory.
        command.current_dir(dir);
        host::as_host(&mut command, "wasm").args([
            "--seconds",
            "60",
            "--out",
            out.to_str().unwrap(),
        ]);
        command
    });
    let entries = host.perf_map_where(6, |name| name.starts_with("guest::"));
    let mut names: Vec<&str> = entries
        .iter()
        .map(|(_, _, n)| n.as_str())
        .filter(|n| *n != "guest::[trampolines]")
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "guest::leaf_1x",
            "guest::leaf_2x",
            "guest::leaf_4x",
            "guest::middle",
            "guest::top"
        ]
    );
    let ips: Vec<u64> = entries
        .iter()
        .flat_map(|&(s, n, _)| [s, s + n - 1])
        .collect();
    let (out, json) = inspect(&ip_args(host.pid(), &ips));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers = json["answers"].as_array().unwrap();
    assert_eq!(answers.len(), ips.len());
    for (i, (a, ip)) in answers.iter().zip(&ips).enumerate() {
        let (start, size, name) = &entries[i / 2];
        assert_eq!(a["kind"], "image", "{a}");
        assert_eq!(a["name"], name.as_str(), "{a}");
        assert_eq!(
            (&a["start"], &a["size"], &a["method_offset"]),
            (&(*start).into(), &(*size).into(), &(ip - start).into()),
            "{a}"
        );
    }
}
