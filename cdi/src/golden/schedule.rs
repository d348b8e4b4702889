//! DataImportCron schedules: the 5-field cron syntax CDI accepts (it parses `spec.schedule` with
//! robfig/cron's `ParseStandard`) and the next time a schedule fires. Quarry's own small parser
//! (no crate): minute, hour, day of month, month and day of week; `*`, `?`, numbers, names
//! (`JAN`, `MON`), ranges `a-b`, steps `/n` and lists `a,b`; the descriptors `@yearly`,
//! `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight` and `@hourly`; `@every DURATION`
//! (Go's duration syntax: `90s`, `1h30m`; runs that long after the last poll, rounded to a
//! second) and a `CRON_TZ=ZONE ` (or `TZ=ZONE `) prefix, as robfig/cron's `ParseStandard` reads
//! them. Times are UTC (as CDI's controller runs) unless a zone is given.
//!
//! As in robfig/cron, when both day fields are restricted a day matching either fires; when one
//! is `*` (or `?`), both must match.

use k8s_openapi::jiff::civil::DateTime;
use k8s_openapi::jiff::tz::TimeZone;
use k8s_openapi::jiff::{Timestamp, ToSpan};

use api::duration::parse_go_duration;

/// Why a schedule was refused; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// Not five fields.
    #[error(
        "schedule {schedule:?}: expected 5 fields (minute hour day-of-month month day-of-week), found {found}"
    )]
    FieldCount {
        /// The schedule as written.
        schedule: String,
        /// Fields found.
        found: usize,
    },
    /// A field that cannot be read.
    #[error("schedule {schedule:?}: {field} {value:?}: {problem}")]
    Field {
        /// The schedule as written.
        schedule: String,
        /// `minute`, `hour`, `day-of-month`, `month` or `day-of-week`.
        field: &'static str,
        /// The field as written.
        value: String,
        /// What is wrong.
        problem: String,
    },
    /// An `@` descriptor Quarry does not know.
    #[error("schedule {0:?}: unknown descriptor")]
    Descriptor(String),
    /// `@every` with a duration that cannot be read.
    #[error("schedule {schedule:?}: @every {value:?}: {problem}")]
    Every {
        /// The schedule as written.
        schedule: String,
        /// The duration as written.
        value: String,
        /// What is wrong.
        problem: String,
    },
    /// A `CRON_TZ=`/`TZ=` zone not in the time zone database.
    #[error("schedule {schedule:?}: unknown time zone {zone:?}")]
    Zone {
        /// The schedule as written.
        schedule: String,
        /// The zone as written.
        zone: String,
    },
}

/// One field's bounds and names.
struct FieldSpec {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const FIELDS: [FieldSpec; 5] = [
    FieldSpec {
        name: "minute",
        min: 0,
        max: 59,
        names: &[],
    },
    FieldSpec {
        name: "hour",
        min: 0,
        max: 23,
        names: &[],
    },
    FieldSpec {
        name: "day-of-month",
        min: 1,
        max: 31,
        names: &[],
    },
    FieldSpec {
        name: "month",
        min: 1,
        max: 12,
        names: &[
            "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
        ],
    },
    FieldSpec {
        name: "day-of-week",
        min: 0,
        max: 6,
        names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
    },
];

/// A parsed schedule: one bit set per allowed value of each field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    minute: u64,
    hour: u64,
    dom: u64,
    month: u64,
    dow: u64,
    /// The day-of-month field is `*` or `?` (robfig's star bit).
    dom_any: bool,
    /// The day-of-week field is `*` or `?`.
    dow_any: bool,
    /// `@every`: seconds between runs (the fields are then unused).
    every: Option<i64>,
    /// The zone the fields are read in.
    tz: TimeZone,
}

/// How far ahead [`Schedule::next_after`] looks (robfig/cron gives up after five years too).
const SEARCH_YEARS: i16 = 5;

impl Schedule {
    /// Parses `spec.schedule`.
    pub fn parse(schedule: &str) -> Result<Schedule, ScheduleError> {
        let mut text = schedule.trim();
        let mut tz = TimeZone::UTC;
        if let Some(rest) = text
            .strip_prefix("CRON_TZ=")
            .or_else(|| text.strip_prefix("TZ="))
        {
            let (zone, after) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            tz = TimeZone::get(zone).map_err(|_| ScheduleError::Zone {
                schedule: schedule.into(),
                zone: zone.into(),
            })?;
            text = after.trim();
        }
        if let Some(d) = text.strip_prefix("@every ") {
            let secs = every_secs(d.trim()).map_err(|problem| ScheduleError::Every {
                schedule: schedule.into(),
                value: d.trim().into(),
                problem,
            })?;
            return Ok(Schedule {
                minute: 0,
                hour: 0,
                dom: 0,
                month: 0,
                dow: 0,
                dom_any: false,
                dow_any: false,
                every: Some(secs),
                tz,
            });
        }
        let expanded = match text {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            t if t.starts_with('@') => return Err(ScheduleError::Descriptor(schedule.into())),
            t => t,
        };
        let parts: Vec<&str> = expanded.split_whitespace().collect();
        if parts.len() != 5 {
            return Err(ScheduleError::FieldCount {
                schedule: schedule.into(),
                found: parts.len(),
            });
        }
        let mut bits = [0u64; 5];
        let mut any = [false; 5];
        for (i, (part, spec)) in parts.iter().zip(&FIELDS).enumerate() {
            (bits[i], any[i]) =
                parse_field(part, spec).map_err(|problem| ScheduleError::Field {
                    schedule: schedule.into(),
                    field: spec.name,
                    value: (*part).into(),
                    problem,
                })?;
        }
        Ok(Schedule {
            minute: bits[0],
            hour: bits[1],
            dom: bits[2],
            month: bits[3],
            dow: bits[4],
            dom_any: any[2],
            dow_any: any[4],
            every: None,
            tz,
        })
    }

    fn day_matches(&self, t: &DateTime) -> bool {
        let dom = self.dom & (1 << t.day()) != 0;
        let dow = self.dow & (1 << t.weekday().to_sunday_zero_offset()) != 0;
        if self.dom_any || self.dow_any {
            dom && dow
        } else {
            dom || dow
        }
    }

    /// The first time after `after` (a whole minute, strictly later) the schedule fires; `None`
    /// when it never does within five years (`0 0 30 2 *`).
    pub fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        if let Some(secs) = self.every {
            // robfig/cron's ConstantDelaySchedule: whole seconds after `after`.
            let whole = Timestamp::from_second(after.as_second()).ok()?;
            return whole.checked_add(secs.seconds()).ok();
        }
        let start = after.to_zoned(self.tz.clone()).datetime();
        let mut t = start
            .date()
            .at(start.hour(), start.minute(), 0, 0)
            .checked_add(1.minute())
            .ok()?;
        let limit = start.year() + SEARCH_YEARS;
        while t.year() <= limit {
            if self.month & (1 << t.month()) == 0 {
                t = t
                    .date()
                    .first_of_month()
                    .at(0, 0, 0, 0)
                    .checked_add(1.month())
                    .ok()?;
            } else if !self.day_matches(&t) {
                t = t.date().checked_add(1.day()).ok()?.at(0, 0, 0, 0);
            } else if self.hour & (1 << t.hour()) == 0 {
                t = t.date().at(t.hour(), 0, 0, 0).checked_add(1.hour()).ok()?;
            } else if self.minute & (1 << t.minute()) == 0 {
                t = t.checked_add(1.minute()).ok()?;
            } else {
                return t.to_zoned(self.tz.clone()).ok().map(|z| z.timestamp());
            }
        }
        None
    }
}

/// `@every`'s delay in whole seconds: robfig/cron rounds a delay below a second up to one, and
/// drops fractions.
fn every_secs(text: &str) -> Result<i64, String> {
    let seconds = parse_go_duration(text)?;
    if seconds <= 0.0 {
        return Err("the duration must be positive".into());
    }
    Ok((seconds as i64).max(1))
}

/// One field: a comma-separated list of `*`/`?`/value/range, each with an optional `/step`.
/// Returns the bits and whether the field is unrestricted (`*` or `?` without a step).
fn parse_field(text: &str, spec: &FieldSpec) -> Result<(u64, bool), String> {
    let mut bits = 0u64;
    let mut any = false;
    for item in text.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => {
                let step: u32 = s
                    .parse()
                    .map_err(|_| format!("step {s:?} is not a number"))?;
                if step == 0 {
                    return Err("step must be at least 1".into());
                }
                (r, Some(step))
            }
            None => (item, None),
        };
        let (lo, hi) = if range == "*" || range == "?" {
            any = step.is_none_or(|s| s == 1);
            (spec.min, spec.max)
        } else if let Some((a, b)) = range.split_once('-') {
            (value(a, spec)?, value(b, spec)?)
        } else {
            let v = value(range, spec)?;
            // `N/step` means N to the maximum.
            (v, if step.is_some() { spec.max } else { v })
        };
        if lo > hi {
            return Err(format!("range start {lo} is after its end {hi}"));
        }
        let step = step.unwrap_or(1) as usize;
        for v in (lo..=hi).step_by(step) {
            bits |= 1 << v;
        }
    }
    Ok((bits, any))
}

/// A number or a name within the field's bounds.
fn value(text: &str, spec: &FieldSpec) -> Result<u32, String> {
    let lower = text.to_ascii_lowercase();
    let v = match spec.names.iter().position(|n| *n == lower) {
        Some(i) => i as u32 + spec.min,
        None => text
            .parse::<u32>()
            .map_err(|_| format!("{text:?} is not a number or a name"))?,
    };
    if v < spec.min || v > spec.max {
        return Err(format!("{v} is outside {}-{}", spec.min, spec.max));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn next(schedule: &str, after: &str) -> String {
        Schedule::parse(schedule)
            .unwrap()
            .next_after(at(after))
            .unwrap()
            .to_string()
    }

    #[test]
    fn a_fixed_weekly_time_fires_on_that_weekday() {
        // 2024-05-02 is a Thursday; the next Monday 01:30 is 2024-05-06.
        assert_eq!(
            next("30 1 * * 1", "2024-05-02T10:00:00Z"),
            "2024-05-06T01:30:00Z"
        );
    }

    #[test]
    fn the_next_run_is_strictly_later_and_on_a_whole_minute() {
        assert_eq!(
            next("* * * * *", "2024-05-02T10:00:00Z"),
            "2024-05-02T10:01:00Z"
        );
        assert_eq!(
            next("* * * * *", "2024-05-02T10:00:59.9Z"),
            "2024-05-02T10:01:00Z"
        );
    }

    #[test]
    fn steps_ranges_and_lists_combine() {
        let s = "0-10/5,30 */6 * * *";
        assert_eq!(next(s, "2024-05-02T06:10:00Z"), "2024-05-02T06:30:00Z");
        assert_eq!(next(s, "2024-05-02T06:30:00Z"), "2024-05-02T12:00:00Z");
        // `N/step` runs from N to the maximum.
        assert_eq!(
            next("50/5 * * * *", "2024-05-02T06:56:00Z"),
            "2024-05-02T07:50:00Z"
        );
    }

    #[test]
    fn month_and_day_names_are_accepted_in_any_case() {
        assert_eq!(
            next("0 0 1 Feb *", "2024-05-02T00:00:00Z"),
            "2025-02-01T00:00:00Z"
        );
        assert_eq!(
            next("0 12 * * fri-SAT", "2024-05-02T00:00:00Z"),
            "2024-05-03T12:00:00Z"
        );
    }

    #[test]
    fn two_restricted_day_fields_fire_on_either() {
        // The 15th (a Wednesday) or any Monday.
        assert_eq!(
            next("0 0 15 * 1", "2024-05-07T00:00:00Z"),
            "2024-05-13T00:00:00Z"
        );
        assert_eq!(
            next("0 0 15 * 1", "2024-05-13T00:00:00Z"),
            "2024-05-15T00:00:00Z"
        );
    }

    #[test]
    fn one_unrestricted_day_field_requires_both() {
        // `?` counts as unrestricted: only the 15th.
        assert_eq!(
            next("0 0 15 * ?", "2024-05-07T00:00:00Z"),
            "2024-05-15T00:00:00Z"
        );
    }

    #[test]
    fn descriptors_expand_as_robfig_cron_does() {
        assert_eq!(
            next("@daily", "2024-05-02T10:00:00Z"),
            "2024-05-03T00:00:00Z"
        );
        assert_eq!(
            next("@hourly", "2024-05-02T10:00:00Z"),
            "2024-05-02T11:00:00Z"
        );
        assert_eq!(
            next("@weekly", "2024-05-02T10:00:00Z"),
            "2024-05-05T00:00:00Z"
        );
        assert_eq!(
            next("@yearly", "2024-05-02T10:00:00Z"),
            "2025-01-01T00:00:00Z"
        );
        assert_eq!(Schedule::parse("@monthly"), Schedule::parse("0 0 1 * *"));
    }

    #[test]
    fn every_runs_that_long_after_the_last_poll_in_whole_seconds() {
        assert_eq!(
            next("@every 1h30m", "2024-05-02T10:00:00.7Z"),
            "2024-05-02T11:30:00Z"
        );
        assert_eq!(
            next("@every 90s", "2024-05-02T10:00:00Z"),
            "2024-05-02T10:01:30Z"
        );
        assert_eq!(
            next("@every 10ms", "2024-05-02T10:00:00Z"),
            "2024-05-02T10:00:01Z"
        );
    }

    #[test]
    fn a_cron_tz_prefix_reads_the_fields_in_that_zone() {
        // 01:30 in Berlin (CEST, UTC+2) is 23:30 UTC the day before.
        assert_eq!(
            next("CRON_TZ=Europe/Berlin 30 1 * * *", "2024-05-02T10:00:00Z"),
            "2024-05-02T23:30:00Z"
        );
        assert_eq!(
            Schedule::parse("TZ=UTC 0 0 * * *"),
            Schedule::parse("0 0 * * *")
        );
    }

    #[test]
    fn a_leap_day_schedule_waits_for_the_leap_year() {
        assert_eq!(
            next("0 0 29 2 *", "2024-03-01T00:00:00Z"),
            "2028-02-29T00:00:00Z"
        );
    }

    #[test]
    fn a_date_that_never_exists_has_no_next_run() {
        let s = Schedule::parse("0 0 30 2 *").unwrap();
        assert_eq!(s.next_after(at("2024-01-01T00:00:00Z")), None);
    }

    #[test]
    fn bad_schedules_are_refused_naming_the_field() {
        let err = |s: &str| Schedule::parse(s).unwrap_err().to_string();
        assert!(
            err("0 0 * *").contains("expected 5 fields"),
            "{}",
            err("0 0 * *")
        );
        assert!(err("61 * * * *").contains("minute \"61\": 61 is outside 0-59"));
        assert!(err("0 24 * * *").contains("hour"));
        assert!(err("0 0 0 * *").contains("day-of-month"));
        assert!(err("0 0 * 13 *").contains("month"));
        assert!(err("0 0 * * 7").contains("day-of-week"));
        assert!(err("0 0 * * funday").contains("not a number or a name"));
        assert!(err("*/0 * * * *").contains("step must be at least 1"));
        assert!(err("5-2 * * * *").contains("after its end"));
        assert!(err("@every 1x").contains("unknown unit"));
        assert!(err("@every").contains("unknown descriptor"));
        assert!(err("CRON_TZ=Mars/Olympus 0 0 * * *").contains("unknown time zone"));
        assert!(err("0 0 * * * *").contains("found 6"));
    }
}
