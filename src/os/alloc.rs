//! The memory allocator of the static (musl) build. musl's own returns a group of small
//! blocks to the kernel as soon as it empties, so a supervisor's short life was dozens of
//! `mmap`/`munmap` pairs, each `munmap` a TLB flush, plus the page faults of mapping the
//! memory again. dlmalloc keeps what is freed for the next allocation; a long-lived
//! process gives back what it no longer uses by calling [`trim`] now and then. Other
//! builds keep their libc's allocator, and [`init`] and [`trim`] do nothing there.

#[cfg(target_env = "musl")]
mod imp {
    use std::alloc::{GlobalAlloc, Layout};
    use std::cell::UnsafeCell;

    use dlmalloc::Dlmalloc;

    /// The process's allocator (see the module).
    pub struct Allocator;

    struct Heap(UnsafeCell<Dlmalloc>);
    struct Lock(UnsafeCell<libc::pthread_mutex_t>);
    // SAFETY: the heap is only reached through `with`, under the lock; the lock is a
    // pthread mutex, made to be shared between threads.
    unsafe impl Sync for Heap {}
    unsafe impl Sync for Lock {}

    static HEAP: Heap = Heap(UnsafeCell::new(Dlmalloc::new()));
    static LOCK: Lock = Lock(UnsafeCell::new(libc::PTHREAD_MUTEX_INITIALIZER));

    fn with<T>(f: impl FnOnce(&mut Dlmalloc) -> T) -> T {
        // SAFETY: the lock makes this the only reference to the heap while `f` runs; `f`
        // is one dlmalloc call, which never allocates through us (no re-entry).
        unsafe {
            libc::pthread_mutex_lock(LOCK.0.get());
            let r = f(&mut *HEAP.0.get());
            libc::pthread_mutex_unlock(LOCK.0.get());
            r
        }
    }

    // SAFETY: each call hands dlmalloc the layout it was given (dlmalloc honours size and
    // alignment, and frees with the layout it allocated with), one call at a time.
    // Not inlined: with LTO, every allocation site got its own copy (+210 KB of binary).
    unsafe impl GlobalAlloc for Allocator {
        #[inline(never)]
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: see the impl.
            with(|h| unsafe { h.malloc(layout.size(), layout.align()) })
        }
        #[inline(never)]
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            // SAFETY: see the impl.
            with(|h| unsafe { h.calloc(layout.size(), layout.align()) })
        }
        #[inline(never)]
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: see the impl; `ptr` came from this allocator with `layout`.
            with(|h| unsafe { h.free(ptr, layout.size(), layout.align()) })
        }
        #[inline(never)]
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: see the impl; `ptr` came from this allocator with `layout`.
            with(|h| unsafe { h.realloc(ptr, layout.size(), layout.align(), new_size) })
        }
    }

    #[global_allocator]
    static ALLOC: Allocator = Allocator;

    extern "C" fn before_fork() {
        // SAFETY: taken by the forking thread, released after the fork on both sides.
        unsafe { libc::pthread_mutex_lock(LOCK.0.get()) };
    }

    extern "C" fn after_fork() {
        // SAFETY: the forking thread holds it (see `before_fork`), in the parent and in the
        // child, whose only thread that is.
        unsafe { libc::pthread_mutex_unlock(LOCK.0.get()) };
    }

    pub fn init() {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: plain function pointers that stay valid for the life of the process.
            unsafe { libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(after_fork)) };
        });
    }

    pub fn trim() {
        // SAFETY: see `with`.
        with(|h| unsafe { h.trim(0) });
    }
}

/// Makes a fork from a threaded process safe for the allocator (the forking thread holds
/// its lock across the fork, so the child never finds it held by a thread it lacks). Call
/// it first thing in `main`.
pub fn init() {
    #[cfg(target_env = "musl")]
    imp::init();
}

/// Gives the kernel back the memory the allocator holds free (for a long-lived process,
/// after a burst); cheap when there is none.
pub fn trim() {
    #[cfg(target_env = "musl")]
    imp::trim();
}
