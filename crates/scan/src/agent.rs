//! The agent inside a Python service (`leaklab.asgi.LeaklabDebug`, docs/agent.md): its tensor
//! census, the document `GET /debug/leaklab/tensors` answers (schema `leaklab.census/1`, written
//! once as the Python package's TypedDicts), and the difference between two censuses by holder.
//!
//! A scan with `--agent` takes a census after the warm-up and one at the end: the holders whose
//! bytes grew between them are who keeps what the judged requests left live, named as a Python
//! engineer reads them (`service.HISTORY`, `app.state.responses`). `leaklab judge` diffs the
//! censuses the pytest plugin takes the same way, so both say "who holds it" in one voice.

use anyhow::{bail, Result};
pub use leaklab_judge::agent::*;
use serde::Serialize;

/// `leaklab census-diff`: two census files compared, what the diff says of them.
#[derive(Debug, Clone, Serialize)]
pub struct DiffReport {
    #[serde(flatten)]
    pub diff: CensusDiff,
    /// What one step is in the text ("request", "call").
    #[serde(skip)]
    pub step: String,
    /// Grown holders shown in the text (the JSON has them all).
    #[serde(skip)]
    pub top: usize,
}

impl leaklab_report::Report for DiffReport {
    /// A description, not a judgement: the verdict is the scan's or the judge's.
    fn outcome(&self) -> leaklab_report::Outcome {
        leaklab_report::Outcome::Pass
    }

    fn text(&self) -> String {
        format!(
            "Who holds it (tensor census, {} {}s apart):\n{}",
            self.diff.steps,
            self.step,
            self.diff.text(self.top, &self.step)
        )
    }

    fn markdown(&self) -> String {
        self.diff.markdown(self.top, &self.step)
    }
}

/// Reads a census file (`-` for stdin), saying which file a bad one is.
pub fn read_census(path: &std::path::Path) -> Result<Census> {
    use std::io::Read;
    let mut bytes = Vec::new();
    if path.as_os_str() == "-" {
        std::io::stdin().read_to_end(&mut bytes)?;
    } else {
        bytes = std::fs::read(path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    }
    Census::from_json(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// [`diff`] of two census files, `steps` requests or calls apart.
pub fn diff_files(
    before: &std::path::Path,
    after: &std::path::Path,
    steps: u64,
    step: &str,
    top: usize,
) -> Result<DiffReport> {
    if before.as_os_str() == "-" && after.as_os_str() == "-" {
        bail!("only one of the two censuses can be read from stdin (-)");
    }
    if steps == 0 {
        bail!("--steps is the number of requests or calls between the censuses: at least 1");
    }
    let (b, a) = (read_census(before)?, read_census(after)?);
    Ok(DiffReport {
        diff: diff(&b, &a, steps),
        step: step.to_string(),
        top,
    })
}

/// `GET {base}/stats`, the agent's cheap route: says before any traffic whether the agent is
/// there and lets this client in.
pub async fn check(client: &reqwest::Client, base: &str) -> Result<()> {
    let url = format!("{}/stats", base.trim_end_matches('/'));
    let response = client.get(&url).send().await.map_err(|e| {
        anyhow::anyhow!(
            "the agent at {base} does not answer: {}",
            leaklab_client::describe(&e)
        )
    })?;
    let status = response.status();
    let body = response.bytes().await?;
    if let Some(refused) = leaklab_client::refused(&url, status, &body) {
        bail!(
            "{refused} (the agent answers loopback clients, or a bearer token: see docs/agent.md)"
        );
    }
    if !status.is_success() {
        bail!("{url} answered {status}: is --agent the base of the agent's routes, e.g. http://127.0.0.1:8000/debug/leaklab? ({})", String::from_utf8_lossy(&body[..body.len().min(200)]).trim());
    }
    Ok(())
}

/// `GET {base}/tensors` with the scan's client (its token or credentials, its CA).
pub async fn fetch(client: &reqwest::Client, base: &str) -> Result<Census> {
    let url = format!("{}/tensors", base.trim_end_matches('/'));
    let response = client
        .get(&url)
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("{url}: {}", leaklab_client::describe(&e)))?;
    let status = response.status();
    let body = response.bytes().await?;
    if let Some(refused) = leaklab_client::refused(&url, status, &body) {
        bail!(
            "{refused} (the agent answers loopback clients, or a bearer token: see docs/agent.md)"
        );
    }
    if !status.is_success() {
        bail!(
            "{url} answered {status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(300)]).trim()
        );
    }
    Census::from_json(&body).map_err(|e| anyhow::anyhow!("{url}: {e}"))
}

/// Answers of an agent route, read as JSON; refusals and errors said as [`fetch`] says them.
async fn route(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
) -> Result<serde_json::Value> {
    answer(client.request(method, url), url).await
}

/// The answer of a request built (with a timeout of its own, where it waits on a window).
async fn answer(request: reqwest::RequestBuilder, url: &str) -> Result<serde_json::Value> {
    let response = request
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("{url}: {}", leaklab_client::describe(&e)))?;
    let status = response.status();
    let body = response.bytes().await?;
    if let Some(refused) = leaklab_client::refused(url, status, &body) {
        bail!(
            "{refused} (the agent answers loopback clients, or a bearer token: see docs/agent.md)"
        );
    }
    if !status.is_success() {
        bail!(
            "{url} answered {status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(400)]).trim()
        );
    }
    serde_json::from_slice(&body).map_err(|e| anyhow::anyhow!("{url}: not JSON ({e})"))
}

/// `GET {base}/stats`: the collector's state and the threads alive.
pub async fn stats(client: &reqwest::Client, base: &str) -> Result<Stats> {
    let url = format!("{}/stats", base.trim_end_matches('/'));
    let value = route(client, reqwest::Method::GET, &url).await?;
    serde_json::from_value(value)
        .map_err(|e| anyhow::anyhow!("{url}: a malformed stats answer: {e}"))
}

/// `POST {base}/trim` (opt-in: the service's owner passes `allow_trim=True`).
pub async fn trim(client: &reqwest::Client, base: &str) -> Result<Trim> {
    let url = format!("{}/trim", base.trim_end_matches('/'));
    let value = route(client, reqwest::Method::POST, &url).await?;
    let mut trim: Trim = serde_json::from_value(value.clone())
        .map_err(|e| anyhow::anyhow!("{url}: a malformed trim answer: {e}"))?;
    trim.document = value;
    Ok(trim)
}

/// The longest window an agent's owner may allow a trace (`python_trace_max_seconds`,
/// `native_max_seconds`: at most 600 s, `_MAX_SECONDS` in asgi.py), and a minute more for its
/// snapshots: a trace's own timeout, in place of the request timeout. The scan bounds its wait
/// for the answer itself once the window's requests are sent (`trace_window`).
const WINDOW_CEILING: std::time::Duration = std::time::Duration::from_secs(660);

/// `POST {base}/pytrace?requests=N` (opt-in: `python_trace_max_seconds`, whose ceiling bounds
/// the window): answers when the window ends, so the caller drives its requests meanwhile.
pub async fn pytrace(client: &reqwest::Client, base: &str, requests: usize) -> Result<PyTrace> {
    let url = format!("{}/pytrace?requests={requests}", base.trim_end_matches('/'));
    let value = answer(client.post(&url).timeout(WINDOW_CEILING), &url).await?;
    serde_json::from_value(value)
        .map_err(|e| anyhow::anyhow!("{url}: a malformed Python trace: {e}"))
}

/// `POST {base}/native?requests=N[&seconds=S]` (opt-in: `native_max_seconds`; `seconds` 0:
/// the owner's ceiling): answers when the window ends, so the caller drives the window's
/// requests meanwhile.
pub async fn native(
    client: &reqwest::Client,
    base: &str,
    requests: usize,
    seconds: f64,
) -> Result<Native> {
    // No `seconds` unless asked: the owner's ceiling (`native_max_seconds`) is the default.
    let seconds = if seconds > 0.0 {
        format!("&seconds={seconds}")
    } else {
        String::new()
    };
    let url = format!(
        "{}/native?requests={requests}{seconds}",
        base.trim_end_matches('/')
    );
    let value = answer(client.post(&url).timeout(WINDOW_CEILING), &url).await?;
    serde_json::from_value(value)
        .map_err(|e| anyhow::anyhow!("{url}: a malformed native trace: {e}"))
}
