//! `leaklab judge FILE`: a check's request document (the pytest plugin's series and censuses)
//! read from a file or stdin, judged by [`leaklab_judge::calls`], and answered as a report.

pub use leaklab_judge::calls::*;
use leaklab_report::Report;

/// `leaklab judge`'s answer: the message for people, one line of JSON for the plugin.
#[derive(serde::Serialize)]
#[serde(transparent)]
pub struct Answered(pub JudgeAnswer);

impl Report for Answered {
    fn outcome(&self) -> Outcome {
        self.0.outcome
    }

    fn text(&self) -> String {
        self.0.message.clone()
    }

    fn markdown(&self) -> String {
        self.0.message.clone()
    }

    /// One line: the plugin reads it from a pipe.
    fn json(&self) -> leaklab_report::Result<String> {
        Ok(serde_json::to_string(&self.0)?)
    }
}

/// Reads the request document at `input` (`-` for stdin) and judges it.
pub fn judge_file(input: &std::path::Path) -> anyhow::Result<Answered> {
    use std::io::Read;
    let mut text = Vec::new();
    if input.as_os_str() == "-" {
        std::io::stdin().read_to_end(&mut text)?;
    } else {
        text = std::fs::read(input)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", input.display()))?;
    }
    let request: JudgeRequest =
        serde_json::from_slice(&text).map_err(|e| anyhow::anyhow!("not a judge request: {e}"))?;
    Ok(Answered(judge_request(&request)))
}
