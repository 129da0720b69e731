//! PLT entries: their rows, their names, and samples in them.
//!
//! - The rows of a linked object's lazy `.plt` (x86-64): each entry has
//!   CFA = rsp + 8 from its start and rsp + 16 past its `push`, where the
//!   push is found in the entry's own bytes, not in its CFI.
//! - The names `plt_stubs` gives are those objdump prints (`<name@plt>:`).
//! - Samples of the agent in `plt_target@plt` keep their callers: the
//!   helper, then the JIT code (≥ 99 % exact). On x86-64 the entry is
//!   stepped by its CFI expression's rows; on aarch64, which has no CFI for
//!   it, by the entry rule over the `.plt` section.

use jitmap::unwind::{UnwindRow, object_rows, plt_stubs, preferred};
use jitmap::{ExecutionManager, HeapConfig};
use jitmap_testkit::e2e::one_run;
use jitmap_testkit::plt::{PLT_STACK, PltCaller, build};
use jitmap_testkit::profile::{exact_stacks, sample_mixed, shown};
use object::{Object, ObjectSection};
use std::collections::BTreeMap;
use std::process::Command;

fn temp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("jitmap-plt-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The row that applies at `addr` in `rows` (sorted by offset).
fn row_at(rows: &[UnwindRow], addr: u64) -> UnwindRow {
    let i = rows.partition_point(|r| u64::from(r.offset) <= addr);
    rows[i - 1]
}

#[test]
fn a_lazy_plt_entry_steps_by_rsp_plus_8_then_plus_16_past_its_push() {
    if !cfg!(target_arch = "x86_64") {
        println!("skipped on aarch64: its PLT has no CFI expression (its stubs move no sp)");
        return;
    }
    let dir = temp("rows");
    let helper = build(&dir).unwrap();
    let elf = std::fs::read(&helper).unwrap();
    let file = object::File::parse(&*elf).unwrap();
    let frame = file.section_by_name(".eh_frame").unwrap();
    let rows = object_rows(frame.data().unwrap(), frame.address()).unwrap();
    let plt = file.section_by_name(".plt").unwrap();
    let code = plt.data().unwrap();
    let rule = |cfa: i32| UnwindRow {
        cfa,
        ra: -8,
        kind: UnwindRow::RULE,
        base: UnwindRow::BASE_SP,
        fp_rule: UnwindRow::FP_SAME,
        has_ra: UnwindRow::RA_AT,
        ..UnwindRow::default()
    };
    let mut entries = 0;
    // Entry 0 calls the resolver; every later entry pushes its index.
    for (i, entry) in code.chunks_exact(16).enumerate().skip(1) {
        let addr = plt.address() + 16 * i as u64;
        // `push imm32` (0x68) and its four bytes: the push ends there.
        let push = entry.iter().position(|&b| b == 0x68).unwrap() as u64;
        let pushed = push + 5;
        for at in 0..16 {
            let want = rule(if at >= pushed { 16 } else { 8 });
            let got = row_at(&rows, addr + at);
            assert_eq!(
                UnwindRow { offset: 0, ..got },
                want,
                "entry {i} + {at} (push ends at {pushed})"
            );
        }
        entries += 1;
    }
    assert_eq!(entries, code.len() / 16 - 1);
    assert!(entries >= 1, "the helper's .plt has entries");
}

/// A binutils tool for this target's objects.
fn binutil(tool: &str) -> String {
    if cfg!(target_arch = "aarch64") {
        format!("aarch64-linux-gnu-{tool}")
    } else {
        tool.to_owned()
    }
}

/// objdump's `<name@plt>` labels of `object`, by address.
fn objdump_plt(object: &std::path::Path) -> BTreeMap<u64, String> {
    let out = Command::new(binutil("objdump"))
        .arg("-d")
        .arg(object)
        .output()
        .unwrap();
    assert!(out.status.success(), "objdump: {out:?}");
    // Lines such as `0000000000001030 <plt_target@plt>:`.
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (addr, rest) = l.split_once(" <")?;
            let name = rest.strip_suffix(">:").filter(|n| n.ends_with("@plt"))?;
            Some((u64::from_str_radix(addr, 16).ok()?, name.to_owned()))
        })
        .collect()
}

/// `plt_stubs` of `object`, by address.
fn stubs(object: &std::path::Path) -> BTreeMap<u64, String> {
    plt_stubs(&*std::fs::read(object).unwrap())
        .into_iter()
        .map(|s| (s.addr, s.name))
        .collect()
}

#[test]
fn plt_entries_are_named_as_objdump_names_them() {
    let dir = temp("names");
    let helper = build(&dir).unwrap();
    let got = stubs(&helper);
    assert_eq!(got, objdump_plt(&helper));
    assert!(got.values().any(|n| n == "plt_target@plt"), "{got:?}");
}

/// libc's PLT calls its own ifuncs (memset, strlen...) through IRELATIVE
/// slots, which objdump names `*ABS*+0x<resolver>@plt`: those take the
/// name of the ifunc whose resolver that is (`nm -D` type `i`; of aliases,
/// the one `preferred` ranks first); every other entry is objdump's.
#[test]
fn libc_plt_entries_are_named_for_their_functions_and_ifuncs() {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let libc = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("/libc.so"))
        .expect("libc is mapped");
    let out = Command::new(binutil("nm"))
        .args(["-D", "--defined-only", libc])
        .output()
        .unwrap();
    assert!(out.status.success(), "nm: {out:?}");
    // Of aliases, the one `preferred` ranks first.
    let mut ifuncs: BTreeMap<u64, String> = BTreeMap::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let [addr, "i", name] = f[..] else { continue };
        let name = name.split('@').next().unwrap();
        let kept = ifuncs
            .entry(u64::from_str_radix(addr, 16).unwrap())
            .or_insert_with(|| name.to_owned());
        if preferred(name) < preferred(kept) {
            *kept = name.to_owned();
        }
    }
    let want: BTreeMap<u64, String> = objdump_plt(std::path::Path::new(libc))
        .into_iter()
        .map(|(addr, name)| {
            let resolver = name
                .strip_prefix("*ABS*+0x")
                .and_then(|n| n.strip_suffix("@plt"))
                .and_then(|hex| u64::from_str_radix(hex, 16).ok());
            match resolver.and_then(|r| ifuncs.get(&r)) {
                Some(ifunc) => (addr, format!("{ifunc}@plt")),
                None => (addr, name),
            }
        })
        .collect();
    let got = stubs(std::path::Path::new(libc));
    assert_eq!(got, want);
    println!("{libc}: {} PLT entries", got.len());
}

#[test]
fn samples_in_a_plt_entry_keep_their_callers() {
    let _one = one_run();
    let dir = temp("agent");
    let manager = ExecutionManager::new(8);
    let heap = manager
        .create_heap(HeapConfig {
            span: 1 << 20,
            ..HeapConfig::default()
        })
        .unwrap();
    let caller = PltCaller::build(&heap, &dir).unwrap();
    assert_ne!(caller.call(10), 0);

    // The agent starts after the helper is loaded: its table has the
    // helper's rows. The share of samples in the one-instruction entry
    // varies with the libraries' placement, from about 1 % to 40 % on
    // x86-64 (about 3 % under qemu-user, whose translation makes the entry
    // cheap): 8,000 samples give at least 40 in it at the lowest share,
    // with a wide margin.
    let goal = 8000;
    let profile = sample_mixed(&manager, goal, || {
        std::hint::black_box(caller.call(std::hint::black_box(100_000)));
    })
    .unwrap();
    let shown = shown(&profile, 8);
    let (in_plt, exact) = exact_stacks(&profile, &PLT_STACK);
    let (in_target, target_exact) =
        exact_stacks(&profile, &["plt_target", PLT_STACK[1], PLT_STACK[2]]);
    println!(
        "plt_target@plt: {exact} of {in_plt} exact; plt_target: {target_exact} of {in_target}; ends {:?}",
        profile.stack_ends
    );
    assert!(in_plt >= 40, "{in_plt} samples in the PLT entry\n{shown}");
    // Complete stacks, down to the thread's start, whose CFI marks the
    // outermost frame with an undefined return address (67.4: on aarch64
    // every one ended `unsupported`).
    assert!(
        profile.stack_ends.root * 100 >= profile.stack_ends.total() * 99,
        "{:?}",
        profile.stack_ends
    );
    assert!(
        exact * 100 >= in_plt * 99,
        "{exact} of {in_plt} exact\n{shown}"
    );
    assert!(
        target_exact * 100 >= in_target * 99,
        "{target_exact} of {in_target} exact\n{shown}"
    );
}

/// Issue 67, item 7: `-z pac-plt`, and BTI in an executable, make 24-byte entries, which the
/// linker does not record; they were cut into 16-byte pieces from the
/// section's start, so that names landed 8 bytes early and a sample on an
/// entry's `br x17` took the next entry's name. Each entry is now named
/// at objdump's address, 24 bytes long, its branch included.
#[cfg(target_arch = "aarch64")]
#[test]
fn plt_entries_of_24_bytes_are_named_whole() {
    let dir = temp("pac-plt");
    let source = dir.join("lib.c");
    std::fs::write(
        &source,
        "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n\
         int lib_entry(const char *s) { char b[64]; strncpy(b, s, 63); b[63] = 0;\n\
         puts(b); return (int)strlen(b) + abs(atoi(s)); }\n\
         int main(int argc, char **argv) { return lib_entry(argv[argc - 1]); }\n",
    )
    .unwrap();
    // PAC entries (`autia1716` before the branch) in shared objects; BTI
    // entries (`bti c` first) in an executable that is not
    // position-independent (GNU ld gives shared objects 16-byte BTI
    // entries).
    for flags in [
        &["-shared", "-fPIC", "-Wl,-z,pac-plt"][..],
        &[
            "-shared",
            "-fPIC",
            "-mbranch-protection=standard",
            "-Wl,-z,force-bti,-z,pac-plt",
        ],
        &[
            "-no-pie",
            "-mbranch-protection=standard",
            "-Wl,-z,force-bti",
        ],
    ] {
        let object = dir.join("lib.so");
        let out = Command::new(binutil("gcc"))
            .arg("-O1")
            .args(flags)
            .arg(&source)
            .arg("-o")
            .arg(&object)
            .output()
            .unwrap();
        assert!(out.status.success(), "{flags:?}: {out:?}");
        let all = plt_stubs(&*std::fs::read(&object).unwrap());
        let named: BTreeMap<u64, String> = all.iter().map(|s| (s.addr, s.name.clone())).collect();
        assert_eq!(named, objdump_plt(&object), "{flags:?}");
        // strncpy, puts, strlen, atoi, and the C runtime's own: each
        // entry whole.
        assert!(all.len() >= 4, "{flags:?}: {all:?}");
        for stub in &all {
            assert_eq!(stub.len, 24, "{flags:?}: {stub:?}");
            // The branch, the entry's fifth instruction, is its own.
            assert_eq!(
                jitmap::unwind::plt_stub_at(&all, stub.addr + 16),
                Some(stub),
                "{flags:?}"
            );
        }
    }
}
