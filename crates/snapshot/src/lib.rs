//! Which lines hold the memory, from the pickles PyTorch already writes.
//!
//! `torch.cuda.memory._dump_snapshot()` (after `_record_memory_history`) writes a pickled dict
//! of segments, their blocks with the stack that allocated each, and the allocator's event
//! trace; leaklab's own services write the same format for their CPU memory. This crate reads
//! it ([`pickle`], [`model`]) and answers ([`explain`]): the live memory grouped by allocating
//! stack and named by the first frame in the user's code, what was allocated after a point and
//! never freed, the reserved-but-unallocated bytes per segment, and the difference between two
//! snapshots. [`render`] writes it as a table, markdown or JSON.
//!
//! No libtorch, no Python: it reads the file.

pub mod explain;
pub mod model;
pub mod pickle;
pub mod render;

pub use explain::{diff, explain, Difference, Explanation, Holder, Since, View};
pub use model::Snapshot;

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: {source}")]
    Pickle { path: String, source: pickle::PickleError },
    #[error("{path}: {source}")]
    Format { path: String, source: model::FormatError },
}

pub type Result<T> = std::result::Result<T, Error>;

/// Reads the snapshot at `path` (memory-mapped: the file is not copied into memory).
pub fn load(path: &Path) -> Result<Snapshot> {
    let shown = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| Error::Io { path: shown.clone(), source })?;
    let len = file.metadata().map_err(|source| Error::Io { path: shown.clone(), source })?.len();
    if len == 0 {
        return Err(Error::Pickle { path: shown, source: pickle::PickleError::Truncated(0, 0) });
    }
    // SAFETY: the map is read-only and lives only while the snapshot is decoded; a file that
    // another process truncates meanwhile would fault, which the tools that write snapshots
    // (PyTorch's dump, leaklab's atomic writes) do not do.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| Error::Io { path: shown.clone(), source })?;
    from_bytes(&map).map_err(|e| match e {
        Error::Pickle { source, .. } => Error::Pickle { path: shown.clone(), source },
        Error::Format { source, .. } => Error::Format { path: shown.clone(), source },
        other => other,
    })
}

/// Decodes a snapshot pickle held in memory.
pub fn from_bytes(bytes: &[u8]) -> Result<Snapshot> {
    let value = pickle::parse(bytes).map_err(|source| Error::Pickle { path: "snapshot".into(), source })?;
    Snapshot::from_value(&value).map_err(|source| Error::Format { path: "snapshot".into(), source })
}
