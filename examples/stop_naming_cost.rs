//! What `Agent::stop` spends naming a profile's native frames, for agents
//! started one after another in one process: the first reads the debug
//! info of every loaded object; later ones, with no object loaded or
//! unloaded in between, reuse what it read.
//!
//! ```text
//! cargo run --release --example stop_naming_cost
//! ```

use jitmap::ExecutionManager;
use jitmap::agent::{Agent, AgentConfig, AgentError};

fn main() -> Result<(), AgentError> {
    let manager = ExecutionManager::new(4);
    for round in 1..=4 {
        let agent = Agent::start(&manager, AgentConfig::default())?;
        let attached = agent.attach_current_thread()?;
        for _ in 0..50 {
            attached.sample_now();
        }
        drop(attached);
        let profile = agent.stop();
        println!(
            "agent {round}: {} samples, stop named them in {:.2} ms of CPU",
            profile.samples,
            profile.naming_cpu.as_secs_f64() * 1e3
        );
    }
    Ok(())
}
