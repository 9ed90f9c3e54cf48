//! Text from peers: the sizes names, errors and logs are cut to before the
//! coordinator stores or shows them, and escaping of control characters
//! for terminals. A worker or client can put anything in a string; what it
//! sends is cut here on arrival, so every reply that carries it still fits
//! a frame, and escaped wherever it reaches a terminal.

use std::borrow::Cow;

/// Longest worker, host or job name kept, in bytes.
pub const MAX_NAME: usize = 128;
/// Longest error message kept (a job's error, a failed attempt's error),
/// in bytes.
pub const MAX_ERROR: usize = 4096;

/// `s` cut to at most `max` bytes on a character boundary, ending in `…`
/// when something was cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let ellipsis = '…';
    let mut end = max.saturating_sub(ellipsis.len_utf8());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = s[..end].to_string();
    out.push(ellipsis);
    out
}

/// Cuts `s` in place (see [`truncate`]).
pub fn truncate_in_place(s: &mut String, max: usize) {
    if s.len() > max {
        *s = truncate(s, max);
    }
}

/// `s` with every control character written as an escape (`\n`, `\t`,
/// `\u{1b}`), so that a name or an error printed into a table or the
/// monitor cannot move the cursor, change colours or add lines.
pub fn escape_controls(s: &str) -> Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_characters_whole_and_marks_the_cut() {
        assert_eq!(truncate("short", 10), "short");
        let cut = truncate(&"é".repeat(100), 11);
        assert!(cut.len() <= 11, "{cut}");
        assert!(cut.ends_with('…'));
        assert_eq!(cut, "éééé…");
        let big = "x".repeat(9 << 20);
        assert_eq!(truncate(&big, MAX_NAME).len(), MAX_NAME);
        let mut s = big;
        truncate_in_place(&mut s, MAX_ERROR);
        assert_eq!(s.len(), MAX_ERROR);
    }

    #[test]
    fn control_characters_are_escaped() {
        assert!(matches!(escape_controls("plain"), Cow::Borrowed("plain")));
        assert_eq!(
            escape_controls("a\nb\u{1b}[31mred\t\u{7}"),
            "a\\nb\\u{1b}[31mred\\t\\u{7}"
        );
        assert!(!escape_controls("x\r\n\u{9b}y")
            .chars()
            .any(char::is_control));
    }
}

/// A duration as people write it on the command line: `2h`, `1h30m`, `5s`,
/// `250ms`.
pub fn short_duration(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let s = d.as_secs();
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    let mut out = String::new();
    for (n, unit) in [(h, "h"), (m, "m"), (s, "s")] {
        if n > 0 {
            out += &format!("{n}{unit}");
        }
    }
    out
}

#[cfg(test)]
mod duration_tests {
    use super::short_duration;
    use std::time::Duration;

    #[test]
    fn durations_read_as_written() {
        for (secs, text) in [
            (7200, "2h"),
            (5400, "1h30m"),
            (5, "5s"),
            (3661, "1h1m1s"),
            (600, "10m"),
        ] {
            assert_eq!(short_duration(Duration::from_secs(secs)), text);
        }
        assert_eq!(short_duration(Duration::from_millis(250)), "250ms");
    }
}
