//! The agent's cost per sample in wasmtime guest code against heap code at
//! the same depth: the handler's walk time (a sample's `end_ns - begin_ns`)
//! for samples whose leaf is a leaf of the 1:2:4 guest (image methods, found
//! by a binary search of the image's functions) and of jitmap's 1:2:4 demo
//! (heap methods, found by the nibble maps), four frames each (leaf, middle,
//! top, and the trampolines or the native caller). One process, one agent,
//! the two demos in alternating rounds; the medians and their ratio per
//! round, then the median of the ratios.
//!
//! `cargo bench -p jitmap-wasmtime --bench agent_cost`

use std::time::{Duration, Instant};

use jitmap::ExecutionManager;
use jitmap::agent::{Agent, AgentConfig, Clock, SampleFrame};
use jitmap::events::monotonic_ns;
use jitmap_demo::demo::{DemoBackend, PublishedDemo};
use jitmap_demo::output::BASE_ITERATIONS;
use jitmap_wasmtime::demo::{Guest, ROUNDS, engine};

const ROUND: Duration = Duration::from_secs(2);
const ROUNDS_EACH: usize = 5;

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `cargo bench` passes `--bench`; nothing else is taken.
    let manager = ExecutionManager::new(4);
    let heap_demo = PublishedDemo::publish(&manager, DemoBackend::Iced)?;
    let mut guest = Guest::new(&engine(false)?)?;
    let registration = jitmap_wasmtime::register(&manager, &guest.module)?;
    let guest_leaves: Vec<u64> = registration
        .methods()
        .filter(|m| m.name.contains("::leaf_"))
        .map(|m| m.method_id)
        .collect();
    let agent = Agent::start(
        &manager,
        AgentConfig {
            hz: 2000,
            clock: Clock::Wall,
            keep_samples: true,
            max_depth: 4,
            ..AgentConfig::default()
        },
    )?;
    let attached = agent.attach_current_thread()?;
    // (guest?, round, from, to)
    let mut spans = Vec::new();
    for round in 0..ROUNDS_EACH {
        for in_guest in [false, true] {
            let (from, began) = (monotonic_ns(), Instant::now());
            while began.elapsed() < ROUND {
                if in_guest {
                    std::hint::black_box(guest.call(ROUNDS)?);
                } else {
                    std::hint::black_box(heap_demo.run(1, BASE_ITERATIONS));
                }
            }
            spans.push((in_guest, round, from, monotonic_ns()));
        }
    }
    drop(attached);
    let profile = agent.stop();
    let heap_leaf = |m: usize| profile.methods[m].name.starts_with("leaf_");
    let mut walks = vec![[Vec::new(), Vec::new()]; ROUNDS_EACH];
    for s in &profile.kept_samples {
        let Some(&(in_guest, round, _, _)) = spans
            .iter()
            .find(|(_, _, from, to)| (*from..=*to).contains(&s.begin_ns))
        else {
            continue;
        };
        let leaf = match s.frames.first() {
            Some(SampleFrame::Image { method_id, .. }) => {
                in_guest && guest_leaves.contains(method_id)
            }
            Some(SampleFrame::Jit { method, .. }) => !in_guest && heap_leaf(*method),
            _ => false,
        };
        if leaf && s.frames.len() == 4 {
            walks[round][usize::from(in_guest)].push(s.end_ns - s.begin_ns);
        }
    }
    println!("round  heap samples  heap median ns  guest samples  guest median ns  guest/heap");
    let mut ratios = Vec::new();
    for (round, [heap, guest]) in walks.into_iter().enumerate() {
        let (nh, ng) = (heap.len(), guest.len());
        let (mh, mg) = (median(heap), median(guest));
        let ratio = mg as f64 / mh.max(1) as f64;
        ratios.push(ratio);
        println!("{round:>5}  {nh:>12}  {mh:>14}  {ng:>13}  {mg:>15}  {ratio:>10.3}");
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "median of the rounds' ratios (guest/heap per sample, 4 frames): {:.3}",
        ratios[ratios.len() / 2]
    );
    drop(registration);
    Ok(())
}
