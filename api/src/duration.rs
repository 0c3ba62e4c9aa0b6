//! Human durations such as `30s`, `15m`, `1h30m`, `7d`, `2w`, as written in specs.

use crate::bounds::Quoted;

const EXPECTED: &str = "a duration like 30m, 1h, 1h30m or 7d (units s, m, h, d, w)";

/// Parses a duration into whole seconds.
pub fn parse_duration(s: &str) -> Result<u64, String> {
    let invalid = || format!("expected {EXPECTED}, got {}", Quoted(s));
    let too_long = || format!("duration {} is too long", Quoted(s));
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(invalid());
        }
        let (number, tail) = rest.split_at(digits);
        let unit = tail.chars().next().ok_or_else(invalid)?;
        let seconds_per_unit = match unit {
            's' => 1,
            'm' => 60,
            'h' => 3_600,
            'd' => 86_400,
            'w' => 604_800,
            _ => return Err(invalid()),
        };
        let n: u64 = number.parse().map_err(|_| too_long())?;
        let part = n.checked_mul(seconds_per_unit).ok_or_else(too_long)?;
        total = total.checked_add(part).ok_or_else(too_long)?;
        rest = &tail[unit.len_utf8()..];
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        assert_eq!(parse_duration("30s"), Ok(30));
        assert_eq!(parse_duration("30m"), Ok(1_800));
        assert_eq!(parse_duration("1h"), Ok(3_600));
        assert_eq!(parse_duration("1h30m"), Ok(5_400));
        assert_eq!(parse_duration("7d"), Ok(604_800));
        assert_eq!(parse_duration("2w"), Ok(1_209_600));
        assert_eq!(parse_duration("0s"), Ok(0));
    }

    #[test]
    fn rejects() {
        for bad in [
            "",
            "1",
            "h",
            "1x",
            "1.5h",
            "-1h",
            "1h 30m",
            "1H",
            "99999999999999999999s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_duration("abc").unwrap_err(),
            "expected a duration like 30m, 1h, 1h30m or 7d (units s, m, h, d, w), got \"abc\""
        );
    }
}
