//! The one place leaklab reads `/proc` and the cgroup memory files: what the kernel says about a
//! process's memory, its descendants, the machine, and a container's limit.
//!
//! Both sides of the libtorch line read these (the probes and the service about themselves, the
//! instrument about a user's process), so they live here, in a crate of std and libc alone that
//! either side may depend on without pulling libtorch into the instrument's tree.
//!
//! Reads return what the kernel said, in bytes; each caller words its own failure, since only
//! it knows what the user should do about a process that is gone or a file it may not read.

use std::io;
use std::path::{Path, PathBuf};

/// Resident set size of this process, from `/proc/self/statm` (cheap: no walk of the mappings,
/// unlike `smaps_rollup`, so a service can read it every few requests).
pub fn rss_of_self() -> io::Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    let resident_pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok(resident_pages * page_size())
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(1) as u64
}

/// A process's memory as `/proc/PID/smaps_rollup` sums it, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rollup {
    /// `Rss:` — every resident page, mapped files (libraries) included.
    pub rss: u64,
    /// `Anonymous:` — resident pages backed by no file: the heap, where leaks live.
    pub anonymous: u64,
}

impl std::ops::Add for Rollup {
    type Output = Rollup;
    fn add(self, other: Rollup) -> Rollup {
        Rollup {
            rss: self.rss + other.rss,
            anonymous: self.anonymous + other.anonymous,
        }
    }
}

/// `Rss:` and `Anonymous:` of one `smaps_rollup` text (the kernel writes kB).
pub fn parse_smaps_rollup(text: &str) -> Rollup {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|kb| kb.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    Rollup {
        rss: field("Rss:"),
        anonymous: field("Anonymous:"),
    }
}

/// `/proc/PID/smaps_rollup` of process `pid`.
pub fn smaps_rollup(pid: u32) -> io::Result<Rollup> {
    Ok(parse_smaps_rollup(&std::fs::read_to_string(format!(
        "/proc/{pid}/smaps_rollup"
    ))?))
}

/// `pid` and every descendant, from each thread's `children` list; `pid` first.
pub fn process_tree(pid: u32) -> Vec<u32> {
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) {
            for task in tasks.flatten() {
                if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
                    for child in text
                        .split_whitespace()
                        .filter_map(|c| c.parse::<u32>().ok())
                    {
                        if !tree.contains(&child) {
                            tree.push(child);
                        }
                    }
                }
            }
        }
        i += 1;
    }
    tree
}

/// The machine's memory (`MemTotal:` of `/proc/meminfo`).
pub fn mem_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// The CPU's model name (`/proc/cpuinfo`), for the benchmarks' "measured on" line.
pub fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, name)| name.trim().to_string())
}

/// What this process may grow to: the machine's memory, or its cgroup's limit when lower (v2,
/// else v1, as seen from inside its own cgroup namespace, which is how containers mount them).
pub fn host_capacity() -> Option<u64> {
    let total = mem_total()?;
    let own = [
        Path::new("/sys/fs/cgroup"),
        Path::new("/sys/fs/cgroup/memory"),
    ]
    .into_iter()
    .find_map(|dir| Cgroup::open(dir).ok())
    .and_then(|c| c.limit());
    Some(own.map_or(total, |l| l.min(total)))
}

/// Which memory controller a cgroup folder belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// `memory.current`, `memory.max`, `memory.stat`'s `inactive_file`.
    V2,
    /// `memory.usage_in_bytes`, `memory.limit_in_bytes`, `memory.stat`'s `total_inactive_file`.
    V1,
}

/// A cgroup folder with a memory controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    pub dir: PathBuf,
    pub version: CgroupVersion,
}

/// A cgroup's memory now, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupUsage {
    /// Everything charged to the cgroup, the page cache included.
    pub usage: u64,
    /// Usage less the inactive file cache: what the OOM killer judges.
    pub working_set: u64,
}

impl Cgroup {
    /// The cgroup at `dir`; an error of kind `NotFound` when the folder has neither
    /// `memory.current` (v2) nor `memory.usage_in_bytes` (v1).
    pub fn open(dir: &Path) -> io::Result<Cgroup> {
        let version = if dir.join("memory.current").exists() {
            CgroupVersion::V2
        } else if dir.join("memory.usage_in_bytes").exists() {
            CgroupVersion::V1
        } else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{} has neither memory.current (v2) nor memory.usage_in_bytes (v1)",
                    dir.display()
                ),
            ));
        };
        Ok(Cgroup {
            dir: dir.to_path_buf(),
            version,
        })
    }

    fn file(&self, v2: &str, v1: &str) -> PathBuf {
        self.dir.join(if self.version == CgroupVersion::V2 {
            v2
        } else {
            v1
        })
    }

    /// The memory limit; `None` for none (v2 writes `max`, v1 a number near 2^63).
    pub fn limit(&self) -> Option<u64> {
        read_number(&self.file("memory.max", "memory.limit_in_bytes")).filter(|&l| l < 1 << 60)
    }

    /// Usage and working set now.
    pub fn usage(&self) -> io::Result<CgroupUsage> {
        let path = self.file("memory.current", "memory.usage_in_bytes");
        let usage = read_number(&path).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("cannot read {}", path.display()),
            )
        })?;
        let key = if self.version == CgroupVersion::V2 {
            "inactive_file "
        } else {
            "total_inactive_file "
        };
        let inactive = std::fs::read_to_string(self.dir.join("memory.stat"))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix(key))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            })
            .unwrap_or(0);
        Ok(CgroupUsage {
            usage,
            working_set: usage.saturating_sub(inactive),
        })
    }
}

fn read_number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaps_rollup_fields_are_read_in_bytes() {
        let text = "55d0-7ff [rollup]\nRss:              123456 kB\nPss:              100000 kB\nAnonymous:         65536 kB\n";
        assert_eq!(
            parse_smaps_rollup(text),
            Rollup {
                rss: 123_456 * 1024,
                anonymous: 65_536 * 1024
            }
        );
    }

    #[test]
    fn this_process_reads_as_itself() {
        let me = std::process::id();
        assert_eq!(process_tree(me)[0], me);
        let rollup = smaps_rollup(me).unwrap();
        assert!(
            rollup.rss >= rollup.anonymous && rollup.anonymous > 0,
            "{rollup:?}"
        );
        // statm and smaps_rollup count the same resident pages, read a moment apart.
        let rss = rss_of_self().unwrap();
        assert!(
            rss > 1 << 20 && (rss as f64 / rollup.rss as f64 - 1.0).abs() < 0.5,
            "statm {rss}, smaps_rollup {}",
            rollup.rss
        );
        assert!(smaps_rollup(u32::MAX - 1).is_err());
        assert!(mem_total().unwrap() >= rss);
        assert!(host_capacity().unwrap() <= mem_total().unwrap());
    }

    #[test]
    fn a_cgroup_folder_reads_by_its_version_and_no_limit_is_none() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        assert_eq!(
            Cgroup::open(dir).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        std::fs::write(dir.join("memory.current"), "1000\n").unwrap();
        std::fs::write(dir.join("memory.max"), "max\n").unwrap();
        std::fs::write(dir.join("memory.stat"), "anon 10\ninactive_file 300\n").unwrap();
        let v2 = Cgroup::open(dir).unwrap();
        assert_eq!((v2.version, v2.limit()), (CgroupVersion::V2, None));
        assert_eq!(
            v2.usage().unwrap(),
            CgroupUsage {
                usage: 1000,
                working_set: 700
            }
        );
        std::fs::write(dir.join("memory.max"), "4096\n").unwrap();
        assert_eq!(v2.limit(), Some(4096));
    }
}
