//! Which stage's memory does not come back.
//!
//! The probe keeps live bytes per stage of birth (preprocess, forward, postprocess, telemetry):
//! a block counts against the stage that allocated it until it is freed, whoever frees it. Each
//! stage's series is judged like any other; the growing ones, steepest first, are the culprits.
//! The stage names where the leaked memory was born, which is where to start reading: the code
//! that keeps it alive may sit in a later stage (a history that stores the forward's output).

use crate::verdict::{judge, DetectorConfig, Judgement, Verdict};
use crate::{Result, Sample};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageFinding<L> {
    /// The stage's label: a name, or the caller's own stage type.
    pub stage: L,
    pub judgement: Judgement,
}

/// Judges every stage series and returns the ones that grow (leak or plateau), steepest first.
pub fn attribute<L: Clone>(
    stages: &[(L, Vec<Sample>)],
    config: &DetectorConfig,
) -> Result<Vec<StageFinding<L>>> {
    let mut findings = Vec::new();
    for (stage, samples) in stages {
        let judgement = judge(samples, config)?;
        if judgement.verdict != Verdict::Flat {
            findings.push(StageFinding {
                stage: stage.clone(),
                judgement,
            });
        }
    }
    findings.sort_by(|a, b| {
        let rank = |f: &StageFinding<L>| {
            (
                f.judgement.verdict == Verdict::Leak,
                f.judgement.slope.bytes_per_request,
            )
        };
        rank(b)
            .partial_cmp(&rank(a))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    Ok(findings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stage_that_keeps_its_memory_is_named_first() {
        let flat: Vec<Sample> = (0..50).map(|i| (i, 4096)).collect();
        let small: Vec<Sample> = (0..50).map(|i| (i, 10 * i as i64)).collect();
        let big: Vec<Sample> = (0..50).map(|i| (i, 5000 * i as i64)).collect();
        let stages = vec![("preprocess", small), ("forward", big), ("telemetry", flat)];
        let found = attribute(&stages, &DetectorConfig::exact(5)).unwrap();
        let names: Vec<_> = found.iter().map(|f| f.stage).collect();
        assert_eq!(names, ["forward", "preprocess"]);
    }
}
