//! The samples the eBPF program sends, decoded from the ring buffer's bytes.
//!
//! The layout mirrors `bpf/profile.bpf.c` (`struct event_header`, `struct
//! frame`); every field is decoded at its fixed offset from little-endian
//! bytes, and a record of the wrong size is refused rather than read past.

use std::fmt;

/// Frames a sample holds at most (`MAX_FRAMES` in the program).
pub const MAX_FRAMES: usize = 64;
/// Name bytes a frame carries at most (`NAME_CAP` in the program).
pub const NAME_CAP: usize = 64;
/// Bytes of `struct event_header`.
pub const HEADER_BYTES: usize = 16;
/// Bytes of `struct frame`.
pub const FRAME_BYTES: usize = 40 + 8 + NAME_CAP;

/// What the program found at one address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// Outside every range section: native code, named in user space.
    Native,
    /// A JIT method, with the name the kernel copied under the sequences'
    /// check (`truncated` when the name was longer than [`NAME_CAP`]).
    Method {
        /// First code byte.
        start: u64,
        /// Code size.
        size: u64,
        /// The runtime's method id.
        method_id: u64,
        /// The heap's id.
        heap_id: u64,
        /// The name (invalid UTF-8 replaced).
        name: String,
        /// Whether the name was cut at [`NAME_CAP`] bytes.
        truncated: bool,
    },
    /// A stub block.
    Stub {
        /// First code byte.
        start: u64,
        /// Its kind.
        kind: u64,
    },
    /// A precompiled image.
    Image {
        /// First address of the image.
        begin: u64,
    },
    /// Inside a heap but in no block.
    Nothing,
    /// A v1 heap whose start lies beyond the capped backward scan.
    TooFar,
    /// The host changed the maps during the lookup: the answer was dropped.
    Stale,
    /// A read failed or a value failed a check.
    Error,
}

/// One frame: its address and what it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The pc (innermost frame) or a return address.
    pub ip: u64,
    /// Reads the program made for this frame.
    pub reads: u16,
    /// What it is.
    pub kind: FrameKind,
}

/// One decoded sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Kernel thread id of the sampled thread.
    pub tid: u32,
    /// Reads made for the sample as a whole (the descriptor's managers and
    /// the range maps' sequences).
    pub reads: u32,
    /// A range map changed while the sample was resolved: it carries no
    /// frames and is dropped.
    pub stale: bool,
    /// Frames, innermost first.
    pub frames: Vec<Frame>,
}

/// Why a ring-buffer record could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Its length does not match its frame count.
    Length {
        /// Bytes received.
        got: usize,
        /// Frames it claims.
        frames: usize,
    },
    /// A frame's kind byte is not one the program writes.
    Kind(u8),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Length { got, frames } => {
                write!(f, "a {got}-byte sample record claims {frames} frames")
            }
            Self::Kind(k) => write!(f, "unknown frame kind {k}"),
        }
    }
}

impl std::error::Error for DecodeError {}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(v)
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    let mut v = [0u8; 4];
    v.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(v)
}

impl Sample {
    /// Decodes one ring-buffer record.
    ///
    /// ```
    /// use jitmap_sim::ebpf::event::{Frame, FrameKind, Sample, FRAME_BYTES, HEADER_BYTES};
    ///
    /// let mut record = vec![0u8; HEADER_BYTES + FRAME_BYTES];
    /// record[0..4].copy_from_slice(&7u32.to_le_bytes()); // tid
    /// record[4..8].copy_from_slice(&1u32.to_le_bytes()); // one frame
    /// record[HEADER_BYTES..HEADER_BYTES + 8].copy_from_slice(&0x1234u64.to_le_bytes());
    /// let sample = Sample::decode(&record)?;
    /// assert_eq!(sample.frames, [Frame { ip: 0x1234, reads: 0, kind: FrameKind::Native }]);
    /// # Ok::<(), jitmap_sim::ebpf::event::DecodeError>(())
    /// ```
    pub fn decode(record: &[u8]) -> Result<Self, DecodeError> {
        if record.len() < HEADER_BYTES {
            return Err(DecodeError::Length {
                got: record.len(),
                frames: 0,
            });
        }
        let tid = u32_at(record, 0);
        let count = u32_at(record, 4) as usize;
        let reads = u32_at(record, 8);
        let stale = u32_at(record, 12) & 1 != 0;
        if count > MAX_FRAMES || record.len() != HEADER_BYTES + count * FRAME_BYTES {
            return Err(DecodeError::Length {
                got: record.len(),
                frames: count,
            });
        }
        let frames = record[HEADER_BYTES..]
            .chunks_exact(FRAME_BYTES)
            .map(decode_frame)
            .collect::<Result<_, _>>()?;
        Ok(Self {
            tid,
            reads,
            stale,
            frames,
        })
    }
}

fn decode_frame(b: &[u8]) -> Result<Frame, DecodeError> {
    let (ip, start, id, heap_id, size) = (
        u64_at(b, 0),
        u64_at(b, 8),
        u64_at(b, 16),
        u64_at(b, 24),
        u64_at(b, 32),
    );
    let name_len = u32_at(b, 40) as usize;
    let reads = u16::from_le_bytes([b[44], b[45]]);
    let copied = usize::from(b[47]).min(NAME_CAP);
    let kind = match b[46] {
        0 => FrameKind::Native,
        1 => FrameKind::Method {
            start,
            size,
            method_id: id,
            heap_id,
            name: String::from_utf8_lossy(&b[48..48 + copied]).into_owned(),
            truncated: name_len > copied,
        },
        2 => FrameKind::Stub { start, kind: id },
        3 => FrameKind::Image { begin: start },
        4 => FrameKind::Nothing,
        5 => FrameKind::TooFar,
        6 => FrameKind::Stale,
        7 => FrameKind::Error,
        k => return Err(DecodeError::Kind(k)),
    };
    Ok(Frame { ip, reads, kind })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(ip: u64, kind: u8, fill: impl FnOnce(&mut [u8])) -> Vec<u8> {
        let mut b = vec![0u8; FRAME_BYTES];
        b[0..8].copy_from_slice(&ip.to_le_bytes());
        b[46] = kind;
        fill(&mut b);
        b
    }

    fn record(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut r = vec![0u8; HEADER_BYTES];
        r[0..4].copy_from_slice(&99u32.to_le_bytes());
        r[4..8].copy_from_slice(&(frames.len() as u32).to_le_bytes());
        r[8..12].copy_from_slice(&1u32.to_le_bytes());
        for f in frames {
            r.extend_from_slice(f);
        }
        r
    }

    #[test]
    fn every_field_decodes_at_its_offset() {
        let method = frame(0x7000_0010, 1, |b| {
            b[8..16].copy_from_slice(&0x7000_0000u64.to_le_bytes());
            b[16..24].copy_from_slice(&42u64.to_le_bytes());
            b[24..32].copy_from_slice(&3u64.to_le_bytes());
            b[32..40].copy_from_slice(&0x40u64.to_le_bytes());
            b[40..44].copy_from_slice(&70u32.to_le_bytes());
            b[44..46].copy_from_slice(&15u16.to_le_bytes());
            b[47] = 64;
            b[48..112].fill(b'a');
        });
        let stub = frame(0x7000_0100, 2, |b| {
            b[8..16].copy_from_slice(&0x7000_00f0u64.to_le_bytes());
            b[16..24].copy_from_slice(&5u64.to_le_bytes());
        });
        let sample = Sample::decode(&record(&[method, stub, frame(1, 6, |_| {})])).unwrap();
        assert_eq!(sample.tid, 99);
        assert_eq!((sample.reads, sample.stale), (1, false));
        assert_eq!(
            sample.frames,
            [
                Frame {
                    ip: 0x7000_0010,
                    reads: 15,
                    kind: FrameKind::Method {
                        start: 0x7000_0000,
                        size: 0x40,
                        method_id: 42,
                        heap_id: 3,
                        name: "a".repeat(64),
                        truncated: true,
                    },
                },
                Frame {
                    ip: 0x7000_0100,
                    reads: 0,
                    kind: FrameKind::Stub {
                        start: 0x7000_00f0,
                        kind: 5
                    },
                },
                Frame {
                    ip: 1,
                    reads: 0,
                    kind: FrameKind::Stale
                },
            ]
        );
    }

    #[test]
    fn a_stale_sample_says_so() {
        let mut r = record(&[]);
        r[12] = 1;
        let sample = Sample::decode(&r).unwrap();
        assert_eq!((sample.stale, sample.frames.len()), (true, 0));
    }

    #[test]
    fn malformed_records_are_refused() {
        assert_eq!(
            Sample::decode(&[0u8; 3]),
            Err(DecodeError::Length { got: 3, frames: 0 })
        );
        let mut r = record(&[frame(1, 0, |_| {})]);
        r.pop();
        assert_eq!(
            Sample::decode(&r),
            Err(DecodeError::Length {
                got: HEADER_BYTES + FRAME_BYTES - 1,
                frames: 1
            })
        );
        let mut big = record(&[]);
        big[4..8].copy_from_slice(&65u32.to_le_bytes());
        big.resize(HEADER_BYTES + 65 * FRAME_BYTES, 0);
        assert!(matches!(
            Sample::decode(&big),
            Err(DecodeError::Length { frames: 65, .. })
        ));
        assert_eq!(
            Sample::decode(&record(&[frame(1, 8, |_| {})])),
            Err(DecodeError::Kind(8))
        );
    }
}
