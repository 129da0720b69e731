//! Profile outputs for other tools: a flamegraph SVG drawn by `inferno`, and a
//! gzipped pprof `profile.proto` written with `prost` (read by `go tool pprof`,
//! Pyroscope, Parca and most profiling UIs). Behind the `export` feature.

use std::collections::HashMap;
use std::io::{self, Write};

use flate2::Compression;
use flate2::write::GzEncoder;
use prost::Message;

use super::{INLINED, Profile};

/// The messages of pprof's `profile.proto` this writer fills, with the
/// field numbers of the published schema.
pub mod proto {
    /// A profile.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        /// What each sample value means.
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        /// The samples.
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        /// Locations (one per frame name here).
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        /// Functions.
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        /// Every string; index 0 is "".
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        /// Wall time the profile ended, ns since the epoch.
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        /// How long it ran.
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        /// What the period counts.
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        /// Sampling period.
        #[prost(int64, tag = "12")]
        pub period: i64,
    }

    /// A value's type and unit, as string-table indices.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        /// Type name.
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        /// Unit name.
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    /// One stack and its values.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        /// Location ids, innermost first.
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        /// One value per sample type.
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
    }

    /// A location.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        /// Its id (1-based).
        #[prost(uint64, tag = "1")]
        pub id: u64,
        /// The function it is in.
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }

    /// A location's function.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        /// Function id.
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        /// Source line (0: unknown).
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    /// A function.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        /// Its id (1-based).
        #[prost(uint64, tag = "1")]
        pub id: u64,
        /// Name (string-table index).
        #[prost(int64, tag = "2")]
        pub name: i64,
        /// System name (string-table index).
        #[prost(int64, tag = "3")]
        pub system_name: i64,
    }
}

/// The profile's outputs for other tools; they need the `export` feature.
#[cfg_attr(docsrs, doc(cfg(feature = "export")))]
impl Profile {
    /// Draws the folded stacks as a flamegraph SVG (feature `export`). A
    /// profile with no samples gives an SVG that says so, titled alike.
    pub fn write_flamegraph(&self, title: &str, mut out: impl Write) -> io::Result<()> {
        let folded = self.folded();
        if folded.trim().is_empty() {
            let title: String = title
                .chars()
                .map(|c| match c {
                    '<' | '>' | '&' | '"' => '_',
                    c => c,
                })
                .collect();
            return write!(
                out,
                "<?xml version=\"1.0\" standalone=\"no\"?>\n\
                 <svg version=\"1.1\" width=\"1200\" height=\"60\" xmlns=\"http://www.w3.org/2000/svg\">\n\
                 <text x=\"600\" y=\"24\" text-anchor=\"middle\" font-size=\"17\">{title}</text>\n\
                 <text x=\"600\" y=\"48\" text-anchor=\"middle\" font-size=\"12\">no samples</text>\n\
                 </svg>\n"
            );
        }
        let mut options = inferno::flamegraph::Options::default();
        options.title = title.to_owned();
        options.count_name = "samples".to_owned();
        inferno::flamegraph::from_lines(&mut options, folded.lines(), out)
            .map_err(|e| io::Error::other(e.to_string()))
    }

    /// The profile as a pprof message: sample types `samples/count` (the
    /// periods each stack stands for: a coalesced signal counts its
    /// overrun too) and `cpu/nanoseconds` or, on the wall clock,
    /// `wall/nanoseconds` (count × `period_ns`), one function per name, and
    /// one location per function with the helpers inlined into it there
    /// (frames marked [`INLINED`]) as its lines, innermost first.
    pub fn to_pprof(&self, period_ns: u64) -> proto::Profile {
        let mut strings = vec![String::new()];
        let mut string_ids: HashMap<String, i64> = HashMap::new();
        let mut intern = |s: &str| -> i64 {
            if let Some(&id) = string_ids.get(s) {
                return id;
            }
            strings.push(s.to_owned());
            let id = strings.len() as i64 - 1;
            string_ids.insert(s.to_owned(), id);
            id
        };
        let value_type = |t: i64, u: i64| proto::ValueType { r#type: t, unit: u };
        let time = match self.clock {
            super::Clock::Cpu => "cpu",
            super::Clock::Wall => "wall",
        };
        let sample_type = vec![
            value_type(intern("samples"), intern("count")),
            value_type(intern(time), intern("nanoseconds")),
        ];
        let period_type = Some(value_type(intern(time), intern("nanoseconds")));
        let mut function = Vec::new();
        let mut function_ids: HashMap<&str, u64> = HashMap::new();
        let mut location = Vec::new();
        let mut location_ids: HashMap<Vec<u64>, u64> = HashMap::new();
        let mut sample = Vec::with_capacity(self.stacks.len());
        for stack in &self.stacks {
            let mut location_id = Vec::with_capacity(stack.frames.len());
            // A location's functions, innermost first: the inlined helpers
            // (marked by `INLINED`) and then the function they sit in, as
            // pprof's lines give them.
            let mut lines: Vec<u64> = Vec::new();
            for frame in &stack.frames {
                let (name, inlined) = match frame.strip_suffix(INLINED) {
                    Some(name) => (name, true),
                    None => (frame.as_str(), false),
                };
                let function_id = *function_ids.entry(name).or_insert_with(|| {
                    let id = function.len() as u64 + 1;
                    let name_id = intern(name);
                    function.push(proto::Function {
                        id,
                        name: name_id,
                        system_name: name_id,
                    });
                    id
                });
                lines.push(function_id);
                if inlined {
                    continue;
                }
                let lines = std::mem::take(&mut lines);
                let next = location.len() as u64 + 1;
                let id = *location_ids.entry(lines.clone()).or_insert(next);
                if id == next {
                    location.push(proto::Location {
                        id,
                        line: lines
                            .iter()
                            .map(|&function_id| proto::Line {
                                function_id,
                                line: 0,
                            })
                            .collect(),
                    });
                }
                location_id.push(id);
            }
            sample.push(proto::Sample {
                location_id,
                value: vec![stack.count as i64, (stack.count * period_ns) as i64],
            });
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        proto::Profile {
            sample_type,
            sample,
            location,
            function,
            string_table: strings,
            time_nanos: now,
            duration_nanos: self.duration.as_nanos() as i64,
            period_type,
            period: period_ns as i64,
        }
    }

    /// Writes [`Profile::to_pprof`] gzipped, as pprof files are stored
    /// (feature `export`).
    pub fn write_pprof(&self, period_ns: u64, out: impl Write) -> io::Result<()> {
        let mut gz = GzEncoder::new(out, Compression::default());
        gz.write_all(&self.to_pprof(period_ns).encode_to_vec())?;
        gz.finish()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::Stack;

    /// A profile that took no sample (a host that exited, or was stopped, at
    /// once; a loaded machine) still has a flame graph, which says so:
    /// inferno alone refuses empty input, and a tool writing its four
    /// outputs would fail.
    #[test]
    fn a_profile_without_samples_draws_an_empty_flamegraph() {
        let mut svg = Vec::new();
        Profile::default()
            .write_flamegraph("empty", &mut svg)
            .unwrap();
        let svg = String::from_utf8(svg).unwrap();
        assert!(
            svg.starts_with("<?xml") && svg.trim_end().ends_with("</svg>"),
            "{svg}"
        );
        assert!(svg.contains("empty") && svg.contains("no samples"), "{svg}");
    }

    #[test]
    fn inlined_frames_become_the_lines_of_their_functions_location() {
        let stack = |frames: &[&str], count| Stack {
            frames: frames.iter().map(|f| f.to_string()).collect(),
            count,
        };
        let profile = Profile {
            samples: 5,
            stacks: vec![
                stack(&["mul (inlined)", "mix (inlined)", "spin", "main"], 3),
                stack(&["spin", "main"], 2),
            ],
            ..Profile::default()
        };
        let pprof = profile.to_pprof(1000);
        let name = |id: u64| {
            let f = &pprof.function[id as usize - 1];
            pprof.string_table[f.name as usize].as_str()
        };
        let lines = |location: u64| -> Vec<&str> {
            pprof.location[location as usize - 1]
                .line
                .iter()
                .map(|l| name(l.function_id))
                .collect()
        };
        assert_eq!(pprof.function.len(), 4);
        assert_eq!(pprof.location.len(), 3);
        let first: Vec<Vec<&str>> = pprof.sample[0]
            .location_id
            .iter()
            .map(|&l| lines(l))
            .collect();
        assert_eq!(first, [vec!["mul", "mix", "spin"], vec!["main"]]);
        let second: Vec<Vec<&str>> = pprof.sample[1]
            .location_id
            .iter()
            .map(|&l| lines(l))
            .collect();
        assert_eq!(second, [vec!["spin"], vec!["main"]]);
        assert_eq!(pprof.sample[0].value, [3, 3000]);
        let name = |id: i64| pprof.string_table[id as usize].as_str();
        let types: Vec<(&str, &str)> = pprof
            .sample_type
            .iter()
            .map(|t| (name(t.r#type), name(t.unit)))
            .collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    }

    /// A wall-clock profile's time is wall time, in its sample type and
    /// its period type.
    #[test]
    fn a_wall_clock_profile_says_wall_nanoseconds() {
        let profile = Profile {
            samples: 1,
            clock: crate::agent::Clock::Wall,
            stacks: vec![Stack {
                frames: vec!["main".into()],
                count: 4,
            }],
            ..Profile::default()
        };
        let pprof = profile.to_pprof(1000);
        let name = |id: i64| pprof.string_table[id as usize].as_str();
        let time = &pprof.sample_type[1];
        assert_eq!(
            (name(time.r#type), name(time.unit)),
            ("wall", "nanoseconds")
        );
        let period = pprof.period_type.unwrap();
        assert_eq!(
            (name(period.r#type), name(period.unit)),
            ("wall", "nanoseconds")
        );
        assert_eq!(pprof.sample[0].value, [4, 4000]);
    }
}
