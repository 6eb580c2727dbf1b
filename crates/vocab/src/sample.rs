//! One memory sample as plain data: what a service's probes read after a request.
//!
//! The probe crate fills these from libtorch and the driver; everything else only reads them.

use crate::stage::StageBytes;
use serde::{Deserialize, Serialize};

/// The counting CPU allocator's figures: exact, in bytes and blocks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuStats {
    pub live_bytes: i64,
    pub peak_bytes: i64,
    pub live_blocks: i64,
    pub alloc_count: u64,
    pub free_count: u64,
    pub alloc_bytes_total: u64,
}

/// `torch.cuda.memory_stats()`'s aggregate figures, current and peak, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaStats {
    pub allocated_bytes: i64,
    pub allocated_peak_bytes: i64,
    pub reserved_bytes: i64,
    pub reserved_peak_bytes: i64,
    pub active_bytes: i64,
    pub active_peak_bytes: i64,
    pub inactive_split_bytes: i64,
    pub inactive_split_peak_bytes: i64,
    pub num_alloc_retries: i64,
    pub num_ooms: i64,
}

/// GPU memory as the driver (NVML) sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmlReading {
    /// This process's used GPU memory, when the driver reports it.
    pub process_used_bytes: Option<u64>,
    pub device_used_bytes: u64,
    pub device_total_bytes: u64,
}

/// What the probes read at one instant. The CPU allocator figures are exact; RSS and heap are
/// process-wide; CUDA and NVML figures are present only on CUDA hosts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemorySample {
    pub cpu: CpuStats,
    pub rss_bytes: u64,
    pub heap_bytes: u64,
    pub cuda: Option<CudaStats>,
    pub nvml: Option<NvmlReading>,
}

/// Memory after one request, as the service's own probes saw it (`/debug/memory/samples`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestSample {
    pub request: u64,
    pub latency_us: u64,
    /// Live CPU allocator bytes by the stage that allocated them.
    pub stage_live_bytes: StageBytes,
    pub memory: MemorySample,
}
