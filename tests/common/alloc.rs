//! A global allocator that counts allocations: a test or a benchmark
//! declares it (`#[global_allocator] static GLOBAL: common::alloc::Counting
//! = common::alloc::Counting;`) and reads [`allocations`] around what it
//! measures.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system allocator, counting each allocation.
pub struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator, unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: a pointer this allocator gave, with its layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Allocations so far, in this process (counted only where [`Counting`]
/// is the global allocator).
pub fn allocations() -> usize {
    ALLOCATIONS.load(Ordering::Relaxed)
}
