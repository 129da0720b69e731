//! Precompiled images: code loaded at a base address with a sorted function
//! table, an entry-point → method map, a hot/cold map and a thunk range, looked
//! up with the contract's ReadyToRun algorithm.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
// A plain counter, never modelled: images are not built under loom.
use std::sync::atomic::{AtomicU64, Ordering};

use crate::info::{DebugEntry, GcInfo};

/// One runtime function: a method's main body, a funclet, or a cold fragment.
/// Offsets are relative to the image base.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageFunction {
    /// First byte.
    pub begin: u32,
    /// One past the last byte.
    pub end: u32,
    /// Unwind data for this function (relative to the image base).
    pub unwind: Box<[u8]>,
}

/// A method of the image, named by its entry point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageMethod {
    /// Offset of the entry point: the `begin` of the method's main function.
    pub entry: u32,
    /// The runtime's method id.
    pub method_id: u64,
    /// GC info, if any.
    pub gc: Option<GcInfo>,
    /// Native offset → source rows, sorted by offset.
    pub debug: Vec<DebugEntry>,
    /// The name profiles and debuggers show for it (for a WebAssembly
    /// guest, `module::function`). Empty: the method has none, and is shown
    /// as `[image method <method_id>]`.
    pub name: String,
}

/// One hot/cold map pair: the first cold function of a method, and the index of
/// the method's main (hot) function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HotCold {
    /// Index of the first function of the cold part.
    pub cold: u32,
    /// Index of the method's main function.
    pub hot: u32,
}

/// What an image registration supplies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageInfo {
    /// Load address.
    pub base: usize,
    /// Bytes mapped.
    pub size: usize,
    /// Runtime functions sorted by address, non-overlapping; cold fragments last.
    pub functions: Vec<ImageFunction>,
    /// Methods by entry point.
    pub methods: Vec<ImageMethod>,
    /// Hot/cold pairs, sorted by cold index.
    pub hot_cold: Vec<HotCold>,
    /// Delay-load thunks; addresses here belong to no method.
    pub thunks: Option<Range<u32>>,
}

/// Why an image was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ImageError {
    /// Size 0.
    Empty,
    /// Larger than 4 GiB, which 32-bit function offsets cannot address.
    TooLarge {
        /// Size in bytes.
        size: usize,
    },
    /// A function is empty or reaches past the image.
    FunctionOutOfRange {
        /// Index in the table.
        index: usize,
    },
    /// A function starts before the previous one.
    Unsorted {
        /// Index in the table.
        index: usize,
    },
    /// A function overlaps the previous one.
    Overlapping {
        /// Index in the table.
        index: usize,
    },
    /// A method's entry is not the start of a hot function.
    EntryNotFunction {
        /// Offset of the entry point.
        entry: u32,
    },
    /// Two methods share an entry.
    DuplicateEntry {
        /// Offset of the entry point.
        entry: u32,
    },
    /// A hot function has no method entry at or before it.
    Orphan {
        /// Index in the table.
        index: usize,
    },
    /// A hot/cold pair names a bad index, or pairs are out of order.
    BadHotCold {
        /// Index of the hot/cold pair.
        pair: usize,
    },
    /// The thunk range is empty or reaches past the image.
    ThunksOutOfRange,
}

impl fmt::Display for ImageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Empty => f.write_str("image of size 0"),
            Self::TooLarge { size } => write!(f, "image of {size:#x} bytes is over 4 GiB"),
            Self::FunctionOutOfRange { index } => {
                write!(f, "function {index} is empty or past the image")
            }
            Self::Unsorted { index } => write!(f, "function {index} is out of order"),
            Self::Overlapping { index } => write!(f, "function {index} overlaps the previous one"),
            Self::EntryNotFunction { entry } => {
                write!(f, "entry {entry:#x} is not the start of a hot function")
            }
            Self::DuplicateEntry { entry } => write!(f, "two methods have entry {entry:#x}"),
            Self::Orphan { index } => write!(f, "function {index} has no method entry before it"),
            Self::BadHotCold { pair } => {
                write!(f, "hot/cold pair {pair} is invalid or out of order")
            }
            Self::ThunksOutOfRange => f.write_str("thunk range is empty or past the image"),
        }
    }
}

impl std::error::Error for ImageError {}

/// One function of an image as a reader in another process sees it: an
/// entry of the table the descriptor (layout 3) points to from an image's
/// range-map fragment, sorted by `begin`. The table and the names it points
/// to live as long as the image section.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RemoteFunction {
    /// First byte, as an offset from the image base.
    pub(crate) begin: u32,
    /// One past the last byte.
    pub(crate) end: u32,
    /// The method's offset at `begin` ([`ImageHit::offset`] there): a cold
    /// part or a funclet continues its method's offsets.
    pub(crate) delta: u32,
    /// Bytes of the method's name (0: it has none).
    pub(crate) name_len: u32,
    /// The method's id.
    pub(crate) method_id: u64,
    /// The method's name (UTF-8, `name_len` bytes).
    pub(crate) name_ptr: usize,
}

/// The next [`ImageSection::id`].
static NEXT_IMAGE_ID: AtomicU64 = AtomicU64::new(1);

/// A validated image.
#[derive(Debug)]
pub struct ImageSection {
    /// Which load this is: unique in the process ([`ImageSection::id`]).
    id: u64,
    info: ImageInfo,
    /// The functions as readers in other processes see them.
    remote: Box<[RemoteFunction]>,
    /// Function index → method index, for functions that are method entries.
    entry_of: Vec<Option<u32>>,
    /// Entry offset → method index.
    by_entry: HashMap<u32, u32>,
    /// Index of the first cold function (`functions.len()` if none).
    first_cold: usize,
}

/// Where an image address landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageHit {
    /// Method index.
    pub method: usize,
    /// Index of the function containing the address.
    pub function: usize,
    /// Index of the method's main function.
    pub main: usize,
    /// Offset from the method start, counting the hot part first.
    pub offset: u64,
    /// Whether the address is in the method's cold part.
    pub cold: bool,
}

/// Hot and cold extents of a method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionInfo {
    /// Bytes in the hot part.
    pub hot_size: u64,
    /// Address of the cold part, if the method has one.
    pub cold_start: Option<usize>,
    /// Bytes in the cold part (0 if none).
    pub cold_size: u64,
}

impl ImageSection {
    /// Validates `info`.
    pub fn new(info: ImageInfo) -> Result<Self, ImageError> {
        if info.size == 0 {
            return Err(ImageError::Empty);
        }
        if info.size as u64 > 1 << 32 {
            return Err(ImageError::TooLarge { size: info.size });
        }
        let f = &info.functions;
        for (index, func) in f.iter().enumerate() {
            if func.begin >= func.end || func.end as usize > info.size {
                return Err(ImageError::FunctionOutOfRange { index });
            }
            if index > 0 && func.begin < f[index - 1].begin {
                return Err(ImageError::Unsorted { index });
            }
            if index > 0 && func.begin < f[index - 1].end {
                return Err(ImageError::Overlapping { index });
            }
        }
        let first_cold = info.hot_cold.first().map_or(f.len(), |p| p.cold as usize);
        for (pair, hc) in info.hot_cold.iter().enumerate() {
            let ordered = pair == 0 || hc.cold > info.hot_cold[pair - 1].cold;
            if !ordered || hc.cold as usize >= f.len() || hc.hot as usize >= first_cold {
                return Err(ImageError::BadHotCold { pair });
            }
        }
        let mut entry_of = vec![None; f.len()];
        let mut by_entry = HashMap::with_capacity(info.methods.len());
        for (m, method) in info.methods.iter().enumerate() {
            let i = f.partition_point(|x| x.begin < method.entry);
            if i >= first_cold || f.get(i).is_none_or(|x| x.begin != method.entry) {
                return Err(ImageError::EntryNotFunction {
                    entry: method.entry,
                });
            }
            if by_entry.insert(method.entry, m as u32).is_some() {
                return Err(ImageError::DuplicateEntry {
                    entry: method.entry,
                });
            }
            entry_of[i] = Some(m as u32);
        }
        if first_cold > 0 && entry_of[0].is_none() {
            return Err(ImageError::Orphan { index: 0 });
        }
        for (pair, hc) in info.hot_cold.iter().enumerate() {
            if entry_of[hc.hot as usize].is_none() {
                return Err(ImageError::BadHotCold { pair });
            }
        }
        if let Some(t) = &info.thunks
            && (t.start >= t.end || t.end as usize > info.size)
        {
            return Err(ImageError::ThunksOutOfRange);
        }
        // Relaxed: only uniqueness matters.
        let id = NEXT_IMAGE_ID.fetch_add(1, Ordering::Relaxed);
        let mut image = Self {
            id,
            info,
            remote: Box::new([]),
            entry_of,
            by_entry,
            first_cold,
        };
        image.remote = image.remote_table();
        Ok(image)
    }

    /// The table [`ImageSection::remote_functions`] returns. Its name
    /// pointers point into `self.info`'s strings, whose buffers stay where
    /// they are while the section lives (it is never changed).
    fn remote_table(&self) -> Box<[RemoteFunction]> {
        self.info
            .functions
            .iter()
            .filter_map(|f| {
                let hit = self.lookup(u64::from(f.begin))?;
                let method = &self.info.methods[hit.method];
                Some(RemoteFunction {
                    begin: f.begin,
                    end: f.end,
                    delta: hit.offset as u32,
                    name_len: u32::try_from(method.name.len()).unwrap_or(u32::MAX),
                    method_id: method.method_id,
                    name_ptr: method.name.as_ptr() as usize,
                })
            })
            .collect()
    }

    /// The functions as readers in other processes see them, sorted.
    pub(crate) fn remote_functions(&self) -> &[RemoteFunction] {
        &self.remote
    }

    /// The registration data.
    pub fn info(&self) -> &ImageInfo {
        &self.info
    }

    /// This section's identity, unique in the process (from 1): two images
    /// loaded one after the other at the same base have different ids, so an
    /// unload event ([`crate::events::ImageUnload::image_id`]) names exactly
    /// the image it removed.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Load address.
    pub fn base(&self) -> usize {
        self.info.base
    }

    /// Whether `rel` (an offset from the base) is in the delay-load thunks.
    pub fn is_thunk(&self, rel: u64) -> bool {
        self.info
            .thunks
            .as_ref()
            .is_some_and(|t| rel >= u64::from(t.start) && rel < u64::from(t.end))
    }

    /// Looks up an offset from the base: binary search, then (for cold code) the
    /// hot/cold map, then a walk back over funclets to the method's entry.
    pub fn lookup(&self, rel: u64) -> Option<ImageHit> {
        if self.is_thunk(rel) {
            return None;
        }
        let f = &self.info.functions;
        let function = f
            .partition_point(|x| u64::from(x.begin) <= rel)
            .checked_sub(1)?;
        if rel >= u64::from(f[function].end) {
            return None;
        }
        if function >= self.first_cold {
            let pair = self
                .info
                .hot_cold
                .partition_point(|p| p.cold as usize <= function)
                - 1;
            let hc = self.info.hot_cold[pair];
            let main = hc.hot as usize;
            let cold_begin = u64::from(f[hc.cold as usize].begin);
            return Some(ImageHit {
                method: self.entry_of[main]? as usize,
                function,
                main,
                offset: self.hot_size(main) + rel - cold_begin,
                cold: true,
            });
        }
        let mut main = function;
        while self.entry_of[main].is_none() {
            main -= 1;
        }
        Some(ImageHit {
            method: self.entry_of[main]? as usize,
            function,
            main,
            offset: rel - u64::from(f[main].begin),
            cold: false,
        })
    }

    /// The method whose entry point is exactly `rel`.
    pub fn method_at_entry(&self, rel: u64) -> Option<&ImageMethod> {
        let rel = u32::try_from(rel).ok()?;
        self.by_entry
            .get(&rel)
            .map(|&m| &self.info.methods[m as usize])
    }

    /// The method whose function holds `rel` (an offset from the base):
    /// [`ImageSection::lookup`], then its method.
    pub fn method_at(&self, rel: u64) -> Option<&ImageMethod> {
        self.lookup(rel).map(|hit| self.method(hit.method))
    }

    /// Method `index`.
    pub fn method(&self, index: usize) -> &ImageMethod {
        &self.info.methods[index]
    }

    /// Every method with where its hot part starts and how many bytes it
    /// has, in address order: what a perf map or a profile's symbol table
    /// lists.
    pub fn method_extents(&self) -> impl Iterator<Item = (&ImageMethod, usize, u64)> + '_ {
        self.entry_of.iter().enumerate().filter_map(|(main, m)| {
            let m = (*m)? as usize;
            let start = self.base() + self.info.functions[main].begin as usize;
            Some((&self.info.methods[m], start, self.hot_size(main)))
        })
    }

    /// Function `index`.
    pub fn function(&self, index: usize) -> &ImageFunction {
        &self.info.functions[index]
    }

    /// Hot and cold extents of the method whose main function is `main`.
    pub fn region(&self, main: usize) -> RegionInfo {
        let f = &self.info.functions;
        let cold = self
            .info
            .hot_cold
            .iter()
            .position(|p| p.hot as usize == main)
            .map(|pair| {
                let from = self.info.hot_cold[pair].cold as usize;
                let to = self
                    .info
                    .hot_cold
                    .get(pair + 1)
                    .map_or(f.len(), |p| p.cold as usize);
                (self.base() + f[from].begin as usize, len(&f[from..to]))
            });
        RegionInfo {
            hot_size: self.hot_size(main),
            cold_start: cold.map(|c| c.0),
            cold_size: cold.map_or(0, |c| c.1),
        }
    }

    /// Bytes in the hot functions of the method whose main function is `main`:
    /// the main body and the funclets that follow it.
    fn hot_size(&self, main: usize) -> u64 {
        let end = (main + 1..self.first_cold)
            .find(|&i| self.entry_of[i].is_some())
            .unwrap_or(self.first_cold);
        len(&self.info.functions[main..end])
    }
}

fn len(functions: &[ImageFunction]) -> u64 {
    functions.iter().map(|x| u64::from(x.end - x.begin)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(begin: u32, end: u32) -> ImageFunction {
        ImageFunction {
            begin,
            end,
            unwind: Box::new([]),
        }
    }

    fn m(entry: u32, method_id: u64, name: &str) -> ImageMethod {
        ImageMethod {
            entry,
            method_id,
            gc: None,
            debug: vec![],
            name: name.to_owned(),
        }
    }

    #[test]
    fn the_remote_table_gives_each_function_its_methods_offset_and_name() {
        // A: main 0x10..0x20 and a funclet 0x20..0x28; B: main 0x30..0x38,
        // unnamed; A's cold part 0x40..0x44; thunks 0x50..0x60 (no function).
        let image = ImageSection::new(ImageInfo {
            base: 0x1000,
            size: 0x100,
            functions: vec![f(0x10, 0x20), f(0x20, 0x28), f(0x30, 0x38), f(0x40, 0x44)],
            methods: vec![m(0x10, 7, "guest::a"), m(0x30, 8, "")],
            hot_cold: vec![HotCold { cold: 3, hot: 0 }],
            thunks: Some(0x50..0x60),
        })
        .unwrap();
        let a = image.method(0).name.as_ptr() as usize;
        let b = image.method(1).name.as_ptr() as usize;
        let entry = |begin, end, delta, name_len, method_id, name_ptr| RemoteFunction {
            begin,
            end,
            delta,
            name_len,
            method_id,
            name_ptr,
        };
        assert_eq!(
            image.remote_functions(),
            [
                entry(0x10, 0x20, 0, 8, 7, a),
                entry(0x20, 0x28, 0x10, 8, 7, a),
                entry(0x30, 0x38, 0, 0, 8, b),
                // The cold part continues after A's 0x18 hot bytes.
                entry(0x40, 0x44, 0x18, 8, 7, a),
            ]
        );
        // Each entry's offset agrees with the in-process lookup everywhere.
        for e in image.remote_functions() {
            for rel in e.begin..e.end {
                let hit = image.lookup(u64::from(rel)).unwrap();
                assert_eq!(hit.offset, u64::from(e.delta + rel - e.begin));
                assert_eq!(image.method(hit.method).method_id, e.method_id);
            }
        }
        let extents: Vec<(u64, usize, u64)> = image
            .method_extents()
            .map(|(m, start, size)| (m.method_id, start, size))
            .collect();
        assert_eq!(extents, [(7, 0x1010, 0x18), (8, 0x1030, 8)]);
    }
}
