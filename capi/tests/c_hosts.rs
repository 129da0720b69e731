//! The C ABI as C hosts use it: the programs in `tests/c/` are compiled with
//! the system compiler against the header and the library this build made,
//! and run. Each also runs built with clang's AddressSanitizer and
//! UndefinedBehaviorSanitizer, which must report nothing. The README's C
//! example is compiled against an install made by `capi/install.sh`, through
//! pkg-config.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use flate2::read::GzDecoder;
use jitmap::agent::export::proto;
use prost::Message;

fn capi_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The directory holding this build's `libjitmap_capi.{so,a}`: `deps/`,
/// beside the test executable. (`cargo test` builds them there and does not
/// copy them up to the profile's directory, where an older build's may be.)
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().to_path_buf();
    assert!(
        dir.join("libjitmap_capi.so").exists(),
        "no libjitmap_capi.so in {}",
        dir.display()
    );
    dir
}

/// A directory in `out` where the built library has the names a host links
/// and loads it by: `libjitmap.so` (for `-ljitmap`) and its SONAME,
/// `libjitmap.so.<major>` (what the loader looks for).
fn linkable(out: &Path) -> PathBuf {
    let dir = out.join("lib");
    if !dir.exists() {
        std::fs::create_dir_all(&dir).unwrap();
        let built = lib_dir().join("libjitmap_capi.so");
        for name in [
            "libjitmap.so".to_owned(),
            format!("libjitmap.so.{}", env!("CARGO_PKG_VERSION_MAJOR")),
        ] {
            std::os::unix::fs::symlink(&built, dir.join(name)).unwrap();
        }
    }
    dir
}

/// Which compiler, and with what.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Build {
    /// The system `cc`.
    Plain,
    /// clang with `-fsanitize=address,undefined`.
    Sanitized,
}

/// Compiles `tests/c/<name>.c` into a temporary directory; returns its path.
fn compile(name: &str, build: Build, out: &Path) -> PathBuf {
    let source = capi_dir().join("tests/c").join(format!("{name}.c"));
    let exe = out.join(format!("{name}-{build:?}"));
    let lib = linkable(out);
    let compiler = match build {
        Build::Plain => jitmap_testkit::frameless::c_compiler(),
        Build::Sanitized => "clang".to_owned(),
    };
    let mut cmd = Command::new(&compiler);
    cmd.args([
        "-std=c11",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-pedantic",
        "-O1",
        "-g",
    ])
    .arg("-I")
    .arg(capi_dir().join("include"))
    .arg(&source)
    .arg("-L")
    .arg(&lib)
    .arg(format!("-Wl,-rpath,{}", lib.display()))
    .args(["-ljitmap", "-lpthread", "-o"])
    .arg(&exe);
    if build == Build::Sanitized {
        cmd.args([
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer",
        ]);
    }
    let output = cmd.output().unwrap_or_else(|e| {
        panic!("{compiler}: {e} (the sanitizer builds need clang: apt-get install clang)")
    });
    assert!(
        output.status.success(),
        "{compiler} {}: {}",
        source.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    exe
}

/// Held by each test for its whole run, compiles included: a host measures
/// shares of its own time, and two cores are all there may be.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs a compiled host; checks that it exited 0 and that no sanitizer
/// spoke. Returns its stdout.
fn run(exe: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let output: Output = Command::new(exe)
        .args(args)
        // cargo's search path for the tests' own libraries would come
        // before the hosts' run paths.
        .env_remove("LD_LIBRARY_PATH")
        .envs(env.iter().copied())
        // Leaks of the test's own never-freed statics are not what is asked.
        .env("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=1")
        .env("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    );
    assert!(
        output.status.success(),
        "{} {args:?} {env:?} failed ({}):\n{stdout}\n{stderr}",
        exe.display(),
        output.status
    );
    for report in ["AddressSanitizer", "runtime error", "LeakSanitizer"] {
        assert!(!stderr.contains(report), "{report}:\n{stderr}");
    }
    stdout
}

/// `key value` pairs of a host's summary line.
fn counts(line: &str) -> std::collections::HashMap<String, u64> {
    let words: Vec<&str> = line.split_whitespace().collect();
    words
        .chunks(2)
        .map(|kv| (kv[0].to_owned(), kv[1].parse().unwrap()))
        .collect()
}

fn jit_host(build: Build) {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let exe = compile("jit_host", build, dir.path());
    // Versions are published over freed ones: on aarch64 under qemu-user,
    // in RWX and flip mode (docs/guide/checked.md), not W^X.
    let protected = if cfg!(target_arch = "x86_64") {
        "wx"
    } else {
        "flip"
    };
    let modes: &[&[(&str, &str)]] = match build {
        Build::Plain => &[
            &[],
            &[("JIT_HOST_MODE", protected)],
            &[("JIT_HOST_V1", "1")],
        ],
        Build::Sanitized => &[&[("JIT_HOST_MODE", "wx")]],
    };
    for env in modes {
        let c = counts(&run(&exe, &[], env));
        println!("{build:?} {env:?}: {c:?}");
        assert_eq!((c["wrong"], c["bad_results"], c["unregistered"]), (0, 0, 0));
        // The executors spend most of their time in JIT code, and the
        // handler found it there.
        assert!(c["samples"] >= 100, "{c:?}");
        assert!(c["found"] * 2 >= c["samples"], "{c:?}");
        assert!(c["tier_ups"] >= 500 && c["tier_downs"] >= 500, "{c:?}");
        // Every byte of every live version, after the run: 64 methods of
        // at least 48 bytes.
        assert!(c["exact"] >= 64 * 48, "{c:?}");
    }
}

#[test]
fn a_c_jit_tiers_up_under_sigprof_lookups_and_every_answer_is_right() {
    jit_host(Build::Plain);
}

/// Whether the sanitizer builds can run here: clang's sanitizer runtimes
/// are the host's (x86-64); Debian has none for an aarch64 cross build.
fn sanitizers_here() -> bool {
    if cfg!(target_arch = "x86_64") {
        return true;
    }
    println!("skipped on aarch64: clang has no AddressSanitizer runtime for the cross target here");
    false
}

#[test]
fn the_c_jit_under_address_and_undefined_behavior_sanitizers() {
    if sanitizers_here() {
        jit_host(Build::Sanitized);
    }
}

/// Issue 67, item 2: what a C JIT does with one method (`inplace_host.c`):
/// reserve 4 KiB, emit 10 or 12 bytes, publish only those, rewrite a
/// constant 2,000 times and a jump target 1,000 times through the write
/// address with `jitmap_heap_make_visible`, call it after each, and free it
/// by its start, while two readers look up every byte around it. In W^X
/// mode (RWX under qemu-user, which does not see code written through a
/// second mapping); built plainly and under ASan and UBSan.
fn inplace_host(build: Build) {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let exe = compile("inplace_host", build, dir.path());
    let mode = if cfg!(target_arch = "x86_64") {
        "wx"
    } else {
        "rwx"
    };
    let c = counts(&run(&exe, &[], &[("JIT_HOST_MODE", mode)]));
    println!("{build:?}: {c:?}");
    assert_eq!(c["wrong"], 0, "{c:?}");
    assert_eq!((c["calls"], c["jumps"]), (2000, 1000), "{c:?}");
    // Two sizes past the reservation, and two addresses where no block
    // starts after the free.
    assert_eq!(c["refused"], 4, "{c:?}");
    // The tail given back took the next block.
    assert_eq!(c["in_tail"], 1, "{c:?}");
    assert!(c["lookups"] >= 8 * (4096 + 128), "{c:?}");
}

#[test]
fn a_c_jit_publishes_less_than_it_reserved_rewrites_in_place_and_frees_by_address() {
    inplace_host(Build::Plain);
    if sanitizers_here() {
        inplace_host(Build::Sanitized);
    }
}

fn agent_host(build: Build) {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let exe = compile("agent_host", build, dir.path());
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let c = counts(&run(&exe, &[out.to_str().unwrap()], &[]));
    assert_eq!((c["wrong"], c["crossed"]), (0, 3), "{c:?}");
    let samples = c["samples"];
    assert!(samples >= 1000, "{c:?}");

    // Folded stacks: the leaves' shares are 1:2:4 within 3 points, each
    // leaf called from the host's main, called from glibc's start: whole
    // stacks, `_start;__libc_start_main_impl;__libc_start_call_main;main;leaf`
    // (issue 67, item 3: on aarch64 the leaves' frames, 32 and 80 bytes
    // with the record at the bottom, put main's stack pointer 16 and 64
    // bytes low, and main's caller was read from the wrong slot). A libc
    // without its local symbols (no `libc6-dbg`; the cross toolchain's)
    // names `__libc_start_call_main`, a static function, by its address,
    // and `__libc_start_main_impl` by its exported alias.
    let whole = |stack: &str, leaf: &str| {
        let frames: Vec<&str> = stack.split(';').collect();
        frames.len() == 5
            && frames[0] == "_start"
            && (frames[1..3] == ["__libc_start_main_impl", "__libc_start_call_main"]
                || frames[1] == "__libc_start_main" && frames[2].starts_with("0x"))
            && frames[3..] == ["main", leaf]
    };
    let folded = std::fs::read_to_string(out.join("folded.txt")).unwrap();
    let mut leaves = [0u64; 3];
    let mut total = 0;
    for line in folded.lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        total += n;
        for (i, leaf) in ["leaf_1x", "leaf_2x", "leaf_4x"].iter().enumerate() {
            if whole(stack, leaf) {
                leaves[i] += n;
            }
        }
    }
    // The stacks count periods: each sample 1 + its signal's overrun.
    assert_eq!(total, c["periods"], "{folded}");
    assert!(c["periods"] >= samples, "{c:?}");
    let in_leaves: u64 = leaves.iter().sum();
    assert!(in_leaves * 10 >= samples * 9, "{folded}");
    for (i, want) in [1.0 / 7.0, 2.0 / 7.0, 4.0 / 7.0].iter().enumerate() {
        let share = leaves[i] as f64 / in_leaves as f64;
        assert!(
            (share - want).abs() <= 0.03,
            "leaf {i}: {share:.3} vs {want:.3}\n{folded}"
        );
    }

    // pprof: gzipped, the same periods, the leaves named.
    let mut bytes = Vec::new();
    GzDecoder::new(std::fs::File::open(out.join("profile.pb.gz")).unwrap())
        .read_to_end(&mut bytes)
        .unwrap();
    let p = proto::Profile::decode(&bytes[..]).unwrap();
    let pprof_samples: i64 = p.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(pprof_samples as u64, c["periods"]);
    let names: Vec<&str> = p
        .function
        .iter()
        .map(|f| p.string_table[f.name as usize].as_str())
        .collect();
    for leaf in ["leaf_1x", "leaf_2x", "leaf_4x"] {
        assert!(names.contains(&leaf), "{names:?}");
    }
    // The report and the flame graph name them too. The report counts the
    // JIT code's entry-probe calls, one per leaf call (or dropped).
    let report = std::fs::read_to_string(out.join("report.txt")).unwrap();
    assert!(
        report.starts_with(&format!("signals: {samples} kept ")),
        "{report}"
    );
    let probes = report
        .lines()
        .find_map(|l| l.strip_prefix("probes: "))
        .unwrap();
    let words: Vec<&str> = probes.split([' ', ',']).filter(|w| !w.is_empty()).collect();
    assert_eq!(
        (words[1], words[3], words[5]),
        ("entries", "values", "dropped")
    );
    let (entries, dropped): (u64, u64) = (words[0].parse().unwrap(), words[4].parse().unwrap());
    assert_eq!(entries + dropped, c["calls"], "{probes}");
    assert!(entries > 0);
    let svg = std::fs::read_to_string(out.join("flamegraph.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("leaf_4x"));
}

#[test]
fn the_agent_profiles_a_c_hosts_jit_code_at_1_2_4() {
    agent_host(Build::Plain);
}

#[test]
fn the_agent_in_a_c_host_under_sanitizers() {
    if sanitizers_here() {
        agent_host(Build::Sanitized);
    }
}

fn misuse(build: Build) {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let exe = compile("misuse", build, dir.path());
    let perf_dir = dir.path().to_str().unwrap();
    let mut env = vec![("MISUSE_PERF_DIR", perf_dir)];
    if !cfg!(target_arch = "x86_64") {
        // qemu-user keeps 32 POSIX timers: 1,024 attached threads cannot
        // be shown there.
        println!("aarch64: the 1,024-thread crowd is left out (qemu-user has 32 POSIX timers)");
        env.push(("MISUSE_NO_CROWD", "1"));
    }
    let stdout = run(&exe, &[], &env);
    let mut lines = stdout.lines();
    // The perf map names the method published after perf output was on
    // (written by a background thread, flushed by the manager's destroy).
    let start = lines.next().unwrap().strip_prefix("perf ").unwrap();
    let map = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("perf-")
        })
        .expect("a perf map");
    let map = std::fs::read_to_string(map).unwrap();
    assert!(
        map.lines()
            .any(|l| l == format!("{start} 10 perf_named_method")),
        "{map}"
    );
    let reached: Vec<&str> = lines
        .next()
        .unwrap()
        .strip_prefix("reached ")
        .unwrap()
        .split(' ')
        .collect();
    // Every status but INTERNAL, which reports a bug and not a misuse, in
    // the header's order.
    let all: Vec<String> = (0..)
        .map(|i| {
            // SAFETY: jitmap_status_name returns a static NUL-terminated string.
            unsafe { std::ffi::CStr::from_ptr(jitmap_capi::jitmap_status_name(i)) }
                .to_str()
                .unwrap()
                .to_owned()
        })
        .take_while(|name| name != "JITMAP_STATUS_UNKNOWN")
        .filter(|name| name != "JITMAP_STATUS_INTERNAL")
        .collect();
    assert_eq!(all.len(), 36);
    // Without the crowd (aarch64 under qemu), all but TOO_MANY_THREADS.
    let crowd = cfg!(target_arch = "x86_64");
    let all: Vec<&str> = all
        .iter()
        .map(String::as_str)
        .filter(|&name| crowd || name != "JITMAP_STATUS_TOO_MANY_THREADS")
        .collect();
    assert_eq!(reached, all);
}

#[test]
fn misuse_reaches_every_status_and_changes_nothing() {
    misuse(Build::Plain);
}

#[test]
fn misuse_under_sanitizers() {
    if sanitizers_here() {
        misuse(Build::Sanitized);
    }
}

#[test]
fn the_header_compiles_cleanly_as_c11_and_as_cpp17() {
    let dir = tempfile::tempdir().unwrap();
    // clang++ rather than c++: a machine with gcc alone may lack g++.
    for (compiler, std, file) in [
        ("cc", "-std=c11", "h.c"),
        ("clang", "-std=c11", "h.c"),
        ("clang++", "-std=c++17", "h.cpp"),
    ] {
        let source = dir.path().join(file);
        std::fs::write(
            &source,
            "#include \"jitmap.h\"\nint main(void) { jitmap_guard g; (void)g; return JITMAP_STATUS_OK; }\n",
        )
        .unwrap();
        let output = Command::new(compiler)
            .args([std, "-Wall", "-Wextra", "-Werror", "-pedantic", "-c", "-o"])
            .arg(dir.path().join("h.o"))
            .arg("-I")
            .arg(capi_dir().join("include"))
            .arg(&source)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{compiler} {std}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// The first C example under `heading` in the guide (`docs/guide/c.md`).
fn guide_example(heading: &str) -> String {
    let guide = std::fs::read_to_string(capi_dir().join("../docs/guide/c.md")).unwrap();
    let section = &guide[guide.find(heading).unwrap()..];
    let code = &section[section.find("```c\n").unwrap() + 5..];
    code[..code.find("```\n").unwrap()].to_owned()
}

/// Installs into `dir`'s `prefix` and builds `code` there against it, with
/// pkg-config's flags and an rpath, warnings as errors; returns the
/// executable and the prefix.
fn build_against_install(dir: &Path, code: &str) -> (PathBuf, PathBuf) {
    let prefix = dir.join("prefix");
    let install = Command::new(capi_dir().join("install.sh"))
        .arg(&prefix)
        .env("JITMAP_LIB_DIR", lib_dir())
        .output()
        .unwrap();
    assert!(install.status.success(), "{install:?}");
    let source = dir.join("host.c");
    std::fs::write(&source, code).unwrap();
    let out = Command::new("pkg-config")
        .args(["--cflags", "--libs", "jitmap"])
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
        .output()
        .expect("pkg-config (apt-get install pkg-config)");
    assert!(out.status.success(), "{out:?}");
    let flags = String::from_utf8(out.stdout).unwrap();
    let exe = dir.join("host");
    let cc = Command::new(jitmap_testkit::frameless::c_compiler())
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic"])
        .arg(&source)
        .args(flags.split_whitespace())
        .arg(format!("-Wl,-rpath,{}", prefix.join("lib").display()))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    (exe, prefix)
}

/// The guide's agent example, built as the first one: it profiles its one
/// JIT leaf for half a second and writes folded stacks in its working
/// directory, nearly all of them `...;main;spin`, and says how many periods
/// they hold.
#[test]
fn the_guides_agent_example_profiles_its_jit_leaf() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let code = guide_example("## Profiling a C host with the agent");
    let (exe, _) = build_against_install(dir.path(), &code);
    // The installed library, as the guide's build finds it (by the rpath),
    // not the one cargo's library path names.
    let out = Command::new(&exe)
        .current_dir(dir.path())
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let folded = std::fs::read_to_string(dir.path().join("profile.folded")).unwrap();
    let (mut all, mut in_spin) = (0u64, 0u64);
    for line in folded.lines() {
        let (stack, count) = line.rsplit_once(' ').unwrap();
        let count: u64 = count.parse().unwrap();
        all += count;
        if stack.ends_with(";main;spin") {
            in_spin += count;
        }
    }
    assert_eq!(stdout, format!("{all} periods of 1 ms in profile.folded\n"));
    // Half a second at 1 kHz of wall-clock time: about 500 periods, nearly
    // all in the leaf (the rest in the loop's clock reads).
    assert!(all >= 100, "{all} periods\n{folded}");
    assert!(
        in_spin * 10 >= all * 9,
        "{in_spin} of {all} in main;spin\n{folded}"
    );
}

/// The guide's C example (`docs/guide/c.md`), built against an install in a
/// temporary prefix through pkg-config and an rpath, as the guide shows.
#[test]
fn the_guide_example_builds_with_pkg_config_after_install() {
    let _one = one_at_a_time();
    let code = guide_example("# Using jitmap from C");
    let dir = tempfile::tempdir().unwrap();
    let (exe, prefix) = build_against_install(dir.path(), &code);
    assert_eq!(
        run(&exe, &[], &[]),
        "answer, method 7, offset 3\nreturns 42\n"
    );
    let modversion = Command::new("pkg-config")
        .args(["--modversion", "jitmap"])
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&modversion.stdout).trim(),
        env!("CARGO_PKG_VERSION")
    );
    // The library as distributions ship it: the versioned file, its SONAME
    // link, the link-time name, and a host that records the SONAME.
    let version = env!("CARGO_PKG_VERSION");
    let major = env!("CARGO_PKG_VERSION_MAJOR");
    let lib = prefix.join("lib");
    let link = |name: &str| std::fs::read_link(lib.join(name)).unwrap();
    assert_eq!(
        link(&format!("libjitmap.so.{major}")),
        Path::new(&format!("libjitmap.so.{version}"))
    );
    assert_eq!(
        link("libjitmap.so"),
        Path::new(&format!("libjitmap.so.{major}"))
    );
    let dynamic = |file: &Path| {
        let out = Command::new("readelf")
            .arg("-d")
            .arg(file)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let soname = format!("[libjitmap.so.{major}]");
    let library = dynamic(&lib.join(format!("libjitmap.so.{version}")));
    assert!(
        library
            .lines()
            .any(|l| l.contains("(SONAME)") && l.contains(&soname)),
        "{library}"
    );
    let host = dynamic(&exe);
    assert!(
        host.lines()
            .any(|l| l.contains("(NEEDED)") && l.contains(&soname)),
        "{host}"
    );
}

/// The guide's own commands, as written (its `sh` block, then its static
/// link line), with `HOME` in a temporary directory: the shared and the
/// static build of its example both run. (The static line once named
/// `/usr/local` while the install went to `$HOME/.local`: "jitmap.h: No
/// such file or directory".)
#[test]
fn the_guide_commands_build_its_example_shared_and_static() {
    let _one = one_at_a_time();
    let guide = std::fs::read_to_string(capi_dir().join("../docs/guide/c.md")).unwrap();
    let block = |fence: &str| {
        let at = guide.find(fence).unwrap() + fence.len();
        guide[at..at + guide[at..].find("```\n").unwrap()].to_owned()
    };
    let (commands, code) = (block("```sh\n"), block("```c\n"));
    let static_link = {
        let at = guide.find("`cc host.c -I").unwrap() + 1;
        &guide[at..at + guide[at..].find('`').unwrap()]
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("host.c"), code).unwrap();
    // `capi/install.sh` as the guide calls it, from the checkout.
    std::os::unix::fs::symlink(capi_dir(), dir.path().join("capi")).unwrap();
    let script = format!("set -eu\n{commands}{static_link} -o static_host\n./static_host\n");
    // The guide's `cc` is this target's compiler: on aarch64 under qemu,
    // the cross compiler, put first on the PATH under that name.
    let mut path = std::env::var_os("PATH").unwrap_or_default();
    let compiler = jitmap_testkit::frameless::c_compiler();
    if compiler != "cc" {
        let found = std::env::split_paths(&path)
            .map(|d| d.join(&compiler))
            .find(|p| p.is_file())
            .unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::os::unix::fs::symlink(found, bin.join("cc")).unwrap();
        let mut dirs = vec![bin];
        dirs.extend(std::env::split_paths(&path));
        path = std::env::join_paths(dirs).unwrap();
    }
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(dir.path())
        .env("PATH", &path)
        .env("HOME", dir.path())
        .env("JITMAP_LIB_DIR", lib_dir())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{script}\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer = "answer, method 7, offset 3\nreturns 42\n";
    assert!(stdout.ends_with(&format!("{answer}{answer}")), "{stdout}");
}
