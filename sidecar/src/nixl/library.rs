//! Finding NIXL at run time. nixl-sys (feature `stub-api`) dlopens `libnixl_capi.so` by
//! name on its first call, so the library comes from `LD_LIBRARY_PATH`, or from
//! `--nixl-lib-dir`: loaded here first by its full path, the dynamic loader then hands
//! nixl-sys that copy (same soname). The wheel's libraries find their own dependencies
//! and NIXL its plugins (`plugins/` beside it) relative to themselves.

use std::ffi::CString;
use std::path::Path;
use std::sync::OnceLock;

/// The C API's file name, as nixl-sys opens it.
const CAPI: &str = "libnixl_capi.so";

/// Whether NIXL's library is loaded (from `dir` first, when given). Decided once per
/// process: nixl-sys decides once too.
pub fn load(dir: Option<&Path>) -> bool {
    static LOADED: OnceLock<bool> = OnceLock::new();
    *LOADED.get_or_init(|| {
        if let Some(dir) = dir {
            open(&dir.join(CAPI));
        }
        !nixl_sys::is_stub()
    })
}

/// Loads `path` for the process, keeping it loaded; a failure is only logged (nixl-sys
/// may still find the library on the loader's path).
fn open(path: &Path) {
    let Ok(name) = CString::new(path.as_os_str().as_encoded_bytes()) else {
        return;
    };
    // SAFETY: `name` is a valid C string; the handle is deliberately never closed, so
    // the library stays loaded for nixl-sys's own dlopen of the same soname.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns a C string owned by the loader, or null.
        let why = unsafe { libc::dlerror() };
        let why = if why.is_null() {
            "unknown".into()
        } else {
            unsafe { std::ffi::CStr::from_ptr(why) }.to_string_lossy()
        };
        tracing::warn!(path = %path.display(), %why, "--nixl-lib-dir: NIXL did not load");
    }
}
