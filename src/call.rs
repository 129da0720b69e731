//! Calling published code from Rust with a stated signature, and the call
//! cells that JIT code and hosts call through, so that no host writes its own
//! `transmute`.
//!
//! [`CodeRef::entry`](crate::CodeRef::entry) turns a published block into a
//! function pointer of the signature the host states (the one `unsafe` step:
//! the host vouches that the bytes are such a function). A [`CallCell`] holds
//! a method's current entry: JIT callers load it (`call [cell]`), the host
//! swaps it on tier-up or redefinition, and the old code is freed once every
//! executor has passed a quiescent point (see [`crate::Executor`]).
//!
//! ```
//! # #[cfg(target_arch = "x86_64")] {
//! use jitmap::{CallCell, CodeInfo, ExecutionManager, HeapConfig, JitKind};
//!
//! let manager = ExecutionManager::new(2);
//! let heap = manager.create_heap(HeapConfig { span: 1 << 20, ..HeapConfig::default() })?;
//! let publish = |value: u8| {
//!     let mut r = heap.reserve(6)?;
//!     r.code_mut().copy_from_slice(&[0xB8, value, 0, 0, 0, 0xC3]); // mov eax, value; ret
//!     r.publish(CodeInfo::new(u64::from(value), "answer", JitKind::Optimized))
//! };
//! let tier0 = publish(1)?;
//! // SAFETY: the bytes are a complete C-ABI function taking nothing, returning u32.
//! let cell = CallCell::new(unsafe { tier0.entry::<extern "C" fn() -> u32>() });
//! assert_eq!((cell.get())(), 1);
//! let tier1 = publish(2)?;
//! // SAFETY: as above.
//! cell.set(unsafe { tier1.entry() });
//! assert_eq!((cell.get())(), 2);
//! heap.free(tier0)?; // reused once every executor has passed a quiescent point
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::sync::{AtomicUsize, Ordering, defect};
use std::fmt;
use std::marker::PhantomData;

/// A function pointer type that published code can be called as: `extern
/// "C" fn` (and on x86-64 `extern "sysv64" fn`) of up to six arguments.
///
/// # Safety
/// Implementors are function pointer types, one machine word wide, that any
/// code address can be turned into.
pub unsafe trait FnPtr: Copy + Send + Sync + 'static {
    /// The function pointer for `address`.
    ///
    /// # Safety
    /// `address` is the entry of machine code that follows this type's ABI
    /// and signature, and that stays executable for as long as the pointer is
    /// called.
    unsafe fn from_address(address: usize) -> Self;

    /// The code address.
    fn address(self) -> usize;
}

macro_rules! fn_ptr {
    ($abi:literal: $($arg:ident),*) => {
        // SAFETY: a function pointer of this ABI, one word wide.
        unsafe impl<R: 'static, $($arg: 'static),*> FnPtr for extern $abi fn($($arg),*) -> R {
            #[inline]
            unsafe fn from_address(address: usize) -> Self {
                // SAFETY: function pointers are code addresses of one word;
                // the caller vouches for the code's ABI and signature.
                unsafe { std::mem::transmute::<usize, Self>(address) }
            }

            #[inline]
            fn address(self) -> usize {
                self as usize
            }
        }
    };
}

macro_rules! fn_ptrs {
    ($abi:literal) => {
        fn_ptr!($abi:);
        fn_ptr!($abi: A);
        fn_ptr!($abi: A, B);
        fn_ptr!($abi: A, B, C);
        fn_ptr!($abi: A, B, C, D);
        fn_ptr!($abi: A, B, C, D, E);
        fn_ptr!($abi: A, B, C, D, E, F);
    };
}

fn_ptrs!("C");
#[cfg(target_arch = "x86_64")]
fn_ptrs!("sysv64");

/// A code address with no Rust signature: the entry of a [`CallCell`] that
/// only JIT code calls through ([`CallCell::address`], `jmp [cell]`), such
/// as the cells behind a compiler's trampolines, whose functions have every
/// signature. It has no call operator, so holding any address is sound.
///
/// ```
/// use jitmap::{CallCell, CodeAddress};
///
/// let cell = CallCell::new(CodeAddress::new(0x1000));
/// let old = cell.set(CodeAddress::new(0x2000));
/// assert_eq!((old.get(), cell.get().get()), (0x1000, 0x2000));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeAddress(usize);

impl CodeAddress {
    /// The code at `address`.
    pub const fn new(address: usize) -> Self {
        Self(address)
    }

    /// The address.
    pub const fn get(self) -> usize {
        self.0
    }
}

// SAFETY: one word; it cannot be called from Rust, so any address it holds
// is sound (the JIT code that jumps through its cell vouches for the code).
unsafe impl FnPtr for CodeAddress {
    unsafe fn from_address(address: usize) -> Self {
        Self(address)
    }

    fn address(self) -> usize {
        self.0
    }
}

/// A method's current entry, which callers load and a host swaps: JIT code
/// calls through [`CallCell::address`] (`call qword ptr [cell]`), Rust code
/// through [`CallCell::get`]. One word, so JIT code reads it whole.
#[repr(transparent)]
pub struct CallCell<F: FnPtr> {
    entry: AtomicUsize,
    _signature: PhantomData<F>,
}

impl<F: FnPtr> CallCell<F> {
    /// A cell holding `entry`.
    pub fn new(entry: F) -> Self {
        Self {
            entry: AtomicUsize::new(entry.address()),
            _signature: PhantomData,
        }
    }

    /// The current entry.
    #[inline]
    pub fn get(&self) -> F {
        // Acquire: pairs with `set`'s Release, so the code it names (published
        // before the store) is seen whole.
        let address = self.entry.load(Ordering::Acquire);
        // SAFETY: only `new` and `set` store here, each from an `F`.
        unsafe { F::from_address(address) }
    }

    /// Switches callers to `entry`; returns the entry it replaces. Callers
    /// already inside the old code finish there: free it only after every
    /// executor has passed a quiescent point (the heap's free does wait).
    pub fn set(&self, entry: F) -> F {
        let order = if defect!(RelaxedCellSet) {
            // The seeded defect (loom builds only): no publication.
            Ordering::Relaxed
        } else {
            // Release: the new code was published (written and made
            // executable) before a caller that loads its address can jump to it.
            Ordering::Release
        };
        let old = self.entry.swap(entry.address(), order);
        // SAFETY: the old value was stored by `new` or `set`, from an `F`.
        unsafe { F::from_address(old) }
    }

    /// The cell's own address, for JIT code that calls through it.
    pub fn address(&self) -> usize {
        std::ptr::from_ref(&self.entry).addr()
    }
}

impl<F: FnPtr> fmt::Debug for CallCell<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Relaxed: a snapshot for display.
        let entry = self.entry.load(Ordering::Relaxed);
        f.debug_struct("CallCell")
            .field("entry", &format_args!("{entry:#x}"))
            .finish()
    }
}
