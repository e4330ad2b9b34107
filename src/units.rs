//! Units people read and write: byte sizes, Kubernetes quantities, durations, and the short
//! digests the operator stamps on what it applies.

use std::time::Duration;

/// Bytes in binary units with one decimal: `4.4 GiB`, `512 B`.
pub fn human_bytes(n: u64) -> String {
    bytesize::ByteSize::b(n).display().iec().to_string()
}

/// A Kubernetes quantity for memory, rounded up to a tenth of a GiB: `6.9Gi`.
pub fn gi_quantity(bytes: u64) -> String {
    let tenths = (u128::from(bytes) * 10).div_ceil(1 << 30);
    format!("{}.{}Gi", tenths / 10, tenths % 10)
}

/// Bytes of a Kubernetes memory quantity (`16Gi`, `16384Mi`, `17179869184`, `16G`, `1.5Gi`,
/// `1.6e10`). Parsed here rather than with kube_quantity 0.9, which reads `1.5Gi` as 1 GiB.
pub fn parse_quantity(q: &str) -> Option<u64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let factor: f64 = match suffix {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "m" => 1e-3,
        // A decimal exponent: e3, E9, e+3.
        e => match e
            .strip_prefix(['e', 'E'])
            .map(|x| x.strip_prefix('+').unwrap_or(x))
        {
            Some(x) if !x.is_empty() && x.bytes().all(|b| b.is_ascii_digit()) => {
                10f64.powi(x.parse::<i32>().ok()?.min(30))
            }
            _ => return None,
        },
    };
    let n: f64 = num.parse().ok()?;
    let bytes = n * factor;
    (bytes.is_finite() && bytes >= 0.0).then_some(bytes as u64)
}

/// A duration as people write it in flags: `90s`, `5m`, `1h30m`, `250ms`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration such as 90s, 5m or 1h30m");
    let t = s.trim();
    if t.is_empty() || t.starts_with('-') {
        return Err(bad());
    }
    if t.bytes().all(|b| b.is_ascii_digit()) {
        return t.parse().map(Duration::from_secs).map_err(|_| bad());
    }
    humantime::parse_duration(t).map_err(|_| bad())
}

/// A duration as a person reads it in a message: `1m30s`, `30m`, `2h`.
pub fn human_duration(d: Duration) -> String {
    let whole = Duration::from_secs(d.as_secs());
    if whole.is_zero() {
        return "0s".into();
    }
    humantime::format_duration(whole)
        .to_string()
        .replace(' ', "")
}

/// A short, stable digest of `bytes` (16 hex characters of SHA-256), for annotations and keys
/// that say "this is what was applied" without carrying the thing itself.
pub fn digest(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(&sha2::Sha256::digest(bytes)[..8])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_as_flags_write_them() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        for bad in ["", "m", "5x", "-3s", "5m3"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert!(parse_duration("soon").unwrap_err().contains("90s"));
    }

    #[test]
    fn durations_read_without_spaces() {
        assert_eq!(human_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(human_duration(Duration::from_secs(1800)), "30m");
        assert_eq!(human_duration(Duration::from_millis(400)), "0s");
        assert_eq!(human_duration(Duration::from_secs(7200)), "2h");
    }

    #[test]
    fn digests_are_short_and_stable() {
        assert_eq!(digest(b"abc"), "ba7816bf8f01cfea");
        assert_ne!(digest(b"abc"), digest(b"abd"));
    }

    #[test]
    fn quantities_parse_in_every_suffix() {
        assert_eq!(parse_quantity("16Gi"), Some(16 << 30));
        assert_eq!(parse_quantity("16384Mi"), Some(16 << 30));
        assert_eq!(parse_quantity("17179869184"), Some(16 << 30));
        assert_eq!(parse_quantity("16G"), Some(16_000_000_000));
        assert_eq!(parse_quantity("1.5Gi"), Some(3 << 29));
        assert_eq!(parse_quantity("1.6e10"), Some(16_000_000_000));
        assert_eq!(parse_quantity("16E9"), Some(16_000_000_000));
        assert_eq!(parse_quantity("1e+3"), Some(1000));
        assert_eq!(parse_quantity("1e"), None);
        assert_eq!(parse_quantity("lots"), None);
        assert_eq!(parse_quantity("5Qi"), None);
    }

    #[test]
    fn memory_quantities_round_up() {
        assert_eq!(gi_quantity(7 << 30), "7.0Gi");
        assert_eq!(gi_quantity((7 << 30) + 1), "7.1Gi");
        assert!(parse_quantity(&gi_quantity(123_456_789_012)).unwrap() >= 123_456_789_012);
    }

    #[test]
    fn sizes_read_like_a_person_writes_them() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3_993_201_344 + 689_872_288), "4.4 GiB");
        assert_eq!(human_bytes(1 << 40), "1.0 TiB");
    }
}
