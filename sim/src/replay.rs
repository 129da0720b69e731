//! `replay`: a line-oriented script of nibble-map operations, used to reproduce
//! bugs and fuzz findings. The format is documented in docs/guide/simulator.md.

use std::fmt;
use std::io::{self, Write};

use jitmap::map_words::MmapWords;
use jitmap::{MapError, MapVersion, MapWriter};

/// One script line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// `map v1|v2`: selects the version; must precede `heap`.
    Map(MapVersion),
    /// `heap SIZE`: creates the map over `[0, SIZE)`.
    Heap(u64),
    /// `set START SIZE`.
    Set(u64, u64),
    /// `del START`.
    Del(u64),
    /// `find ADDR`.
    Find(u64),
    /// `dump`: every non-zero word, then `end`.
    Dump,
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Map(v) => write!(f, "map {v}"),
            Self::Heap(size) => write!(f, "heap {size:#x}"),
            Self::Set(start, size) => write!(f, "set {start:#x} {size:#x}"),
            Self::Del(start) => write!(f, "del {start:#x}"),
            Self::Find(addr) => write!(f, "find {addr:#x}"),
            Self::Dump => f.write_str("dump"),
        }
    }
}

/// Why a script line failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplayError {
    /// The first word is not a known command.
    UnknownCommand(String),
    /// Fewer arguments than the command takes.
    MissingArgument,
    /// More arguments than the command takes.
    ExtraArgument,
    /// An argument is not a decimal or `0x` hex number that fits in 64 bits.
    BadNumber(String),
    /// An operation before `heap`.
    NoHeap,
    /// A second `heap`.
    HeapTwice,
    /// `map` after `heap`.
    MapAfterHeap,
    /// The map rejected the operation.
    Map(MapError),
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownCommand(c) => write!(f, "unknown command {c:?}"),
            Self::MissingArgument => f.write_str("missing argument"),
            Self::ExtraArgument => f.write_str("too many arguments"),
            Self::BadNumber(n) => write!(f, "bad number {n:?}"),
            Self::NoHeap => f.write_str("no heap: 'heap SIZE' must come first"),
            Self::HeapTwice => f.write_str("heap already set"),
            Self::MapAfterHeap => f.write_str("'map' must come before 'heap'"),
            Self::Map(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ReplayError {}

/// Parses a decimal or `0x` hexadecimal number.
pub fn parse_number(text: &str) -> Result<u64, ReplayError> {
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.map_err(|_| ReplayError::BadNumber(text.to_owned()))
}

/// Parses one line; `Ok(None)` for a blank line or a `#` comment.
pub fn parse_line(line: &str) -> Result<Option<Command>, ReplayError> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let mut fields = line.split_whitespace();
    let name = fields.next().unwrap_or_default();
    let mut arg = || {
        fields
            .next()
            .ok_or(ReplayError::MissingArgument)
            .and_then(parse_number)
    };
    let command = match name {
        "map" => Command::Map(
            fields
                .next()
                .ok_or(ReplayError::MissingArgument)?
                .parse()
                .map_err(ReplayError::Map)?,
        ),
        "heap" => Command::Heap(arg()?),
        "set" => {
            let start = arg()?;
            Command::Set(start, arg()?)
        }
        "del" => Command::Del(arg()?),
        "find" => Command::Find(arg()?),
        "dump" => Command::Dump,
        other => return Err(ReplayError::UnknownCommand(other.to_owned())),
    };
    if fields.next().is_some() {
        return Err(ReplayError::ExtraArgument);
    }
    Ok(Some(command))
}

/// The state of a replay: the chosen version and, after `heap`, the map.
pub struct Replay {
    version: MapVersion,
    writer: Option<MapWriter<MmapWords>>,
}

impl Replay {
    /// A replay that uses `version` unless the script says `map`.
    pub fn new(version: MapVersion) -> Self {
        Self {
            version,
            writer: None,
        }
    }

    /// The map, once `heap` has run.
    pub fn writer(&self) -> Option<&MapWriter<MmapWords>> {
        self.writer.as_ref()
    }

    /// Applies one command, writing its output to `out`. The outer error is an
    /// I/O failure; the inner one is the line's own failure.
    pub fn apply(
        &mut self,
        command: Command,
        out: &mut dyn Write,
    ) -> io::Result<Result<(), ReplayError>> {
        Ok(match command {
            Command::Map(_) if self.writer.is_some() => Err(ReplayError::MapAfterHeap),
            Command::Map(version) => {
                self.version = version;
                Ok(())
            }
            Command::Heap(_) if self.writer.is_some() => Err(ReplayError::HeapTwice),
            Command::Heap(size) => MapWriter::new(self.version, size)
                .map(|w| self.writer = Some(w))
                .map_err(ReplayError::Map),
            Command::Set(start, size) => self
                .writer_mut()
                .and_then(|w| w.set(start, size).map_err(ReplayError::Map)),
            Command::Del(start) => self
                .writer_mut()
                .and_then(|w| w.delete(start).map_err(ReplayError::Map)),
            Command::Find(addr) => match self.writer_mut() {
                Ok(w) => {
                    match w.map().find(addr) {
                        Some(start) => writeln!(out, "find {addr:#x} {start:#x}")?,
                        None => writeln!(out, "find {addr:#x} none")?,
                    }
                    Ok(())
                }
                Err(e) => Err(e),
            },
            Command::Dump => match self.writer_mut() {
                Ok(w) => {
                    for (index, word) in w.map().nonzero_words() {
                        writeln!(out, "word {index} {word:#010x}")?;
                    }
                    writeln!(out, "end")?;
                    Ok(())
                }
                Err(e) => Err(e),
            },
        })
    }

    fn writer_mut(&mut self) -> Result<&mut MapWriter<MmapWords>, ReplayError> {
        self.writer.as_mut().ok_or(ReplayError::NoHeap)
    }
}

/// Runs a whole script. Each failing line prints `error <line> <reason>` and the
/// replay goes on. Returns whether every line succeeded.
pub fn run(script: &str, version: MapVersion, out: &mut dyn Write) -> io::Result<bool> {
    let mut replay = Replay::new(version);
    let mut all_ok = true;
    for (number, line) in script.lines().enumerate() {
        let result = match parse_line(line) {
            Ok(None) => continue,
            Ok(Some(command)) => replay.apply(command, out)?,
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            all_ok = false;
            writeln!(out, "error {} {e}", number + 1)?;
        }
    }
    Ok(all_ok)
}
