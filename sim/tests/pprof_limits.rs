//! The pprof endpoint in a process with no file descriptor left. Its own
//! test binary: it lowers the process's `RLIMIT_NOFILE` and fills it.
//!
//! On the old server, `accept` failing with EMFILE returned at once, the
//! connection stayed in the backlog, and `poll` woke again at once: the
//! serving thread spun (1.8 to 3.0 s of CPU in 3 idle seconds), and the
//! client waited for ever. This test then failed at its read cap with no
//! answer.

use std::fs::File;
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::FromRawFd;
use std::time::Duration;

use jitmap::ExecutionManager;
use jitmap::agent::{Agent, AgentConfig, Clock, Unwind};

/// The `stat` file of this process's thread named `name`, opened while
/// descriptors are left, to be read again with [`ticks`].
/// The thread names itself once it runs: this waits for that, a minute at
/// most.
fn thread_stat(name: &str) -> File {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        for task in std::fs::read_dir("/proc/self/task").unwrap() {
            let path = task.unwrap().path();
            let Ok(comm) = std::fs::read_to_string(path.join("comm")) else {
                continue;
            };
            if comm.trim_end() == name {
                return File::open(path.join("stat")).unwrap();
            }
        }
        std::thread::yield_now();
    }
    panic!("no thread named {name}");
}

/// A thread's CPU time (user + system, in clock ticks) from its `stat`.
fn ticks(stat: &File) -> u64 {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 1024];
    let n = stat.read_at(&mut buf, 0).unwrap();
    let stat = String::from_utf8_lossy(&buf[..n]);
    // Fields after the command's closing parenthesis: state is field 3,
    // utime 14 and stime 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[test]
fn with_no_descriptor_left_a_waiting_connection_is_shed_not_spun_on() {
    let manager = ExecutionManager::new(4);
    let config = AgentConfig {
        clock: Clock::Wall,
        unwind: Unwind::FramePointer,
        ..AgentConfig::default()
    };
    let agent = Agent::start(&manager, config).unwrap();
    let address: SocketAddr = agent.serve("127.0.0.1:0".parse().unwrap()).unwrap();
    let stat = thread_stat("jitmap-pprof");

    // The client's socket, made while descriptors are left; connected once
    // none are.
    // SAFETY: plain socket(2); the result is checked.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor, owned from here on.
    let client = unsafe { TcpStream::from_raw_fd(fd) };
    client
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();

    // Fill the descriptor table: a soft limit just above what is open, then
    // /dev/null until EMFILE.
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out pointer.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
        0
    );
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    let lowered = libc::rlimit {
        rlim_cur: (open + 64).min(limit.rlim_max),
        rlim_max: limit.rlim_max,
    };
    // SAFETY: a valid limit, no higher than the hard one.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lowered) }, 0);
    let mut held = Vec::new();
    let full = loop {
        match File::open("/dev/null") {
            Ok(f) => held.push(f),
            Err(e) => break e,
        }
    };
    assert_eq!(full.raw_os_error(), Some(libc::EMFILE));

    let before = ticks(&stat);
    let (ip, port) = match address {
        SocketAddr::V4(a) => (u32::from(*a.ip()), a.port()),
        SocketAddr::V6(_) => unreachable!("bound to 127.0.0.1"),
    };
    let to = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr { s_addr: ip.to_be() },
        sin_zero: [0; 8],
    };
    // SAFETY: a valid IPv4 address of its own size, on the socket above.
    let connected = unsafe {
        libc::connect(
            fd,
            (&to as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    assert_eq!(connected, 0);

    // The answer: 503, then the close.
    let mut answer = Vec::new();
    (&client).read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{answer}"
    );
    assert!(
        answer.ends_with("the server has no file descriptor left\n"),
        "{answer}"
    );
    assert_eq!(agent.connections_shed(), 1);

    // Nothing is left to wake the serving thread: over the next second it
    // uses under a tenth of a core (clock ticks are 10 ms; the old server
    // used every tick it was given).
    std::thread::sleep(Duration::from_secs(1));
    let used = ticks(&stat) - before;
    // SAFETY: sysconf has no preconditions.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    assert!(
        used * 10 < ticks_per_second + 10,
        "the serving thread used {used} ticks (of {ticks_per_second} a second)"
    );

    drop(held);
    // SAFETY: the limit read above.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    drop(agent.stop());
}
