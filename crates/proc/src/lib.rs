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

/// A process's resident memory, in bytes (`smaps_rollup`'s or `status`'s two sums).
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
    Rollup {
        rss: smaps_field(text, "Rss:").unwrap_or(0),
        anonymous: smaps_field(text, "Anonymous:").unwrap_or(0),
    }
}

/// One kB field of a `smaps_rollup` text, in bytes.
fn smaps_field(text: &str, name: &str) -> Option<u64> {
    let kb: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix(name))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// `/proc/PID/smaps_rollup` of process `pid`.
pub fn smaps_rollup(pid: u32) -> io::Result<Rollup> {
    Ok(parse_smaps_rollup(&std::fs::read_to_string(format!(
        "/proc/{pid}/smaps_rollup"
    ))?))
}

/// `VmRSS:` and `RssAnon:` of one `/proc/PID/status` text (the kernel writes kB).
/// None where the text has no memory lines: a process that exited and awaits its parent (a
/// zombie) still has a `status`, but no memory left to read.
pub fn parse_status(text: &str) -> Option<Rollup> {
    Some(Rollup {
        rss: status_field(text, "VmRSS:")?,
        anonymous: status_field(text, "RssAnon:")?,
    })
}

fn status_field(text: &str, name: &str) -> Option<u64> {
    let value = text.lines().find_map(|l| l.strip_prefix(name))?;
    let first = value.split_whitespace().next()?;
    // `Threads:` is a count; the memory fields are in kB.
    let n: u64 = first.parse().ok()?;
    Some(if value.trim_end().ends_with("kB") {
        n * 1024
    } else {
        n
    })
}

/// `Threads:` of process `pid`'s `status` text.
fn threads_of_status(pid: u32, text: &str) -> io::Result<u64> {
    status_field(text, "Threads:").ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/proc/{pid}/status has no Threads:"),
        )
    })
}

/// One process as a sampler sees it at one instant: its resident memory, its threads and,
/// where asked, its private dirty memory, each file read once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessReading {
    pub memory: Rollup,
    pub threads: u64,
    /// `Private_Dirty:` of `smaps_rollup`: a forked child's copy-on-write faults turn shared
    /// pages private without changing its resident or anonymous sums.
    pub private_dirty: Option<u64>,
}

/// Process `pid`'s memory and threads from one read of its `status`, plus one of its
/// `smaps_rollup` where the kernel's counters are not exact or `private_dirty` is asked for (a
/// walk of its mappings: 12 to 64 ms for the zoo's forked torch worker, 512 MB resident,
/// against 0.02 ms for `status`, 2 busy cores, 2026-12-06; so callers ask for it sparingly).
///
/// The memory is read the cheapest exact way the kernel offers: the `status` counters where
/// the kernel sums them exactly (Linux 6.16 and later, "mm: fix the inaccurate memory
/// statistics issue for users"), else `smaps_rollup`. Both count the same pages (equal to the
/// kB on 6.18 here), but `smaps_rollup` walks every mapping under the process's mmap lock:
/// 13.7 ms a read for a 520 MB torch service against 0.02 ms for `status` (2026-12-05, 2
/// cores), a cost the scan paid after every answer and the service with it. Older kernels'
/// counters lag by per-CPU (or per-thread) batches of pages, noise a leak judged in kilobytes
/// cannot afford, so there the walk stays. An exited process (a zombie: its `status` has no
/// memory lines) is an error, never 0 bytes.
pub fn reading(pid: u32, private_dirty: bool) -> io::Result<ProcessReading> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let threads = threads_of_status(pid, &status)?;
    let exact = status_is_exact();
    let rollup = if private_dirty || !exact {
        Some(std::fs::read_to_string(format!(
            "/proc/{pid}/smaps_rollup"
        ))?)
    } else {
        None
    };
    let memory = match &rollup {
        Some(text) if !exact => parse_smaps_rollup(text),
        _ => parse_status(&status).ok_or_else(|| exited(pid))?,
    };
    Ok(ProcessReading {
        memory,
        threads,
        private_dirty: rollup
            .filter(|_| private_dirty)
            .and_then(|text| smaps_field(&text, "Private_Dirty:")),
    })
}

fn exited(pid: u32) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("process {pid} has exited (its status has no memory lines)"),
    )
}

/// Whether this kernel's `/proc/PID/status` memory counters are exact sums (Linux >= 6.16).
pub fn status_is_exact() -> bool {
    static EXACT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *EXACT.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .ok()
            .and_then(|r| kernel_at_least(&r, (6, 16)))
            .unwrap_or(false)
    })
}

/// Whether a kernel release such as `6.18.44-fc-v1272` is at least `major.minor`.
fn kernel_at_least(release: &str, (major, minor): (u32, u32)) -> Option<bool> {
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let got_major: u32 = parts.next()?.parse().ok()?;
    let got_minor: u32 = parts.next()?.parse().ok()?;
    Some((got_major, got_minor) >= (major, minor))
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

/// The shared libraries `pid` has mapped: the file names (no folder) of the mappings in
/// `/proc/PID/maps` that name a `.so`, each once, sorted.
pub fn libraries(pid: u32) -> io::Result<Vec<String>> {
    Ok(parse_libraries(&std::fs::read_to_string(format!(
        "/proc/{pid}/maps"
    ))?))
}

/// [`libraries`] from the text of a `maps` file.
pub fn parse_libraries(maps: &str) -> Vec<String> {
    let mut names: Vec<String> = maps
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .filter(|path| path.starts_with('/'))
        .filter_map(|path| path.rsplit('/').next())
        .filter(|name| name.ends_with(".so") || name.contains(".so."))
        .map(str::to_string)
        .collect();
    names.sort();
    names.dedup();
    names
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
    fn the_libraries_mapped_are_named_once_each() {
        let maps = "\
7f00-7f10 r--p 00000000 08:01 1 /venv/torch/lib/libtorch_cpu.so
7f10-7f20 r-xp 00010000 08:01 1 /venv/torch/lib/libtorch_cpu.so
7f20-7f30 r--p 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libc.so.6
7f30-7f40 rw-p 00000000 00:00 0
7f40-7f50 r--p 00000000 08:01 3 /usr/bin/python3.11
7f50-7f60 rw-p 00000000 00:00 0 [heap]
";
        assert_eq!(parse_libraries(maps), ["libc.so.6", "libtorch_cpu.so"]);
        let own = libraries(std::process::id()).unwrap();
        assert!(own.iter().any(|l| l.starts_with("libc.so")), "{own:?}");
    }

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
        assert_eq!(smaps_field(text, "Private_Dirty:"), None);
        let text = format!("{text}Private_Dirty:      2048 kB\n");
        assert_eq!(smaps_field(&text, "Private_Dirty:"), Some(2048 * 1024));
    }

    #[test]
    fn status_fields_are_read_in_bytes_and_kernels_by_release() {
        let text = "Name:\tpython\nVmRSS:\t  519592 kB\nRssAnon:\t  293380 kB\nThreads:\t12\n";
        assert_eq!(
            parse_status(text),
            Some(Rollup {
                rss: 519_592 * 1024,
                anonymous: 293_380 * 1024
            })
        );
        // A zombie's status: no memory lines, so no reading (not zero bytes).
        assert_eq!(
            parse_status("Name:\tpython\nState:\tZ (zombie)\nThreads:\t1\n"),
            None
        );
        assert_eq!(status_field(text, "Threads:"), Some(12));
        assert_eq!(kernel_at_least("6.18.44-fc-v1272", (6, 16)), Some(true));
        assert_eq!(kernel_at_least("6.16.0", (6, 16)), Some(true));
        assert_eq!(kernel_at_least("6.15.9-arch1", (6, 16)), Some(false));
        assert_eq!(kernel_at_least("5.15.0-91-generic", (6, 16)), Some(false));
        assert_eq!(kernel_at_least("garbage", (6, 16)), None);
    }

    #[test]
    fn status_and_smaps_rollup_agree_where_status_is_exact() {
        if !status_is_exact() {
            return; // an older kernel: reading() walks smaps_rollup itself
        }
        // A quiet heap: 64 MB touched and kept, so both reads see the same resident pages.
        let kept = vec![1u8; 64 << 20];
        let me = std::process::id();
        let (a, b) = (
            reading(me, false).unwrap().memory,
            smaps_rollup(me).unwrap(),
        );
        // Read a moment apart: equal to the kB here (6.18) run alone; 1 MiB leaves room for a
        // test beside this one in the same process, and still tells the field read (RssFile
        // or VmSize would miss by tens of MB).
        assert!(a.anonymous.abs_diff(b.anonymous) <= 1 << 20, "{a:?} {b:?}");
        assert!(a.rss.abs_diff(b.rss) <= 1 << 20, "{a:?} {b:?}");
        assert!(a.anonymous >= kept.len() as u64);
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
        // One reading: memory and threads from one status, private memory where asked.
        let one = reading(me, true).unwrap();
        assert!(one.threads >= 1 && one.memory.anonymous > 0, "{one:?}");
        assert!(one.memory.rss >= one.memory.anonymous, "{one:?}");
        assert!(one.private_dirty.is_some_and(|b| b > 0), "{one:?}");
        assert_eq!(reading(me, false).unwrap().private_dirty, None);
        assert!(reading(u32::MAX - 1, false).is_err());
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
