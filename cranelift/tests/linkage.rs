//! Programs declared the way a language front end declares them (translate a
//! body, declaring what it calls as it goes, then declare the function
//! itself, then define it), run on cranelift-jit and on `JitmapModule` side
//! by side: every linkage a declaration can be upgraded through, and the
//! shapes that need it (self and mutual recursion, the address of a function
//! declared later, data that points at one).

mod programs;

use cranelift_codegen::ir::{InstBuilder, MemFlagsData, types::I64};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{DataDescription, FuncId, Linkage, Module, default_libcall_names};
use jitmap::ExecutionManager;
use jitmap_cranelift::{JitmapBuilder, JitmapModule};
use programs::{body, f1, sig};

/// The host's own `f`, which an import of `f` resolves to.
extern "C" fn host_f(x: i64) -> i64 {
    x + 100
}

/// What the tests need of a module beyond the `Module` trait, for both
/// implementations.
trait Host: Module {
    fn finalize(&mut self) -> Result<(), String>;
    fn address(&self, func: FuncId) -> *const u8;
}

impl Host for JITModule {
    fn finalize(&mut self) -> Result<(), String> {
        self.finalize_definitions().map_err(|e| e.to_string())
    }
    fn address(&self, func: FuncId) -> *const u8 {
        self.get_finalized_function(func)
    }
}

impl Host for JitmapModule {
    fn finalize(&mut self) -> Result<(), String> {
        self.finalize_definitions().map_err(|e| e.to_string())
    }
    fn address(&self, func: FuncId) -> *const u8 {
        self.get_finalized_function(func)
    }
}

fn jit() -> JITModule {
    let mut builder = JITBuilder::new(default_libcall_names()).unwrap();
    builder.symbol("f", host_f as *const u8);
    JITModule::new(builder)
}

fn jitmap_module(manager: &ExecutionManager) -> JitmapModule {
    let mut builder = JitmapBuilder::new(manager, default_libcall_names()).unwrap();
    builder.symbol("f", host_f as *const u8);
    JitmapModule::new(builder).unwrap()
}

const LINKAGES: [Linkage; 5] = [
    Linkage::Import,
    Linkage::Local,
    Linkage::Preemptible,
    Linkage::Hidden,
    Linkage::Export,
];

/// What one declaration sequence did: the second declaration's merged
/// linkage, the definition's outcome, the finalize's, and what `g` (which
/// calls `f`) and `f` return for 1 through the module's own addresses.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    merged: Linkage,
    defined: Result<(), String>,
    finalized: Result<(), String>,
    g_of_1: Option<i64>,
    f_of_1: Option<i64>,
}

/// `f` declared as `first`, `g` (which calls `f`) translated against that
/// declaration, `f` declared again as `second`, then `f` defined if its
/// merged linkage is definable (its body returns x + 7), `g` defined, and
/// both called.
fn upgrade<M: Host>(module: &mut M, first: Linkage, second: Linkage) -> Outcome {
    let f = module
        .declare_function("f", first, &sig(module, 1))
        .unwrap();
    let mut g_body = body(module, 1, |module, b, args| {
        let callee = module.declare_func_in_func(f, b.func);
        let c = b.ins().call(callee, &[args[0]]);
        let r = b.inst_results(c)[0];
        let r = b.ins().iadd_imm_s(r, 1);
        b.ins().return_(&[r]);
    });
    let again = module
        .declare_function("f", second, &sig(module, 1))
        .unwrap();
    assert_eq!(again, f);
    let merged = module.declarations().get_function_decl(f).linkage;
    let mut f_body = body(module, 1, |_, b, args| {
        let r = b.ins().iadd_imm_s(args[0], 7);
        b.ins().return_(&[r]);
    });
    let defined = module
        .define_function(f, &mut f_body)
        .map_err(|e| e.to_string());
    let g = module
        .declare_function("g", Linkage::Export, &sig(module, 1))
        .unwrap();
    module.define_function(g, &mut g_body).unwrap();
    let finalized = module.finalize();
    // cranelift-jit has no address for an import it did not define.
    let definable = merged.is_definable();
    let call = |func, called: bool| {
        (finalized.is_ok() && called).then(|| {
            // SAFETY: `f` and `g` take and return one i64.
            let f = unsafe { f1(module.address(func)) };
            f(1)
        })
    };
    Outcome {
        merged,
        defined,
        f_of_1: call(f, definable),
        g_of_1: call(g, true),
        finalized,
    }
}

#[test]
fn every_linkage_upgrade_behaves_as_on_cranelift_jit() {
    let mut callable = 0;
    for first in LINKAGES {
        for second in LINKAGES {
            let expected = upgrade(&mut jit(), first, second);
            let manager = ExecutionManager::new(2);
            let got = upgrade(&mut jitmap_module(&manager), first, second);
            assert_eq!(got, expected, "{first:?} then {second:?}");
            // Both right, not only equal: an import reaches the host's `f`,
            // a definition the module's.
            let definable = expected.merged.is_definable();
            let f_of_1 = if definable { 8 } else { 101 };
            assert_eq!(
                got.f_of_1,
                definable.then_some(f_of_1),
                "{first:?} then {second:?}"
            );
            assert_eq!(got.g_of_1, Some(f_of_1 + 1), "{first:?} then {second:?}");
            callable += 1;
        }
    }
    assert_eq!(callable, 25);
}

/// Declares `name` as a language front end does when a body it translates
/// calls a function it has not seen: an import, upgraded later.
fn callee_of<M: Module>(module: &mut M, name: &str) -> FuncId {
    module
        .declarations()
        .get_name(name)
        .and_then(|id| match id {
            cranelift_module::FuncOrDataId::Func(f) => Some(f),
            cranelift_module::FuncOrDataId::Data(_) => None,
        })
        .unwrap_or_else(|| {
            module
                .declare_function(name, Linkage::Import, &sig(module, 1))
                .unwrap()
        })
}

/// Translates `build` (which may declare callees with [`callee_of`]), then
/// declares `name` as an export and defines it: the front end's order.
fn translate_declare_define<M: Module>(
    module: &mut M,
    name: &str,
    build: impl FnOnce(
        &mut M,
        &mut cranelift_frontend::FunctionBuilder<'_>,
        &[cranelift_codegen::ir::Value],
    ),
) -> FuncId {
    let mut ctx = body(module, 1, build);
    let id = module
        .declare_function(name, Linkage::Export, &sig(module, 1))
        .unwrap();
    module.define_function(id, &mut ctx).unwrap();
    id
}

/// `recursive_fib(n)`, translated before it is declared: its call to itself
/// declares its own name as an import first.
fn recursive_fib<M: Host>(module: &mut M) -> Vec<i64> {
    // Translating the body meets the call first: an import of its own name.
    let me = callee_of(module, "recursive_fib");
    let mut ctx = programs::fib_body(module, me);
    let fib = module
        .declare_function("recursive_fib", Linkage::Export, &sig(module, 1))
        .unwrap();
    assert_eq!(fib, me);
    module.define_function(fib, &mut ctx).unwrap();
    module.finalize().unwrap();
    // SAFETY: one i64 in, one out.
    let fib = unsafe { f1(module.address(fib)) };
    (0..20).map(|n| fib(n)).collect()
}

/// `is_even` and `is_odd`, each calling the other, translated in `order`:
/// the first one's call declares the second as an import.
fn mutual<M: Host>(module: &mut M, even_first: bool) -> Vec<i64> {
    // parity(n) = n == 0 ? base : other(n - 1)
    fn parity<M: Module>(module: &mut M, name: &str, other: &str, base: i64) -> FuncId {
        let other = other.to_owned();
        translate_declare_define(module, name, move |module, b, args| {
            let callee = callee_of(module, &other);
            let callee = module.declare_func_in_func(callee, b.func);
            let zero = b.create_block();
            let more = b.create_block();
            b.ins().brif(args[0], more, &[], zero, &[]);
            b.switch_to_block(zero);
            let r = b.ins().iconst(I64, base);
            b.ins().return_(&[r]);
            b.switch_to_block(more);
            let n1 = b.ins().iadd_imm_s(args[0], -1);
            let c = b.ins().call(callee, &[n1]);
            let r = b.inst_results(c)[0];
            b.ins().return_(&[r]);
        })
    }
    let (even, odd) = if even_first {
        let even = parity(module, "is_even", "is_odd", 1);
        (even, parity(module, "is_odd", "is_even", 0))
    } else {
        let odd = parity(module, "is_odd", "is_even", 0);
        (parity(module, "is_even", "is_odd", 1), odd)
    };
    module.finalize().unwrap();
    // SAFETY: one i64 in, one out.
    let (even, odd) = unsafe { (f1(module.address(even)), f1(module.address(odd))) };
    (0..12).flat_map(|n| [even(n), odd(n)]).collect()
}

/// `twice_later(x)` calls `later` through its address, taken while `later`
/// was only an import; `later(x) = 3x` is declared and defined afterwards.
fn address_of_later<M: Host>(module: &mut M) -> Vec<i64> {
    let caller = translate_declare_define(module, "twice_later", |module, b, args| {
        let later = callee_of(module, "later");
        let fref = module.declare_func_in_func(later, b.func);
        let pointer = module.target_config().pointer_type();
        let address = b.ins().func_addr(pointer, fref);
        let signature = b.import_signature(sig(module, 1));
        let c = b.ins().call_indirect(signature, address, &[args[0]]);
        let r = b.inst_results(c)[0];
        let r = b.ins().imul_imm_s(r, 2);
        b.ins().return_(&[r]);
    });
    translate_declare_define(module, "later", |_, b, args| {
        let r = b.ins().imul_imm_s(args[0], 3);
        b.ins().return_(&[r]);
    });
    module.finalize().unwrap();
    // SAFETY: one i64 in, one out.
    let caller = unsafe { f1(module.address(caller)) };
    [-2, 0, 5, 1 << 20].map(|x| caller(x)).to_vec()
}

/// A data object holding the address of `target`, which the data's
/// description declared as an import; `target(x) = x - 11` is declared and
/// defined afterwards, and `via_table(x)` calls it through the data.
fn data_to_later<M: Host>(module: &mut M) -> Vec<i64> {
    let table = module
        .declare_data("table", Linkage::Local, false, false)
        .unwrap();
    let target = callee_of(module, "target");
    let mut description = DataDescription::new();
    description.define_zeroinit(8);
    let fref = module.declare_func_in_data(target, &mut description);
    description.write_function_addr(0, fref);
    module.define_data(table, &description).unwrap();
    translate_declare_define(module, "target", |_, b, args| {
        let r = b.ins().iadd_imm_s(args[0], -11);
        b.ins().return_(&[r]);
    });
    let via = translate_declare_define(module, "via_table", |module, b, args| {
        let gv = module.declare_data_in_func(table, b.func);
        let pointer = module.target_config().pointer_type();
        let at = b.ins().symbol_value(pointer, gv);
        let address = b.ins().load(pointer, MemFlagsData::trusted(), at, 0);
        let signature = b.import_signature(sig(module, 1));
        let c = b.ins().call_indirect(signature, address, &[args[0]]);
        let r = b.inst_results(c)[0];
        b.ins().return_(&[r]);
    });
    module.finalize().unwrap();
    // SAFETY: one i64 in, one out.
    let via = unsafe { f1(module.address(via)) };
    [0, 11, 100].map(|x| via(x)).to_vec()
}

/// Runs `program` on cranelift-jit and on `JitmapModule`, checks they agree
/// and that both equal `expected`.
fn check(
    program: fn(&mut JITModule) -> Vec<i64>,
    on_jitmap: fn(&mut JitmapModule) -> Vec<i64>,
    expected: Vec<i64>,
) {
    let from_jit = program(&mut jit());
    let manager = ExecutionManager::new(2);
    let from_jitmap = on_jitmap(&mut jitmap_module(&manager));
    assert_eq!(from_jitmap, from_jit);
    assert_eq!(from_jitmap, expected);
}

#[test]
fn a_recursive_function_translated_before_it_is_declared_runs() {
    check(
        recursive_fib,
        recursive_fib,
        (0..20).map(programs::fib).collect(),
    );
}

#[test]
fn mutual_recursion_runs_declared_in_either_order() {
    let expected: Vec<i64> = (0..12).flat_map(|n| [1 - n % 2, n % 2]).collect();
    check(|m| mutual(m, true), |m| mutual(m, true), expected.clone());
    check(|m| mutual(m, false), |m| mutual(m, false), expected);
}

#[test]
fn the_address_of_a_function_declared_later_reaches_it() {
    check(
        address_of_later,
        address_of_later,
        [-2i64, 0, 5, 1 << 20].map(|x| 6 * x).to_vec(),
    );
}

#[test]
fn data_pointing_at_a_function_first_declared_as_an_import_reaches_it() {
    check(data_to_later, data_to_later, vec![-11, 0, 89]);
}
