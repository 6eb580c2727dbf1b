//! Atomic file writes: a reader (or a killed run) never sees half a report.

use crate::{Error, Result};
use std::io::Write;
use std::path::Path;

/// Writes `bytes` to a temporary file in the same folder, syncs it, then renames it over `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let failed = |source| Error::Write {
        path: path.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(|source| Error::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut builder = tempfile::Builder::new();
    builder.prefix(".leaklab-").suffix(".tmp");
    // A report is read by others (a CI job's artifacts, a shared folder): the modes a plain
    // write gets (0666 less the umask), not the temporary file's owner-only 0600.
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    let mut tmp = builder.tempfile_in(dir).map_err(failed)?;
    tmp.write_all(bytes).map_err(failed)?;
    tmp.as_file().sync_all().map_err(failed)?;
    tmp.persist(path).map_err(|e| failed(e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_replaces_the_file_whole_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("deep/er/report.json");
        write_atomic(&path, b"first").unwrap();
        write_atomic(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        let names: Vec<String> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["report.json"]);
    }

    #[cfg(unix)]
    #[test]
    fn a_report_gets_the_modes_of_a_plain_write() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("plain"), b"x").unwrap();
        write_atomic(&dir.path().join("report.md"), b"x").unwrap();
        let mode = |name: &str| {
            std::fs::metadata(dir.path().join(name))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("report.md"), mode("plain"));
    }

    #[test]
    fn a_folder_that_cannot_be_made_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a-file"), b"").unwrap();
        let err = write_atomic(&dir.path().join("a-file/report.md"), b"x")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("cannot write ") && err.contains("a-file"),
            "{err}"
        );
    }
}
