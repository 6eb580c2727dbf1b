//! The one Prometheus call the fleet scan makes: `GET /api/v1/query_range`, over as many
//! windows as the server's 11,000-points-per-series limit needs, merged back per series.
//!
//! What comes back is dirty by nature, and kept as it is: samples the server answers as `NaN`
//! or `±Inf` are dropped and counted; scrape gaps are simply missing timestamps.

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::collections::BTreeMap;

/// The most points Prometheus returns per series in one range query (its own limit is 11,000).
const MAX_POINTS: f64 = 10_000.0;

/// One series over the range: its labels and its finite samples, `(unix seconds, value)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub labels: BTreeMap<String, String>,
    pub points: Vec<(f64, f64)>,
    /// Samples the server returned that were not finite numbers.
    pub dropped: usize,
}

/// A query's time range, in unix seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Range {
    pub start: f64,
    pub end: f64,
    pub step: f64,
}

pub struct Client {
    base: String,
    http: reqwest::Client,
}

#[derive(Deserialize)]
struct Answer<T> {
    status: String,
    #[serde(default = "Option::default")]
    data: Option<Data<T>>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct Data<T> {
    #[serde(rename = "resultType")]
    result_type: String,
    result: Vec<T>,
}

#[derive(Deserialize)]
struct RawSample {
    metric: BTreeMap<String, String>,
    value: (f64, String),
}

#[derive(Deserialize)]
struct RawSeries {
    metric: BTreeMap<String, String>,
    #[serde(default)]
    values: Vec<(f64, String)>,
}

impl Client {
    /// `base` is the server's address, e.g. `https://prometheus:9090`; `http` its trust,
    /// credentials and headers (a managed Prometheus is HTTPS behind a token or basic auth).
    pub fn new(base: &str, http: &leaklab_client::ClientOptions) -> Result<Client> {
        let base = base.trim_end_matches('/').to_string();
        if !base.starts_with("http://") && !base.starts_with("https://") {
            bail!("`{base}` is not a Prometheus address: give its URL, e.g. http://127.0.0.1:9090");
        }
        Ok(Client {
            base,
            http: http.build()?,
        })
    }

    /// `query` evaluated over `range`; the series come back sorted by their labels.
    pub async fn query_range(&self, query: &str, range: Range) -> Result<Vec<Series>> {
        if !(range.step > 0.0 && range.end > range.start) {
            bail!(
                "empty range: start {} end {} step {} s",
                range.start,
                range.end,
                range.step
            );
        }
        let mut merged: BTreeMap<BTreeMap<String, String>, Series> = BTreeMap::new();
        let mut start = range.start;
        while start <= range.end {
            let end = (start + range.step * (MAX_POINTS - 1.0)).min(range.end);
            for raw in self
                .window(
                    query,
                    Range {
                        start,
                        end,
                        step: range.step,
                    },
                )
                .await?
            {
                let series = merged.entry(raw.metric.clone()).or_insert_with(|| Series {
                    labels: raw.metric,
                    points: Vec::new(),
                    dropped: 0,
                });
                for (t, v) in raw.values {
                    // Prometheus writes NaN, +Inf and -Inf as such; parse() reads them, and only
                    // finite numbers are memory.
                    match v.parse::<f64>() {
                        Ok(x) if x.is_finite() => series.points.push((t, x)),
                        _ => series.dropped += 1,
                    }
                }
            }
            start = end + range.step;
        }
        Ok(merged.into_values().collect())
    }

    /// `query` evaluated at `time`: each series' value, finite ones only.
    pub async fn query_instant(
        &self,
        query: &str,
        time: f64,
    ) -> Result<Vec<(BTreeMap<String, String>, f64)>> {
        let found: Vec<RawSample> = self
            .call("query", query, &[("time", time.to_string())], "vector")
            .await?;
        Ok(found
            .into_iter()
            .filter_map(|s| {
                s.value
                    .1
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite())
                    .map(|v| (s.metric, v))
            })
            .collect())
    }

    async fn window(&self, query: &str, range: Range) -> Result<Vec<RawSeries>> {
        let params = [
            ("start", range.start.to_string()),
            ("end", range.end.to_string()),
            ("step", range.step.to_string()),
        ];
        self.call("query_range", query, &params, "matrix").await
    }

    /// `POST /api/v1/{endpoint}` with the query and `params`; the result, of type `expected`.
    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        endpoint: &str,
        query: &str,
        params: &[(&str, String)],
        expected: &str,
    ) -> Result<Vec<T>> {
        let url = format!("{}/api/v1/{endpoint}", self.base);
        let mut form = vec![("query", query.to_string())];
        form.extend(params.iter().cloned());
        let response = self.http.post(&url).form(&form).send().await.map_err(|e| {
            anyhow::anyhow!(
                "cannot reach Prometheus at {}: {}",
                self.base,
                leaklab_client::describe(&e)
            )
        })?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .with_context(|| format!("Prometheus at {} stopped answering", self.base))?;
        if let Some(refused) = leaklab_client::refused(&self.base, status, &body) {
            bail!("Prometheus at {refused}");
        }
        let answer: Answer<T> = serde_json::from_slice(&body).map_err(|e| {
            let head: String = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
            anyhow::anyhow!("{url} answered {status} with something that is not the Prometheus API ({e}): {head}")
        })?;
        if answer.status != "success" {
            bail!(
                "Prometheus refused `{query}`: {} ({})",
                answer.error.unwrap_or_default(),
                answer.error_type.unwrap_or_default()
            );
        }
        let data = answer
            .data
            .context("Prometheus answered success without data")?;
        if data.result_type != expected {
            bail!("`{query}` gave a {} where a {expected} was expected: give an instant-vector expression", data.result_type);
        }
        Ok(data.result)
    }
}
