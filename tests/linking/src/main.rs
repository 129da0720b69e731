//! A minimal jitmap host: a manager, a heap, one published method, a lookup
//! and the agent, so that every part that could export a symbol is linked in.

use std::sync::Arc;

use jitmap::agent::{Agent, AgentConfig};
use jitmap::{CodeInfo, ExecutionManager, HeapConfig, JitKind};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manager = ExecutionManager::new(4);
    let config = HeapConfig {
        span: 1 << 20,
        gdb_jit: true,
        ..HeapConfig::default()
    };
    // Without the `gdb-jit` feature a heap that asks for it is refused.
    let gdb = match manager.create_heap(config) {
        Ok(_) => "gdb-jit".to_owned(),
        Err(e) => format!("{e:?}"),
    };
    let heap = manager.create_heap(HeapConfig {
        gdb_jit: cfg!(feature = "gdb-jit"),
        ..config
    })?;
    let mut r = heap.reserve(1)?;
    r.code_mut()[0] = 0xC3;
    let code = r.publish(CodeInfo::new(1, "ret", JitKind::Optimized))?;
    let reader = manager.register_reader()?;
    let guard = manager.pin(&reader)?;
    let found = guard.find(code.start()).map(|b| b.method_id());
    drop(guard);
    let agent = Agent::start(&manager, AgentConfig::default())?;
    let probe = jitmap::agent::jitmap_probe_enter as *const () as usize;
    agent.stop();
    println!("{gdb} {found:?} {probe:#x}");
    Ok(())
}
