//! Go's `time.ParseDuration` text (`48h0m0s`, `90m`, `1.5h`, `300ms`), which CRD fields written
//! for Go operators carry: HCO's `certConfig` durations, a DataImportCron's `@every` schedule.

/// The seconds a Go duration names (units `h`, `m`, `s`, `ms`, `us`/`µs`, `ns`, combined), or
/// what is wrong with the text. Signs are not accepted: every field that takes one is a length.
pub fn parse_go_duration(text: &str) -> Result<f64, String> {
    if text.is_empty() {
        return Err("empty duration".into());
    }
    let mut seconds = 0.0;
    let mut rest = text;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("{rest:?} has no unit (h, m, s, ms, us, ns)"))?;
        let value: f64 = rest[..num_end]
            .parse()
            .map_err(|_| format!("{:?} is not a number", &rest[..num_end]))?;
        let unit_end = rest[num_end..]
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .map_or(rest.len(), |i| num_end + i);
        let scale = match &rest[num_end..unit_end] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            u => return Err(format!("unknown unit {u:?}")),
        };
        seconds += value * scale;
        rest = &rest[unit_end..];
    }
    Ok(seconds)
}

#[cfg(test)]
mod tests {
    use super::parse_go_duration;

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("48h0m0s"), Ok(172800.0));
        assert_eq!(parse_go_duration("1h30m"), Ok(5400.0));
        assert_eq!(parse_go_duration("1.5h"), Ok(5400.0));
        assert_eq!(parse_go_duration("300ms"), Ok(0.3));
        for bad in ["", "10", "h", "5 days", "1x", "-1h"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
    }
}
