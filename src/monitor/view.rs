//! Draws the monitor from the model: a header with the farm's burn rate and
//! the connection, the workers and jobs tables, the tile mosaic of the
//! selected job's current frame, the event log, and a footer of key hints;
//! the help and confirm pop-ups over them. [`render`] only reads the
//! [`App`]. Columns that matter less drop out as the terminal narrows: 80
//! columns shows the essentials, 140 and wider everything.

use ratatui::layout::{Alignment, Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Cell, Clear, Paragraph, Row, Table, TableState, Wrap};
use ratatui::Frame;
use tessera_protocol::messages::{
    FarmEvent, JobState, JobStatus, TileState, TileStatus, WorkerState, WorkerStatus,
};
use tessera_protocol::telemetry::Telemetry;

use super::app::{App, Confirm, Link, LogItem, Pane};

mod cells;

#[cfg(test)]
pub use cells::short_cpu;
pub use cells::{duration, money};
use cells::{
    gpu_cell, job_state_text, memory_text, power_text, progress_line, task_text, temp_text,
    util_text,
};

pub const QUEUED: Color = Color::DarkGray;
pub const RENDERING: Color = Color::Yellow;
pub const DONE: Color = Color::Green;
pub const FAILED: Color = Color::Red;

const FOCUS: Color = Color::Cyan;

/// How much room there is for columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Width {
    /// Under 100 columns: the essentials.
    Narrow,
    /// Under 140 columns.
    Medium,
    Wide,
}

impl Width {
    fn of(columns: u16) -> Width {
        match columns {
            0..100 => Width::Narrow,
            100..140 => Width::Medium,
            _ => Width::Wide,
        }
    }
}

pub fn render(app: &App, frame: &mut Frame) {
    let area = frame.area();
    let width = Width::of(area.width);
    let [header, body, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(area);
    // Each table gets its rows plus border and header, up to a third of
    // the body; the mosaic and the log share what is left.
    let cap = (body.height / 3).max(4);
    let rows = |n: usize| (n.max(1) as u16).saturating_add(3).min(cap);
    let [workers, jobs, bottom] = Layout::vertical([
        Constraint::Length(rows(app.workers().len())),
        Constraint::Length(rows(app.jobs().len())),
        Constraint::Min(0),
    ])
    .areas(body);
    let [mosaic, log] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(bottom);

    render_header(app, frame, header, width);
    render_workers(app, frame, workers, width);
    render_jobs(app, frame, jobs, width);
    render_mosaic(app, frame, mosaic);
    render_log(app, frame, log);
    render_footer(app, frame, footer, width);
    if app.help {
        render_help(frame, area);
    }
    if let Some(confirm) = &app.confirm {
        render_confirm(confirm, frame, area);
    }
}

fn render_header(app: &App, frame: &mut Frame, area: Rect, width: Width) {
    let link = match &app.link {
        Link::Connecting => Span::styled(" ◌ connecting… ", Style::new().fg(Color::Yellow)),
        Link::Connected => Span::styled(" ● connected ", Style::new().fg(Color::Green)),
        Link::Reconnecting { .. } => Span::styled(
            " ◌ reconnecting… ",
            Style::new().fg(Color::Black).bg(Color::Yellow),
        ),
    };
    let mut spans = vec![
        Span::styled(" tessera ", Style::new().bold().reversed()),
        link,
    ];
    if let Some(s) = &app.snapshot {
        let running = s.jobs.iter().filter(|j| !j.state.is_final()).count();
        spans.extend([
            Span::raw("│ burn "),
            Span::styled(
                format!("${:.2}/h", s.farm.burn_usd_per_hour + 0.0),
                Style::new().bold(),
            ),
            Span::raw(" │ idle "),
            Span::styled(
                format!("${:.2}/h", s.farm.idle_usd_per_hour + 0.0),
                Style::new().bold(),
            ),
        ]);
        if width > Width::Narrow {
            let plural =
                |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
            spans.push(Span::raw(format!(
                " │ {} │ {}, {running} active",
                plural(s.workers.len(), "worker"),
                plural(s.jobs.len(), "job"),
            )));
        }
    }
    if let Link::Reconnecting { error } = &app.link {
        spans.push(Span::styled(
            format!(" │ {error}"),
            Style::new().fg(Color::Yellow),
        ));
    }
    frame.render_widget(Line::from(spans), area);
}

/// A bordered pane; the focused one has a coloured border and a `▸` before
/// its title (for terminals without colour, and for eyes).
fn pane_block(title: &str, focused: bool) -> Block<'_> {
    let block = Block::bordered().border_type(BorderType::Rounded);
    if focused {
        block
            .title(format!(" ▸ {title} "))
            .border_style(Style::new().fg(FOCUS))
            .title_style(Style::new().fg(FOCUS).bold())
    } else {
        block
            .title(format!(" {title} "))
            .border_style(Style::new().fg(Color::DarkGray))
    }
}

/// The selected row: a blue band in the focused table, underlined in the
/// other. Only the background changes, so coloured cells keep their colour.
fn highlight(focused: bool) -> Style {
    if focused {
        Style::new().bg(Color::Blue).bold()
    } else {
        Style::new().add_modifier(Modifier::UNDERLINED)
    }
}

fn render_workers(app: &App, frame: &mut Frame, area: Rect, width: Width) {
    let focused = app.pane == Pane::Workers;
    let block = pane_block("Workers", focused);
    let workers = app.workers();
    if workers.is_empty() {
        let text = if app.snapshot.is_some() {
            "no workers connected: start one with `tessera worker --ticket @DATA_DIR/worker.ticket`"
        } else {
            "waiting for the coordinator…"
        };
        frame.render_widget(Paragraph::new(text).dim().block(block), area);
        return;
    }
    let mut columns: Vec<(&str, Constraint)> = vec![
        ("NAME", Constraint::Length(12)),
        ("STATE", Constraint::Length(8)),
    ];
    if width == Width::Wide {
        columns.push(("ENGINE", Constraint::Length(17)));
    }
    columns.push(("GPU", Constraint::Fill(1)));
    columns.push(("UTIL", Constraint::Length(4)));
    if width >= Width::Medium {
        columns.push(("MEMORY", Constraint::Length(11)));
        columns.push(("TEMP", Constraint::Length(4)));
    }
    if width == Width::Wide {
        columns.push(("POWER", Constraint::Length(9)));
    }
    columns.push((
        "TASK",
        Constraint::Length(if width == Width::Narrow { 14 } else { 20 }),
    ));
    columns.push(("$/H", Constraint::Length(6)));
    if width >= Width::Medium {
        columns.push(("UP", Constraint::Length(6)));
    }
    let rows = workers.iter().map(|w| {
        let t = w.telemetry.as_ref();
        let mut cells = vec![
            Cell::from(w.name.clone()),
            Cell::from(w.state.name()).style(worker_state_style(w.state)),
        ];
        if width == Width::Wide {
            // Blender as `blender 4.5 OPTIX`: its version and the device
            // its slots render on (the builtin engine beside it is left out
            // for room).
            let engines: Vec<String> = match w.blenders.as_slice() {
                [b, ..] => vec![format!("blender {} {}", b.version.short(), b.render_device)],
                [] => w.engines.iter().map(|e| e.name().to_string()).collect(),
            };
            cells.push(Cell::from(engines.join(",")));
        }
        cells.push(gpu_cell(t, width));
        cells.push(Cell::from(util_text(t)));
        if width >= Width::Medium {
            cells.push(Cell::from(memory_text(t)));
            cells.push(Cell::from(temp_text(t)));
        }
        if width == Width::Wide {
            cells.push(Cell::from(power_text(t)));
        }
        cells.push(Cell::from(task_text(w, width)));
        cells.push(Cell::from(format!("${:.2}", w.price_per_hour)));
        if width >= Width::Medium {
            cells.push(Cell::from(duration(w.connected_secs as f64)));
        }
        Row::new(cells)
    });
    let header = Row::new(columns.iter().map(|(name, _)| *name)).style(Style::new().bold());
    let table = Table::new(rows, columns.iter().map(|(_, c)| *c))
        .header(header)
        .block(block)
        .row_highlight_style(highlight(focused));
    let selected = app
        .selected_worker
        .and_then(|id| workers.iter().position(|w| w.id == id));
    let mut state = TableState::new().with_selected(selected);
    frame.render_stateful_widget(table, area, &mut state);
}

fn worker_state_style(state: WorkerState) -> Style {
    match state {
        WorkerState::Idle => Style::new(),
        WorkerState::Busy => Style::new().fg(Color::Green),
        WorkerState::Draining => Style::new().fg(Color::Yellow),
        WorkerState::Silent => Style::new().fg(Color::Red),
    }
}

fn render_jobs(app: &App, frame: &mut Frame, area: Rect, width: Width) {
    let focused = app.pane == Pane::Jobs;
    let block = pane_block("Jobs", focused);
    let jobs = app.jobs();
    if jobs.is_empty() {
        let text = if app.snapshot.is_some() {
            "no jobs yet: `tessera submit SCENE` queues one"
        } else {
            ""
        };
        frame.render_widget(Paragraph::new(text).dim().block(block), area);
        return;
    }
    let bar_width: u16 = match width {
        Width::Narrow => 18,
        Width::Medium => 24,
        Width::Wide => 32,
    };
    let mut columns: Vec<(&str, Constraint)> = Vec::new();
    if width >= Width::Medium {
        columns.push(("ID", Constraint::Length(4)));
    }
    columns.extend([
        ("NAME", Constraint::Fill(1)),
        ("PROGRESS", Constraint::Length(bar_width)),
        ("FRAMES", Constraint::Length(7)),
        ("STATE", Constraint::Length(8)),
        ("ETA", Constraint::Length(6)),
        ("COST", Constraint::Length(7)),
        ("TO END", Constraint::Length(7)),
    ]);
    if width == Width::Wide {
        columns.push(("NOTE", Constraint::Fill(1)));
    }
    let rows = jobs.iter().map(|j| {
        let (state, state_style) = job_state_text(j);
        let eta = match (j.state.is_final() || j.paused, j.eta_secs) {
            (false, Some(s)) => duration(s),
            _ => "–".into(),
        };
        let mut cells = Vec::new();
        if width >= Width::Medium {
            cells.push(Cell::from(j.id.to_string()));
        }
        cells.extend([
            Cell::from(j.name.clone()),
            Cell::from(progress_line(j.tasks_done, j.tasks_total, bar_width)),
            Cell::from(format!("{}/{}", j.frames_done, j.frames_total)),
            Cell::from(state).style(state_style),
            Cell::from(eta),
            Cell::from(money(Some(j.cost_usd))),
            Cell::from(if j.state.is_final() {
                "–".into()
            } else {
                money(j.cost_to_finish_usd)
            }),
        ]);
        if width == Width::Wide {
            let note = j
                .error
                .clone()
                .or_else(|| j.blocked.clone())
                .or_else(|| crate::report::after_note(j))
                .unwrap_or_default();
            cells.push(Cell::from(note).style(Style::new().fg(Color::Red)));
        }
        Row::new(cells)
    });
    let header = Row::new(columns.iter().map(|(name, _)| *name)).style(Style::new().bold());
    let table = Table::new(rows, columns.iter().map(|(_, c)| *c))
        .header(header)
        .block(block)
        .row_highlight_style(highlight(focused));
    let selected = app
        .selected_job
        .and_then(|id| jobs.iter().position(|j| j.id == id));
    let mut state = TableState::new().with_selected(selected);
    frame.render_stateful_widget(table, area, &mut state);
}

pub fn tile_color(state: TileState) -> Color {
    match state {
        TileState::Queued => QUEUED,
        TileState::Rendering(_) => RENDERING,
        TileState::Done => DONE,
        TileState::Failed => FAILED,
    }
}

/// Where each tile goes in `area`: the frame fitted into it at its aspect
/// ratio (a terminal cell is about twice as tall as wide), centred, each
/// tile's cells proportional to its pixels.
pub fn tile_cells(area: Rect, tiles: &[TileStatus]) -> Vec<Rect> {
    let w = tiles
        .iter()
        .map(|t| t.tile.x + t.tile.width)
        .max()
        .unwrap_or(0);
    let h = tiles
        .iter()
        .map(|t| t.tile.y + t.tile.height)
        .max()
        .unwrap_or(0);
    if w == 0 || h == 0 || area.width == 0 || area.height == 0 {
        return vec![Rect::default(); tiles.len()];
    }
    let aspect = f64::from(w) / f64::from(h) * 2.0;
    let (mut cols, mut rows) = (area.width, area.height);
    if f64::from(cols) / f64::from(rows) > aspect {
        cols = ((f64::from(rows) * aspect).round() as u16).clamp(1, area.width);
    } else {
        rows = ((f64::from(cols) / aspect).round() as u16).clamp(1, area.height);
    }
    let x0 = area.x + (area.width - cols) / 2;
    let y0 = area.y + (area.height - rows) / 2;
    let sx = |px: u32| x0 + (u64::from(px) * u64::from(cols) / u64::from(w)) as u16;
    let sy = |px: u32| y0 + (u64::from(px) * u64::from(rows) / u64::from(h)) as u16;
    tiles
        .iter()
        .map(|t| {
            let (left, right) = (sx(t.tile.x), sx(t.tile.x + t.tile.width));
            let (top, bottom) = (sy(t.tile.y), sy(t.tile.y + t.tile.height));
            Rect::new(left, top, right - left, bottom - top)
        })
        .collect()
}

fn render_mosaic(app: &App, frame: &mut Frame, area: Rect) {
    let job = app.selected_job_status();
    let mosaic = app.shown_mosaic();
    let mut title = "Tiles".to_string();
    if let (Some(j), Some(m)) = (job, mosaic) {
        let (_, _, done, _) = m.counts();
        title = format!(
            "Tiles · frame {} · {done}/{} done · {}{}",
            m.frame,
            m.tiles.len(),
            j.name,
            if app.pinned {
                " · pinned (f follows)"
            } else {
                ""
            }
        );
    }
    let block = pane_block(&title, false);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let Some(m) = mosaic.filter(|m| !m.tiles.is_empty()) else {
        let text = match (job, mosaic.and_then(|m| m.error.as_deref())) {
            (None, _) => "no job selected".to_string(),
            (Some(_), Some(e)) => e.to_string(),
            (Some(j), None) if j.tasks_done == 0 && j.tasks_running == 0 => {
                "no frame started yet".to_string()
            }
            (Some(_), None) => "loading tiles…".to_string(),
        };
        frame.render_widget(Paragraph::new(text).dim(), inner);
        return;
    };
    // The legend takes two lines where one is too narrow for it.
    let legend_height = if inner.width < 48 { 2 } else { 1 };
    let [grid, legend] =
        Layout::vertical([Constraint::Min(0), Constraint::Length(legend_height)]).areas(inner);
    let cells = tile_cells(grid, &m.tiles);
    let buf = frame.buffer_mut();
    for (t, r) in m.tiles.iter().zip(&cells) {
        let color = tile_color(t.state);
        // A gap column (and row, where there is room) keeps tiles apart.
        let fill_w = if r.width >= 3 { r.width - 1 } else { r.width };
        let fill_h = if r.height >= 3 {
            r.height - 1
        } else {
            r.height
        };
        let fill = Rect::new(r.x, r.y, fill_w, fill_h);
        for y in fill.top()..fill.bottom() {
            for x in fill.left()..fill.right() {
                buf[(x, y)].set_symbol(" ").set_bg(color);
            }
        }
        // Too short for a gap row: a thin line along the top of the tile
        // keeps it apart from the one above.
        if fill.height == r.height && r.y > grid.y {
            for x in fill.left()..fill.right() {
                buf[(x, fill.y)].set_symbol("▔").set_fg(Color::Black);
            }
        }
        let label = match t.state {
            TileState::Rendering(Some((done, total))) if total > 0 => {
                format!("{}%", u64::from(done) * 100 / u64::from(total))
            }
            TileState::Failed => "✗".into(),
            _ => String::new(),
        };
        let len = label.chars().count() as u16;
        if !label.is_empty() && len <= fill.width && fill.height > 0 {
            let x = fill.x + (fill.width - len) / 2;
            let y = fill.y + fill.height / 2;
            buf.set_string(x, y, &label, Style::new().bg(color).fg(Color::Black).bold());
        }
    }
    let (queued, rendering, done, failed) = m.counts();
    let swatch = |c: Color, label: String| {
        [
            Span::styled("■", Style::new().fg(c)),
            Span::raw(format!(" {label}  ")),
        ]
    };
    let mut spans = Vec::new();
    spans.extend(swatch(QUEUED, format!("queued {queued}")));
    spans.extend(swatch(RENDERING, format!("rendering {rendering}")));
    spans.extend(swatch(DONE, format!("done {done}")));
    spans.extend(swatch(FAILED, format!("failed {failed}")));
    frame.render_widget(
        Paragraph::new(Line::from(spans)).wrap(Wrap { trim: true }),
        legend,
    );
}

/// `HH:MM:SS` (UTC) of a unix time in milliseconds.
pub fn clock(unix_ms: u64) -> String {
    let s = unix_ms / 1000 % 86_400;
    format!("{:02}:{:02}:{:02}", s / 3600, s % 3600 / 60, s % 60)
}

/// One log line for a farm event; `worker` and `job` are the names they
/// had when it happened.
fn event_line(event: &FarmEvent, worker: Option<&str>, job_name: Option<&str>) -> (String, Style) {
    let on = |id: &u64| worker.map_or(format!("worker {id}"), str::to_string);
    match event {
        FarmEvent::WorkerJoined { name, .. } => {
            (format!("{name} joined"), Style::new().fg(Color::Green))
        }
        FarmEvent::WorkerLeft { name, .. } => {
            (format!("{name} left"), Style::new().fg(Color::Yellow))
        }
        FarmEvent::TaskStarted { job, index, worker } => (
            format!("job {job} task {index} → {}", on(worker)),
            Style::new().fg(Color::Gray),
        ),
        FarmEvent::TaskFinished {
            job,
            index,
            worker,
            render_ms,
        } => (
            format!(
                "job {job} task {index} done on {} in {:.1}s",
                on(worker),
                *render_ms as f64 / 1000.0
            ),
            Style::new(),
        ),
        FarmEvent::TaskFailed {
            job,
            index,
            worker,
            error,
        } => (
            format!("job {job} task {index} failed on {}: {error}", on(worker)),
            Style::new().fg(Color::Red),
        ),
        FarmEvent::JobChanged { job, state } => {
            let name = job_name.map(|n| format!(" ({n})")).unwrap_or_default();
            let style = match state {
                JobState::Failed => Style::new().fg(Color::Red).bold(),
                JobState::Done => Style::new().fg(Color::Green).bold(),
                _ => Style::new().bold(),
            };
            (format!("job {job}{name} is {}", state.name()), style)
        }
        FarmEvent::JobHeld { job, paused } => {
            let name = job_name.map(|n| format!(" ({n})")).unwrap_or_default();
            let what = if *paused { "paused" } else { "resumed" };
            (format!("job {job}{name} is {what}"), Style::new().bold())
        }
    }
}

fn render_log(app: &App, frame: &mut Frame, area: Rect) {
    let block = pane_block("Events", false);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let n = inner.height as usize;
    let skip = app.log.len().saturating_sub(n);
    let lines: Vec<Line> = app
        .log
        .iter()
        .skip(skip)
        .map(|l| {
            let (text, style) = match &l.item {
                LogItem::Farm { event, worker, job } => {
                    event_line(event, worker.as_deref(), job.as_deref())
                }
                LogItem::Note(t) => (t.clone(), Style::new().fg(Color::Cyan)),
                LogItem::Error(t) => (format!("error: {t}"), Style::new().fg(Color::Red).bold()),
            };
            Line::from(vec![
                Span::styled(clock(l.unix_ms), Style::new().fg(Color::DarkGray)),
                Span::raw(" "),
                Span::styled(text, style),
            ])
        })
        .collect();
    frame.render_widget(Paragraph::new(lines), inner);
}

/// Key, what it does, and the same in fewer letters for 80 columns.
const KEYS: [(&str, &str, &str); 7] = [
    ("↑↓/jk", "move", "move"),
    ("Tab", "pane", "pane"),
    ("p", "pause/resume", "pause"),
    ("c", "cancel job", "cancel"),
    ("d", "drain worker", "drain"),
    ("?", "help", "help"),
    ("q", "quit", "quit"),
];

fn render_footer(app: &App, frame: &mut Frame, area: Rect, width: Width) {
    let line = match &app.confirm {
        Some(c) => Line::from(vec![
            Span::styled(format!(" {} ", confirm_question(c)), Style::new().bold()),
            Span::styled(" y ", Style::new().reversed()),
            Span::raw(" yes   "),
            Span::styled(" n ", Style::new().reversed()),
            Span::raw(" no"),
        ]),
        None => {
            let mut spans = Vec::new();
            for (key, what, short) in KEYS {
                let what = if width == Width::Narrow { short } else { what };
                spans.push(Span::styled(
                    format!(" {key}"),
                    Style::new().fg(FOCUS).bold(),
                ));
                spans.push(Span::raw(format!(" {what} ")));
            }
            Line::from(spans)
        }
    };
    frame.render_widget(line, area);
}

fn confirm_question(c: &Confirm) -> String {
    match c {
        Confirm::Cancel { job, name } => format!("Cancel job {job} ({name})?"),
        Confirm::Drain { name, .. } => {
            format!("Drain worker {name} (finish its tasks, then leave)?")
        }
    }
}

fn popup(area: Rect, width: u16, height: u16) -> Rect {
    area.centered(
        Constraint::Length(width.min(area.width)),
        Constraint::Length(height.min(area.height)),
    )
}

fn render_confirm(c: &Confirm, frame: &mut Frame, area: Rect) {
    let question = confirm_question(c);
    let width = (question.chars().count() as u16 + 6).max(30);
    let r = popup(area, width, 5);
    frame.render_widget(Clear, r);
    let text = vec![
        Line::from(question).bold(),
        Line::from(""),
        Line::from("y: yes    any other key: no"),
    ];
    frame.render_widget(
        Paragraph::new(text).alignment(Alignment::Center).block(
            Block::bordered()
                .border_type(BorderType::Double)
                .title(" Confirm ")
                .yellow(),
        ),
        r,
    );
}

fn render_help(frame: &mut Frame, area: Rect) {
    let rows = [
        ("↑ ↓  j k", "move the selection"),
        ("PgUp PgDn Home End", "move further"),
        ("Tab", "switch between jobs and workers"),
        ("f", "tiles follow the running job again"),
        ("p", "pause / resume the selected job"),
        ("c", "cancel the selected job (asks)"),
        ("d", "drain the selected worker (asks)"),
        ("?", "show / hide this help"),
        ("q  Esc  Ctrl-C", "quit"),
    ];
    let mut lines: Vec<Line> = rows
        .iter()
        .map(|(k, what)| {
            Line::from(vec![
                Span::styled(format!("{k:>18}  "), Style::new().fg(FOCUS).bold()),
                Span::raw(*what),
            ])
        })
        .collect();
    lines.push(Line::from(""));
    lines.push(Line::from(vec![
        Span::raw("  tiles: "),
        Span::styled("■ queued ", Style::new().fg(QUEUED)),
        Span::styled("■ rendering ", Style::new().fg(RENDERING)),
        Span::styled("■ done ", Style::new().fg(DONE)),
        Span::styled("■ failed", Style::new().fg(FAILED)),
    ]));
    let r = popup(area, 58, lines.len() as u16 + 2);
    frame.render_widget(Clear, r);
    frame.render_widget(
        Paragraph::new(lines).block(
            Block::bordered()
                .border_type(BorderType::Rounded)
                .title(" Help ")
                .border_style(Style::new().fg(FOCUS)),
        ),
        r,
    );
}
