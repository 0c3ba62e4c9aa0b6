//! A counting global allocator: every test and run of tb-fuzz measures, per execution, the
//! largest single allocation and the most memory live at once above what was live before, so a
//! hostile input that makes a parser allocate from a claimed length (not from bytes it has) is a
//! finding even when the machine could have satisfied it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The largest single allocation one execution may make.
pub const MAX_SINGLE: usize = 64 << 20;
/// The most memory one execution may hold at once (above what was live before it).
pub const MAX_LIVE: usize = 256 << 20;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);
/// Called (once) when the system refuses an allocation, before the process aborts: the driver
/// saves the input that caused it.
static ON_REFUSED: std::sync::OnceLock<fn(usize)> = std::sync::OnceLock::new();

/// The allocator: the system's, counted.
pub struct Counting;

fn note_alloc(size: usize) {
    let live = LIVE.fetch_add(size, Relaxed) + size;
    PEAK.fetch_max(live, Relaxed);
    LARGEST.fetch_max(size, Relaxed);
}

fn refused(size: usize) {
    if let Some(f) = ON_REFUSED.get() {
        f(size);
    }
}

// SAFETY: every call is forwarded to `System` with the same arguments; the counters are plain
// atomics and never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if p.is_null() {
            refused(layout.size());
        } else {
            note_alloc(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if p.is_null() {
            refused(layout.size());
        } else {
            note_alloc(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if p.is_null() {
            refused(new_size);
        } else {
            LIVE.fetch_sub(layout.size(), Relaxed);
            note_alloc(new_size);
        }
        p
    }
}

/// What one execution allocated.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    pub largest: usize,
    pub peak_above_start: usize,
}

impl Usage {
    /// Why this usage is a finding, if it is.
    pub fn excess(&self) -> Option<String> {
        if self.largest > MAX_SINGLE {
            Some(format!(
                "one allocation of {} bytes (at most {MAX_SINGLE} allowed)",
                self.largest
            ))
        } else if self.peak_above_start > MAX_LIVE {
            Some(format!(
                "{} bytes live at once (at most {MAX_LIVE} allowed)",
                self.peak_above_start
            ))
        } else {
            None
        }
    }
}

/// Runs `f`, measuring its allocations. The counters are global: measure one thing at a time
/// (the replay test runs its cases on one thread).
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, Usage) {
    let start = LIVE.load(Relaxed);
    PEAK.store(start, Relaxed);
    LARGEST.store(0, Relaxed);
    let out = f();
    let usage = Usage {
        largest: LARGEST.load(Relaxed),
        peak_above_start: PEAK.load(Relaxed).saturating_sub(start),
    };
    (out, usage)
}

/// Sets what to do when the system refuses an allocation (the process aborts right after).
pub fn on_refused(f: fn(usize)) {
    let _ = ON_REFUSED.set(f);
}
