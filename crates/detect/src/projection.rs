//! Time to exhaustion: from a slope to "OOM after N requests, H hours".
//!
//! The reference scenario: a container starts at 12 GB of VRAM on an 80 GB card and leaks
//! 50 MB per request (decimal units, as the story gives them, everywhere it is told). Headroom
//! is 68 GB, so the card is full after 68 GB / 50 MB = 1,360 requests. At one request every 32 s
//! that is 43,520 s, 12.1 hours: the OOM of the story.

use serde::{Deserialize, Serialize};

/// A device or container: where memory starts, where it ends, how fast requests arrive.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Scenario {
    pub start_bytes: f64,
    pub capacity_bytes: f64,
    pub seconds_per_request: f64,
}

/// How long until `capacity_bytes` is reached.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Projection {
    pub headroom_bytes: f64,
    /// Whole requests that still fit (the next one would cross the capacity).
    pub requests: u64,
    pub seconds: f64,
}

impl Projection {
    pub fn hours(&self) -> f64 {
        self.seconds / 3600.0
    }
}

pub const GB: f64 = 1e9;
pub const MB: f64 = 1e6;

impl Scenario {
    /// 12 GB in use at start, an 80 GB card, one request every 32 s (decimal units).
    pub const REFERENCE: Scenario = Scenario {
        start_bytes: 12.0 * GB,
        capacity_bytes: 80.0 * GB,
        seconds_per_request: 32.0,
    };

    /// `None` when the slope is not positive: no growth, no OOM.
    pub fn project(&self, bytes_per_request: f64) -> Option<Projection> {
        // NaN is not positive either.
        if bytes_per_request.is_nan() || bytes_per_request <= 0.0 {
            return None;
        }
        let headroom_bytes = (self.capacity_bytes - self.start_bytes).max(0.0);
        // The tiny epsilon keeps 68e9 / 50e6 = 1360 from flooring to 1359 through rounding.
        let requests = (headroom_bytes / bytes_per_request * (1.0 + 1e-12)).floor() as u64;
        Some(Projection {
            headroom_bytes,
            requests,
            seconds: requests as f64 * self.seconds_per_request,
        })
    }

    /// The inverse: from an observed slope and time to OOM, the seconds between requests that
    /// explain them (`None` when the slope is not positive or the time is not).
    pub fn implied_seconds_per_request(
        &self,
        bytes_per_request: f64,
        seconds_to_oom: f64,
    ) -> Option<f64> {
        let requests = (self.capacity_bytes - self.start_bytes) / bytes_per_request;
        (bytes_per_request > 0.0 && seconds_to_oom > 0.0 && requests > 0.0)
            .then(|| seconds_to_oom / requests)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_scenario_dies_after_about_twelve_hours() {
        let p = Scenario::REFERENCE.project(50.0 * MB).unwrap();
        assert_eq!(p.headroom_bytes, 68.0 * GB);
        assert_eq!(p.requests, 1360);
        assert_eq!(p.seconds, 43_520.0);
        assert!((p.hours() - 12.09).abs() < 0.01, "{}", p.hours());
    }

    #[test]
    fn in_binary_units_it_is_1392_requests() {
        const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
        const MIB: f64 = 1024.0 * 1024.0;
        let binary = Scenario {
            start_bytes: 12.0 * GIB,
            capacity_bytes: 80.0 * GIB,
            seconds_per_request: 32.0,
        };
        assert_eq!(binary.project(50.0 * MIB).unwrap().requests, 1392);
    }

    #[test]
    fn twelve_hours_at_fifty_mb_per_request_means_a_request_every_32_seconds() {
        let s = Scenario::REFERENCE
            .implied_seconds_per_request(50.0 * MB, 43_520.0)
            .unwrap();
        assert!((s - 32.0).abs() < 1e-9, "{s}");
    }

    #[test]
    fn no_growth_no_oom() {
        assert_eq!(Scenario::REFERENCE.project(0.0), None);
        assert_eq!(Scenario::REFERENCE.project(-5.0), None);
        assert_eq!(
            Scenario::REFERENCE.implied_seconds_per_request(0.0, 100.0),
            None
        );
    }
}
