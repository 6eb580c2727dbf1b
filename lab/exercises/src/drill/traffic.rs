//! The incident service's traffic, deterministic: what the check replays, and the "captured
//! production" request bodies the briefing hands to `leaklab scan --body`.
//!
//! Request `i` is a batch of [`ROWS`] standardisable rows, except every eighth, a batch of
//! [`RAW_ROWS`] rows of raw, unscaled features from a misbehaving client, which the service must
//! refuse. Every fifth good request repeats the good request three before it (a retry), which
//! any cache in front of the model must answer.

use leaklab_vocab::{InferRequest, SeededRng};
use std::path::Path;

pub const ROWS: usize = 8;
pub const RAW_ROWS: usize = 64;
const FEATURES: usize = super::FEATURES as usize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A good request with an input not seen before.
    New,
    /// A good request repeating an earlier input.
    Repeat,
    /// Raw features to refuse.
    Raw,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub kind: Kind,
    pub rows: usize,
    pub values: Vec<f32>,
}

/// Request `i` of the traffic.
pub fn request(i: usize) -> Request {
    if i % 8 == 7 {
        return Request {
            kind: Kind::Raw,
            rows: RAW_ROWS,
            values: values(0xBAD0_0000 + i as u64, RAW_ROWS, 1000.0),
        };
    }
    let good = i - i / 8;
    let (kind, input) = if good % 5 == 4 {
        (Kind::Repeat, good - 3)
    } else {
        (Kind::New, good)
    };
    Request {
        kind,
        rows: ROWS,
        values: values(input as u64, ROWS, 3.0),
    }
}

fn values(seed: u64, rows: usize, scale: f64) -> Vec<f32> {
    let mut rng = SeededRng::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x1BC1_DE17);
    (0..rows * FEATURES)
        .map(|_| (rng.symmetric() * scale) as f32)
        .collect()
}

/// Request `i` as the JSON body the service takes.
pub fn body(i: usize) -> Vec<u8> {
    let r = request(i);
    let inputs = r.values.chunks(FEATURES).map(<[f32]>::to_vec).collect();
    serde_json::to_vec(&InferRequest { inputs }).expect("a request serialises")
}

/// Bodies captured from production, as a folder `leaklab scan --body` cycles through.
pub const CAPTURED: usize = 16;

/// Writes the [`CAPTURED`] bodies into `dir`.
pub fn write_dir(dir: &Path) -> std::io::Result<()> {
    for i in 0..CAPTURED {
        std::fs::write(dir.join(format!("request-{i:02}.json")), body(i))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_in_eight_is_raw_and_repeats_repeat_a_new_input_three_back() {
        let requests: Vec<Request> = (0..400).map(request).collect();
        assert_eq!(requests.iter().filter(|r| r.kind == Kind::Raw).count(), 50);
        for (i, r) in requests.iter().enumerate() {
            match r.kind {
                Kind::Raw => assert!(r.rows == RAW_ROWS && r.values.iter().any(|v| v.abs() > 50.0)),
                Kind::New => assert!(r.values.iter().all(|v| v.abs() <= 3.0)),
                Kind::Repeat => {
                    let earlier = requests[..i]
                        .iter()
                        .rev()
                        .filter(|e| e.kind != Kind::Raw)
                        .nth(2)
                        .unwrap();
                    assert_eq!(
                        (earlier.kind, &earlier.values),
                        (Kind::New, &r.values),
                        "request {i}"
                    );
                }
            }
        }
        assert_eq!(request(9), request(9));
    }
}
