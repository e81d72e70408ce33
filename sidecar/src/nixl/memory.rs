//! Host memory NIXL reads from or into: its own mapping, so that once unmapped an
//! address a peer kept points at nothing (a stale read faults instead of reading
//! whatever the allocator put there next).

use std::ptr::NonNull;

use nixl_sys::{MemType, MemoryRegion, NixlDescriptor};

/// `len` bytes of anonymous, private host memory, zeroed, unmapped on drop.
#[derive(Debug)]
pub struct HostMemory {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned, and reached only through `&self`/`&mut self`.
unsafe impl Send for HostMemory {}
unsafe impl Sync for HostMemory {}

impl HostMemory {
    pub fn new(len: usize) -> std::io::Result<Self> {
        let len = len.max(1);
        // SAFETY: an anonymous private mapping; no file, no fixed address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast()).ok_or_else(std::io::Error::last_os_error)?;
        Ok(Self { ptr, len })
    }

    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` mapped bytes, initialised (zeroed by the kernel).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

impl MemoryRegion for HostMemory {
    unsafe fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    fn size(&self) -> usize {
        self.len
    }
}

impl NixlDescriptor for HostMemory {
    fn mem_type(&self) -> MemType {
        MemType::Dram
    }

    fn device_id(&self) -> u64 {
        0
    }
}

/// So that payloads read into it become `Bytes` without a copy.
impl AsRef<[u8]> for HostMemory {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}
