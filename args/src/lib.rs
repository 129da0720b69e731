//! The command-line conventions that `jitmap` and `jitmap-sim` share: option
//! types that validate themselves while clap parses them, output paths that
//! are checked before any work starts, and exit codes that mean one thing in
//! every subcommand.
//!
//! | exit | meaning |
//! | --- | --- |
//! | 0 | the command ran and every check passed |
//! | 1 | a wrong answer or a failed check (the run itself completed) |
//! | 2 | bad input, or a file, process or privilege that could not be used |
//!
//! ```
//! use clap::Parser;
//! use jitmap_args::{Hz, Seconds, Threads};
//!
//! #[derive(Parser)]
//! struct Options {
//!     #[arg(long, default_value = "5")]
//!     seconds: Seconds,
//!     #[arg(long, default_value = "1000")]
//!     hz: Hz,
//!     #[arg(long, default_value = "2")]
//!     threads: Threads,
//! }
//!
//! let o = Options::try_parse_from(["tool", "--seconds", "2.5"]).unwrap();
//! assert_eq!(o.seconds.duration().as_millis(), 2500);
//! // Clap turns a refused value into exit status 2, naming the option.
//! let e = Options::try_parse_from(["tool", "--seconds", "inf"]).err().unwrap();
//! assert_eq!(e.exit_code(), 2);
//! assert!(e.to_string().contains("--seconds"));
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

/// What a subcommand's run ended in, when it ran to the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every answer right, every check passed: exit status 0.
    Passed,
    /// A wrong answer or a failed check: exit status 1.
    Failed,
    /// The output was written, but a part the target holds could not be
    /// read by design (a runtime version whose layout is unknown): exit
    /// status 3.
    Partial,
}

impl Outcome {
    /// `Passed` when `ok`, else `Failed`.
    pub fn from_ok(ok: bool) -> Self {
        if ok { Self::Passed } else { Self::Failed }
    }
}

impl From<Outcome> for ExitCode {
    fn from(o: Outcome) -> Self {
        match o {
            Outcome::Passed => ExitCode::SUCCESS,
            Outcome::Failed => ExitCode::FAILURE,
            Outcome::Partial => ExitCode::from(3),
        }
    }
}

/// Why a subcommand stopped before the end. Its message names the option,
/// file or process at fault.
#[derive(Debug)]
pub enum CliError {
    /// An option, argument or combination that cannot be used: exit 2.
    Input(String),
    /// A file or directory that could not be read or written; the error names
    /// its path (see [`fs_err`]): exit 2.
    Io(std::io::Error),
    /// The run could not go on because the code under test refused (a heap
    /// or the agent returned an error mid-run): a failed check, exit 1.
    Failed(String),
}

impl CliError {
    /// A bad input, from anything that displays.
    pub fn input(what: impl fmt::Display) -> Self {
        Self::Input(what.to_string())
    }

    /// A run that could not go on, from anything that displays.
    pub fn failed(what: impl fmt::Display) -> Self {
        Self::Failed(what.to_string())
    }

    /// The exit status: 1 for [`CliError::Failed`], else 2.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Failed(_) => 1,
            Self::Input(_) | Self::Io(_) => 2,
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Input(what) | Self::Failed(what) => f.write_str(what),
            Self::Io(e) => write!(f, "{e}"),
        }
    }
}

/// `Io` shows the I/O error's message, so its source is that error's own.
impl std::error::Error for CliError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Input(_) | Self::Failed(_) => None,
            Self::Io(e) => e.source(),
        }
    }
}

impl From<std::io::Error> for CliError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

/// What a subcommand returns.
pub type CliResult = Result<Outcome, CliError>;

/// Ends `program sub`: prints a [`CliError`] with both names on stderr and
/// maps the result to its exit status.
pub fn finish(program: &str, sub: &str, result: CliResult) -> ExitCode {
    match result {
        Ok(outcome) => outcome.into(),
        Err(e) => {
            eprintln!("{program} {sub}: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// The longest run any subcommand accepts, in seconds.
pub const MAX_SECONDS: f64 = 3600.0;

/// A run's length: a finite number of seconds in (0, [`MAX_SECONDS`]].
/// `0`, negatives, `nan`, `inf` and `1e300` are refused while parsing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Seconds(f64);

impl Seconds {
    /// `seconds`, if it is in range.
    pub fn new(seconds: f64) -> Result<Self, String> {
        if seconds.is_finite() && seconds > 0.0 && seconds <= MAX_SECONDS {
            Ok(Self(seconds))
        } else {
            Err(format!(
                "must be a number of seconds in (0, {MAX_SECONDS}], not {seconds}"
            ))
        }
    }

    /// The length as a `Duration`.
    pub fn duration(self) -> Duration {
        Duration::from_secs_f64(self.0)
    }

    /// The length in seconds.
    pub fn get(self) -> f64 {
        self.0
    }
}

impl FromStr for Seconds {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let value: f64 = s
            .trim()
            .parse()
            .map_err(|_| format!("must be a number of seconds, not `{s}`"))?;
        Self::new(value)
    }
}

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The highest sampling rate either tool takes: the eBPF profiler's, whose
/// perf events cost the sampled thread no signal. The in-process agent
/// samples at most [`jitmap::agent::MAX_HZ`]; [`Hz::for_agent`] holds a
/// faster rate to it.
pub const MAX_HZ: u32 = 100_000;

/// A sampling rate: 1 to [`MAX_HZ`] samples per second.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hz(u32);

impl Hz {
    /// The rate.
    pub fn get(self) -> u32 {
        self.0
    }

    /// The rate the in-process agent runs at: this one, or the agent's
    /// ceiling ([`jitmap::agent::MAX_HZ`], a period of at least
    /// [`jitmap::agent::MIN_PERIOD`]) with a notice that says so.
    ///
    /// ```
    /// use jitmap_args::Hz;
    /// let fast: Hz = "100000".parse().unwrap();
    /// let (hz, notice) = fast.for_agent();
    /// assert_eq!(hz, jitmap::agent::MAX_HZ);
    /// assert!(notice.unwrap().starts_with("--hz 100000 is over the agent's 10000 Hz"));
    /// assert_eq!("250".parse::<Hz>().unwrap().for_agent(), (250, None));
    /// ```
    pub fn for_agent(self) -> (u32, Option<String>) {
        let max = jitmap::agent::MAX_HZ;
        if self.0 <= max {
            return (self.0, None);
        }
        let notice = format!(
            "--hz {} is over the agent's {max} Hz (a timer period under {} µs keeps a thread in \
             its signal handler): sampling at {max} Hz",
            self.0,
            jitmap::agent::MIN_PERIOD.as_micros()
        );
        (max, Some(notice))
    }
}

impl FromStr for Hz {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let max = MAX_HZ;
        match s.trim().parse::<u32>() {
            Ok(hz) if (1..=max).contains(&hz) => Ok(Self(hz)),
            _ => Err(format!(
                "must be a whole number of samples per second in 1..={max}, not `{s}`"
            )),
        }
    }
}

/// The most threads a subcommand starts of one kind.
pub const MAX_THREADS: usize = 64;

/// A thread count: 1 to [`MAX_THREADS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Threads(usize);

impl Threads {
    /// The count.
    pub fn get(self) -> usize {
        self.0
    }
}

impl FromStr for Threads {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_THREADS).contains(&n) => Ok(Self(n)),
            _ => Err(format!(
                "must be a whole number of threads in 1..={MAX_THREADS}, not `{s}`"
            )),
        }
    }
}

/// A directory for a command's outputs. Its path is reachable only through
/// [`OutDir::prepare`], which creates the directory and proves it writable,
/// so a command cannot start its work before the check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutDir(PathBuf);

impl OutDir {
    /// Creates the directory (and its parents) and writes and removes a
    /// probe file in it; the error names the path.
    pub fn prepare(&self) -> Result<&Path, CliError> {
        if self.0.exists() && !self.0.is_dir() {
            return Err(CliError::Input(format!(
                "{} is a file, not a directory: --out names the directory the outputs go to",
                self.0.display()
            )));
        }
        fs_err::create_dir_all(&self.0)?;
        let probe = self.0.join(format!(".jitmap-probe-{}", std::process::id()));
        fs_err::write(&probe, b"")?;
        fs_err::remove_file(&probe)?;
        Ok(&self.0)
    }
}

impl FromStr for OutDir {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        non_empty_path(s, "directory").map(Self)
    }
}

/// `s` as a path, unless it is empty.
fn non_empty_path(s: &str, what: &str) -> Result<PathBuf, String> {
    if s.is_empty() {
        Err(format!("must be a {what} path, not empty"))
    } else {
        Ok(PathBuf::from(s))
    }
}

/// A file a command writes at its end. Its path is reachable only through
/// [`OutFile::prepare`], which creates (or truncates) it first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutFile(PathBuf);

impl OutFile {
    /// Creates the file, so that a path that cannot be written is refused
    /// before the work; the error names the path.
    pub fn prepare(&self) -> Result<&Path, CliError> {
        fs_err::File::create(&self.0)?;
        Ok(&self.0)
    }
}

impl FromStr for OutFile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        non_empty_path(s, "file").map(Self)
    }
}

/// Reads a whole input file, or standard input for `-`; the error names the
/// file.
pub fn read_input(file: &str) -> Result<String, CliError> {
    if file == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
            .map_err(|e| CliError::Input(format!("standard input: {e}")))?;
        Ok(s)
    } else {
        Ok(fs_err::read_to_string(file)?)
    }
}

/// Writes `text` to standard output; a failed write (a closed pipe, a full
/// disk) is an I/O error that names standard output.
pub fn emit(text: &str) -> Result<(), CliError> {
    std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes()).map_err(|e| {
        CliError::Io(std::io::Error::new(
            e.kind(),
            format!("standard output: {e}"),
        ))
    })
}

/// The share of samples a run may drop before it says so on stderr: 1%.
pub const DROPPED_WARNING_SHARE: f64 = 0.01;

/// A warning for stderr when more than [`DROPPED_WARNING_SHARE`] of the
/// timer interrupts taken (the agent's signals, the eBPF profiler's perf
/// events) lost their samples; `None` otherwise.
///
/// ```
/// use jitmap_args::dropped_warning;
/// assert_eq!(dropped_warning(1000, 10), None);
/// let w = dropped_warning(46_672, 33_872).unwrap();
/// assert!(w.starts_with("warning: 33872 of 46672 timer interrupts (72.6%) lost their samples"));
/// ```
pub fn dropped_warning(taken: u64, dropped: u64) -> Option<String> {
    if taken == 0 || (dropped as f64) <= DROPPED_WARNING_SHARE * taken as f64 {
        return None;
    }
    Some(format!(
        "warning: {dropped} of {taken} timer interrupts ({:.1}%) lost their samples, more than {}%: \
         the profile under-counts; lower --hz or give the machine fewer threads",
        dropped as f64 * 100.0 / taken as f64,
        DROPPED_WARNING_SHARE * 100.0
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_refuses_what_no_run_can_take() {
        for bad in ["0", "-2", "nan", "inf", "-inf", "1e300", "3600.5", "x", ""] {
            let e = bad.parse::<Seconds>().unwrap_err();
            assert!(e.starts_with("must be a number of seconds"), "{bad}: {e}");
        }
        assert_eq!(
            "0.25".parse::<Seconds>().unwrap().duration().as_millis(),
            250
        );
        assert_eq!("3600".parse::<Seconds>().unwrap().get(), 3600.0);
    }

    #[test]
    fn hz_and_threads_keep_to_their_bounds() {
        assert_eq!("1".parse::<Hz>().unwrap().get(), 1);
        assert_eq!("100000".parse::<Hz>().unwrap().get(), 100_000);
        for bad in ["0", "100001", "-1", "1.5", "many"] {
            assert!(bad.parse::<Hz>().is_err(), "{bad}");
        }
        assert_eq!("64".parse::<Threads>().unwrap().get(), 64);
        for bad in ["0", "65", "100000", "-1"] {
            assert!(bad.parse::<Threads>().is_err(), "{bad}");
        }
    }

    #[test]
    fn an_output_path_that_cannot_be_made_is_refused_by_name() {
        let e = "/proc/nope/out"
            .parse::<OutDir>()
            .unwrap()
            .prepare()
            .unwrap_err();
        assert!(e.to_string().contains("/proc/nope/out"), "{e}");
        let e = "/proc/nope.svg"
            .parse::<OutFile>()
            .unwrap()
            .prepare()
            .unwrap_err();
        assert!(e.to_string().contains("/proc/nope.svg"), "{e}");
        let dir = std::env::temp_dir().join(format!("jitmap-args-{}", std::process::id()));
        let out: OutDir = dir.to_str().unwrap().parse().unwrap();
        assert_eq!(out.prepare().unwrap(), dir);
        assert_eq!(fs_err::read_dir(&dir).unwrap().count(), 0);
        fs_err::remove_dir(&dir).unwrap();
    }

    #[test]
    fn a_missing_input_is_named() {
        let e = read_input("/nonexistent/script").unwrap_err();
        assert!(e.to_string().contains("/nonexistent/script"), "{e}");
    }

    #[test]
    fn drops_warn_above_one_percent() {
        assert_eq!(dropped_warning(0, 0), None);
        assert_eq!(dropped_warning(100, 1), None);
        assert!(
            dropped_warning(100, 2)
                .unwrap()
                .contains("2 of 100 timer interrupts (2.0%)")
        );
    }
}
