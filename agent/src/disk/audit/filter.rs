//! Selecting audit records: minion glob, actions, origins and a time window,
//! all combined with AND (each list with OR).

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::Record;

/// What `salt-keysync audit` shows. The default shows everything.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Shell-style glob on the minion id (`web*`, `db-[0-9]?`), like salt-key's.
    pub minion: Option<glob::Pattern>,
    /// Any of these actions; empty: all.
    pub actions: Vec<String>,
    /// Any of these origin nodes; empty: all.
    pub origins: Vec<String>,
    /// Records at or after this instant.
    pub since: Option<OffsetDateTime>,
    /// Records at or before this instant.
    pub until: Option<OffsetDateTime>,
}

impl Filter {
    pub fn matches(&self, record: &Record) -> bool {
        if let Some(pattern) = &self.minion {
            if !record.minion.as_deref().is_some_and(|m| pattern.matches(m)) {
                return false;
            }
        }
        if !self.actions.is_empty() && !self.actions.contains(&record.action) {
            return false;
        }
        if !self.origins.is_empty() && !record.origin.as_ref().is_some_and(|o| self.origins.contains(o)) {
            return false;
        }
        if self.since.is_some() || self.until.is_some() {
            let Ok(time) = OffsetDateTime::parse(&record.time, &Rfc3339) else { return false };
            if self.since.is_some_and(|since| time < since) || self.until.is_some_and(|until| time > until) {
                return false;
            }
        }
        true
    }
}

/// Parses `--since` / `--until`: RFC 3339 (`2026-11-21T10:00:00Z`), a date
/// (`2026-11-21`, midnight UTC), or a duration before `now` (`2h`, `30m`,
/// `1day 2h`).
pub fn parse_time_bound(text: &str, now: OffsetDateTime) -> Result<OffsetDateTime, String> {
    if let Ok(at) = OffsetDateTime::parse(text, &Rfc3339) {
        return Ok(at);
    }
    let date_format = time::macros::format_description!("[year]-[month]-[day]");
    if let Ok(date) = time::Date::parse(text, &date_format) {
        return Ok(date.midnight().assume_utc());
    }
    match humantime::parse_duration(text) {
        Ok(ago) => Ok(now - ago),
        Err(_) => Err(format!(
            "{text:?} is neither an RFC 3339 time (2026-11-21T10:00:00Z), a date (2026-11-21) nor a duration ago (2h, 30m)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Action, Outcome, Via};
    use super::*;

    fn record(time: &str, action: Action, minion: &str, origin: &str) -> Record {
        Record {
            time: time.into(),
            minion: Some(minion.into()),
            origin: Some(origin.into()),
            ..Record::new(action, Via::Local, Outcome::Applied)
        }
    }

    fn at(text: &str) -> OffsetDateTime {
        OffsetDateTime::parse(text, &Rfc3339).unwrap()
    }

    #[test]
    fn each_filter_alone_and_combined() {
        let records = [
            record("2026-11-21T10:00:00Z", Action::Accept, "web01", "master-a"),
            record("2026-11-21T11:00:00Z", Action::Reject, "web02", "master-b"),
            record("2026-11-21T12:00:00Z", Action::Accept, "db01", "master-b"),
            record("2026-11-21T13:00:00Z", Action::Delete, "web01", "master-c"),
        ];
        let check = |filter: Filter, expected: &[usize]| {
            let got: Vec<usize> = (0..records.len()).filter(|&i| filter.matches(&records[i])).collect();
            assert_eq!(got, expected, "{filter:?}");
        };
        check(Filter::default(), &[0, 1, 2, 3]);
        check(Filter { minion: Some(glob::Pattern::new("web*").unwrap()), ..Filter::default() }, &[0, 1, 3]);
        check(Filter { minion: Some(glob::Pattern::new("web0[2-9]").unwrap()), ..Filter::default() }, &[1]);
        check(Filter { actions: vec!["accept".into()], ..Filter::default() }, &[0, 2]);
        check(Filter { actions: vec!["reject".into(), "delete".into()], ..Filter::default() }, &[1, 3]);
        check(Filter { origins: vec!["master-b".into()], ..Filter::default() }, &[1, 2]);
        check(Filter { since: Some(at("2026-11-21T11:00:00Z")), ..Filter::default() }, &[1, 2, 3]);
        check(Filter { until: Some(at("2026-11-21T11:30:00Z")), ..Filter::default() }, &[0, 1]);
        check(
            Filter {
                minion: Some(glob::Pattern::new("web*").unwrap()),
                actions: vec!["accept".into(), "delete".into()],
                since: Some(at("2026-11-21T09:00:00Z")),
                until: Some(at("2026-11-21T12:30:00Z")),
                ..Filter::default()
            },
            &[0],
        );
        // A record without a minion never matches a minion filter.
        let start = Record::new(Action::Start, Via::Local, Outcome::Started);
        assert!(!Filter { minion: Some(glob::Pattern::new("*").unwrap()), ..Filter::default() }.matches(&start));
    }

    #[test]
    fn time_bounds() {
        let now = at("2026-11-21T12:00:00Z");
        assert_eq!(parse_time_bound("2h", now).unwrap(), at("2026-11-21T10:00:00Z"));
        assert_eq!(parse_time_bound("30m", now).unwrap(), at("2026-11-21T11:30:00Z"));
        assert_eq!(parse_time_bound("2026-11-20T08:00:00+01:00", now).unwrap(), at("2026-11-20T07:00:00Z"));
        assert_eq!(parse_time_bound("2026-11-20", now).unwrap(), at("2026-11-20T00:00:00Z"));
        let err = parse_time_bound("yesterday", now).unwrap_err();
        assert!(err.contains("\"yesterday\" is neither"), "{err}");
    }
}
