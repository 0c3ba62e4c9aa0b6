//! Cron expressions for Schedules: five fields (minute hour day-of-month month day-of-week) or
//! one of the `@hourly`-style macros, with the classic cron meaning.
//!
//! Parsing is kept apart from time zones and clocks: the schedule controller asks
//! [`CronSchedule::matches`] about each wall-clock minute in the Schedule's time zone.

use std::fmt;

use crate::bounds::Quoted;

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
        let invalid = |why: String| format!("{} is not a valid schedule: {why}", Quoted(text));
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
        let schedule = CronSchedule {
            minutes: sets[0],
            hours: sets[1],
            days_of_month: sets[2],
            months: sets[3],
            days_of_week: sets[4],
            day_of_month_any: parts[2].starts_with('*'),
            day_of_week_any: parts[4].starts_with('*'),
            text: text.to_string(),
        };
        if !schedule.can_fire() {
            return Err(invalid(format!(
                "it never fires: no month it allows ({}) has a day of the month it allows ({}); \
                 February has at most 29 days, April, June, September and November 30",
                list(schedule.months, &MONTH_NAMES, 1),
                list(schedule.days_of_month, &[], 0)
            )));
        }
        Ok(schedule)
    }

    /// Whether some calendar day matches. Worked out, not searched for: every field is a
    /// non-empty set, so minutes and hours always match somewhere; when both day fields are
    /// restricted a day matches if either does, and every weekday comes round in every month;
    /// otherwise a day must be in the day-of-month set and in the months, and every date that
    /// exists (29 February included, once in four years at most eight apart) falls on every
    /// weekday within a 28-year cycle. So the schedule fires iff some allowed month has an
    /// allowed day of the month that it can hold.
    fn can_fire(&self) -> bool {
        if !self.day_of_month_any && !self.day_of_week_any {
            return true;
        }
        const LONGEST: [u32; 12] = [31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
        (1..=12u32).any(|month| {
            self.months & (1 << month) != 0
                && (1..=LONGEST[month as usize - 1]).any(|day| self.days_of_month & (1 << day) != 0)
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

/// The members of a field's set, by name where the field has names: `feb`, `30,31`.
fn list(set: u64, names: &[&str], first: u32) -> String {
    (0..64u32)
        .filter(|v| set & (1u64 << v) != 0)
        .map(|v| match names.get((v - first.min(v)) as usize) {
            Some(name) if !names.is_empty() => name.to_string(),
            _ => v.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
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
                return Err(format!(
                    "{} range {} runs backwards",
                    field.name,
                    Quoted(range)
                ));
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
                        "{} step {} must be a whole number of at least 1",
                        field.name,
                        Quoted(s)
                    ));
                }
            },
        };
        let mut v = lo;
        while v <= hi {
            set |= 1 << v;
            // A step near u32::MAX overflowed here (`5/4294967295`): past the end is done.
            let Some(next) = v.checked_add(step) else {
                break;
            };
            v = next;
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
            "{} {} is out of range; expected {}-{}{names}",
            field.name,
            Quoted(text),
            field.min,
            field.max
        )
    };
    match text.parse::<u32>() {
        Ok(v) if (field.min..=field.max).contains(&v) => Ok(v),
        Ok(_) => Err(out_of_range()),
        Err(_) if text.bytes().all(|b| b.is_ascii_digit()) && !text.is_empty() => {
            Err(out_of_range())
        }
        Err(_) => Err(format!(
            "{} {} is not a number; expected {}-{}{names}, '*', ',', '-' or '/N'",
            field.name,
            Quoted(text),
            field.min,
            field.max
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
    fn schedules_that_never_fire_are_refused() {
        for never in [
            "0 0 31 2 *",
            "0 0 30,31 feb *",
            "0 0 31 4,6,9,11 *",
            "0 0 30 2 *",
        ] {
            let err = CronSchedule::parse(never).expect_err(never);
            assert!(err.contains("it never fires"), "{never}: {err}");
        }
        let err = CronSchedule::parse("0 0 31 2 *").unwrap_err();
        assert!(err.contains("(feb)") && err.contains("(31)"), "{err}");
        // 29 February comes every four years; both day fields restricted means either.
        for fires in ["0 0 29 2 *", "0 0 31 2 mon", "0 0 31 1-2 *", "0 0 */31 2 *"] {
            assert!(CronSchedule::parse(fires).is_ok(), "{fires}");
        }
    }

    #[test]
    fn a_step_larger_than_the_field_fires_once() {
        let s = CronSchedule::parse("5/4294967295 * * * *").unwrap();
        assert!(s.matches(5, 0, 1, 1, 0));
        assert!(!s.matches(4, 0, 1, 1, 0));
        assert!(!s.matches(0, 0, 1, 1, 0));
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
