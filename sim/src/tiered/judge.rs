//! Judging the agent's kept samples against the shadow model.
//!
//! A Cranelift module makes a version callable inside its
//! `finalize_definitions`, before the run knows where it put it (the shadow
//! says it is being placed). A sample taken in that moment names a version
//! the shadow cannot judge yet: it waits for the next pass, not counted as
//! wrong, and is judged once the version's place is known.

use jitmap::agent::{Kept, SampleFrame};

use super::shadow::Shadow;

/// What one pass over kept samples found.
#[derive(Debug, Default)]
pub(super) struct Judged {
    /// Frames judged.
    pub frames: u64,
    /// What was wrong, one line per wrong frame.
    pub wrong: Vec<String>,
    /// Samples naming a version still being placed, with the versions they
    /// name: to be judged in a later pass.
    pub deferred: Kept,
}

/// Judges every JIT, stub and unattributed frame of `kept`'s samples; a
/// leaf left unattributed must be one the handler's capped v1 walk
/// (`v1_words` map words) cannot reach. With `defer`, a sample that names
/// a version still being placed is set aside whole; without (the last pass,
/// every publish returned), it is judged as it is.
pub(super) fn judge(shadow: &Shadow, kept: &Kept, v1_words: Option<usize>, defer: bool) -> Judged {
    let mut out = Judged::default();
    for sample in &kept.samples {
        let named = sample.frames.iter().filter_map(|f| match *f {
            SampleFrame::Jit { method, .. } => kept.method(method).map(|m| (method, m)),
            _ => None,
        });
        if defer && named.clone().any(|(_, m)| shadow.is_placing(m.method_id)) {
            for (index, m) in named {
                out.deferred.methods.insert(index, m.clone());
            }
            out.deferred.samples.push(sample.clone());
            continue;
        }
        for (depth, frame) in sample.frames.iter().enumerate() {
            let judged = match *frame {
                SampleFrame::Jit { addr, method, .. } => {
                    let at = if depth == 0 { addr } else { addr - 1 };
                    match kept.method(method) {
                        Some(m) => shadow.judge_sample(at, sample.end_ns, m.method_id, &m.name),
                        None => Err(format!("sample frame at {addr:#x} names no method")),
                    }
                }
                SampleFrame::Unattributed { addr } if depth == 0 => {
                    shadow.judge_unattributed(addr, sample.end_ns, v1_words)
                }
                SampleFrame::Stub { addr, .. } => {
                    let at = if depth == 0 { addr } else { addr - 1 };
                    shadow.judge_stub(at, sample.end_ns)
                }
                _ => continue,
            };
            out.frames += 1;
            if let Err(what) = judged {
                out.wrong.push(what);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use jitmap::JitKind;
    use jitmap::agent::{MethodVersion, Sample};

    use super::*;
    use crate::tiered::shadow::Version;

    fn version(name: &str, start: usize, publish: u64) -> Version {
        Version {
            name: name.to_string(),
            start,
            size: 0x40,
            publish_begin: publish,
            publish_end: publish + 1,
            free_begin: u64::MAX,
            free_end: u64::MAX,
            stub: false,
            reserved_in_publish: false,
        }
    }

    fn method(method_id: u64, name: &str, start: usize) -> MethodVersion {
        MethodVersion {
            method_id,
            name: name.to_string(),
            label: name.to_string(),
            kind: JitKind::Baseline,
            start,
            freed: false,
            merged: 0,
        }
    }

    /// Samples ending at `end_ns`, each one frame at `addr` in method index
    /// `index`.
    fn kept(frames: &[(usize, usize, u64)], methods: &[(usize, MethodVersion)]) -> Kept {
        Kept {
            samples: frames
                .iter()
                .map(|&(addr, index, end_ns)| Sample {
                    tid: 1,
                    begin_ns: end_ns - 1,
                    end_ns,
                    weight: 1,
                    frames: vec![SampleFrame::Jit {
                        addr,
                        method: index,
                        offset: 4,
                    }],
                })
                .collect(),
            methods: methods.iter().cloned().collect(),
            ..Kept::default()
        }
    }

    #[test]
    fn a_sample_naming_a_version_being_placed_is_judged_once_it_is_placed() {
        // `scale`'s test reads the process's allocator figures: this crate's
        // unit tests take turns.
        let _turn = crate::scale::measuring();
        let mut s = Shadow::default();
        // Version 1 held 0x100 and was freed; version 2 reuses its bytes
        // and is callable before the run knows where it is.
        s.publishing(1, version("old", 0x100, 10));
        s.freeing(1, 20);
        s.freed(1, 21);
        s.publishing(3, version("other", 0x200, 10));
        s.placing(2);
        let k = kept(
            &[(0x104, 0, 40), (0x204, 1, 40)],
            &[(0, method(2, "new", 0x100)), (1, method(3, "other", 0x200))],
        );
        let first = judge(&s, &k, None, true);
        assert_eq!(first.frames, 1);
        assert_eq!(first.wrong, Vec::<String>::new());
        assert_eq!(first.deferred.samples, k.samples[..1].to_vec());
        assert_eq!(
            first.deferred.methods.keys().copied().collect::<Vec<_>>(),
            [0]
        );
        // The last pass judges it as it is: the shadow does not know it.
        let last = judge(&s, &k, None, false);
        assert_eq!((last.frames, last.wrong.len()), (2, 1));
        assert!(last.wrong[0].contains("named new (version 2: None"));
        s.placed(2, version("new", 0x100, 30));
        let second = judge(&s, &first.deferred, None, true);
        assert_eq!(second.frames, 1);
        assert_eq!(second.wrong, Vec::<String>::new());
        assert!(second.deferred.samples.is_empty());
    }
}
