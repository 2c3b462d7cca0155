//! Zeroed, page-aligned memory: what a provider allocates for [`crate::Pd::register`], and
//! what an application maps on huge pages to register with [`crate::Pd::register_raw`].

use std::ptr::NonNull;

/// Bytes of a page (the granularity and alignment of [`Pages`]).
pub(crate) const PAGE: usize = 4096;
/// Bytes of a huge page ([`Pages::huge`]: `MAP_HUGETLB`'s default size on x86-64).
pub const HUGE_PAGE: usize = 2 << 20;

/// An anonymous private mapping of whole pages, unmapped when dropped. The kernel zeroes the
/// pages as it maps them (`MAP_POPULATE`), where an aligned `alloc_zeroed` clears every byte
/// in the allocating thread's own instructions; they are all there when the mapping is made,
/// so a worker that uses them later takes no page fault (which can sleep) on its loop.
///
/// Drop every registration over it first: the device may reach the pages until then.
#[derive(Debug)]
pub struct Pages {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; it hands out raw pointers only, and
// whoever writes through them synchronizes as a region's contract says.
unsafe impl Send for Pages {}
// SAFETY: as above (`&Pages` reads only its pointer and length).
unsafe impl Sync for Pages {}

impl Pages {
    /// `len` bytes (`len > 0`), rounded up to whole pages, zeroed.
    pub fn new(len: usize) -> std::io::Result<Pages> {
        Pages::map(len, PAGE, 0)
    }

    /// `len` bytes on huge pages, rounded up to whole ones ([`HUGE_PAGE`]), zeroed; fails
    /// unless the host reserved them (`vm.nr_hugepages`).
    pub fn huge(len: usize) -> std::io::Result<Pages> {
        Pages::map(len, HUGE_PAGE, libc::MAP_HUGETLB)
    }

    fn map(len: usize, page: usize, flags: libc::c_int) -> std::io::Result<Pages> {
        let len = len
            .max(1)
            .checked_next_multiple_of(page)
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOMEM))?;
        // SAFETY: an anonymous private mapping: no file, no address hint; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE | flags,
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

    /// The first byte (valid for reads and writes of [`Pages::len`] bytes while `self` lives).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes mapped (whole pages).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it maps nothing (never: a mapping has at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; its owner dropped every
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
        assert_eq!(p.as_ptr() as usize % PAGE, 0);
        assert_eq!(p.len(), 2 * PAGE);
        // SAFETY: inside the mapping, which lives to the end of the test.
        let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), p.len()) };
        assert!(bytes.iter().all(|&b| b == 0));
        assert!(Pages::new(usize::MAX).is_err(), "a size past the address space is refused");
    }
}
