//! Parsers for command-line values shared by several commands.

use super::*;

/// One `--state` value: a state, or a name for several.
#[derive(Debug, Clone)]
pub(crate) struct States(pub(crate) Vec<JobState>);

pub(crate) fn parse_states(s: &str) -> Result<States, String> {
    match JobState::named(s) {
        Some(states) => Ok(States(states)),
        None => Err(format!(
            "`{}` is not a job state: queued, running, done, failed, canceled, active or finished",
            s.trim().to_ascii_lowercase()
        )),
    }
}

/// `--since`: a duration ago (`2h`) or a UTC date or time
/// (`2026-12-01`, `2026-12-01T09:30`, `2026-12-01T09:30:00Z`, with an
/// optional `+HH:MM` offset); unix milliseconds.
pub(crate) fn parse_since(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    if t.len() < 10 || t.as_bytes().get(4) != Some(&b'-') {
        let ago = parse_duration(t).map_err(|_| {
            format!(
                "`{text}`: give a duration ago (2h, 30m, 7d) or a UTC time (2026-12-01T09:30:00Z)"
            )
        })?;
        return Ok(now.saturating_sub(ago.as_millis() as u64));
    }
    parse_utc(t).ok_or_else(|| {
        format!(
            "`{text}` is not a time: expected 2026-12-01, 2026-12-01T09:30 or 2026-12-01T09:30:00Z"
        )
    })
}

/// An ISO 8601 date or date-time in UTC (or with an offset), as unix ms.
pub(crate) fn parse_utc(t: &str) -> Option<u64> {
    let num = |s: &str| -> Option<i64> {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok())?
    };
    let (date, rest) = t.split_at(10);
    let mut d = date.split('-');
    let (y, m, day) = (num(d.next()?)?, num(d.next()?)?, num(d.next()?)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || y < 1970 {
        return None;
    }
    let mut secs = 0i64;
    let mut offset = 0i64;
    if let Some(time) = rest.strip_prefix(['T', 't', ' ']) {
        let (clock, zone) = match time.find(['Z', 'z', '+', '-']) {
            Some(i) => time.split_at(i),
            None => (time, ""),
        };
        let mut parts = clock.split(':');
        let h = num(parts.next()?)?;
        let min = num(parts.next()?)?;
        let sec = match parts.next() {
            Some(s) => num(s.split('.').next()?)?,
            None => 0,
        };
        if parts.next().is_some() || h > 23 || min > 59 || sec > 60 {
            return None;
        }
        secs = h * 3600 + min * 60 + sec;
        if let Some(z) = zone
            .strip_prefix('+')
            .map(|z| (1, z))
            .or(zone.strip_prefix('-').map(|z| (-1, z)))
        {
            let (sign, z) = z;
            let (oh, om) = z.split_once(':').unwrap_or((z.get(..2)?, z.get(2..)?));
            offset = sign * (num(oh)? * 3600 + num(om)? * 60);
        } else if !matches!(zone, "" | "Z" | "z") {
            return None;
        }
    } else if !rest.is_empty() {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let (y, m) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let unix = days * 86_400 + secs - offset;
    u64::try_from(unix).ok().map(|s| s * 1000)
}

/// A duration such as `7d`, `12h`, `30m`, `45s`, `1.5h` or `1h 30m`
/// (humantime's syntax); `0` alone needs no unit.
pub(crate) fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let t = text.trim();
    if t == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    humantime::parse_duration(t).map_err(|e| match e {
        humantime::DurationError::UnknownUnit { unit, .. } if unit.is_empty() => {
            format!("`{text}`: give a unit, e.g. 7d, 12h, 30m or 45s")
        }
        humantime::DurationError::NumberOverflow => format!("`{text}` is too long a duration"),
        _ if t.starts_with('-') => format!("`{text}`: the duration must be 0 or more"),
        _ => format!("`{text}` is not a duration (e.g. 7d, 12h, 30m or 45s)"),
    })
}

/// Seconds (`90`, `2.5`) or a duration with its unit (`90s`, `5m`).
pub(crate) fn parse_seconds(text: &str) -> Result<std::time::Duration, String> {
    match text.trim().parse::<f64>() {
        Ok(n) if n.is_finite() && n >= 0.0 => std::time::Duration::try_from_secs_f64(n)
            .map_err(|_| format!("`{text}` is too long a duration")),
        Ok(_) => Err(format!("`{text}`: give 0 or more seconds")),
        Err(_) => parse_duration(text),
    }
}

/// A size such as `50G`, `800M`, `64K` (powers of 1024) or plain bytes.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let mult = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("`{text}`: unknown size unit (use K, M, G or T)")),
            };
            (&t[..i], mult)
        }
        _ => (t, 1),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{text}` is not a size (e.g. 50G, 800M or bytes)"))?;
    if n.is_nan() || n < 1.0 || n.is_infinite() {
        return Err(format!("`{text}`: the size must be at least 1 byte"));
    }
    Ok((n * mult as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_a_duration_ago_or_a_utc_time() {
        assert_eq!(parse_utc("1970-01-02"), Some(86_400_000));
        assert_eq!(parse_utc("2026-12-01T09:30:00Z"), Some(1_796_117_400_000));
        assert_eq!(parse_utc("2026-12-01T09:30"), Some(1_796_117_400_000));
        assert_eq!(
            parse_utc("2026-12-01T10:30:00+01:00"),
            Some(1_796_117_400_000)
        );
        assert_eq!(parse_utc("2000-02-29T00:00:00Z"), Some(951_782_400_000));
        for bad in ["2026-13-01", "2026-12-01T25:00", "2026-12-01X", "2026-1-1"] {
            assert!(parse_since(bad).is_err(), "{bad}");
        }
        let now = parse_since("0s").unwrap();
        let hour_ago = parse_since("1h").unwrap();
        assert!(now - hour_ago >= 3_599_000 && now - hour_ago <= 3_601_000);
        assert!(parse_since("soon").is_err());
        assert_eq!(
            parse_duration("1.5h"),
            Ok(std::time::Duration::from_secs(5400))
        );
        assert_eq!(
            parse_duration("1h 30m"),
            Ok(std::time::Duration::from_secs(5400))
        );
        assert_eq!(parse_duration("0"), Ok(std::time::Duration::ZERO));
        assert!(parse_duration("12").unwrap_err().contains("give a unit"));
        assert!(parse_duration("-3h").unwrap_err().contains("0 or more"));
        assert!(parse_duration("3 parsecs")
            .unwrap_err()
            .contains("is not a duration"));
        assert_eq!(
            parse_states("active").unwrap().0,
            vec![JobState::Queued, JobState::Running]
        );
        assert!(parse_states("paused")
            .unwrap_err()
            .contains("not a job state"));
    }
}
