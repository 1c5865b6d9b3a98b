//! A topic's archive (#35): what a topic accepted, kept for its retention so it can be replayed.
//!
//! `ingest` writes one line per accepted event of a topic whose `retentionDays` is above 0, after
//! the events are durably fanned out, to the Firehose stream of its retention's class
//! ([`ARCHIVE_CLASSES`]), which keeps them in S3 under the class's prefix and its hour prefix
//! (`archive/7d/YYYY/MM/DD/HH/`: the hour the stream received the oldest record of the object,
//! so an object can hold events received up to its buffering interval later, in the next
//! hour). A line
//! holds the topic, the publish time, the topic's input schema and the event exactly as it was
//! fanned out (stamped fields included), so a replay sends what the first delivery sent.

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::journal::millis;
use crate::limits::LimitError;
use crate::schema::InputSchema;

/// Where the archive's objects are in their bucket: below this, the stream's hour prefix.
pub const ARCHIVE_PREFIX: &str = "archive/";

/// A topic's retention: 0 (no archive) to 365 days, as EventBridge's archives and event buses
/// keep events.
pub const RETENTION_DAYS: std::ops::RangeInclusive<i64> = 0..=365;

/// How much earlier than an event's arrival its object's hour prefix can be: Firehose names an
/// object by the arrival of its oldest record, and gathers records for at most its longest
/// buffering interval (900 s). A read of a window reads the hours from this much before its
/// start.
pub const BUFFER_SLACK: Duration = Duration::minutes(15);

/// How much later than its publish time an event can reach the stream: `ingest` writes it
/// after the fan-out, within its 15 s timeout, with room to spare. A read of a window reads the
/// hours to this much past its end.
pub const ARRIVAL_SLACK: Duration = Duration::minutes(2);

/// Checks a topic's `retentionDays`.
pub fn validate_retention_days(days: i64) -> Result<u16, LimitError> {
    if RETENTION_DAYS.contains(&days) {
        // Within 0..=365.
        Ok(u16::try_from(days).unwrap_or_default())
    } else {
        Err(LimitError::new(
            "retentionDays",
            days,
            format!(
                "{} to {} (0 keeps no archive)",
                RETENTION_DAYS.start(),
                RETENTION_DAYS.end()
            ),
        ))
    }
}

/// Retention classes (#35), in days. A topic's events are archived in the class of its
/// retention, the shortest at least as long (a topic keeping 10 days archives in the 30-day
/// class), under [`class_prefix`]: each class has a stream and a lifecycle rule of its own, so
/// what a topic archived is deleted after its class's days, however many topics there are (S3
/// allows 1,000 lifecycle rules a bucket; five classes need five). An event keeps the class it
/// was archived in when its topic's retention changes later.
pub const ARCHIVE_CLASSES: [u16; 5] = [1, 7, 30, 90, 365];

/// The class a topic keeping `retention_days` archives in; none for 0 (no archive).
pub fn archive_class(retention_days: u16) -> Option<u16> {
    if retention_days == 0 {
        return None;
    }
    ARCHIVE_CLASSES
        .into_iter()
        .find(|&class| class >= retention_days)
}

/// How long a class's objects are kept: a day past the class, so a read at the edge of a
/// topic's retention, or a replay that takes up to a day, still finds them (the stacks'
/// lifecycle rule of the class).
pub fn class_expiry_days(class: u16) -> u16 {
    class + 1
}

/// The class a prefix's segment names (`7d` in `archive/7d/`, or in a stream's name
/// `<prefix>-archive-7d`): its days; none for anything else.
pub fn class_of_segment(segment: &str) -> Option<u16> {
    let days = segment.strip_suffix('d')?;
    if days.is_empty() || !days.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    days.parse().ok()
}

/// Where a class's objects are in the bucket: `archive/7d/`, then the stream's hour prefix.
pub fn class_prefix(class: u16) -> String {
    format!("{ARCHIVE_PREFIX}{class}d/")
}

/// The lifecycle rule's prefix for archives written before classes (`archive/YYYY/MM/DD/HH/`,
/// years 2000 to 2999: no class prefix starts with it), which the stacks'
/// `ArchiveRetentionDays` expires.
pub const UNCLASSED_PREFIX: &str = "archive/2";

/// The stacks' `ArchiveRetentionDays` default (and `gridrelay local`'s): how long archives
/// written before classes are kept. The longest retention, so a stack updated from before
/// classes deletes nothing its topics' retentions still reach.
pub const DEFAULT_UNCLASSED_EXPIRY_DAYS: u16 = 365;

/// The classes whose objects of `hour` may still be kept at `now`. An object of the hour is
/// written within its first 75 minutes (the stream's longest buffering after the hour it
/// names), kept [`class_expiry_days`], and deleted by S3 at a midnight (UTC) after that, in
/// time: a class is read for an hour until two days past its expiry. Past that, every
/// object of the hour in the class is gone.
pub fn classes_keeping(hour: DateTime<Utc>, now: DateTime<Utc>) -> Vec<u16> {
    ARCHIVE_CLASSES
        .into_iter()
        .filter(|&class| hour + Duration::days(i64::from(class_expiry_days(class)) + 2) > now)
        .collect()
}

/// Checks a topic's retention of `days` (already within 0 to 365) against the installation:
/// its journal bucket must have the lifecycle rule of the retention's class
/// (`class_rule_days`: that rule's days, none without one), or the topic would archive into
/// objects nothing deletes, or that a stack from before classes does not write.
pub fn validate_retention_class(days: u16, class_rule_days: Option<u16>) -> Result<(), LimitError> {
    let Some(class) = archive_class(days) else {
        return Ok(());
    };
    match class_rule_days {
        Some(kept) if kept >= days => Ok(()),
        kept => Err(LimitError::new(
            "retentionDays",
            days,
            format!(
                "0 (no archive), or a retention this installation archives: its journal bucket \
                 {} for {} (the class of {days} days); update the stack (docs/archive.md)",
                match kept {
                    Some(kept) => format!("keeps only {kept} days"),
                    None => "has no lifecycle rule".to_string(),
                },
                class_prefix(class)
            ),
        )),
    }
}

/// What `GRIDRELAY_ARCHIVE_STREAMS` holds: each class's stream, as `1=name,7=name,…`.
pub fn format_archive_streams(streams: &std::collections::BTreeMap<u16, String>) -> String {
    streams
        .iter()
        .map(|(class, stream)| format!("{class}={stream}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Reads `GRIDRELAY_ARCHIVE_STREAMS` (`field`: `1=name,7=name,…`): each entry a class of
/// [`ARCHIVE_CLASSES`] and a stream's name.
pub fn parse_archive_streams(
    field: &str,
    text: &str,
) -> Result<std::collections::BTreeMap<u16, String>, LimitError> {
    let allowed = || {
        format!(
            "class=stream, comma-separated, for the classes {ARCHIVE_CLASSES:?} (days), each \
             once"
        )
    };
    let mut streams = std::collections::BTreeMap::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let parsed = entry.split_once('=').and_then(|(class, stream)| {
            let class = class.trim().parse::<u16>().ok()?;
            let stream = stream.trim();
            (ARCHIVE_CLASSES.contains(&class) && !stream.is_empty()).then_some((class, stream))
        });
        let Some((class, stream)) = parsed else {
            return Err(LimitError::new(field, entry, allowed()));
        };
        if streams.insert(class, stream.to_string()).is_some() {
            return Err(LimitError::new(field, entry, allowed()));
        }
    }
    Ok(streams)
}

/// One archived event, as a line of the archive.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArchivedEvent {
    pub topic: String,
    /// When it was published (the time its fan-out stamped on it).
    #[serde(with = "millis")]
    pub time: DateTime<Utc>,
    /// The topic's input schema when it was published: what `event` is.
    pub schema: InputSchema,
    /// The event as it was fanned out.
    pub event: Box<RawValue>,
}

impl PartialEq for ArchivedEvent {
    fn eq(&self, other: &Self) -> bool {
        self.topic == other.topic
            && self.time == other.time
            && self.schema == other.schema
            && self.event.get() == other.event.get()
    }
}

/// The archive's lines for events a topic accepted at `time`: one JSON line per event.
pub fn archive_lines(
    topic: &str,
    schema: InputSchema,
    time: DateTime<Utc>,
    events: &[Box<RawValue>],
) -> Vec<Vec<u8>> {
    #[derive(Serialize)]
    struct Line<'a> {
        topic: &'a str,
        #[serde(with = "millis")]
        time: DateTime<Utc>,
        schema: InputSchema,
        event: &'a RawValue,
    }
    events
        .iter()
        .map(|event| {
            let line = Line {
                topic,
                time,
                schema,
                event,
            };
            // Strings, a time, an enum and raw JSON always serialize.
            let mut bytes = serde_json::to_vec(&line).unwrap_or_default();
            bytes.push(b'\n');
            bytes
        })
        .collect()
}

/// The archived events in an object's lines (unpacked, [`crate::journal::unpack_object`]); a
/// line that is not one is skipped and counted.
pub fn read_archive_lines(lines: &[u8]) -> (Vec<ArchivedEvent>, usize) {
    crate::journal::read_json_lines(lines)
}

/// A window of publish times, `start` included and `end` not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeWindow {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
}

impl TimeWindow {
    /// A window from `start` to `end`; `field_end` names the end in the error when it is not
    /// after the start.
    pub fn new(
        start: DateTime<Utc>,
        end: DateTime<Utc>,
        field_end: &str,
    ) -> Result<Self, LimitError> {
        // To the millisecond, as the archive keeps publish times.
        let (start, end) = (to_millis(start), to_millis(end));
        if end <= start {
            return Err(LimitError::new(
                field_end,
                crate::journal::format_time(end),
                format!(
                    "a time after the start, {}",
                    crate::journal::format_time(start)
                ),
            ));
        }
        Ok(Self { start, end })
    }

    pub fn contains(&self, at: DateTime<Utc>) -> bool {
        self.start <= at && at < self.end
    }

    /// The hours whose prefixes can hold events of the window: from [`BUFFER_SLACK`] before
    /// its start to [`ARRIVAL_SLACK`] past its end.
    pub fn hours(&self) -> (DateTime<Utc>, DateTime<Utc>) {
        (self.start - BUFFER_SLACK, self.end + ARRIVAL_SLACK)
    }
}

/// `at` to the millisecond (what the archive and replays keep).
pub(crate) fn to_millis(at: DateTime<Utc>) -> DateTime<Utc> {
    use chrono::DurationRound;
    at.duration_trunc(Duration::milliseconds(1)).unwrap_or(at)
}

/// The window of a topic's archive a reader (a listing, a replay) may ask for: from `start` up
/// to `end`, both in the past, within the topic's retention (`retention_days` back from `now`),
/// and, for a topic created again since, from its creation (`created_at`) on, so the events of
/// an older topic of the same name are not its own.
pub fn archive_window(
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    now: DateTime<Utc>,
    retention_days: u16,
    created_at: DateTime<Utc>,
) -> Result<TimeWindow, LimitError> {
    use crate::journal::format_time;
    if retention_days == 0 {
        return Err(LimitError::new(
            "retentionDays",
            0,
            "1 to 365 for the topic to keep an archive (topic update --retention-days N); it \
             archives what it accepts from then on",
        ));
    }
    let earliest = now - Duration::days(i64::from(retention_days));
    if start < earliest {
        return Err(LimitError::new(
            "startTime",
            format_time(start),
            format!(
                "{} or later (the topic keeps {retention_days} days)",
                format_time(earliest)
            ),
        ));
    }
    if end > now {
        return Err(LimitError::new(
            "endTime",
            format_time(end),
            format!("{} or earlier (now)", format_time(now)),
        ));
    }
    if end <= created_at {
        return Err(LimitError::new(
            "endTime",
            format_time(end),
            format!(
                "a time after {}, when the topic was created (again: what an older topic of its \
                 name accepted is not its own)",
                format_time(created_at)
            ),
        ));
    }
    TimeWindow::new(start.max(created_at), end, "endTime")
}

/// The events of `topic` in `window`, in publish order (the order they were read in, for
/// equal times), from events read from the window's hours.
pub fn events_in_window(
    events: Vec<ArchivedEvent>,
    topic: &str,
    window: &TimeWindow,
) -> Vec<ArchivedEvent> {
    let mut chosen: Vec<ArchivedEvent> = events
        .into_iter()
        .filter(|e| e.topic == topic && window.contains(e.time))
        .collect();
    chosen.sort_by_key(|e| e.time);
    chosen
}

/// #36: the windows to read for events published in `spans` (each `(from, to)`, `to`
/// included), within a topic's retention (`retention_days` back from `now`; none without
/// one) and from its creation (`created_at`) on. Spans whose objects' hours meet are read as
/// one window, so no hour is read twice; a span wholly outside is left out.
pub fn windows_for_spans(
    spans: impl IntoIterator<Item = (DateTime<Utc>, DateTime<Utc>)>,
    now: DateTime<Utc>,
    retention_days: u16,
    created_at: DateTime<Utc>,
) -> Vec<TimeWindow> {
    if retention_days == 0 {
        return Vec::new();
    }
    let earliest = (now - Duration::days(i64::from(retention_days))).max(created_at);
    let mut windows: Vec<TimeWindow> = spans
        .into_iter()
        .filter_map(|(from, to)| {
            let end = to.min(now) + Duration::milliseconds(1);
            TimeWindow::new(from.max(earliest), end, "to").ok()
        })
        .collect();
    windows.sort_by_key(|w| w.start);
    // The hour an instant's objects are listed under.
    let hour = |at: DateTime<Utc>| {
        use chrono::DurationRound;
        at.duration_trunc(Duration::hours(1)).unwrap_or(at)
    };
    let mut merged: Vec<TimeWindow> = Vec::with_capacity(windows.len());
    for window in windows {
        match merged.last_mut() {
            Some(last) if hour(window.hours().0) <= hour(last.hours().1) => {
                last.end = last.end.max(window.end)
            }
            _ => merged.push(window),
        }
    }
    merged
}

/// What a replay's step took from one archive object ([`take_events`]).
#[derive(Debug, Default)]
pub struct Taken {
    /// The topic's events of the window, in the object's order.
    pub events: Vec<ArchivedEvent>,
    /// The line to read next when the step stopped before the object's end (it had taken what
    /// it may); none when it read to the end.
    pub next_line: Option<usize>,
    /// Lines that were not archived events.
    pub skipped: usize,
}

/// Up to `max` events of `topic` published in `window`, of at most `max_bytes` together
/// (the first may pass it if `first_may_pass`: a step takes at least one event), from an
/// object's `lines` (unpacked), from line `from_line` on (lines count from 0, every line,
/// blank or not, as written).
pub fn take_events(
    lines: &[u8],
    from_line: usize,
    topic: &str,
    window: &TimeWindow,
    (max, max_bytes, first_may_pass): (usize, usize, bool),
) -> Taken {
    let mut taken = Taken::default();
    let mut bytes = 0;
    let mut lines = lines.split(|b| *b == b'\n').enumerate().skip(from_line);
    for (index, line) in lines.by_ref() {
        if taken.events.len() >= max {
            taken.next_line = Some(index);
            return taken;
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<ArchivedEvent>(line) {
            Ok(event) if event.topic == topic && window.contains(event.time) => {
                let size = event.event.get().len();
                let may_pass = first_may_pass && taken.events.is_empty();
                if !may_pass && bytes + size > max_bytes {
                    taken.next_line = Some(index);
                    return taken;
                }
                bytes += size;
                taken.events.push(event)
            }
            Ok(_) => {}
            Err(_) => taken.skipped += 1,
        }
    }
    taken
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    /// #36: the windows a send again reads: one per group of spans whose hours meet, within
    /// the retention and from the topic's creation; none without a retention.
    #[test]
    fn spans_are_read_as_few_windows_within_the_retention() {
        let t = |h: u32, m: u32| Utc.with_ymd_and_hms(2026, 11, 28, h, m, 0).unwrap();
        let ms = Duration::milliseconds(1);
        let now = t(12, 0);
        let created = t(1, 0);
        let spans = [
            (t(10, 0), t(10, 0)),
            (t(10, 20), t(10, 20)),
            (t(3, 30), t(4, 0)),
            (t(0, 0), t(0, 30)),
            (t(0, 30), t(2, 0)),
            (t(11, 0), t(13, 0)),
        ];
        let windows = windows_for_spans(spans, now, 1, created);
        let got: Vec<_> = windows.iter().map(|w| (w.start, w.end)).collect();
        assert_eq!(
            got,
            vec![
                // From the creation; the span before it is left out.
                (t(1, 0), t(2, 0) + ms),
                // Its hours (2 h) and the next span's (3 h) do not meet.
                (t(3, 30), t(4, 0) + ms),
                // 10:00 and 10:20 share their hours; 11:00 to now meets them too.
                (t(10, 0), now + ms),
            ]
        );
        let two_days = windows_for_spans([(t(0, 0), t(0, 0))], now + Duration::days(2), 1, created);
        assert!(two_days.is_empty(), "past the retention: {two_days:?}");
        assert!(windows_for_spans(spans, now, 0, created).is_empty());
    }

    /// A topic archives in the shortest class at least as long as its retention, and each
    /// class's objects are under a prefix no other class's, nor the unclassed rule's, starts
    /// with.
    #[test]
    fn a_retention_archives_in_the_shortest_class_that_keeps_it() {
        assert_eq!(archive_class(0), None);
        assert_eq!(archive_class(1), Some(1));
        assert_eq!(archive_class(2), Some(7));
        assert_eq!(archive_class(7), Some(7));
        assert_eq!(archive_class(10), Some(30));
        assert_eq!(archive_class(91), Some(365));
        assert_eq!(archive_class(365), Some(365));
        for days in 1..=365 {
            let class = archive_class(days).unwrap();
            assert!(class >= days);
        }
        for class in ARCHIVE_CLASSES {
            let prefix = class_prefix(class);
            assert!(prefix.starts_with(ARCHIVE_PREFIX), "{prefix}");
            assert!(!prefix.starts_with(UNCLASSED_PREFIX), "{prefix}");
            for other in ARCHIVE_CLASSES.into_iter().filter(|&o| o != class) {
                assert!(!class_prefix(other).starts_with(&prefix), "{prefix}");
            }
        }
        assert_eq!(class_prefix(30), "archive/30d/");
        assert_eq!(class_of_segment("30d"), Some(30));
        for not_one in ["d", "30", "x7d", "2026"] {
            assert_eq!(class_of_segment(not_one), None, "{not_one}");
        }
    }

    /// An hour's objects of a class are read until two days past its expiry, a day past the
    /// class.
    #[test]
    fn an_hour_is_read_in_the_classes_that_still_keep_it() {
        let hour = Utc.with_ymd_and_hms(2026, 11, 1, 12, 0, 0).unwrap();
        assert_eq!(classes_keeping(hour, hour), ARCHIVE_CLASSES.to_vec());
        // The 1-day class: kept 2 days, read until 4.
        assert_eq!(
            classes_keeping(hour, hour + Duration::days(4) - Duration::minutes(1)),
            ARCHIVE_CLASSES.to_vec()
        );
        assert_eq!(
            classes_keeping(hour, hour + Duration::days(4)),
            vec![7, 30, 90, 365]
        );
        assert_eq!(classes_keeping(hour, hour + Duration::days(100)), vec![365]);
        assert_eq!(classes_keeping(hour, hour + Duration::days(367)), vec![365]);
        assert!(classes_keeping(hour, hour + Duration::days(368)).is_empty());
    }

    /// A retention is taken where the bucket has its class's rule, refused naming the field,
    /// the value and what to do where it has none or a shorter one.
    #[test]
    fn a_retention_whose_class_the_bucket_does_not_expire_is_refused() {
        assert!(validate_retention_class(0, None).is_ok());
        assert!(validate_retention_class(10, Some(30)).is_ok());
        let e = validate_retention_class(10, None).unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("retentionDays", "10")
        );
        assert!(
            e.allowed.contains("has no lifecycle rule for archive/30d/"),
            "{e}"
        );
        assert!(e.allowed.contains("update the stack"), "{e}");
        let e = validate_retention_class(30, Some(7)).unwrap_err();
        assert!(e.allowed.contains("keeps only 7 days"), "{e}");
    }

    /// `GRIDRELAY_ARCHIVE_STREAMS` reads back what it was written as; a bad entry is refused
    /// naming the variable and the entry.
    #[test]
    fn archive_streams_read_back_and_a_bad_entry_is_named() {
        let streams: std::collections::BTreeMap<u16, String> = ARCHIVE_CLASSES
            .into_iter()
            .map(|c| (c, format!("s-archive-{c}d")))
            .collect();
        let text = format_archive_streams(&streams);
        assert_eq!(parse_archive_streams("V", &text).unwrap(), streams);
        assert!(parse_archive_streams("V", "").unwrap().is_empty());
        for bad in ["3=s", "7=", "7", "x=s", "7=a,7=b"] {
            let e = parse_archive_streams("V", bad).unwrap_err();
            assert_eq!(e.field, "V");
            assert!(e.allowed.contains("[1, 7, 30, 90, 365]"), "{e}");
        }
    }

    use crate::journal::{compress_record, unpack_object};

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_string()).unwrap()
    }

    #[test]
    fn retention_is_0_to_365_days_and_the_error_names_field_value_and_range() {
        assert_eq!(validate_retention_days(0), Ok(0));
        assert_eq!(validate_retention_days(7), Ok(7));
        assert_eq!(validate_retention_days(365), Ok(365));
        for bad in [-1, 366, 100_000] {
            let e = validate_retention_days(bad).unwrap_err();
            assert_eq!(e.field, "retentionDays");
            assert_eq!(e.value, bad.to_string());
            assert!(e.allowed.starts_with("0 to 365"), "{}", e.allowed);
        }
    }

    #[test]
    fn an_archive_window_lies_within_the_topics_retention_and_life() {
        let now = Utc.with_ymd_and_hms(2026, 11, 27, 12, 0, 0).unwrap();
        let created = now - Duration::days(30);
        let day = Duration::days(1);
        let w = archive_window(now - day * 7, now, now, 7, created).unwrap();
        assert_eq!((w.start, w.end), (now - day * 7, now));

        let e = archive_window(now - day * 8, now, now, 7, created).unwrap_err();
        assert_eq!(e.field, "startTime");
        assert!(
            e.allowed.contains("2026-11-20T12:00:00.000Z or later"),
            "{e}"
        );
        let e = archive_window(now - day, now + day, now, 7, created).unwrap_err();
        assert_eq!(e.field, "endTime");
        let e = archive_window(now - day, now, now, 0, created).unwrap_err();
        assert_eq!((e.field.as_str(), e.value.as_str()), ("retentionDays", "0"));
        let e = archive_window(now - day, now - day * 2, now, 7, created).unwrap_err();
        assert_eq!(e.field, "endTime");

        // A topic created again an hour ago: its window starts then; one that ends before
        // that says why.
        let recreated = now - Duration::hours(1);
        let w = archive_window(now - day, now, now, 7, recreated).unwrap();
        assert_eq!(w.start, recreated);
        let e = archive_window(now - day, now - Duration::hours(2), now, 7, recreated).unwrap_err();
        assert_eq!(e.field, "endTime");
        assert!(e.allowed.contains("when the topic was created"), "{e}");
    }

    #[test]
    fn archived_lines_read_back_as_the_events_exactly_as_they_were_fanned_out() {
        let at = Utc.with_ymd_and_hms(2026, 11, 27, 12, 0, 0).unwrap();
        let events = [
            raw(r#"{"id":"1","data":{"n":1}}"#),
            raw(r#"{"id":"2", "data" : [1,2]}"#),
        ];
        let lines = archive_lines("orders", InputSchema::CloudEventSchemaV1_0, at, &events);
        assert_eq!(lines.len(), 2);
        assert!(lines.iter().all(|l| l.ends_with(b"\n")));
        // As the stream writes them: compressed records one after another.
        let object: Vec<u8> = lines.iter().flat_map(|l| compress_record(l)).collect();
        let (unpacked, damaged) = unpack_object(&object);
        assert_eq!(damaged, 0);
        let (read, skipped) = read_archive_lines(&unpacked);
        assert_eq!(skipped, 0);
        assert_eq!(read.len(), 2);
        assert_eq!(read[1].event.get(), r#"{"id":"2", "data" : [1,2]}"#);
        assert_eq!(read[0].schema, InputSchema::CloudEventSchemaV1_0);
        assert_eq!(read[0].time, at);
        assert_eq!(read[0].topic, "orders");
    }

    /// A replay's steps read an object from where the last one stopped, take only the topic's
    /// events of the window, and say where to go on.
    #[test]
    fn steps_take_an_objects_events_from_a_line_on_up_to_their_share() {
        let at = |m| Utc.with_ymd_and_hms(2026, 11, 27, 12, m, 0).unwrap();
        let window = TimeWindow::new(at(10), at(20), "endTime").unwrap();
        let line = |topic: &str, m: u32| {
            archive_lines(
                topic,
                InputSchema::EventGridSchema,
                at(m),
                &[raw(&format!(r#"{{"id":"{topic}-{m}"}}"#))],
            )
            .remove(0)
        };
        let lines: Vec<u8> = [
            line("orders", 11),
            line("billing", 12),
            b"not json\n".to_vec(),
            line("orders", 9),
            line("orders", 13),
            line("orders", 14),
        ]
        .concat();
        let ids = |t: &Taken| -> Vec<String> {
            t.events.iter().map(|e| e.event.get().to_string()).collect()
        };
        let first = take_events(&lines, 0, "orders", &window, (2, usize::MAX, true));
        assert_eq!(
            ids(&first),
            [r#"{"id":"orders-11"}"#, r#"{"id":"orders-13"}"#]
        );
        assert_eq!((first.next_line, first.skipped), (Some(5), 1));
        let rest = take_events(&lines, 5, "orders", &window, (2, usize::MAX, true));
        assert_eq!(ids(&rest), [r#"{"id":"orders-14"}"#]);
        assert_eq!((rest.next_line, rest.skipped), (None, 0));
        let past = take_events(&lines, 6, "orders", &window, (2, usize::MAX, true));
        assert!(past.events.is_empty() && past.next_line.is_none());
        // A byte budget stops a step before the event that would pass it, never before the
        // first.
        let one = r#"{"id":"orders-11"}"#.len();
        let by_bytes = take_events(&lines, 0, "orders", &window, (10, one + 1, true));
        assert_eq!(ids(&by_bytes), [r#"{"id":"orders-11"}"#]);
        assert_eq!(by_bytes.next_line, Some(4));
        let at_least_one = take_events(&lines, 0, "orders", &window, (10, 1, true));
        assert_eq!(at_least_one.events.len(), 1);
        let none_past = take_events(&lines, 0, "orders", &window, (10, 1, false));
        assert_eq!((none_past.events.len(), none_past.next_line), (0, Some(0)));
    }

    #[test]
    fn a_window_keeps_its_topics_events_from_its_start_up_to_not_including_its_end() {
        let at = |m| Utc.with_ymd_and_hms(2026, 11, 27, 12, m, 0).unwrap();
        let event = |topic: &str, m| ArchivedEvent {
            topic: topic.into(),
            time: at(m),
            schema: InputSchema::EventGridSchema,
            event: raw(&format!(r#"{{"id":"{topic}-{m}"}}"#)),
        };
        let window = TimeWindow::new(at(10), at(20), "endTime").unwrap();
        let read = vec![
            event("orders", 15),
            event("orders", 9),
            event("orders", 10),
            event("orders", 20),
            event("billing", 12),
            event("orders", 19),
        ];
        let ids: Vec<String> = events_in_window(read, "orders", &window)
            .iter()
            .map(|e| e.event.get().to_string())
            .collect();
        assert_eq!(
            ids,
            [
                r#"{"id":"orders-10"}"#,
                r#"{"id":"orders-15"}"#,
                r#"{"id":"orders-19"}"#
            ]
        );
        let e = TimeWindow::new(at(20), at(20), "endTime").unwrap_err();
        assert_eq!(e.field, "endTime");
        // From 15 minutes before the start (an object is named by its oldest record's arrival)
        // to 2 minutes past the end.
        assert_eq!(window.hours(), (at(10) - BUFFER_SLACK, at(22)));
        // Kept to the millisecond, as publish times are.
        let fine = TimeWindow::new(
            at(10) + Duration::microseconds(1_500),
            at(20) + Duration::microseconds(999),
            "endTime",
        )
        .unwrap();
        assert_eq!(
            (fine.start, fine.end),
            (at(10) + Duration::milliseconds(1), at(20))
        );
    }
}
