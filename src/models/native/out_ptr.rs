//! A view of an output buffer that the thread team's jobs write in disjoint parts at once.

use std::marker::PhantomData;

/// A raw view of `&'a mut [T]` (f32 unless said otherwise) that can be copied to several
/// threads.
///
/// It borrows the buffer mutably for `'a`, so the buffer outlives every copy and nothing else
/// touches it meanwhile; it is `Copy` so that each job holds one. Writing through it is
/// `unsafe`: the caller promises that no two threads touch the same element at once (each job
/// owns its own columns or slots).
pub struct OutPtr<'a, T = f32> {
    ptr: *mut T,
    len: usize,
    _buffer: PhantomData<&'a mut [T]>,
}

// SAFETY: an `OutPtr` is a `&mut [T]` shared out in disjoint parts; every access goes through
// `write` or `slice`, whose callers promise that no element is touched by two threads at once.
unsafe impl<T: Send> Send for OutPtr<'_, T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for OutPtr<'_, T> {}

// (Written out rather than derived: a derive would ask `T: Copy` of the pointer's target.)
impl<T> Clone for OutPtr<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for OutPtr<'_, T> {}

impl<'a, T> OutPtr<'a, T> {
    /// Views `out` for as long as it is borrowed.
    pub fn new(out: &'a mut [T]) -> Self {
        Self { ptr: out.as_mut_ptr(), len: out.len(), _buffer: PhantomData }
    }

    /// Elements in the view.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty view.
    #[cfg_attr(not(feature = "bench-internals"), allow(dead_code))]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Writes element `i` (panics if `i` is out of bounds).
    ///
    /// # Safety
    /// No other thread may read or write element `i` at the same time.
    pub unsafe fn write(self, i: usize, value: T) {
        assert!(i < self.len, "OutPtr::write out of bounds");
        // SAFETY: `i` is in bounds of the borrowed buffer; the caller rules out a data race.
        unsafe { *self.ptr.add(i) = value };
    }

    /// The elements `start..start + len` as a slice (panics if out of bounds).
    ///
    /// # Safety
    /// No other thread, and no other slice or write through a copy of this view, may touch
    /// these elements while the slice lives.
    pub unsafe fn slice(self, start: usize, len: usize) -> &'a mut [T] {
        assert!(start.checked_add(len).is_some_and(|end| end <= self.len), "OutPtr::slice out of bounds");
        // SAFETY: the range is in bounds of the buffer, borrowed for 'a; the caller rules out
        // any other access to it while the slice lives.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }

    /// The start of the buffer, for the kernels' stores.
    pub(crate) fn as_ptr(self) -> *mut T {
        self.ptr
    }
}
