//! A global allocator that counts allocations: a test or a benchmark
//! declares it (`#[global_allocator] static GLOBAL: common::alloc::Counting
//! = common::alloc::Counting;`) and reads [`allocations`] around what it
//! measures, or [`per_call`] for a call made many times.

use std::alloc::{GlobalAlloc, Layout, System};
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};

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

/// Heap allocations per call of `call` over `n` calls: each call's input
/// is made by `make` before the count and its output dropped after it, so
/// only the call itself is counted.
pub fn per_call<I, O>(n: usize, make: impl FnMut() -> I, mut call: impl FnMut(I) -> O) -> f64 {
    let inputs: Vec<I> = std::iter::repeat_with(make).take(n).collect();
    let mut outputs = Vec::with_capacity(n);
    let before = allocations();
    for input in inputs {
        outputs.push(call(input));
    }
    let counted = allocations() - before;
    drop(outputs);
    counted as f64 / n as f64
}

/// Polls a future that must be ready at once (a probe's answer, which
/// never waits): its output, or a panic naming it.
pub fn ready_now<F: Future>(fut: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(fut).poll(&mut cx) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the probe must answer without waiting"),
    }
}
