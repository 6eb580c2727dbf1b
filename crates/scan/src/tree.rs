//! The process tree process by process: each process's anonymous memory and every thread
//! alive, read in the same walk as the summed series, so the diagnosis can say which process
//! grew ("child process 1234 (`python … worker`) +8.9 kB a request, this process +0") and
//! whether memory follows the thread count.

pub use leaklab_judge::tree::{ProcessGrowth, ThreadCount, TreeLook};
use std::collections::BTreeMap;

/// One look at the tree: its resident memory summed (the `rss` and `anonymous` series), its
/// threads in all, each process's anonymous bytes, and, where asked, each child's private dirty
/// bytes. The series and the diagnosis both come from it, so they see the same instant.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TreeReading {
    pub total: leaklab_proc::Rollup,
    pub threads: u64,
    pub anonymous: Vec<(u32, u64)>,
    pub private: Vec<(u32, u64)>,
}

impl TreeReading {
    /// What the judgement reads of it: the processes and threads, not the sums.
    pub fn look(&self) -> TreeLook {
        TreeLook {
            threads: self.threads,
            anonymous: self.anonymous.clone(),
            private: self.private.clone(),
        }
    }
}

/// Reads the tree under `root` now: one walk of its descendants and one
/// [`leaklab_proc::reading`] per process (the cheap `status` where the kernel sums it exactly).
/// An error where `root` itself cannot be read; a child gone between the listing and its read
/// is left out. `private`: also each child's `Private_Dirty` (its `smaps_rollup`, a walk of its
/// mappings): a forked worker's copy-on-write faults turn shared pages private without changing
/// its resident or anonymous sums, so only this shows a worker copying its parent's memory.
///
/// One walk where the series and the diagnosis each used to walk the tree (and the diagnosis
/// read each `status` twice): the process side of a sample took 75-85 µs for the zoo's
/// forward_hook (one process) and 170-216 µs for worker_process (two), 30 and 66 µs now
/// (release build, 2 busy cores, 2026-12-06). The children's private memory, every fourth
/// judged sample, still dominates a tree with a torch child: ~12 ms a walk of worker_process's
/// 512 MB worker, 3.0-3.2 ms a sample averaged.
pub fn try_read(root: u32, private: bool) -> std::io::Result<TreeReading> {
    let mut reading = TreeReading::default();
    for pid in leaklab_proc::process_tree(root) {
        let process = match leaklab_proc::reading(pid, private && pid != root) {
            Ok(process) => process,
            Err(e) if pid == root => return Err(e),
            Err(_) => continue,
        };
        reading.total = reading.total + process.memory;
        reading.threads += process.threads;
        reading.anonymous.push((pid, process.memory.anonymous));
        if let Some(dirty) = process.private_dirty {
            reading.private.push((pid, dirty));
        }
    }
    Ok(reading)
}

/// A process's command line, cut to `max` characters (`[name]` for a kernel thread or a
/// process gone).
pub fn command_line(pid: u32, max: usize) -> String {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let words: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|w| !w.is_empty())
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect();
    let line = if words.is_empty() {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|c| format!("[{}]", c.trim()))
            .unwrap_or_else(|_| "[gone]".into())
    } else {
        words.join(" ")
    };
    if line.chars().count() <= max {
        line
    } else {
        format!("{}…", line.chars().take(max - 1).collect::<String>())
    }
}

/// The command line of every process the readings saw, as the judgement names them.
pub fn commands(readings: &[(u64, TreeReading)]) -> BTreeMap<u32, String> {
    let pids: std::collections::BTreeSet<u32> = readings
        .iter()
        .flat_map(|(_, r)| r.anonymous.iter().map(|(pid, _)| *pid))
        .collect();
    pids.into_iter()
        .map(|pid| (pid, command_line(pid, 60)))
        .collect()
}

/// [`leaklab_judge::tree::judge`] over readings taken here, with their command lines read now.
pub fn judge(
    root: u32,
    readings: &[(u64, TreeReading)],
    warmup: u64,
    floor: f64,
) -> (Vec<ProcessGrowth>, Option<ThreadCount>) {
    let looks: Vec<(u64, TreeLook)> = readings.iter().map(|(x, r)| (*x, r.look())).collect();
    leaklab_judge::tree::judge(root, &looks, &commands(readings), warmup, floor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use leaklab_detect::Verdict;

    #[test]
    fn this_process_reads_with_its_threads_and_a_child_that_grows_is_told_apart() {
        let me = std::process::id();
        let now = try_read(me, true).expect("this process reads");
        assert!(now.threads >= 1 && now.anonymous[0].0 == me, "{now:?}");
        assert!(
            now.private.is_empty(),
            "the root's private memory is not read"
        );
        // The sums are the processes' own: here one process, so its anonymous bytes.
        assert_eq!(now.total.anonymous, now.anonymous[0].1);
        assert!(now.total.rss >= now.total.anonymous, "{now:?}");
        assert!(try_read(u32::MAX - 1, false).is_err());
        // A child: read in the same walk, its private memory too, and counted in the sums.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let with_child = try_read(me, true).expect("this process reads");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(
            with_child.anonymous.iter().any(|(p, _)| *p == child.id())
                && with_child
                    .private
                    .iter()
                    .any(|(p, b)| *p == child.id() && *b > 0),
            "{with_child:?}"
        );
        let summed: u64 = with_child.anonymous.iter().map(|(_, b)| b).sum();
        assert_eq!(with_child.total.anonymous, summed);
        assert!(!command_line(me, 200).is_empty());
        // The root flat, a child climbing 16 kB a request: each judged on its own.
        let readings: Vec<(u64, TreeReading)> = (0..200u64)
            .map(|x| {
                (
                    x,
                    TreeReading {
                        threads: 10 + x / 100,
                        total: Default::default(),
                        anonymous: vec![(7, 300 << 20), (me, (50 << 20) + 16_384 * x)],
                        private: vec![(me, (10 << 20) + 16_384 * x)],
                    },
                )
            })
            .collect();
        let (processes, threads) = judge(7, &readings, 20, 65_536.0);
        assert_eq!(processes[0].pid, 7, "the root first");
        assert_eq!(processes[0].verdict, Some(Verdict::Flat));
        assert_eq!(processes[1].verdict, Some(Verdict::Leak));
        assert!((processes[1].bytes_per_request - 16_384.0).abs() < 1.0);
        assert!(processes[1]
            .line()
            .starts_with(&format!("child process {me} (")));
        assert_eq!(processes[1].measure, "anonymous");
        // Copy-on-write: the child's anonymous memory flat, its private dirty memory climbing.
        let cow: Vec<(u64, TreeReading)> = (0..200u64)
            .map(|x| {
                (
                    x,
                    TreeReading {
                        threads: 10,
                        total: Default::default(),
                        anonymous: vec![(7, 300 << 20), (me, 50 << 20)],
                        private: vec![(me, (10 << 20) + 65_536 * x)],
                    },
                )
            })
            .collect();
        let (processes, _) = judge(7, &cow, 20, 65_536.0);
        assert_eq!(
            (processes[1].verdict, processes[1].measure.as_str()),
            (Some(Verdict::Leak), "private dirty")
        );
        assert_eq!(
            threads,
            Some(ThreadCount {
                first: 10,
                last: 11
            })
        );
    }
}
