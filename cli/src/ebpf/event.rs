//! The samples the eBPF program sends, decoded from the ring buffer's bytes.
//!
//! The layout mirrors `bpf/profile.bpf.c`: a `struct event_header`, its
//! `frames` frames (`struct frame`), then `names` bytes of names that the
//! frames point into. Every field is decoded at its fixed offset from
//! little-endian bytes, and a record whose sizes or name slices do not add
//! up is refused rather than read past.

use std::fmt;

use jitmap::remote::dotnet::names::MethodIdentity;

/// Frames a sample holds at most (`MAX_FRAMES` in the program).
pub const MAX_FRAMES: usize = 64;
/// Bytes of one name the program copies at most (`NAME_CAP`).
pub const NAME_CAP: usize = 256;
/// Bytes of names one sample carries at most (`NAMES_BYTES`).
pub const NAMES_BYTES: usize = 4096;
/// Bytes of `struct event_header`.
pub const HEADER_BYTES: usize = 24;
/// Bytes of `struct frame`.
pub const FRAME_BYTES: usize = 56;

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
        /// Whether the name was cut.
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
        /// The method whose function holds the address (descriptor layout
        /// 3), if one does.
        method: Option<ImageMethod>,
    },
    /// Inside a heap but in no block.
    Nothing,
    /// A v1 heap whose start lies beyond the capped backward scan.
    TooFar,
    /// The host changed the maps during the lookup: the answer was dropped.
    Stale,
    /// A read failed or a value failed a check.
    Error,
    /// A method CoreCLR compiled, named in user space by its `MethodDesc`.
    DotnetMethod {
        /// First code byte (the nibble map's start).
        start: u64,
        /// Its `MethodDesc`.
        method_desc: u64,
        /// In a collectible assembly's code, what named the method while
        /// it ran: its name is given only if the `MethodDesc` still has it.
        identity: Option<Identity>,
    },
    /// A stub block in a CoreCLR code heap.
    DotnetStub {
        /// First code byte.
        start: u64,
        /// Its `StubCodeBlockKind` (0 to 15).
        kind: u64,
    },
    /// Inside a CoreCLR range of stubs (precodes, virtual-call stubs).
    DotnetStubs {
        /// First address of the range.
        begin: u64,
        /// Its `CodeRangeMapRangeList`, which says the stubs' kind.
        list: u64,
    },
    /// Inside a ReadyToRun image.
    DotnetImage {
        /// First address of the image's range.
        begin: u64,
        /// Its `Module`.
        module: u64,
    },
    /// In a CoreCLR code heap, past the capped backward scan of its nibble
    /// map (`V1_MAX_WORDS` words): the method is unknown.
    DotnetTooFar,
}

/// An image method a frame named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageMethod {
    /// The runtime's method id.
    pub method_id: u64,
    /// The name (invalid UTF-8 replaced; empty: the method has none).
    pub name: String,
    /// Whether the name was cut.
    pub truncated: bool,
}

/// The identity of a method frame in a collectible assembly's code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Identity {
    /// As the program read it while the method ran.
    Read(MethodIdentity),
    /// A read failed: the frame is a method, but not named.
    Unreadable,
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
    /// The leaf is native code without a frame pointer whose caller, a JIT
    /// method, the kernel's frame-pointer walk skipped (the word on top of
    /// the stack returns into that method).
    pub frameless_leaf: bool,
    /// The walk ended at the last frame because its object's native rows
    /// are stale: another object is mapped where they were loaded for.
    pub stale_rows: bool,
    /// The walk ended at the last frame because its unwind rows have no
    /// rule the kernel's walk can apply (CFI with a DWARF expression, as a
    /// PLT stub's), or no FDE of its native object covers it.
    pub no_rule: bool,
    /// A native frame in no object with rows (one loaded since the rows
    /// were last refreshed, or anonymous code) was stepped by the frame
    /// pointer, or the whole stack is the kernel's frame-pointer walk: the
    /// frames past it are only as good as the frame pointer.
    pub unknown_code: bool,
    /// Frames, innermost first.
    pub frames: Vec<Frame>,
}

/// Why a ring-buffer record could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Its length does not match its frame count and name bytes.
    Length {
        /// Bytes received.
        got: usize,
        /// Frames it claims.
        frames: usize,
    },
    /// A frame's kind byte is not one the program writes.
    Kind(u8),
    /// A frame's name lies outside the sample's name area.
    Name {
        /// Where it starts in the area.
        offset: usize,
        /// Its bytes.
        len: usize,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Length { got, frames } => {
                write!(f, "a {got}-byte sample record claims {frames} frames")
            }
            Self::Kind(k) => write!(f, "unknown frame kind {k}"),
            Self::Name { offset, len } => {
                write!(f, "a {len}-byte name at {offset} lies outside its sample")
            }
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
    /// use jitmap_cli::ebpf::event::{Frame, FrameKind, Sample, FRAME_BYTES, HEADER_BYTES};
    ///
    /// let mut record = vec![0u8; HEADER_BYTES + FRAME_BYTES];
    /// record[0..4].copy_from_slice(&7u32.to_le_bytes()); // tid
    /// record[4..8].copy_from_slice(&1u32.to_le_bytes()); // one frame
    /// record[HEADER_BYTES..HEADER_BYTES + 8].copy_from_slice(&0x1234u64.to_le_bytes());
    /// let sample = Sample::decode(&record)?;
    /// assert_eq!(sample.frames, [Frame { ip: 0x1234, reads: 0, kind: FrameKind::Native }]);
    /// # Ok::<(), jitmap_cli::ebpf::event::DecodeError>(())
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
        let flags = u32_at(record, 12);
        let stale = flags & 1 != 0;
        let frameless_leaf = flags & 2 != 0;
        let stale_rows = flags & 8 != 0;
        let no_rule = flags & 16 != 0;
        let unknown_code = flags & 32 != 0;
        let names = u32_at(record, 16) as usize;
        let bad_length = Err(DecodeError::Length {
            got: record.len(),
            frames: count,
        });
        if count > MAX_FRAMES || names > NAMES_BYTES {
            return bad_length;
        }
        let names_at = HEADER_BYTES + count * FRAME_BYTES;
        if record.len() != names_at + names {
            return bad_length;
        }
        let area = &record[names_at..];
        let mut frames: Vec<Frame> = record[HEADER_BYTES..names_at]
            .chunks_exact(FRAME_BYTES)
            .map(|b| decode_frame(b, area))
            .collect::<Result<_, _>>()?;
        // The top-of-stack word's lookup, sent after the stack's frames.
        if flags & 4 != 0 {
            frames.pop();
        }
        Ok(Self {
            tid,
            reads,
            stale,
            frameless_leaf,
            stale_rows,
            no_rule,
            unknown_code,
            frames,
        })
    }
}

fn decode_frame(b: &[u8], names: &[u8]) -> Result<Frame, DecodeError> {
    let (ip, start, id, heap_id, size) = (
        u64_at(b, 0),
        u64_at(b, 8),
        u64_at(b, 16),
        u64_at(b, 24),
        u64_at(b, 32),
    );
    let name_len = u32_at(b, 40) as usize;
    let reads = u16::from_le_bytes([b[44], b[45]]);
    let offset = usize::from(u16::from_le_bytes([b[48], b[49]]));
    let copied = usize::from(u16::from_le_bytes([b[50], b[51]]));
    // The frame's name in the sample's name area (invalid UTF-8 replaced).
    let name = || {
        names
            .get(offset..offset + copied)
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .ok_or(DecodeError::Name {
                offset,
                len: copied,
            })
    };
    let kind = match b[46] {
        0 => FrameKind::Native,
        1 => FrameKind::Method {
            start,
            size,
            method_id: id,
            heap_id,
            name: name()?,
            truncated: name_len > copied,
        },
        2 => FrameKind::Stub { start, kind: id },
        3 => FrameKind::Image {
            begin: heap_id,
            method: if b[47] == 1 {
                Some(ImageMethod {
                    method_id: id,
                    name: name()?,
                    truncated: name_len > copied,
                })
            } else {
                None
            },
        },
        4 => FrameKind::Nothing,
        5 => FrameKind::TooFar,
        6 => FrameKind::Stale,
        7 => FrameKind::Error,
        9 => FrameKind::DotnetMethod {
            start,
            method_desc: id,
            identity: match b[47] {
                1 => Some(Identity::Read(MethodIdentity::from_raw(
                    u32_at(b, 52),
                    size,
                ))),
                2 => Some(Identity::Unreadable),
                _ => None,
            },
        },
        10 => FrameKind::DotnetStub { start, kind: id },
        11 => FrameKind::DotnetStubs {
            begin: start,
            list: id,
        },
        12 => FrameKind::DotnetImage {
            begin: start,
            module: id,
        },
        13 => FrameKind::DotnetTooFar,
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

    fn record(frames: &[Vec<u8>], names: &[u8]) -> Vec<u8> {
        let mut r = vec![0u8; HEADER_BYTES];
        r[0..4].copy_from_slice(&99u32.to_le_bytes());
        r[4..8].copy_from_slice(&(frames.len() as u32).to_le_bytes());
        r[8..12].copy_from_slice(&1u32.to_le_bytes());
        r[16..20].copy_from_slice(&(names.len() as u32).to_le_bytes());
        for f in frames {
            r.extend_from_slice(f);
        }
        r.extend_from_slice(names);
        r
    }

    /// A method frame whose name is `len` bytes at `offset` of the name
    /// area, of a full name of `full` bytes.
    fn method(ip: u64, offset: u16, len: u16, full: u32) -> Vec<u8> {
        frame(ip, 1, |b| {
            b[8..16].copy_from_slice(&0x7000_0000u64.to_le_bytes());
            b[16..24].copy_from_slice(&42u64.to_le_bytes());
            b[24..32].copy_from_slice(&3u64.to_le_bytes());
            b[32..40].copy_from_slice(&0x40u64.to_le_bytes());
            b[40..44].copy_from_slice(&full.to_le_bytes());
            b[44..46].copy_from_slice(&15u16.to_le_bytes());
            b[48..50].copy_from_slice(&offset.to_le_bytes());
            b[50..52].copy_from_slice(&len.to_le_bytes());
        })
    }

    #[test]
    fn a_collectible_dotnet_methods_identity_decodes_from_size_and_pad() {
        let with = frame(0x1234, 9, |b| {
            b[8..16].copy_from_slice(&0x1000u64.to_le_bytes());
            b[16..24].copy_from_slice(&0xA0u64.to_le_bytes());
            b[32..40].copy_from_slice(b"UnloadA\0");
            b[47] = 1;
            // The desc's bits (a flag above the token's 12), the chunk's.
            b[52..56].copy_from_slice(&(0x8005u32 | 0x0001_0000).to_le_bytes());
        });
        let without = frame(0x1234, 9, |b| b[32..40].copy_from_slice(b"UnloadA\0"));
        let unread = frame(0x1234, 9, |b| b[47] = 2);
        let kinds: Vec<FrameKind> = Sample::decode(&record(&[with, without, unread], &[]))
            .unwrap()
            .frames
            .into_iter()
            .map(|f| f.kind)
            .collect();
        let identity = MethodIdentity {
            rid: 1 << 12 | 5,
            name_hash: u64::from_le_bytes(*b"UnloadA\0"),
        };
        assert_eq!(
            kinds,
            [
                FrameKind::DotnetMethod {
                    start: 0x1000,
                    method_desc: 0xA0,
                    identity: Some(Identity::Read(identity)),
                },
                FrameKind::DotnetMethod {
                    start: 0,
                    method_desc: 0,
                    identity: None,
                },
                FrameKind::DotnetMethod {
                    start: 0,
                    method_desc: 0,
                    identity: Some(Identity::Unreadable),
                },
            ]
        );
    }

    #[test]
    fn every_field_decodes_at_its_offset() {
        let stub = frame(0x7000_0100, 2, |b| {
            b[8..16].copy_from_slice(&0x7000_00f0u64.to_le_bytes());
            b[16..24].copy_from_slice(&5u64.to_le_bytes());
        });
        let frames = [
            method(0x7000_0010, 0, 3, 3),
            stub,
            method(0x7000_0020, 3, 4, 300),
            frame(1, 6, |_| {}),
        ];
        let sample = Sample::decode(&record(&frames, b"topleaf")).unwrap();
        assert_eq!(sample.tid, 99);
        assert_eq!((sample.reads, sample.stale), (1, false));
        let method = |ip, name: &str, truncated| Frame {
            ip,
            reads: 15,
            kind: FrameKind::Method {
                start: 0x7000_0000,
                size: 0x40,
                method_id: 42,
                heap_id: 3,
                name: name.into(),
                truncated,
            },
        };
        assert_eq!(
            sample.frames,
            [
                method(0x7000_0010, "top", false),
                Frame {
                    ip: 0x7000_0100,
                    reads: 0,
                    kind: FrameKind::Stub {
                        start: 0x7000_00f0,
                        kind: 5
                    },
                },
                method(0x7000_0020, "leaf", true),
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
        let mut r = record(&[], b"");
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
        // One byte short of its name area.
        let mut r = record(&[method(1, 0, 2, 2)], b"ab");
        r.pop();
        assert_eq!(
            Sample::decode(&r),
            Err(DecodeError::Length {
                got: HEADER_BYTES + FRAME_BYTES + 1,
                frames: 1
            })
        );
        let mut big = record(&[], b"");
        big[4..8].copy_from_slice(&65u32.to_le_bytes());
        big.resize(HEADER_BYTES + 65 * FRAME_BYTES, 0);
        assert!(matches!(
            Sample::decode(&big),
            Err(DecodeError::Length { frames: 65, .. })
        ));
        assert_eq!(
            Sample::decode(&record(&[frame(1, 8, |_| {})], b"")),
            Err(DecodeError::Kind(8))
        );
        // A name reaching past the area.
        assert_eq!(
            Sample::decode(&record(&[method(1, 1, 2, 2)], b"ab")),
            Err(DecodeError::Name { offset: 1, len: 2 })
        );
    }
}
