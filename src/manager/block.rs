//! What a lookup answers: the method block containing an address, with the
//! contract's full API read on demand.

use std::fmt;

use crate::heap::{CodeHeader, DebugEntry, GcInfo, Hit, JitKind};
use crate::image::{ImageHit, ImageSection, RegionInfo};
use crate::info::EhFrame;

#[derive(Clone, Copy)]
enum Source<'g> {
    /// JIT code: the map's hit (the header is read from its slot on demand).
    Jit { hit: Hit<'g>, heap_base: usize },
    Image {
        image: &'g ImageSection,
        hit: ImageHit,
    },
}

/// The header of a JIT method found by a lookup.
fn jit_header(hit: Hit<'_>) -> &CodeHeader {
    // SAFETY: `classify` builds a JIT `CodeBlock` only for a method (its slot was
    // read as a header pointer, or the heap has never held a stub), and the guard
    // behind the hit's lifetime keeps the header alive.
    unsafe { hit.header() }
}

/// The method block containing a looked-up address. Fields beyond the start and
/// offset are read on demand, so a lookup touches no more memory than it needs.
#[derive(Clone, Copy)]
pub struct CodeBlock<'g> {
    start: usize,
    offset: u64,
    source: Source<'g>,
}

impl fmt::Debug for CodeBlock<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CodeBlock")
            .field("method_id", &self.method_id())
            .field("start", &format_args!("{:#x}", self.start))
            .field("offset", &self.offset)
            .finish_non_exhaustive()
    }
}

impl<'g> CodeBlock<'g> {
    /// A JIT method's block, from the maps' exact hit in the heap at
    /// `heap_base`.
    #[inline(always)]
    pub(super) fn jit(hit: Hit<'g>, heap_base: usize) -> Self {
        Self {
            start: hit.start,
            offset: hit.offset,
            source: Source::Jit { hit, heap_base },
        }
    }

    /// An image method's block.
    pub(super) fn image(image: &'g ImageSection, hit: ImageHit) -> Self {
        Self {
            start: image.base() + image.function(hit.main).begin as usize,
            offset: hit.offset,
            source: Source::Image { image, hit },
        }
    }

    /// The runtime's method id.
    pub fn method_id(&self) -> u64 {
        match self.source {
            Source::Jit { hit, .. } => jit_header(hit).method_id(),
            Source::Image { image, hit } => image.method(hit.method).method_id,
        }
    }

    /// Address of the method's entry (its main body's first byte).
    pub fn start(&self) -> usize {
        self.start
    }

    /// Offset of the address within the method; in a cold part, the hot part's
    /// size plus the offset into the cold part (the contract's
    /// `GetRelativeOffset`).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Start of the funclet containing the address, or the method start if the
    /// address is in the main body or its cold part.
    pub fn funclet_start(&self) -> usize {
        match self.source {
            Source::Jit { hit, .. } => match jit_header(hit).unwind_at(self.offset) {
                Some((index, entry)) if index > 0 => self.start + entry.begin as usize,
                _ => self.start,
            },
            Source::Image { image, hit } if !hit.cold => {
                image.base() + image.function(hit.function).begin as usize
            }
            Source::Image { .. } => self.start,
        }
    }

    /// Whether the address is in a funclet.
    pub fn is_funclet(&self) -> bool {
        self.funclet_start() != self.start
    }

    /// Hot and cold extents of the method.
    pub fn region(&self) -> RegionInfo {
        match self.source {
            Source::Jit { hit, .. } => {
                let header = jit_header(hit);
                match header.cold_offset() {
                    Some(hot) => RegionInfo {
                        hot_size: u64::from(hot),
                        cold_start: Some(self.start + hot as usize),
                        cold_size: header.code_size() - u64::from(hot),
                    },
                    None => RegionInfo {
                        hot_size: header.code_size(),
                        cold_start: None,
                        cold_size: 0,
                    },
                }
            }
            Source::Image { image, hit } => image.region(hit.main),
        }
    }

    /// Unwind data for the function (main body, funclet or cold fragment) at the
    /// address.
    pub fn unwind_info(&self) -> Option<&'g [u8]> {
        match self.source {
            Source::Jit { hit, .. } => jit_header(hit)
                .unwind_at(self.offset)
                .map(|(_, e)| &*e.data),
            Source::Image { image, hit } => Some(&image.function(hit.function).unwind),
        }
    }

    /// The method's DWARF unwinding tables ([`crate::info::CodeInfo::eh_frame`]),
    /// if its host gave them: JIT code only. The agent's mixed unwinder steps
    /// through a JIT frame with them.
    ///
    /// ```
    /// use jitmap::{CodeInfo, ExecutionManager, HeapConfig, JitKind};
    /// use jitmap::info::EhFrame;
    /// let manager = ExecutionManager::new(2);
    /// let heap = manager.create_heap(HeapConfig { span: 1 << 20, ..HeapConfig::default() })?;
    /// let mut r = heap.reserve(16)?;
    /// r.code_mut().fill(0xC3);
    /// let mut info = CodeInfo::new(1, "ret", JitKind::Optimized);
    /// info.eh_frame = Some(EhFrame { frame: vec![0; 4].into(), header: Box::default() });
    /// let code = r.publish(info)?;
    /// let reader = manager.register_reader()?;
    /// let guard = manager.pin(&reader)?;
    /// assert_eq!(guard.find(code.start()).unwrap().eh_frame().unwrap().frame.len(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn eh_frame(&self) -> Option<&'g EhFrame> {
        match self.source {
            Source::Jit { hit, .. } => jit_header(hit).eh_frame(),
            Source::Image { .. } => None,
        }
    }

    /// The method's unwind rules: its `.eh_frame` evaluated into rows by code
    /// offset when it was published (empty without one, and for image
    /// methods), as the agent's handler and the eBPF profiler step with them.
    ///
    /// ```
    /// # use jitmap::{CodeInfo, ExecutionManager, HeapConfig, JitKind};
    /// let manager = ExecutionManager::new(4);
    /// let heap = manager.create_heap(HeapConfig { span: 1 << 20, ..HeapConfig::default() })?;
    /// let mut r = heap.reserve(1)?;
    /// r.code_mut()[0] = 0xC3;
    /// let code = r.publish(CodeInfo::new(1, "f", JitKind::Optimized))?;
    /// let reader = manager.register_reader()?;
    /// let guard = manager.pin(&reader)?;
    /// assert!(guard.find(code.start()).unwrap().unwind_rows().is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn unwind_rows(&self) -> &'g [crate::unwind::UnwindRow] {
        match self.source {
            Source::Jit { hit, .. } => jit_header(hit).unwind_rows(),
            Source::Image { .. } => &[],
        }
    }

    /// The address unwind data is relative to: the heap base or the image base.
    pub fn unwind_base(&self) -> usize {
        match self.source {
            Source::Jit { heap_base, .. } => heap_base,
            Source::Image { image, .. } => image.base(),
        }
    }

    /// The method's native-offset → source rows.
    pub fn debug_info(&self) -> &'g [DebugEntry] {
        match self.source {
            Source::Jit { hit, .. } => jit_header(hit).debug(),
            Source::Image { image, hit } => &image.method(hit.method).debug,
        }
    }

    /// The source row in effect at the address.
    pub fn debug_at(&self) -> Option<&'g DebugEntry> {
        let rows = self.debug_info();
        let i = rows.partition_point(|e| u64::from(e.offset) <= self.offset);
        rows.get(i.checked_sub(1)?)
    }

    /// GC info and its version.
    pub fn gc_info(&self) -> Option<&'g GcInfo> {
        match self.source {
            Source::Jit { hit, .. } => jit_header(hit).gc(),
            Source::Image { image, hit } => image.method(hit.method).gc.as_ref(),
        }
    }

    /// The tier that produced the code.
    pub fn jit_kind(&self) -> JitKind {
        match self.source {
            Source::Jit { hit, .. } => jit_header(hit).kind(),
            Source::Image { .. } => JitKind::Precompiled,
        }
    }

    /// Whether the block is JIT code (in a heap) rather than a precompiled
    /// image's method. A JIT block's start and the time it was found identify
    /// the published version exactly: the code events say which version was
    /// placed at that start last before then (see [`crate::agent`]).
    pub fn is_jit(&self) -> bool {
        matches!(self.source, Source::Jit { .. })
    }

    /// The method's name; `None` for an image method published without one.
    pub fn name(&self) -> Option<&'g str> {
        match self.source {
            Source::Jit { hit, .. } => Some(jit_header(hit).name()),
            Source::Image { image, hit } => {
                let name = image.method(hit.method).name.as_str();
                (!name.is_empty()).then_some(name)
            }
        }
    }
}
