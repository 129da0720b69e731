//! Registering modules and components: names, refusals, and unloading.

use std::sync::Arc;

use jitmap::events::{CodeEvent, CodeListener};
use jitmap::{ExecutionManager, Lookup};
use jitmap_wasmtime::{RegisterError, register, register_component};
use parking_lot::Mutex;
use wasmtime::component::Component;
use wasmtime::{Config, Engine, Module};

/// An unnamed module with one named and one unnamed function (a name
/// section names only what has a `$name`).
const TWO: &str = r#"(module
  (func $named (result i32) i32.const 1)
  (func (result i32) i32.const 2)
  (export "a" (func 0)) (export "b" (func 1)))"#;

#[test]
fn every_byte_of_the_text_is_named_and_lookups_find_the_functions() {
    let manager = ExecutionManager::new(4);
    let module = Module::new(&Engine::default(), TWO).unwrap();
    let r = register(&manager, &module).unwrap();
    let text = module.text();
    assert_eq!((r.base(), r.size()), (text.as_ptr() as usize, text.len()));
    let base = r.base();
    for f in module.functions() {
        let name = match f.index.as_u32() {
            0 => "wasm::named".to_owned(),
            n => format!("wasm::wasm-function[{n}]"),
        };
        for at in [f.offset, f.offset + f.len - 1] {
            assert_eq!(r.name_at(base + at), Some(name.as_str()));
        }
        // The manager's lookup finds the method and its offset.
        let reader = manager.register_reader().unwrap();
        let guard = manager.pin(&reader).unwrap();
        let Lookup::Method(block) = guard.classify(base + f.offset + 1) else {
            panic!("no method at {:#x}", base + f.offset + 1);
        };
        assert_eq!(block.offset(), 1);
        let id = block.method_id();
        drop(guard);
        let method = r.methods().find(|m| m.method_id == id).unwrap();
        assert_eq!(method.name, name);
    }
    // Whatever lies between and around the functions is the trampolines'.
    let mut covered = vec![false; text.len()];
    for f in module.functions() {
        covered[f.offset..f.offset + f.len].fill(true);
    }
    let gaps: Vec<usize> = (0..text.len()).filter(|&i| !covered[i]).collect();
    assert!(!gaps.is_empty());
    for i in gaps {
        assert_eq!(r.name_at(base + i), Some("wasm::[trampolines]"));
    }
    assert_eq!(r.name_at(base + text.len()), None);
    assert_eq!(r.name_at(base - 1), None);
}

#[test]
fn registering_one_module_twice_is_refused_and_changes_nothing() {
    let manager = ExecutionManager::new(4);
    let module = Module::new(&Engine::default(), TWO).unwrap();
    let first = register(&manager, &module).unwrap();
    let base = first.base();
    assert_eq!(
        register(&manager, &module).unwrap_err(),
        RegisterError::AlreadyRegistered { base }
    );
    // A clone shares the code: the same refusal.
    assert_eq!(
        register(&manager, &module.clone()).unwrap_err(),
        RegisterError::AlreadyRegistered { base }
    );
    assert_eq!(manager.images().len(), 1);
    assert_eq!(manager.images()[0].base(), base);
    drop(first);
    assert!(manager.images().is_empty());
    // Once unregistered, it registers again.
    let again = register(&manager, &module).unwrap();
    assert_eq!(again.base(), base);
}

#[test]
fn a_module_without_code_is_refused() {
    let manager = ExecutionManager::new(4);
    let empty = Module::new(&Engine::default(), "(module)").unwrap();
    assert_eq!(empty.text().len(), 0);
    assert_eq!(
        register(&manager, &empty).unwrap_err(),
        RegisterError::NoCode
    );
    assert!(manager.images().is_empty());
}

/// The image events a listener saw.
#[derive(Default)]
struct Seen(Mutex<Vec<(char, usize)>>);

impl CodeListener for Seen {
    fn on_event(&self, event: &CodeEvent) {
        match event {
            CodeEvent::ImageLoad(l) => self.0.lock().push(('L', l.image.base())),
            CodeEvent::ImageUnload(u) => self.0.lock().push(('U', u.base)),
            _ => {}
        }
    }
}

#[test]
fn a_registration_dropped_after_its_managers_handle_still_unloads() {
    let manager = ExecutionManager::new(4);
    let seen = Arc::new(Seen::default());
    manager
        .listeners()
        .add(Arc::clone(&seen) as Arc<dyn CodeListener>)
        .unwrap();
    let listeners = Arc::clone(manager.listeners());
    let module = Module::new(&Engine::default(), TWO).unwrap();
    let r = register(&manager, &module).unwrap();
    let base = r.base();
    drop(manager);
    // The registration keeps what it needs: it still answers, then unloads.
    assert_eq!(
        r.name_at(base + module.functions().next().unwrap().offset),
        Some("wasm::named")
    );
    drop(r);
    listeners.flush();
    assert_eq!(*seen.0.lock(), [('L', base), ('U', base)]);
}

#[test]
fn a_components_core_functions_are_named_under_the_given_name() {
    let engine = Engine::new(Config::new().wasm_component_model(true)).unwrap();
    let component = Component::new(
        &engine,
        r#"(component
  (core module
    (func $first (result i32) i32.const 1)
    (func (result i32) i32.const 2)
    (export "a" (func 0)) (export "b" (func 1))))"#,
    )
    .unwrap();
    let manager = ExecutionManager::new(4);
    let r = register_component(&manager, &component, "plugin").unwrap();
    let mut names: Vec<&str> = r
        .methods()
        .map(|m| m.name.as_str())
        .filter(|n| !n.ends_with("[trampolines]"))
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["plugin::first", "plugin::module[0]::wasm-function[1]"]
    );
    assert_eq!(
        register_component(&manager, &component, "again").unwrap_err(),
        RegisterError::AlreadyRegistered { base: r.base() }
    );
}
