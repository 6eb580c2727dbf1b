//! Which lines hold the memory, from the pickles PyTorch already writes.
//!
//! `torch.cuda.memory._dump_snapshot()` (after `_record_memory_history`) writes a pickled dict
//! of segments, their blocks with the stack that allocated each, and the allocator's event
//! trace; leaklab's own services write the same format for their CPU memory. This crate reads
//! it and answers ([`explain()`]): the live memory grouped by allocating stack and named by
//! the first frame in the user's code, what was allocated after a point and never freed, the
//! reserved-but-unallocated bytes per segment, and ([`diff()`]) the difference between two
//! snapshots. [`render`] writes it as a table, markdown or JSON; [`trim`] writes a small
//! snapshot of the top holders and a trace window that PyTorch's memory_viz opens.
//!
//! The modules are layered one way (tidy checks it; docs/architecture.md draws it), each
//! importing only from its own layer and those below:
//! 1. [`pickle`]: the pickle machine, which knows nothing of snapshots;
//! 2. [`model`], `build`, `record`: the typed snapshot and the builder that makes it from the
//!    machine's values (`record` its one-pass reader of blocks and events);
//! 3. [`explain`](mod@explain), [`diff`](mod@diff): the answers;
//! 4. [`trim`], [`render`], [`report`] and this root: files in, files and reports out.
//!
//! No libtorch, no Python: it reads the file.

pub(crate) mod build;
pub mod diff;
pub mod explain;
pub mod model;
pub mod pickle;
pub(crate) mod record;
pub mod render;
pub mod report;
pub mod trim;

pub use build::ReadOptions;
pub use diff::{diff, Difference};
pub use explain::{explain, Explanation, Holder, View};
pub use model::{Since, Snapshot};

use std::path::Path;

/// What went wrong, with the file it was about. The cause is part of the message (not a
/// chained source), so that it is said once however the error is printed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("cannot write {path}: {error} (nothing was written there)")]
    Write { path: String, error: std::io::Error },
    #[error("{path}: {error}")]
    Pickle {
        path: String,
        error: pickle::PickleError,
    },
    #[error("{path}: {error}")]
    Format {
        path: String,
        error: model::FormatError,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

/// Reads the snapshot at `path` (memory-mapped: the file is not copied into memory).
pub fn load(path: &Path) -> Result<Snapshot> {
    load_with(path, &ReadOptions::default())
}

/// Reads the snapshot at `path` with `options`.
pub fn load_with(path: &Path, options: &ReadOptions) -> Result<Snapshot> {
    let shown = path.display().to_string();
    let io = |error| Error::Io {
        path: shown.clone(),
        error,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    if file.metadata().map_err(io)?.len() == 0 {
        return Err(Error::Pickle {
            path: shown,
            error: pickle::PickleError::Truncated(0, 0),
        });
    }
    // SAFETY: the map is read-only and lives only while the snapshot is decoded; a file that
    // another process truncates meanwhile would fault, which the tools that write snapshots
    // (PyTorch's dump, leaklab's atomic writes) do not do.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    // The reader goes through the file once, front to back.
    let _ = map.advise(memmap2::Advice::Sequential);
    read(&map, &shown, options)
}

/// Decodes a snapshot pickle held in memory.
pub fn from_bytes(bytes: &[u8]) -> Result<Snapshot> {
    from_bytes_with(bytes, &ReadOptions::default())
}

/// Decodes a snapshot pickle held in memory, with `options`.
pub fn from_bytes_with(bytes: &[u8], options: &ReadOptions) -> Result<Snapshot> {
    read(bytes, "snapshot", options)
}

fn read(bytes: &[u8], path: &str, options: &ReadOptions) -> Result<Snapshot> {
    build::read(bytes, options).map_err(|e| match e {
        build::ReadError::Pickle(error) => Error::Pickle {
            path: path.into(),
            error,
        },
        build::ReadError::Format(error) => Error::Format {
            path: path.into(),
            error,
        },
    })
}
