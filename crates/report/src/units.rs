//! Bytes and durations as every leaklab report writes them: decimal units, the way the
//! reference scenario is stated (12 GB, 50 MB a request), and durations an operator reads.

/// [`human_bytes`] with its sign always written: a growth, "+16.38 kB", or a fall.
pub fn signed_bytes(bytes: f64) -> String {
    if bytes >= 0.0 {
        format!("+{}", human_bytes(bytes))
    } else {
        human_bytes(bytes)
    }
}

/// Bytes in decimal units (kB, MB, GB), as the reference scenario is stated.
pub fn human_bytes(bytes: f64) -> String {
    let abs = bytes.abs();
    let (value, unit) = match abs {
        a if a >= 1e9 => (bytes / 1e9, "GB"),
        a if a >= 1e6 => (bytes / 1e6, "MB"),
        a if a >= 1e3 => (bytes / 1e3, "kB"),
        _ => (bytes, "B"),
    };
    if unit == "B" {
        format!("{value:.0} B")
    } else {
        format!("{value:.2} {unit}")
    }
}

/// A duration as an operator reads it: days past two days, hours past two hours, then minutes.
pub fn human_duration(seconds: f64) -> String {
    match seconds {
        s if s >= 2.0 * 86400.0 => format!("{:.1} days", s / 86400.0),
        s if s >= 7200.0 => format!("{:.1} h", s / 3600.0),
        s if s >= 120.0 => format!("{:.0} min", s / 60.0),
        s => format!("{s:.0} s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_switch_unit_at_each_thousand_and_keep_their_sign() {
        assert_eq!(human_bytes(0.0), "0 B");
        assert_eq!(human_bytes(999.0), "999 B");
        assert_eq!(human_bytes(1000.0), "1.00 kB");
        assert_eq!(human_bytes(16_384.0), "16.38 kB");
        assert_eq!(human_bytes(50e6), "50.00 MB");
        assert_eq!(human_bytes(2_147_483_648.0), "2.15 GB");
        assert_eq!(
            human_bytes(-81_920.0),
            "-81.92 kB",
            "a shrinking series reads as such"
        );
    }

    #[test]
    fn durations_read_in_the_unit_an_operator_would_say() {
        assert_eq!(human_duration(59.6), "60 s");
        assert_eq!(human_duration(119.0), "119 s");
        assert_eq!(human_duration(120.0), "2 min");
        assert_eq!(
            human_duration(43_520.0),
            "12.1 h",
            "the reference scenario's OOM"
        );
        assert_eq!(human_duration(7.0 * 86400.0), "7.0 days");
    }
}
