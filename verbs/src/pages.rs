//! The zeroed, page-aligned memory a provider allocates for [`crate::Pd::register`].

use std::ptr::NonNull;

/// Bytes of a page (the granularity and alignment of [`Pages`]).
pub(crate) const PAGE: usize = 4096;

/// An anonymous private mapping of whole pages, unmapped when dropped. The kernel zeroes each
/// page as it is first touched (or pinned, by a registration on a device): nothing is cleared
/// up front, where an aligned `alloc_zeroed` clears every byte in the registering thread.
#[derive(Debug)]
pub(crate) struct Pages {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; it hands out raw pointers only, and
// whoever writes through them synchronizes as the region's contract says.
unsafe impl Send for Pages {}
// SAFETY: as above (`&Pages` reads only its pointer and length).
unsafe impl Sync for Pages {}

impl Pages {
    /// `len` bytes (`len > 0`), rounded up to whole pages, zeroed.
    pub(crate) fn new(len: usize) -> std::io::Result<Pages> {
        let len = len
            .max(1)
            .checked_next_multiple_of(PAGE)
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOMEM))?;
        // SAFETY: an anonymous private mapping: no file, no address hint; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast())
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOMEM))?;
        Ok(Pages { ptr, len })
    }

    /// The first byte.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once; its owner dropped every
        // registration over it first.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_zeroed_aligned_and_whole() {
        let p = Pages::new(5000).unwrap();
        assert_eq!(p.ptr() as usize % PAGE, 0);
        assert_eq!(p.len, 2 * PAGE);
        // SAFETY: inside the mapping, which lives to the end of the test.
        let bytes = unsafe { std::slice::from_raw_parts(p.ptr(), p.len) };
        assert!(bytes.iter().all(|&b| b == 0));
        assert!(Pages::new(usize::MAX).is_err(), "a size past the address space is refused");
    }
}
