//! A host's SIGPROF handler, installed before the agent, that never returns
//! to its caller: it `siglongjmp`s out (the usual timeout idiom). The agent
//! passes the host's own signals on to it; detaching the thread and stopping
//! the agent must still return, since neither may wait for a handler that
//! left through a jump.
//!
//! On the old handler (the in-flight count raised around the host's handler,
//! lowered only after it returned) the first escape left the count at 1 for
//! ever, and `drop(attached)` spun in `wait_for_handlers`: this test's
//! watchdog failed it after its cap.

use std::sync::mpsc;
use std::time::Duration;

use jitmap::ExecutionManager;
use jitmap::agent::{Agent, AgentConfig, Clock};
use jitmap_testkit::e2e::temp_dir;
use jitmap_testkit::frameless::{build_shared_object, load};

/// The host: a SIGPROF handler that jumps back to `escape`'s `sigsetjmp`.
const HOST_C: &str = r#"
#include <setjmp.h>
#include <signal.h>
#include <string.h>

static sigjmp_buf target;

static void on_prof(int sig) {
    (void)sig;
    siglongjmp(target, 1);
}

int escape_install(void) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_prof;
    sigemptyset(&action.sa_mask);
    return sigaction(SIGPROF, &action, 0);
}

/* Raises SIGPROF at this thread; 1 when the handler jumped out of it. */
int escape(void) {
    if (sigsetjmp(target, 1) == 0) {
        raise(SIGPROF);
        return 0;
    }
    return 1;
}
"#;

#[test]
fn a_host_handler_that_jumps_out_does_not_hang_detach_or_stop() {
    let dir = temp_dir("chained-escape");
    let object = build_shared_object(&dir, "escape", HOST_C).unwrap();
    let (_handle, install) = load(&object, c"escape_install").unwrap();
    let (_handle, escape) = load(&object, c"escape").unwrap();
    type CFn = extern "C" fn() -> i32;
    // SAFETY: both symbols are the C functions above, `int f(void)`.
    let (install, escape) = unsafe {
        (
            std::mem::transmute::<usize, CFn>(install),
            std::mem::transmute::<usize, CFn>(escape),
        )
    };
    assert_eq!(install(), 0);

    let manager = ExecutionManager::new(4);
    // One timer signal a second: the raises below are the only SIGPROFs
    // while they run. A timer's signal pending beside a raise's could
    // merge with it (one pending slot per standard signal; qemu-user's
    // emulation merged them, one raise in 100), and the merged signal is
    // the agent's own, not passed on.
    let config = AgentConfig {
        clock: Clock::Wall,
        hz: 1,
        ..AgentConfig::default()
    };
    let agent = Agent::start(&manager, config).unwrap();
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let attached = agent.attach_current_thread().unwrap();
        // Each raise reaches the agent's handler first (not its timer's
        // signal: passed on), then the host's, which jumps out.
        let escaped: i32 = (0..100).map(|_| escape()).sum();
        drop(attached);
        drop(agent.stop());
        done.send(escaped).unwrap();
    });
    // A generous cap: detach and stop take milliseconds; on the old code
    // they never return.
    let escaped = finished
        .recv_timeout(Duration::from_secs(120))
        .expect("detach or stop hung after a host handler jumped out");
    assert_eq!(escaped, 100, "every raise reached the host's handler");
}
