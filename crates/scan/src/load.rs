//! The load a scan drives: the user's own request bodies (a file, a folder cycled, or stdin),
//! sent as they are or, with `--vary`, with every number in the JSON nudged per request
//! (seeded, reproducible), since caches leak only on new inputs.

use anyhow::{bail, Context, Result};
use leaklab_vocab::SeededRng;
use std::io::Read;
use std::path::Path;

/// The bodies to cycle through, read once.
pub fn read_bodies(sources: &[String]) -> Result<Vec<Vec<u8>>> {
    let mut bodies = Vec::new();
    for source in sources {
        if source == "-" {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("cannot read the request body from stdin")?;
            bodies.push(buf);
            continue;
        }
        let path = Path::new(source);
        if path.is_dir() {
            let mut files: Vec<_> = std::fs::read_dir(path)
                .with_context(|| format!("cannot list {source}"))?
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect();
            files.sort();
            if files.is_empty() {
                bail!("the body folder {source} holds no files");
            }
            for f in files {
                bodies.push(
                    std::fs::read(&f).with_context(|| format!("cannot read {}", f.display()))?,
                );
            }
        } else {
            bodies.push(
                std::fs::read(path)
                    .with_context(|| format!("cannot read the request body {source}"))?,
            );
        }
    }
    Ok(bodies)
}

/// The content type to send where no `--header` names one: `application/json` when every body
/// is JSON, none otherwise (a service reads other bodies by what it expects).
pub fn content_type(bodies: &[Vec<u8>], headers: &[(String, String)]) -> Option<&'static str> {
    let named = headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"));
    let json = !bodies.is_empty()
        && bodies
            .iter()
            .all(|b| serde_json::from_slice::<serde::de::IgnoredAny>(b).is_ok());
    (json && !named).then_some("application/json")
}

/// Body `index` of the cycle, varied when `vary` holds a seed: every JSON number is multiplied
/// by a factor within ±0.1 % drawn from the seed and the index (integers stay integers).
pub fn body(bodies: &[Vec<u8>], index: u64, vary: Option<u64>) -> Result<Vec<u8>> {
    let Some(raw) = bodies.get(index as usize % bodies.len().max(1)) else {
        return Ok(Vec::new());
    };
    let Some(seed) = vary else {
        return Ok(raw.clone());
    };
    let mut value: serde_json::Value = serde_json::from_slice(raw)
        .context("--vary needs JSON bodies (it nudges their numbers)")?;
    let mut rng = SeededRng::new(seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    nudge(&mut value, &mut rng);
    Ok(serde_json::to_vec(&value)?)
}

/// A JSON body's shape: every array of numbers' dimensions, by its path, in order
/// (`inputs: 1×3×97×131`); `None` for a body that is not JSON.
pub fn shape(body: &[u8]) -> Option<String> {
    fn walk(value: &serde_json::Value, path: &str, out: &mut Vec<String>) {
        use serde_json::Value;
        match value {
            Value::Array(items) if is_numeric(value) => {
                let mut dims = vec![items.len()];
                let mut inner = items.first();
                while let Some(Value::Array(next)) = inner {
                    dims.push(next.len());
                    inner = next.first();
                }
                let dims: Vec<String> = dims.iter().map(usize::to_string).collect();
                out.push(format!("{path}: {}", dims.join("×")));
            }
            Value::Array(items) => items
                .iter()
                .enumerate()
                .for_each(|(i, v)| walk(v, &format!("{path}[{i}]"), out)),
            Value::Object(map) => map.iter().for_each(|(k, v)| {
                let path = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                walk(v, &path, out)
            }),
            _ => {}
        }
    }
    /// An array whose innermost first elements are numbers (a tensor as JSON).
    fn is_numeric(value: &serde_json::Value) -> bool {
        match value {
            serde_json::Value::Array(items) => items
                .first()
                .is_some_and(|v| v.is_number() || is_numeric(v)),
            _ => false,
        }
    }
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let mut out = Vec::new();
    walk(&value, "", &mut out);
    Some(out.join(", "))
}

/// The bodies' shapes ([`shape`]), where there are two or more and all are JSON.
pub fn shapes(bodies: &[Vec<u8>]) -> Option<leaklab_judge::evidence::Shapes> {
    if bodies.len() < 2 {
        return None;
    }
    // Distinct shapes, the first few in the order the bodies come (a folder may hold thousands).
    let mut seen = std::collections::HashSet::new();
    let mut examples = Vec::new();
    for b in bodies {
        let s = shape(b)?;
        if seen.insert(s.clone()) && examples.len() < 3 {
            examples.push(s);
        }
    }
    Some(leaklab_judge::evidence::Shapes {
        bodies: bodies.len(),
        distinct: seen.len(),
        examples,
    })
}

fn nudge(value: &mut serde_json::Value, rng: &mut SeededRng) {
    use serde_json::Value;
    match value {
        Value::Number(n) => {
            let unit = rng.symmetric();
            if let Some(f) = n.as_f64().filter(|_| n.is_f64()) {
                if let Some(v) = serde_json::Number::from_f64(f * (1.0 + 1e-3 * unit) + 1e-6 * unit)
                {
                    *n = v;
                }
            } else if let Some(i) = n.as_i64() {
                *n = serde_json::Number::from(i + (unit * 2.0).round() as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| nudge(v, rng)),
        Value::Object(map) => map.values_mut().for_each(|v| nudge(v, rng)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varied_bodies_differ_per_request_and_repeat_per_seed() {
        let bodies = vec![br#"{"inputs": [[0.5, -1.25, 3.0]], "top_k": 5, "name": "x"}"#.to_vec()];
        let a = body(&bodies, 1, Some(7)).unwrap();
        assert_ne!(a, body(&bodies, 2, Some(7)).unwrap());
        assert_eq!(a, body(&bodies, 1, Some(7)).unwrap());
        let v: serde_json::Value = serde_json::from_slice(&a).unwrap();
        assert!((v["inputs"][0][0].as_f64().unwrap() - 0.5).abs() < 1e-3);
        assert_eq!(v["name"], "x");
        assert_eq!(body(&bodies, 1, None).unwrap(), bodies[0]);
        assert!(body(&[b"not json".to_vec()], 0, Some(1))
            .unwrap_err()
            .to_string()
            .contains("--vary needs JSON"));
    }

    #[test]
    fn a_body_s_shape_is_its_arrays_dimensions_and_bodies_are_told_apart_by_it() {
        let image = |h: usize, w: usize| {
            serde_json::to_vec(&serde_json::json!({
                "image": vec![vec![vec![0.5; w]; h]; 3],
                "top_k": 5,
                "meta": {"ids": [1, 2]},
            }))
            .unwrap()
        };
        assert_eq!(
            shape(&image(97, 131)).unwrap(),
            "image: 3×97×131, meta.ids: 2"
        );
        assert_eq!(shape(b"not json"), None);
        let bodies = vec![image(8, 8), image(9, 8), image(8, 8), image(16, 4)];
        let s = shapes(&bodies).unwrap();
        assert_eq!((s.bodies, s.distinct), (4, 3));
        assert_eq!(s.examples[1], "image: 3×9×8, meta.ids: 2");
        assert_eq!(shapes(&bodies[..1]), None, "one body has one shape");
        assert_eq!(shapes(&[image(8, 8), b"x".to_vec()]), None);
    }

    #[test]
    fn json_bodies_go_as_json_unless_a_header_says_otherwise() {
        let json = vec![br#"{"inputs": [[0.1]]}"#.to_vec()];
        assert_eq!(content_type(&json, &[]), Some("application/json"));
        assert_eq!(
            content_type(
                &json,
                &[("Content-Type".into(), "application/x-ndjson".into())]
            ),
            None
        );
        assert_eq!(content_type(&[b"a,b\n1,2".to_vec()], &[]), None);
        assert_eq!(content_type(&[], &[]), None);
    }
}
