//! Every threshold the judgement applies, in one place. [`HOST_NOISE_FLOOR`] is traced to the
//! corpus of recordings (lab/corpus): its statistic re-derives it from the calibration split and
//! a test fails when the constant falls outside (`leaklab_runner::corpus`). The others were set
//! by hand from readings of the zoo and the lab (the lines above each say which) and are not yet
//! re-derived: the corpus has no subject that exercises them (no repeat phase judged apart from
//! its axis, no trim probe, no census).

/// The least noise a host-memory series (RSS, anonymous memory, a cgroup's, an RSS gauge) is
/// judged against, as the pytest plugin judges anonymous memory: heaps move in glibc's top pad
/// (128 KiB), pymalloc's arenas and first-touched pages of buffers allocated ahead, so a fixed
/// service creeps by hundreds of bytes a request for a while. Measured on the README's fixed
/// app (3 scans of 600 requests, no budget): with a page as the floor the slope's lower bound
/// reached +26 B a request (a plateau only because its tail stopped), at 64 KiB every lower
/// bound was -614 B or below; the smallest leak of docs/scan.md (2 kB of tensors a request, 5.9
/// to 8.1 kB from outside) still read `leak` over 200 judged requests (lower bounds 3.9 and
/// 6.0 kB, 2 runs), and the README's 7.1 kB one with a lower bound of 6.5 kB.
///
/// Set by the corpus's calibration split: at least the smallest floor of a grid of powers of two
/// (4 KiB to 1 MiB) under which no must-pass calibration recording fails at 300, 600 or 1,000
/// judged requests (the collector's garbage left out: real growth until a full collection, no
/// floor tells it from a leak; full collections at both ends do, `--collect`), at most the largest under which the 2 KiB rung is found in 95 % of the
/// calibration recordings at 600 (`leaklab_runner::corpus::host_noise_floor_bounds`). On the
/// 500 recordings of 2026-12-06 both bounds are 64 KiB: 32 KiB fails a must-pass recording,
/// 128 KiB misses 2 KiB leaks.
pub const HOST_NOISE_FLOOR: f64 = 64.0 * 1024.0;

/// Repeats that grow, at the most of their bound (Theil–Sen's, or their rise's where tighter:
/// [`leaklab_detect::NoisyJudgement::rise_high`]), less than this share of what new inputs add (and are not a
/// leak themselves) make the growth per new input: most of it follows new inputs.
/// Checked against the corpus's calibration split (`leaklab_runner::corpus::repeat_share_bounds`):
/// above the largest ratio of the repeats' bound to the new inputs' slope among caches keyed by
/// input (0.01 on 2026-12-07), at most the smallest among leaks per request (1.21); set between,
/// at one half, not fitted.
pub const REPEAT_SHARE: f64 = 0.5;

/// The share of the memory under which a growth is read as the service settling: see [`crate::diagnosis::settled`].
/// Not set by the corpus: it changes the axis of a growth that does not fail, never a verdict,
/// and the corpus's measures (false alarms, leaks found with their axis) read verdicts; set by
/// hand from the zoo's readings (`settled`'s comment).
pub const SETTLED_SHARE: f64 = 0.01;

/// A plateau under this share of the memory that the trim probe shows was free memory the
/// allocator kept is the service settling too (see [`crate::diagnosis::given_back`]). A zoo fixed twin under CI's
/// load rose 3.88 MB (1.1 % of ~350 MB) and its allocator returned 18.2 MB, where the same twin
/// holds 10-19 MB free in every run, flat or not (16 runs); the smallest given-back cause
/// measured rose 1.53 % (glibc's arenas, 9.6 MB). Not set by the corpus: an axis, never a
/// verdict (as [`SETTLED_SHARE`]); set by hand from those readings.
pub const SETTLED_GIVEN_BACK_SHARE: f64 = 0.02;

/// How many times a bounded rise the allocator must return when asked for the growth to count
/// as given back. The probe runs at the scan's end and returns every free byte the allocator
/// kept, the warm-up's and the looks' as well as the judged requests', so a cache that churns
/// returns about its own rise; memory nothing holds returns far more. Measured on the zoo
/// (five runs each, 2026-12-05): a capped per-shape cache returned 0.99 to 1.16 times its judged
/// rise, oneDNN's default cache 0.68 to 0.93 times (the axis, per new input, stands), glibc's
/// arenas on pool threads 8.7 to 11 times. Not set by the corpus: it names the axis of a growth
/// that stopped, never a verdict, and no subject of the corpus is the allocator's to give back;
/// set by hand between those readings.
pub const GIVEN_BACK_SHARE: f64 = 2.0;

/// A failing growth is the collector's garbage where, after the trim probe's full collection
/// and `malloc_trim(0)` before the warm-up and again after the judged requests, the memory
/// kept no more than this share of what its slope says the requests between them added (or no
/// more than its noise floor). Collections free the garbage's objects but leave some of their
/// heap behind (pymalloc's arenas and pages shared with live objects): a service whose only
/// growth is per-request cycles holding 8 KiB tensors (crates/cli/python/tests/
/// cycles_service.py) kept 1.10 and 1.12 kB a request where its slope read 16.8 kB (0.07 of
/// it); the same cycles kept in a list kept 12.6 of 16.8 kB (0.75), and beside a native leak of
/// 8 KiB a request 13.0 of 19.7 kB (0.66). With the first full collection moved before the
/// warm-up (153c0bd), the same services kept 1.66 kB a request over 949 requests (the cycles),
/// 12.8 kB (kept in a list) and 13.3 kB (beside the native leak): the share still parts them.
/// Set by the corpus's calibration split (`leaklab_runner::corpus::garbage_kept_share_bounds`):
/// at least the largest share kept by a must-pass subject that keeps nothing (0.29, cycle-bytes-8k
/// on 2026-12-07: a cycle of 8 KiB `bytes` leaves more heap behind than the tensors did), under
/// the smallest kept by a leak (0.63); midway between, rounded down to a twentieth. A leak smaller
/// than this share of the garbage beside it passes (docs/scan.md says so).
pub const GARBAGE_KEPT_SHARE: f64 = 0.45;

/// The collector's third threshold (gen1 collections between full ones) at or under which its
/// full collections are taken to come at CPython's own cadence: its default, 10 (3.14's
/// incremental collector reports 0). A service that raised it defers full collections as far
/// as it likes, so a full collection forced by the trim probe proves nothing of production.
/// Set by CPython's default, not by a statistic.
pub const FULL_COLLECTION_THRESHOLD: u64 = 10;

/// The fewest blocks a line of the agent's Python trace must have gained a request for its bytes
/// to count as kept by every request: a per-request growth gains at least one block a request
/// (every object is one), while a request in flight at one snapshot and not the other, or a
/// container's table resized, is a block or two in the whole window (the zoo's
/// onnxruntime_arena: 1.34 MB in 2 blocks over 80 requests, a request's input array). Set by
/// hand from the zoo's readings of 2026-12-07 (28 variants): between 2 blocks a window and one
/// a request. Not set by the corpus: its statistic (`leaklab_runner::corpus::traced_blocks_bounds`)
/// reads traces taken between requests, and the `agent` regimes' traces were taken before the
/// trace waited for such a moment; read anyway, they do not separate on blocks alone: must-pass
/// subjects that keep nothing up to 26.2 blocks a request (one request's parsed body in flight)
/// and 1.19 (what `torch.tensor` itself keeps a call), leaks from 0.99. The owner rule weighs
/// the lines' bytes against the growth ([`PYTHON_SHARE`]), which does.
pub const TRACED_BLOCKS_PER_REQUEST: f64 = 0.25;

/// The smallest share of the growth a census must hold for the owner to be Python: a holder
/// of less than a quarter is beside the point (the rest is elsewhere). Checked against the
/// corpus's calibration split (`leaklab_runner::corpus::python_share_bounds`): above the census's
/// share of every leak the C allocator holds (0.00 on 2026-12-07), at most its share of every
/// leak of tensors Python holds (0.49: a 4 KiB tensor kept costs the process about 8.4 kB); set
/// by hand between, before those bounds were measured. On validation a 1 KiB tensor kept read
/// 0.12 (8.4 kB a request for 1 KiB of storage): under the eighth of the rule's second clause.
pub const PYTHON_SHARE: f64 = 0.25;

/// Grown holders under one parent whose names differ only by their digits, at the least, that
/// are read as one container's entries added under generated names
/// ([`crate::agent::siblings`]). Set by what a name can mean, not by a statistic: two such
/// names (`x1`, `x2`) are as often written by hand; three or more grown in one window between
/// two censuses are a name made per request.
pub const SIBLINGS: usize = 3;

/// The least net growth of the tensors reachable from Python (the agent's census, after minus
/// before, over the requests after the judged ones) that makes a host plateau a growth that went
/// on: the census counts storages exactly, so what it sees gained is kept, whatever the pages
/// did. Checked against the corpus's calibration split
/// (`leaklab_runner::corpus::census_growth_bounds`): above the most any must-pass subject's
/// census gained (0 B on 2026-12-07: bounded caches full before the census, garbage collected
/// or not reachable), at most the least a calibration leak of tensors' census gained (the 4 KiB
/// rung over 75 requests, 307.2 kB; on validation the 1 KiB rung's 76.8 kB); set at the host
/// noise floor's size, between them, before the rule was judged on the corpus.
pub const CENSUS_GROWTH: f64 = 64.0 * 1024.0;
