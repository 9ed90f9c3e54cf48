//! The monitor without a terminal or a farm: update tests drive [`App`] with
//! messages, draw tests render it on ratatui's `TestBackend` and compare the
//! screen with the snapshots in `snapshots/` (rewrite them with
//! `TESSERA_UPDATE_SNAPSHOTS=1`) and check colours cell by cell.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::style::Color;
use ratatui::Terminal;
use tessera_protocol::job::{Engine, TileGrid, TileRect};
use tessera_protocol::messages::{
    FarmEvent, FarmStatus, JobState, JobStatus, RunningTask, Snapshot, TileState, TileStatus,
    WorkerState, WorkerStatus,
};
use tessera_protocol::telemetry::{GpuTelemetry, HostTelemetry, Telemetry};

use super::app::{App, Command, Confirm, Link, Msg, Pane, LOG_CAPACITY};
use super::view;

const GIB: u64 = 1 << 30;
/// 2023-11-14 22:13:20 UTC.
const NOW: u64 = 1_700_000_000_000;

fn rtx_4090() -> Telemetry {
    Telemetry {
        host: HostTelemetry {
            cpu_model: "AMD Ryzen 9 7950X 16-Core Processor".into(),
            cores: 32,
            load_1m: 1.5,
            memory_used_bytes: 20 * GIB,
            memory_total_bytes: 64 * GIB,
        },
        gpus: vec![GpuTelemetry {
            index: 0,
            name: "NVIDIA GeForce RTX 4090".into(),
            utilization_pct: 97,
            memory_used_bytes: 18 * GIB + 400 * (1 << 20),
            memory_total_bytes: 24 * GIB,
            temperature_c: 71,
            power_draw_w: 412.3,
            power_limit_w: 450.0,
            sm_clock_mhz: 2745,
            memory_clock_mhz: 10501,
        }],
        gpu_note: None,
    }
}

fn cpu_only() -> Telemetry {
    Telemetry {
        host: HostTelemetry {
            cpu_model: "AMD EPYC 7B13 64-Core Processor".into(),
            cores: 16,
            load_1m: 8.0,
            memory_used_bytes: 12 * GIB,
            memory_total_bytes: 64 * GIB,
        },
        gpus: Vec::new(),
        gpu_note: Some("no NVIDIA driver".into()),
    }
}

fn job(id: u64, name: &str, state: JobState) -> JobStatus {
    JobStatus {
        id,
        name: name.into(),
        engine: Engine::Blender,
        state,
        priority: 0,
        frames_total: 8,
        frames_done: 0,
        tasks_total: 128,
        tasks_done: 0,
        tasks_running: 0,
        bytes_uploaded: 0,
        bytes_deduplicated: 0,
        bytes_to_workers: 0,
        render_ms: 0,
        submitted_unix_ms: NOW - 600_000,
        finished_unix_ms: None,
        error: None,
        blocked: None,
        cost_usd: 0.0,
        cost_to_finish_usd: None,
        eta_secs: None,
        paused: false,
        verification: None,
        after: Vec::new(),
        after_failure: Default::default(),
        waiting_for: Vec::new(),
        deadline_unix_ms: None,
        budget_usd: None,
    }
}

fn worker(id: u64, name: &str, telemetry: Telemetry) -> WorkerStatus {
    WorkerStatus {
        id,
        name: name.into(),
        hostname: format!("{name}.farm"),
        engines: vec![Engine::Blender, Engine::Builtin],
        slots: 1,
        state: WorkerState::Idle,
        running: 0,
        tasks_done: 0,
        price_per_hour: 0.0,
        connected_secs: 0,
        tasks: Vec::new(),
        telemetry: Some(telemetry),
        interruptible: false,
        blenders: Vec::new(),
    }
}

/// Two workers (an RTX 4090 busy on job 7, a CPU node with no NVIDIA
/// driver), a job mid-way, a paused job and a finished one.
fn farm() -> Snapshot {
    let mut gpu = worker(1, "gpu-4090", rtx_4090());
    gpu.state = WorkerState::Busy;
    gpu.running = 1;
    gpu.tasks_done = 41;
    gpu.price_per_hour = 0.45;
    gpu.connected_secs = 7384;
    gpu.blenders = vec![tessera_protocol::blender::BlenderOffer {
        version: tessera_protocol::blender::BlenderVersion::new(4, 5, 4),
        name: "Blender 4.5.4 LTS (bpy)".into(),
        device_types: vec!["CUDA".into(), "OPTIX".into()],
        devices: vec!["OPTIX: NVIDIA GeForce RTX 4090".into()],
        render_device: "OPTIX".into(),
        oidn: true,
        osl: true,
        eevee: true,
    }];
    gpu.tasks = vec![RunningTask {
        job: 7,
        index: 101,
        frame: 12,
        tile: TileRect {
            x: 480,
            y: 270,
            width: 480,
            height: 270,
        },
        progress: Some((48, 128)),
        stage: None,
    }];
    let mut cpu = worker(2, "cpu-node", cpu_only());
    cpu.engines = vec![Engine::Builtin];
    cpu.price_per_hour = 0.10;
    cpu.connected_secs = 300;

    let mut shot = job(7, "shot_010", JobState::Running);
    shot.frames_done = 3;
    shot.tasks_done = 58;
    shot.tasks_running = 2;
    shot.cost_usd = 1.23;
    shot.cost_to_finish_usd = Some(1.48);
    shot.eta_secs = Some(620.0);
    let mut paused = job(8, "shot_020", JobState::Running);
    paused.paused = true;
    paused.tasks_total = 64;
    paused.cost_to_finish_usd = None;
    let mut done = job(5, "lookdev", JobState::Done);
    done.engine = Engine::Builtin;
    done.frames_total = 4;
    done.frames_done = 4;
    done.tasks_total = 16;
    done.tasks_done = 16;
    done.cost_usd = 0.07;
    Snapshot {
        unix_ms: NOW,
        jobs: vec![shot, paused, done],
        workers: vec![gpu, cpu],
        farm: FarmStatus {
            burn_usd_per_hour: 0.55,
            idle_usd_per_hour: 0.10,
        },
    }
}

/// Frame 12 of job 7, 4×4 tiles of 1920×1080: five done, two rendering
/// (one with progress), one failed, the rest queued.
fn frame_12_tiles() -> Vec<TileStatus> {
    let grid = TileGrid { cols: 4, rows: 4 };
    (0..16)
        .map(|i| TileStatus {
            tile: grid.rect(i, 1920, 1080),
            state: match i {
                0..=4 => TileState::Done,
                5 => TileState::Rendering(Some((48, 128))),
                6 => TileState::Rendering(None),
                7 => TileState::Failed,
                _ => TileState::Queued,
            },
        })
        .collect()
}

/// The populated farm as the monitor shows it after a while.
fn populated() -> App {
    let mut app = App::new();
    app.update(Msg::Link(Link::Connected));
    // The feed sends a snapshot first, then events as they happen.
    app.update(Msg::Snapshot(farm()));
    for (i, event) in [
        FarmEvent::WorkerJoined {
            worker: 1,
            name: "gpu-4090".into(),
        },
        FarmEvent::WorkerJoined {
            worker: 2,
            name: "cpu-node".into(),
        },
        FarmEvent::JobChanged {
            job: 7,
            state: JobState::Running,
        },
        FarmEvent::TaskFinished {
            job: 7,
            index: 100,
            worker: 1,
            render_ms: 2140,
        },
        FarmEvent::TaskFailed {
            job: 7,
            index: 39,
            worker: 2,
            error: "out of memory".into(),
        },
        FarmEvent::TaskStarted {
            job: 7,
            index: 101,
            worker: 1,
        },
    ]
    .into_iter()
    .enumerate()
    {
        app.update(Msg::Event {
            unix_ms: NOW - 60_000 + i as u64 * 1000,
            event,
        });
    }
    app.update(Msg::Tiles {
        job: 7,
        frame: 12,
        tiles: frame_12_tiles(),
    });
    app
}

fn key(code: KeyCode) -> Msg {
    Msg::Key(KeyEvent::new(code, KeyModifiers::NONE))
}

fn draw(app: &App, width: u16, height: u16) -> Buffer {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal.draw(|f| view::render(app, f)).unwrap();
    terminal.backend().buffer().clone()
}

fn lines(buf: &Buffer) -> Vec<String> {
    (0..buf.area.height)
        .map(|y| {
            let mut line = String::new();
            for x in 0..buf.area.width {
                line.push_str(buf[(x, y)].symbol());
            }
            line.trim_end().to_string()
        })
        .collect()
}

/// Compares the screen's text with `snapshots/NAME.txt`.
fn assert_snapshot(name: &str, buf: &Buffer) {
    let text = lines(buf).join("\n") + "\n";
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/monitor/snapshots")
        .join(format!("{name}.txt"));
    if std::env::var_os("TESSERA_UPDATE_SNAPSHOTS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with TESSERA_UPDATE_SNAPSHOTS=1 to write it. The screen:\n{text}",
            path.display()
        )
    });
    assert!(
        text == want,
        "the screen differs from {} (TESSERA_UPDATE_SNAPSHOTS=1 rewrites it)\n--- got:\n{text}--- want:\n{want}",
        path.display()
    );
}

fn screen_text(buf: &Buffer) -> String {
    lines(buf).join("\n")
}

/// Every cell whose symbol starts `text` on some line, as (x, y).
fn find(buf: &Buffer, text: &str) -> Vec<(u16, u16)> {
    let mut hits = Vec::new();
    for (y, line) in lines(buf).iter().enumerate() {
        let chars: Vec<char> = line.chars().collect();
        let want: Vec<char> = text.chars().collect();
        for x in 0..chars.len() {
            if chars[x..].starts_with(&want) {
                hits.push((x as u16, y as u16));
            }
        }
    }
    hits
}

fn cells_with_bg(buf: &Buffer, color: Color) -> Vec<(u16, u16)> {
    let mut out = Vec::new();
    for y in 0..buf.area.height {
        for x in 0..buf.area.width {
            if buf[(x, y)].bg == color {
                out.push((x, y));
            }
        }
    }
    out
}

/// The failed tile is the one red block, and it carries the ✗.
fn assert_failed_tile_is_red(buf: &Buffer) {
    let red = cells_with_bg(buf, view::FAILED);
    assert!(!red.is_empty(), "no red cell:\n{}", screen_text(buf));
    let (x0, y0) = (
        red.iter().map(|c| c.0).min().unwrap(),
        red.iter().map(|c| c.1).min().unwrap(),
    );
    let (x1, y1) = (
        red.iter().map(|c| c.0).max().unwrap(),
        red.iter().map(|c| c.1).max().unwrap(),
    );
    assert_eq!(
        red.len(),
        usize::from(x1 - x0 + 1) * usize::from(y1 - y0 + 1),
        "red cells form one rectangle"
    );
    let mark = find(buf, "✗");
    assert_eq!(mark.len(), 1, "{}", screen_text(buf));
    let (mx, my) = mark[0];
    assert!((x0..=x1).contains(&mx) && (y0..=y1).contains(&my));
    assert_eq!(buf[(mx, my)].bg, Color::Red);
    // Tile 7 is the last of the second row: right of the rendering tiles.
    let yellow = cells_with_bg(buf, view::RENDERING);
    assert!(
        yellow.iter().all(|c| c.0 < x0),
        "rendering tiles lie left of the failed one"
    );
    assert!(
        yellow.iter().any(|c| c.1 >= y0 && c.1 <= y1),
        "…on the same row"
    );
    let green = cells_with_bg(buf, view::DONE);
    assert!(green.len() > red.len(), "five done tiles, one failed");
    let grey = cells_with_bg(buf, view::QUEUED);
    assert!(grey.len() > green.len(), "eight queued tiles, five done");
    // The tile rendering with known progress says how far it is.
    let pct = find(buf, "37%");
    assert_eq!(pct.len(), 1, "{}", screen_text(buf));
    assert_eq!(buf[pct[0]].bg, view::RENDERING);
}

/// The background colours of the screen, one letter a cell, for eyes.
fn colour_map(buf: &Buffer) -> String {
    let mut out = String::new();
    for y in 0..buf.area.height {
        for x in 0..buf.area.width {
            out.push(match buf[(x, y)].bg {
                Color::Green => 'G',
                Color::Yellow => 'Y',
                Color::Red => 'R',
                Color::DarkGray => '.',
                Color::Blue => 'B',
                _ => ' ',
            });
        }
        out.push('\n');
    }
    out
}

#[test]
fn populated_farm_at_80x24() {
    let app = populated();
    let buf = draw(&app, 80, 24);
    if std::env::var_os("TESSERA_SHOW_COLOURS").is_some() {
        println!("{}", colour_map(&buf));
    }
    assert_snapshot("farm_80x24", &buf);
    let text = screen_text(&buf);
    for want in [
        "● connected",
        "burn $0.55/h",
        "idle $0.10/h",
        // Workers: one with a GPU, one without.
        "gpu-4090",
        "NVIDIA GeForce RTX 4090",
        "97%",
        "j7 f12 48/128",
        "$0.45",
        "cpu-node",
        "CPU · no NVIDIA driver",
        "50%",
        // The job mid-way, the paused one, the finished one.
        "shot_010",
        "58/128",
        "3/8",
        "10m20s",
        "$1.23",
        "$1.48",
        "paused",
        "lookdev",
        "done",
        // Mosaic and log.
        "frame 12",
        "5/16 done",
        "failed 1",
        "job 7 task 39 failed on cpu-n",
        "q quit",
    ] {
        assert!(text.contains(want), "no {want:?} at 80×24:\n{text}");
    }
    assert_failed_tile_is_red(&buf);
    // The progress bar of shot_010: 58 of 128 tasks is 45%, so the first
    // cells of the bar are green and the rest grey.
    let (x, y) = find(&buf, "58/128")[0];
    let bar: Vec<Color> = (0..x - 1)
        .map(|bx| buf[(bx, y)].fg)
        .filter(|c| *c == view::DONE || *c == Color::DarkGray)
        .collect();
    let filled = bar.iter().filter(|c| **c == view::DONE).count();
    assert!(bar.len() >= 8 && filled * 100 / bar.len() >= 35 && filled * 100 / bar.len() <= 55);
}

#[test]
fn the_wide_monitor_shows_each_workers_blender_and_device() {
    let buf = draw(&populated(), 160, 48);
    assert_eq!(
        find(&buf, "blender 4.5 OPTIX").len(),
        1,
        "{}",
        screen_text(&buf)
    );
}

#[test]
fn populated_farm_at_160x48() {
    let app = populated();
    let buf = draw(&app, 160, 48);
    if std::env::var_os("TESSERA_SHOW_COLOURS").is_some() {
        println!("{}", colour_map(&buf));
    }
    assert_snapshot("farm_160x48", &buf);
    let text = screen_text(&buf);
    for want in [
        "ENGINE",
        "blender 4.5 OPTIX",
        "NVIDIA GeForce RTX 4090",
        "18.4/24G",
        "71°C",
        "412/450W",
        "j7 f12 #101 48/128",
        "2h03m",
        "CPU: AMD EPYC 7B13 64-Core · no NVIDIA driver",
        "12.0/64G",
        "5m00s",
        "shot_010",
        "10m20s",
        "$1.23",
        "$1.48",
        "paused",
        "TO END",
        "rendering 2",
        "queued 8",
        "done 5",
        "failed 1",
        "22:12:25 job 7 task 101 → gpu-4090",
    ] {
        assert!(text.contains(want), "no {want:?} at 160×48:\n{text}");
    }
    assert_failed_tile_is_red(&buf);
    // The mosaic keeps the frame's 16:9 shape: with cells twice as tall as
    // wide, the red tile is about 2×(16/9)/… wider than tall.
    let red = cells_with_bg(&buf, view::FAILED);
    let w = red.iter().map(|c| c.0).max().unwrap() - red.iter().map(|c| c.0).min().unwrap() + 1;
    let h = red.iter().map(|c| c.1).max().unwrap() - red.iter().map(|c| c.1).min().unwrap() + 1;
    let ratio = f64::from(w) / f64::from(h);
    assert!((2.5..=4.5).contains(&ratio), "a 480×270 tile drawn {w}×{h}");
}

#[test]
fn the_focused_pane_and_selection_are_highlighted() {
    let mut app = populated();
    app.update(key(KeyCode::Down));
    let buf = draw(&app, 120, 40);
    let (_, y) = find(&buf, "shot_020")[0];
    assert_eq!(buf[(10, y)].bg, Color::Blue, "the selected job's row");
    app.update(key(KeyCode::Tab));
    let buf = draw(&app, 120, 40);
    // Workers are listed by name: the first row is cpu-node's.
    let (_, y) = find(&buf, "cpu-node")[0];
    assert_eq!(buf[(5, y)].bg, Color::Blue, "the selected worker's row");
}

#[test]
fn help_and_confirm_pop_up_over_the_farm() {
    let mut app = populated();
    app.update(key(KeyCode::Char('?')));
    let text = screen_text(&draw(&app, 80, 24));
    assert!(
        text.contains("Help") && text.contains("drain the selected worker"),
        "{text}"
    );
    app.update(key(KeyCode::Esc));
    assert!(
        !app.help && !app.quit,
        "Esc closes the help, not the monitor"
    );

    app.update(key(KeyCode::Char('c')));
    let text = screen_text(&draw(&app, 80, 24));
    assert!(text.contains("Cancel job 7 (shot_010)?"), "{text}");
    assert!(text.contains("y: yes"), "{text}");
}

#[test]
fn reconnecting_shows_in_the_header_and_the_last_picture_stays() {
    let mut app = populated();
    app.update(Msg::Link(Link::Reconnecting {
        error: "no word from the coordinator for 3s".into(),
    }));
    let text = screen_text(&draw(&app, 120, 40));
    assert!(text.contains("reconnecting…"), "{text}");
    assert!(
        text.contains("gpu-4090") && text.contains("shot_010"),
        "{text}"
    );
    assert_eq!(
        app.update(Msg::Tick),
        None,
        "no polling while the link is down"
    );
}

#[test]
fn an_empty_farm_and_tiny_terminals_draw_without_panicking() {
    let app = App::new();
    let text = screen_text(&draw(&app, 80, 24));
    assert!(
        text.contains("connecting…") && text.contains("waiting for the coordinator"),
        "{text}"
    );
    let mut empty = App::new();
    empty.update(Msg::Link(Link::Connected));
    empty.update(Msg::Snapshot(Snapshot {
        unix_ms: NOW,
        jobs: Vec::new(),
        workers: Vec::new(),
        farm: FarmStatus {
            burn_usd_per_hour: 0.0,
            idle_usd_per_hour: 0.0,
        },
    }));
    let text = screen_text(&draw(&empty, 100, 30));
    assert!(
        text.contains("no workers connected") && text.contains("no jobs yet"),
        "{text}"
    );
    let mut full = populated();
    for (w, h) in [
        (1, 1),
        (10, 3),
        (30, 8),
        (79, 23),
        (80, 24),
        (99, 30),
        (100, 30),
        (139, 40),
        (140, 40),
        (250, 70),
    ] {
        draw(&full, w, h);
        full.help = true;
        draw(&full, w, h);
        full.help = false;
        full.confirm = Some(Confirm::Drain {
            worker: 1,
            name: "gpu-4090".into(),
        });
        draw(&full, w, h);
        full.confirm = None;
    }
}

#[test]
fn keys_move_the_selection_within_the_focused_pane() {
    let mut app = populated();
    assert_eq!(app.pane, Pane::Jobs);
    assert_eq!(app.selected_job, Some(7), "the first active job");
    assert_eq!(app.selected_worker, Some(2), "the first by name (cpu-node)");
    let mut seen = Vec::new();
    for k in [
        KeyCode::Down,
        KeyCode::Char('j'),
        KeyCode::Down,
        KeyCode::Char('k'),
        KeyCode::Up,
        KeyCode::Up,
        KeyCode::End,
        KeyCode::Home,
    ] {
        app.update(key(k));
        seen.push(app.selected_job.unwrap());
    }
    assert_eq!(seen, [8, 5, 5, 8, 7, 7, 5, 7]);
    assert_eq!(app.selected_worker, Some(2), "the other pane did not move");

    app.update(key(KeyCode::Tab));
    assert_eq!(app.pane, Pane::Workers);
    app.update(key(KeyCode::Down));
    assert_eq!(app.selected_worker, Some(1), "gpu-4090, next by name");
    assert_eq!(app.selected_job, Some(7));
    app.update(key(KeyCode::BackTab));
    assert_eq!(app.pane, Pane::Jobs);
}

#[test]
fn moving_to_another_job_polls_its_tiles_at_once() {
    let mut app = populated();
    // Job 8 has no running task and nothing stitched: ask which frames are.
    assert_eq!(
        app.update(key(KeyCode::Down)),
        Some(Command::FetchFrames { job: 8 })
    );
    assert_eq!(
        app.update(key(KeyCode::Up)),
        Some(Command::FetchTiles { job: 7, frame: 12 })
    );
}

#[test]
fn p_pauses_and_resumes_the_selected_job() {
    let mut app = populated();
    assert_eq!(
        app.update(key(KeyCode::Char('p'))),
        Some(Command::Pause {
            job: 7,
            paused: true
        })
    );
    app.update(key(KeyCode::Down));
    assert_eq!(
        app.update(key(KeyCode::Char('p'))),
        Some(Command::Pause {
            job: 8,
            paused: false
        }),
        "a paused job resumes"
    );
    app.update(key(KeyCode::Down));
    let before = app.log.len();
    assert_eq!(
        app.update(key(KeyCode::Char('p'))),
        None,
        "a done job has nothing to pause"
    );
    assert_eq!(app.log.len(), before + 1, "…and the log says so");
}

#[test]
fn c_asks_and_y_cancels() {
    let mut app = populated();
    assert_eq!(app.update(key(KeyCode::Char('c'))), None);
    assert_eq!(
        app.confirm,
        Some(Confirm::Cancel {
            job: 7,
            name: "shot_010".into()
        })
    );
    assert_eq!(
        app.update(key(KeyCode::Char('y'))),
        Some(Command::Cancel { job: 7 })
    );
    assert_eq!(app.confirm, None);

    // Anything but y dismisses, and does not act on the key.
    app.update(key(KeyCode::Char('c')));
    assert_eq!(app.update(key(KeyCode::Char('n'))), None);
    assert_eq!(app.confirm, None);
    app.update(key(KeyCode::Char('c')));
    assert_eq!(app.update(key(KeyCode::Char('q'))), None);
    assert!(!app.quit, "q answers the question; it does not quit");
}

#[test]
fn d_asks_and_y_drains_the_selected_worker() {
    let mut app = populated();
    app.update(key(KeyCode::Tab));
    app.update(key(KeyCode::Down));
    app.update(key(KeyCode::Char('d')));
    assert_eq!(
        app.confirm,
        Some(Confirm::Drain {
            worker: 1,
            name: "gpu-4090".into()
        })
    );
    assert_eq!(
        app.update(key(KeyCode::Char('y'))),
        Some(Command::Drain { worker: 1 })
    );
}

#[test]
fn q_esc_and_ctrl_c_quit() {
    for msg in [
        key(KeyCode::Char('q')),
        key(KeyCode::Esc),
        Msg::Key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)),
        Msg::Stop,
    ] {
        let mut app = populated();
        assert_eq!(app.update(msg.clone()), Some(Command::Quit), "{msg:?}");
        assert!(app.quit);
    }
    // Ctrl-C quits even from a question.
    let mut app = populated();
    app.update(key(KeyCode::Char('c')));
    assert_eq!(
        app.update(Msg::Key(KeyEvent::new(
            KeyCode::Char('c'),
            KeyModifiers::CONTROL
        ))),
        Some(Command::Quit)
    );
}

#[test]
fn first_snapshot_polls_the_selected_jobs_tiles() {
    let mut app = App::new();
    app.update(Msg::Link(Link::Connected));
    assert_eq!(
        app.update(Msg::Snapshot(farm())),
        Some(Command::FetchTiles { job: 7, frame: 12 }),
        "the frame job 7's worker is rendering"
    );
    assert_eq!(
        app.update(Msg::Tick),
        Some(Command::FetchTiles { job: 7, frame: 12 })
    );
}

#[test]
fn a_finished_job_shows_its_last_frame() {
    let mut app = App::new();
    app.update(Msg::Link(Link::Connected));
    let mut s = farm();
    s.jobs.retain(|j| j.id == 5);
    s.workers[0].tasks.clear();
    assert_eq!(
        app.update(Msg::Snapshot(s)),
        Some(Command::FetchFrames { job: 5 })
    );
    assert_eq!(app.update(Msg::Tick), None, "asked already");
    assert_eq!(
        app.update(Msg::Frames {
            job: 5,
            frames: vec![1, 2, 4, 3]
        }),
        Some(Command::FetchTiles { job: 5, frame: 4 })
    );
}

#[test]
fn the_mosaic_stays_on_a_frame_until_it_is_done() {
    let mut app = populated();
    // The worker finished its task and took none yet: keep frame 12.
    let mut s = farm();
    s.workers[0].tasks.clear();
    app.update(Msg::Snapshot(s.clone()));
    assert_eq!(
        app.update(Msg::Tick),
        Some(Command::FetchTiles { job: 7, frame: 12 })
    );
    // Frame 13 starts while 12 is still on screen: the lowest running
    // frame wins over the frame on screen.
    s.workers[1].tasks = vec![RunningTask {
        job: 7,
        index: 110,
        frame: 13,
        tile: TileRect {
            x: 0,
            y: 0,
            width: 480,
            height: 270,
        },
        progress: None,
        stage: None,
    }];
    app.update(Msg::Snapshot(s));
    assert_eq!(
        app.update(Msg::Tick),
        Some(Command::FetchTiles { job: 7, frame: 13 })
    );
}

#[test]
fn snapshots_keep_the_selection_by_id() {
    let mut app = populated();
    app.update(key(KeyCode::Down));
    assert_eq!(app.selected_job, Some(8));
    let mut s = farm();
    s.jobs.reverse();
    app.update(Msg::Snapshot(s));
    assert_eq!(
        app.selected_job,
        Some(8),
        "job 8 moved, the selection followed"
    );
}

/// A worker that reconnects has a new id (a coordinator restart gives
/// every worker one, in the order they come back); the selection follows
/// it by name, even when its old id now belongs to another worker.
#[test]
fn the_selected_worker_is_followed_by_name_across_new_ids() {
    let mut app = populated();
    app.update(key(KeyCode::Tab));
    app.update(key(KeyCode::Down));
    assert_eq!(app.selected_worker, Some(1), "gpu-4090");
    // After a restart: gpu-4090 came back second (id 2), cpu-node first.
    let mut s = farm();
    s.workers[0].id = 2;
    s.workers[1].id = 1;
    app.update(Msg::Snapshot(s));
    assert_eq!(app.selected_worker, Some(2), "still gpu-4090");
    assert_eq!(
        app.selected_worker_status().map(|w| w.name.as_str()),
        Some("gpu-4090")
    );
    // It leaves: the first by name is selected.
    let mut s = farm();
    s.workers.remove(0);
    s.workers[0].id = 1;
    app.update(Msg::Snapshot(s));
    assert_eq!(
        app.selected_worker_status().map(|w| w.name.as_str()),
        Some("cpu-node")
    );
}

#[test]
fn the_log_keeps_the_last_200_lines() {
    let mut app = App::new();
    for i in 0..250u32 {
        app.update(Msg::Event {
            unix_ms: NOW + u64::from(i),
            event: FarmEvent::TaskStarted {
                job: 1,
                index: i,
                worker: 1,
            },
        });
    }
    assert_eq!(app.log.len(), LOG_CAPACITY);
    assert_eq!(app.log.front().unwrap().unix_ms, NOW + 50);
    assert_eq!(app.log.back().unwrap().unix_ms, NOW + 249);
    app.update(Msg::Notice {
        unix_ms: NOW + 300,
        text: "cannot pause job 1: job 1 is not queued or running".into(),
        error: true,
    });
    assert_eq!(app.log.len(), LOG_CAPACITY);
    let text = screen_text(&draw(&app, 100, 30));
    assert!(text.contains("error: cannot pause job 1"), "{text}");
    assert!(text.contains("job 1 task 249"), "most recent last:\n{text}");
}

#[test]
fn failed_tile_polls_do_not_lose_the_mosaic() {
    let mut app = populated();
    app.update(Msg::TilesFailed {
        job: 7,
        frame: 12,
        error: "cannot fetch the tiles: timed out".into(),
    });
    let m = app.shown_mosaic().unwrap();
    assert_eq!(m.tiles.len(), 16, "the last tiles stay on screen");
    assert!(m.error.is_some());
}

#[test]
fn cpu_models_lose_their_trademarks() {
    assert_eq!(
        view::short_cpu("Intel(R) Xeon(R) CPU E5-2690 v4 @ 2.60GHz"),
        "Intel Xeon E5-2690 v4"
    );
    assert_eq!(
        view::short_cpu("AMD EPYC 7B13 64-Core Processor"),
        "AMD EPYC 7B13 64-Core"
    );
    assert_eq!(view::duration(7384.0), "2h03m");
    assert_eq!(view::duration(59.4), "59s");
    assert_eq!(view::duration(90_000.0), "1d01h");
    assert_eq!(view::clock(NOW), "22:13:20");
    assert_eq!(view::money(Some(12.345)), "$12.35");
    assert_eq!(view::money(Some(0.0042)), "$0.004");
    assert_eq!(view::money(Some(0.0)), "$0.00");
    assert_eq!(view::money(None), "–");
}

#[test]
fn log_lines_keep_the_names_they_had_when_they_happened() {
    let mut app = populated();
    app.update(Msg::Event {
        unix_ms: NOW + 1000,
        event: FarmEvent::TaskFinished {
            job: 7,
            index: 101,
            worker: 1,
            render_ms: 900,
        },
    });
    // The coordinator restarted: id 1 now names another worker.
    let mut s = farm();
    s.workers.retain(|w| w.id == 2);
    s.workers[0].id = 1;
    app.update(Msg::Snapshot(s));
    let text = screen_text(&draw(&app, 120, 40));
    assert!(
        text.contains("job 7 task 101 done on gpu-4090 in 0.9s"),
        "{text}"
    );
}

#[test]
fn control_characters_in_names_and_errors_are_shown_escaped() {
    let mut app = App::new();
    app.update(Msg::Link(Link::Connected));
    let mut s = farm();
    s.jobs[0].name = "evil\n\u{1b}[2Jname".into();
    s.jobs[0].error = Some("boom\r\u{1b}[31m".into());
    s.workers[0].name = "w\u{1b}]0;title\u{7}".into();
    app.update(Msg::Snapshot(s));
    app.update(Msg::Event {
        unix_ms: NOW + 1000,
        event: FarmEvent::TaskFailed {
            job: 7,
            index: 3,
            worker: 1,
            error: "bad\nline\u{1b}[H".into(),
        },
    });
    let buf = draw(&app, 160, 48);
    let cells: String = (0..buf.area.height)
        .flat_map(|y| (0..buf.area.width).map(move |x| (x, y)))
        .map(|p| buf[p].symbol().to_string())
        .collect();
    assert!(
        !cells.chars().any(char::is_control),
        "a control character reached the screen"
    );
    let text = screen_text(&buf);
    assert!(text.contains("evil\\n"), "{text}");
    assert!(text.contains("bad\\nline"), "{text}");
}

/// Jobs as the coordinator sends them (by id): three finished, one running.
fn history(running: u64) -> Snapshot {
    let mut s = farm();
    s.jobs = (1..=running)
        .map(|id| {
            let state = if id == running {
                JobState::Running
            } else {
                JobState::Done
            };
            job(id, &format!("shot_{id:03}"), state)
        })
        .collect();
    s
}

#[test]
fn running_jobs_come_first_and_the_tiles_follow_them_unless_pinned() {
    let mut app = App::new();
    app.update(Msg::Link(Link::Connected));
    app.update(Msg::Snapshot(history(4)));
    let order: Vec<u64> = app.jobs().iter().map(|j| j.id).collect();
    assert_eq!(
        order,
        [4, 3, 2, 1],
        "running first, then the newest finished"
    );
    assert_eq!(app.selected_job, Some(4));
    // Job 4 ends and job 5 starts: the tiles move on to job 5.
    let cmd = app.update(Msg::Snapshot(history(5)));
    assert_eq!(app.selected_job, Some(5));
    assert!(
        matches!(
            cmd,
            Some(Command::FetchFrames { job: 5 } | Command::FetchTiles { job: 5, .. })
        ),
        "{cmd:?}"
    );
    let text = screen_text(&draw(&app, 100, 30));
    let running = text.find("shot_005").unwrap();
    let finished = text.find("shot_001").unwrap();
    assert!(
        running < finished,
        "the running job is listed first:\n{text}"
    );
    // The user picks a finished job: it stays, pinned, while job 6 runs.
    app.update(key(KeyCode::Down));
    assert_eq!(app.selected_job, Some(4));
    app.update(Msg::Snapshot(history(6)));
    assert_eq!(app.selected_job, Some(4), "pinned");
    app.update(Msg::Tiles {
        job: 4,
        frame: 1,
        tiles: frame_12_tiles(),
    });
    assert!(screen_text(&draw(&app, 160, 40)).contains("pinned (f follows)"));
    // `f` follows the running job again.
    app.update(key(KeyCode::Char('f')));
    assert_eq!(app.selected_job, Some(6));
    assert!(!app.pinned);
}

#[test]
fn the_header_never_shows_a_negative_idle_cost() {
    let mut app = populated();
    let mut s = farm();
    for w in &mut s.workers {
        w.state = WorkerState::Busy;
    }
    // What summing no idle workers gave: -0.0.
    s.farm.idle_usd_per_hour = [0.0f64; 0].iter().sum();
    assert!(s.farm.idle_usd_per_hour.is_sign_negative());
    app.update(Msg::Snapshot(s));
    let text = screen_text(&draw(&app, 120, 30));
    assert!(text.contains("idle $0.00/h"), "{text}");
    assert!(!text.contains("$-0.00"), "{text}");
}

#[test]
fn a_job_waiting_for_another_shows_waiting_and_one_held_by_a_failure_shows_held() {
    let mut app = App::new();
    app.update(Msg::Link(Link::Connected));
    let mut s = farm();
    let mut waiting = job(9, "shot_030", JobState::Queued);
    waiting.after = vec![7];
    waiting.waiting_for = vec![7];
    waiting.blocked = Some("waiting for job 7 to finish (--after)".into());
    let mut held = job(10, "shot_040", JobState::Queued);
    held.after = vec![8];
    held.waiting_for = vec![8];
    held.blocked = Some("held: job 8, which it runs after, failed".into());
    s.jobs.extend([waiting, held]);
    app.update(Msg::Snapshot(s));
    let text = screen_text(&draw(&app, 160, 48));
    let row = |name: &str| {
        text.lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("{name} not listed:\n{text}"))
            .to_string()
    };
    assert!(row("shot_030").contains("waiting"), "{}", row("shot_030"));
    assert!(
        row("shot_030").contains("waiting for job 7"),
        "{}",
        row("shot_030")
    );
    assert!(row("shot_040").contains(" held "), "{}", row("shot_040"));
}
