//! Native return addresses to function, file and line, when a snapshot is written.
//!
//! The allocator captures bare return addresses (cheap, on every allocation); this module
//! resolves them later, once per distinct address, with the `backtrace` crate (gimli reading
//! the DWARF line tables of each loaded object). An address in an object without line tables
//! (libtorch's wheel ships none) is named by its symbol and placed in its object file, so the
//! snapshot reader can tell torch's frames from the caller's.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

/// One resolved frame; an inlined call yields several for one address, innermost first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedFrame {
    pub name: String,
    pub filename: String,
    pub line: i64,
}

/// Addresses already resolved in this process (code does not move while it runs).
static CACHE: Mutex<Option<HashMap<u64, Vec<ResolvedFrame>>>> = Mutex::new(None);

/// The frames of the return addresses `addresses`, innermost first.
pub fn resolve(addresses: &[u64]) -> Vec<ResolvedFrame> {
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    let cache = cache.get_or_insert_with(HashMap::new);
    let mut out = Vec::new();
    for &addr in addresses {
        out.extend(
            cache
                .entry(addr)
                .or_insert_with(|| resolve_one(addr))
                .iter()
                .cloned(),
        );
    }
    out
}

fn resolve_one(return_addr: u64) -> Vec<ResolvedFrame> {
    // A return address points after the call; the call itself is one byte back.
    let pc = return_addr.saturating_sub(1);
    let mut frames = Vec::new();
    backtrace::resolve(pc as *mut c_void, |symbol| {
        let name = symbol
            .name()
            .map(|n| format!("{n:#}"))
            .unwrap_or_else(|| "??".into());
        let (filename, line) = match (symbol.filename(), symbol.lineno()) {
            (Some(file), line) => (file.display().to_string(), line.unwrap_or(0) as i64),
            (None, _) => (object_of(pc).unwrap_or_else(|| "??".into()), 0),
        };
        frames.push(ResolvedFrame {
            name,
            filename,
            line,
        });
    });
    if frames.is_empty() {
        frames.push(ResolvedFrame {
            name: format!("0x{return_addr:x}"),
            filename: object_of(pc).unwrap_or_else(|| "??".into()),
            line: 0,
        });
    }
    frames
}

/// The shared object (or executable) that holds `pc`.
fn object_of(pc: u64) -> Option<String> {
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables and fills `info`.
    let found = unsafe { libc::dladdr(pc as *const c_void, &mut info) } != 0;
    (found && !info.dli_fname.is_null()).then(|| {
        // SAFETY: dladdr returned a NUL-terminated path owned by the loader.
        let path = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned();
        // The main executable is named as it was started (`target/debug/x`): made absolute,
        // it reads as an object file, not a source, to the snapshot reader.
        std::fs::canonicalize(&path).map_or(path, |p| p.display().to_string())
    })
}
