//! Cron expressions for Schedules: five fields (minute hour day-of-month month day-of-week) or
//! one of the `@hourly`-style macros, with the classic cron meaning.
//!
//! Parsing is kept apart from time zones and clocks: the schedule controller asks
//! [`CronSchedule::matches`] about each wall-clock minute in the Schedule's time zone.

use std::fmt;

/// A parsed cron expression: the set of allowed values of each field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronSchedule {
    minutes: u64,
    hours: u64,
    days_of_month: u64,
    months: u64,
    days_of_week: u64,
    /// Cron's rule: when both day fields are restricted, a day matches if EITHER matches.
    day_of_month_any: bool,
    day_of_week_any: bool,
    text: String,
}

struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const MONTH_NAMES: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const DAY_NAMES: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

const FIELDS: [Field; 5] = [
    Field {
        name: "minute",
        min: 0,
        max: 59,
        names: &[],
    },
    Field {
        name: "hour",
        min: 0,
        max: 23,
        names: &[],
    },
    Field {
        name: "day of month",
        min: 1,
        max: 31,
        names: &[],
    },
    Field {
        name: "month",
        min: 1,
        max: 12,
        names: &MONTH_NAMES,
    },
    // 7 is Sunday too, as in most crons.
    Field {
        name: "day of week",
        min: 0,
        max: 7,
        names: &DAY_NAMES,
    },
];

const MACROS: [(&str, &str); 7] = [
    ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
    ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"),
    ("@daily", "0 0 * * *"),
    ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"),
];

const SYNTAX: &str = "expected five fields (minute hour day-of-month month day-of-week) such as \
                      \"0 2 * * *\", or one of @hourly, @daily, @weekly, @monthly, @yearly";

impl CronSchedule {
    pub fn parse(expr: &str) -> Result<CronSchedule, String> {
        let text = expr.trim();
        let invalid = |why: String| format!("{text:?} is not a valid schedule: {why}");
        let expanded = if text.starts_with('@') {
            MACROS
                .iter()
                .find(|(m, _)| m.eq_ignore_ascii_case(text))
                .map(|(_, e)| *e)
                .ok_or_else(|| invalid(format!("unknown macro; {SYNTAX}")))?
        } else {
            text
        };
        let parts: Vec<&str> = expanded.split_whitespace().collect();
        if parts.len() != 5 {
            return Err(invalid(format!("it has {} fields; {SYNTAX}", parts.len())));
        }
        let mut sets = [0u64; 5];
        for ((set, part), field) in sets.iter_mut().zip(&parts).zip(&FIELDS) {
            *set = parse_field(part, field).map_err(invalid)?;
        }
        // Fold day-of-week 7 into 0 (both Sunday).
        if sets[4] & (1 << 7) != 0 {
            sets[4] = (sets[4] & !(1 << 7)) | 1;
        }
        Ok(CronSchedule {
            minutes: sets[0],
            hours: sets[1],
            days_of_month: sets[2],
            months: sets[3],
            days_of_week: sets[4],
            day_of_month_any: parts[2].starts_with('*'),
            day_of_week_any: parts[4].starts_with('*'),
            text: text.to_string(),
        })
    }

    /// Whether the schedule fires at this wall-clock minute. `month` and `day_of_month` count
    /// from 1; `day_of_week` counts from 0 = Sunday.
    pub fn matches(
        &self,
        minute: u32,
        hour: u32,
        day_of_month: u32,
        month: u32,
        day_of_week: u32,
    ) -> bool {
        let has = |set: u64, v: u32| v < 64 && set & (1u64 << v) != 0;
        let dom = has(self.days_of_month, day_of_month);
        let dow = has(self.days_of_week, day_of_week % 7);
        let day = match (self.day_of_month_any, self.day_of_week_any) {
            (false, false) => dom || dow,
            _ => dom && dow,
        };
        has(self.minutes, minute) && has(self.hours, hour) && has(self.months, month) && day
    }
}

impl fmt::Display for CronSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// One field: a comma-separated list of `*`, `N`, `A-B`, each optionally followed by `/STEP`.
fn parse_field(text: &str, field: &Field) -> Result<u64, String> {
    let mut set = 0u64;
    for item in text.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => (range, Some(step)),
            None => (item, None),
        };
        let (lo, hi) = if range == "*" {
            (field.min, field.max)
        } else if let Some((a, b)) = range.split_once('-') {
            let (a, b) = (value(a, field)?, value(b, field)?);
            if a > b {
                return Err(format!("{} range {range:?} runs backwards", field.name));
            }
            (a, b)
        } else {
            let a = value(range, field)?;
            // `5/15` means "from 5, every 15", as in Vixie cron.
            (a, if step.is_some() { field.max } else { a })
        };
        let step = match step {
            None => 1,
            Some(s) => match s.parse::<u32>() {
                Ok(n) if n >= 1 => n,
                _ => {
                    return Err(format!(
                        "{} step {s:?} must be a whole number of at least 1",
                        field.name
                    ));
                }
            },
        };
        let mut v = lo;
        while v <= hi {
            set |= 1 << v;
            v += step;
        }
    }
    Ok(set)
}

/// A number or (for months and days of the week) a three-letter name, checked against the range.
fn value(text: &str, field: &Field) -> Result<u32, String> {
    if let Some(i) = field
        .names
        .iter()
        .position(|n| n.eq_ignore_ascii_case(text))
    {
        return Ok(i as u32 + field.min);
    }
    let names = if field.names.is_empty() {
        String::new()
    } else {
        format!(
            " or {}-{}",
            field.names[0],
            field.names[field.names.len() - 1]
        )
    };
    let out_of_range = || {
        format!(
            "{} {text:?} is out of range; expected {}-{}{names}",
            field.name, field.min, field.max
        )
    };
    match text.parse::<u32>() {
        Ok(v) if (field.min..=field.max).contains(&v) => Ok(v),
        Ok(_) => Err(out_of_range()),
        Err(_) if text.bytes().all(|b| b.is_ascii_digit()) && !text.is_empty() => {
            Err(out_of_range())
        }
        Err(_) => Err(format!(
            "{} {text:?} is not a number; expected {}-{}{names}, '*', ',', '-' or '/N'",
            field.name, field.min, field.max
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_common_expressions() {
        for good in [
            "0 2 * * *",
            "*/15 * * * *",
            "0 9-17 * * mon-fri",
            "30 4 1,15 * *",
            "0 0 * jan,jul 0",
            "0 0 * * 7",
            "5/10 * * * *",
            "@daily",
            "@hourly",
            "@weekly",
            "@monthly",
            "@yearly",
            "@annually",
            "@midnight",
            "  0 2 * * *  ",
        ] {
            assert!(CronSchedule::parse(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn rejects_with_reasons() {
        let cases = [
            ("", "0 fields"),
            ("* * * *", "4 fields"),
            ("* * * * * *", "6 fields"),
            ("60 * * * *", "minute \"60\" is out of range; expected 0-59"),
            ("* 24 * * *", "hour \"24\" is out of range"),
            (
                "* * 0 * *",
                "day of month \"0\" is out of range; expected 1-31",
            ),
            ("* * 32 * *", "day of month"),
            (
                "* * * 13 *",
                "month \"13\" is out of range; expected 1-12 or jan-dec",
            ),
            (
                "* * * * 8",
                "day of week \"8\" is out of range; expected 0-7 or sun-sat",
            ),
            ("* * * * funday", "is not a number"),
            ("*/0 * * * *", "step \"0\""),
            ("10-5 * * * *", "runs backwards"),
            ("@often", "unknown macro"),
            ("1,,2 * * * *", "minute \"\""),
        ];
        for (expr, want) in cases {
            let err = CronSchedule::parse(expr).expect_err(expr);
            assert!(err.contains(want), "{expr}: {err}");
            assert!(err.contains("is not a valid schedule"), "{err}");
        }
    }

    #[test]
    fn matches_minutes() {
        let s = CronSchedule::parse("*/15 2 * * *").unwrap();
        assert!(s.matches(0, 2, 10, 6, 3));
        assert!(s.matches(45, 2, 10, 6, 3));
        assert!(!s.matches(10, 2, 10, 6, 3));
        assert!(!s.matches(0, 3, 10, 6, 3));
    }

    #[test]
    fn day_fields_follow_cron_rules() {
        // Both restricted: the 1st of the month OR any Monday.
        let s = CronSchedule::parse("0 0 1 * mon").unwrap();
        assert!(s.matches(0, 0, 1, 5, 4));
        assert!(s.matches(0, 0, 9, 5, 1));
        assert!(!s.matches(0, 0, 9, 5, 2));
        // Sunday as 7.
        let s = CronSchedule::parse("0 0 * * 7").unwrap();
        assert!(s.matches(0, 0, 3, 1, 0));
        assert!(s.matches(0, 0, 3, 1, 7));
        assert!(!s.matches(0, 0, 3, 1, 6));
    }
}
