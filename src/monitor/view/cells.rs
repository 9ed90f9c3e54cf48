//! The text of one table cell: a CPU's short name, a GPU's utilisation,
//! memory, temperature and power, a worker's task, durations, money, a
//! job's state and progress line. Pure functions of the snapshot's values.

use super::*;

/// A CPU model without the trademark noise: "Intel(R) Xeon(R) CPU E5-2690
/// v4 @ 2.60GHz" → "Intel Xeon E5-2690 v4".
pub fn short_cpu(model: &str) -> String {
    let model = model.split(" @ ").next().unwrap_or(model);
    let cleaned = model
        .replace("(R)", "")
        .replace("(r)", "")
        .replace("(TM)", "")
        .replace("(tm)", "");
    cleaned
        .split_whitespace()
        .filter(|w| !matches!(*w, "CPU" | "Processor"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The GPU column: GPU names, or the CPU and why there is no GPU.
pub(super) fn gpu_cell(t: Option<&Telemetry>, width: Width) -> Cell<'static> {
    let Some(t) = t else {
        return Cell::from("–").dim();
    };
    if let Some(first) = t.gpus.first() {
        let text = if t.gpus.iter().all(|g| g.name == first.name) && t.gpus.len() > 1 {
            format!("{}× {}", t.gpus.len(), first.name)
        } else {
            t.gpus
                .iter()
                .map(|g| g.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Cell::from(text);
    }
    let text = match (&t.gpu_note, width) {
        (Some(note), Width::Narrow) => format!("CPU · {note}"),
        (Some(note), _) => format!("CPU: {} · {note}", short_cpu(&t.host.cpu_model)),
        (None, _) => format!("CPU: {}", short_cpu(&t.host.cpu_model)),
    };
    Cell::from(text).style(Style::new().fg(Color::Magenta))
}

pub(super) fn util_text(t: Option<&Telemetry>) -> String {
    match t {
        None => "–".into(),
        Some(t) if !t.gpus.is_empty() => {
            let sum: u32 = t.gpus.iter().map(|g| g.utilization_pct).sum();
            format!("{}%", sum / t.gpus.len() as u32)
        }
        // No GPU: the CPU's load as a share of its cores.
        Some(t) => format!(
            "{:.0}%",
            (f64::from(t.host.load_1m) * 100.0 / f64::from(t.host.cores.max(1))).min(999.0)
        ),
    }
}

pub(super) fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// VRAM used/total for GPUs, the host's memory otherwise.
pub(super) fn memory_text(t: Option<&Telemetry>) -> String {
    match t {
        None => "–".into(),
        Some(t) if !t.gpus.is_empty() => {
            let used: u64 = t.gpus.iter().map(|g| g.memory_used_bytes).sum();
            let total: u64 = t.gpus.iter().map(|g| g.memory_total_bytes).sum();
            format!("{:.1}/{:.0}G", gib(used), gib(total))
        }
        Some(t) => format!(
            "{:.1}/{:.0}G",
            gib(t.host.memory_used_bytes),
            gib(t.host.memory_total_bytes)
        ),
    }
}

pub(super) fn temp_text(t: Option<&Telemetry>) -> String {
    match t.and_then(|t| t.gpus.iter().map(|g| g.temperature_c).max()) {
        Some(c) => format!("{c}°C"),
        None => "–".into(),
    }
}

pub(super) fn power_text(t: Option<&Telemetry>) -> String {
    match t {
        Some(t) if !t.gpus.is_empty() => {
            let draw: f32 = t.gpus.iter().map(|g| g.power_draw_w).sum();
            let limit: f32 = t.gpus.iter().map(|g| g.power_limit_w).sum();
            format!("{draw:.0}/{limit:.0}W")
        }
        _ => "–".into(),
    }
}

/// The first task a worker holds: `j7 f12 #17 48/128` (job, frame, task,
/// samples done/total), and `+N` more.
pub(super) fn task_text(w: &WorkerStatus, width: Width) -> String {
    let Some(t) = w.tasks.first() else {
        return "–".into();
    };
    let mut s = if width == Width::Narrow {
        format!("j{} f{}", t.job, t.frame)
    } else {
        format!("j{} f{} #{}", t.job, t.frame, t.index)
    };
    if let Some((done, total)) = t.progress {
        s.push_str(&format!(" {done}/{total}"));
    }
    if w.tasks.len() > 1 {
        s.push_str(&format!(" +{}", w.tasks.len() - 1));
    }
    s
}

/// `1h02m`, `4m07s`, `12s`.
pub fn duration(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

/// Dollars: cents from $1 up, a tenth of a cent below (short test renders
/// and cheap nodes cost fractions of a cent).
pub fn money(v: Option<f64>) -> String {
    match v {
        None => "–".into(),
        Some(v) if v.abs() >= 1.0 || v == 0.0 => format!("${v:.2}"),
        Some(v) => format!("${v:.3}"),
    }
}

pub(super) fn job_state_text(j: &JobStatus) -> (String, Style) {
    if !j.state.is_final() && j.paused {
        return ("paused".into(), Style::new().fg(Color::Yellow).bold());
    }
    if !j.state.is_final() && !j.waiting_for.is_empty() {
        // `--after`: waiting for its jobs, or held by one that failed.
        let held = j.blocked.as_deref().is_some_and(|b| b.starts_with("held"));
        let text = if held { "held" } else { "waiting" };
        return (text.into(), Style::new().fg(Color::Cyan));
    }
    if !j.state.is_final() && j.blocked.is_some() {
        return ("blocked".into(), Style::new().fg(Color::Red));
    }
    let style = match j.state {
        JobState::Queued => Style::new().fg(Color::Gray),
        JobState::Running => Style::new().fg(Color::Yellow),
        JobState::Done => Style::new().fg(Color::Green),
        JobState::Failed => Style::new().fg(Color::Red).bold(),
        JobState::Canceled => Style::new().fg(Color::DarkGray),
    };
    (j.state.name().into(), style)
}

/// `██████░░░░ 45/96` in `width` columns.
pub(super) fn progress_line(done: u32, total: u32, width: u16) -> Line<'static> {
    let count = format!(" {done}/{total}");
    let bar = (width as usize)
        .saturating_sub(count.chars().count())
        .max(1);
    let frac = if total == 0 {
        0.0
    } else {
        f64::from(done.min(total)) / f64::from(total)
    };
    let filled = (frac * bar as f64).round() as usize;
    Line::from(vec![
        Span::styled("█".repeat(filled), Style::new().fg(DONE)),
        Span::styled("░".repeat(bar - filled), Style::new().fg(Color::DarkGray)),
        Span::raw(count),
    ])
}
