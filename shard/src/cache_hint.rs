//! A hint that memory will be read soon, so that a batch of lookups into a
//! large table (the dedup set of an `ack_batch`) waits for its cache misses
//! together rather than one after another.

/// Starts loading the cache line holding `r`.
#[inline]
pub(crate) fn prefetch<T>(r: &T) {
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    // SAFETY: a prefetch has no architectural effect (it cannot fault and
    // changes no register or memory the program sees), and `r` is a live
    // reference in any case. The intrinsic is unsafe only because it takes
    // a raw pointer.
    unsafe {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>((r as *const T).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = r;
}
