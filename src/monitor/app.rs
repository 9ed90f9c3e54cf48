//! The monitor's model: what the operator sees and has selected, as plain
//! data. Everything that happens — a key, a farm snapshot, a farm event, a
//! tile reply, a lost connection — arrives as one [`Msg`], and
//! [`App::update`] turns it into new state and at most one [`Command`] for
//! the run loop to carry out. No I/O and no clock here: tests drive it with
//! messages and read the state back.

use std::collections::{BTreeMap, VecDeque};

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use tessera_protocol::messages::{
    FarmEvent, JobState, JobStatus, Snapshot, TileState, TileStatus, WorkerStatus,
};

/// How many log lines the monitor keeps.
pub const LOG_CAPACITY: usize = 200;

/// The table that ↑/↓ move in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pane {
    #[default]
    Jobs,
    Workers,
}

/// The monitor's link to the coordinator's feed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Link {
    #[default]
    Connecting,
    Connected,
    /// The feed dropped (coordinator restarted, network gone); retrying.
    Reconnecting {
        error: String,
    },
}

/// Everything that can happen to the monitor, on one channel.
#[derive(Debug, Clone)]
pub enum Msg {
    Key(KeyEvent),
    /// The terminal changed size: nothing to change, only to redraw.
    Resize,
    /// Time to poll the mosaic (about every 500 ms).
    Tick,
    Snapshot(Snapshot),
    Event {
        unix_ms: u64,
        event: FarmEvent,
    },
    /// The tiles of one frame of a job, as the coordinator answered.
    Tiles {
        job: u64,
        frame: u32,
        tiles: Vec<TileStatus>,
    },
    TilesFailed {
        job: u64,
        frame: u32,
        error: String,
    },
    /// The frames of a job stitched so far.
    Frames {
        job: u64,
        frames: Vec<u32>,
    },
    Link(Link),
    /// A line for the event log: a command's result, a connection change.
    Notice {
        unix_ms: u64,
        text: String,
        error: bool,
    },
    /// A signal (SIGTERM, SIGHUP) asked the monitor to close.
    Stop,
}

/// What the run loop should do for the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Pause { job: u64, paused: bool },
    Cancel { job: u64 },
    Drain { worker: u64 },
    FetchTiles { job: u64, frame: u32 },
    FetchFrames { job: u64 },
    Quit,
}

/// A destructive command waiting for `y`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirm {
    Cancel { job: u64, name: String },
    Drain { worker: u64, name: String },
}

#[derive(Debug, Clone)]
pub enum LogItem {
    /// A farm event, with the names its worker and job had when it
    /// happened (ids are reused after a coordinator restart).
    Farm {
        event: FarmEvent,
        worker: Option<String>,
        job: Option<String>,
    },
    Note(String),
    Error(String),
}

#[derive(Debug, Clone)]
pub struct LogLine {
    pub unix_ms: u64,
    pub item: LogItem,
}

/// The tiles of the frame on screen.
#[derive(Debug, Clone)]
pub struct Mosaic {
    pub job: u64,
    pub frame: u32,
    pub tiles: Vec<TileStatus>,
    /// Why the last poll failed, if it did.
    pub error: Option<String>,
}

impl Mosaic {
    pub fn all_done(&self) -> bool {
        !self.tiles.is_empty() && self.tiles.iter().all(|t| t.state == TileState::Done)
    }

    /// (queued, rendering, done, failed)
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        let mut c = (0, 0, 0, 0);
        for t in &self.tiles {
            match t.state {
                TileState::Queued => c.0 += 1,
                TileState::Rendering(_) => c.1 += 1,
                TileState::Done => c.2 += 1,
                TileState::Failed => c.3 += 1,
            }
        }
        c
    }
}

/// The whole state of the monitor.
#[derive(Debug, Clone, Default)]
pub struct App {
    /// The latest picture of the farm; `None` until the feed sent one.
    pub snapshot: Option<Snapshot>,
    /// Farm events and notices, oldest first, at most [`LOG_CAPACITY`].
    pub log: VecDeque<LogLine>,
    pub pane: Pane,
    pub selected_job: Option<u64>,
    /// The user picked the selected job: the tiles stay on it. Unpinned,
    /// the selection follows the running jobs (`f` unpins).
    pub pinned: bool,
    pub selected_worker: Option<u64>,
    pub mosaic: Option<Mosaic>,
    /// Frames stitched so far, per job, as last fetched.
    pub stitched: BTreeMap<u64, Vec<u32>>,
    /// `frames_done` of each job when its stitched frames were last asked for.
    frames_asked: BTreeMap<u64, u32>,
    /// The latest name of each worker id, from snapshots and join events.
    worker_names: BTreeMap<u64, String>,
    pub link: Link,
    pub help: bool,
    pub confirm: Option<Confirm>,
    pub quit: bool,
}

impl App {
    pub fn new() -> App {
        App::default()
    }

    pub fn jobs(&self) -> &[JobStatus] {
        self.snapshot.as_ref().map_or(&[], |s| &s.jobs)
    }

    pub fn workers(&self) -> &[WorkerStatus] {
        self.snapshot.as_ref().map_or(&[], |s| &s.workers)
    }

    pub fn job(&self, id: u64) -> Option<&JobStatus> {
        self.jobs().iter().find(|j| j.id == id)
    }

    pub fn worker(&self, id: u64) -> Option<&WorkerStatus> {
        self.workers().iter().find(|w| w.id == id)
    }

    fn job_name(&self, id: u64) -> Option<String> {
        self.job(id).map(|j| j.name.clone())
    }

    pub fn selected_job_status(&self) -> Option<&JobStatus> {
        self.selected_job.and_then(|id| self.job(id))
    }

    pub fn selected_worker_status(&self) -> Option<&WorkerStatus> {
        self.selected_worker.and_then(|id| self.worker(id))
    }

    /// The mosaic of the selected job, when one has been fetched.
    pub fn shown_mosaic(&self) -> Option<&Mosaic> {
        self.mosaic
            .as_ref()
            .filter(|m| Some(m.job) == self.selected_job)
    }

    /// The model's time: the latest snapshot's, or the latest log line's.
    fn now_ms(&self) -> u64 {
        let log = self.log.back().map_or(0, |l| l.unix_ms);
        self.snapshot.as_ref().map_or(log, |s| s.unix_ms.max(log))
    }

    pub fn update(&mut self, msg: Msg) -> Option<Command> {
        match escaped(msg) {
            Msg::Key(key) => self.on_key(key),
            Msg::Resize => None,
            Msg::Tick => self.poll_mosaic(),
            Msg::Snapshot(s) => self.on_snapshot(s),
            Msg::Event { unix_ms, event } => {
                if let FarmEvent::WorkerJoined { worker, name } = &event {
                    self.worker_names.insert(*worker, name.clone());
                }
                let (worker, job) = match &event {
                    FarmEvent::WorkerJoined { .. } | FarmEvent::WorkerLeft { .. } => (None, None),
                    FarmEvent::TaskStarted { job, worker, .. }
                    | FarmEvent::TaskFinished { job, worker, .. }
                    | FarmEvent::TaskFailed { job, worker, .. } => {
                        (self.worker_names.get(worker).cloned(), self.job_name(*job))
                    }
                    FarmEvent::JobChanged { job, .. } | FarmEvent::JobHeld { job, .. } => {
                        (None, self.job_name(*job))
                    }
                };
                self.push_log(unix_ms, LogItem::Farm { event, worker, job });
                None
            }
            Msg::Tiles { job, frame, tiles } => {
                self.mosaic = Some(Mosaic {
                    job,
                    frame,
                    tiles,
                    error: None,
                });
                None
            }
            Msg::TilesFailed { job, frame, error } => {
                match &mut self.mosaic {
                    Some(m) if m.job == job && m.frame == frame => m.error = Some(error),
                    _ => {
                        self.mosaic = Some(Mosaic {
                            job,
                            frame,
                            tiles: Vec::new(),
                            error: Some(error),
                        })
                    }
                }
                None
            }
            Msg::Frames { job, frames } => {
                self.stitched.insert(job, frames);
                self.poll_mosaic()
            }
            Msg::Link(link) => {
                self.link = link;
                None
            }
            Msg::Notice {
                unix_ms,
                text,
                error,
            } => {
                let item = if error {
                    LogItem::Error(text)
                } else {
                    LogItem::Note(text)
                };
                self.push_log(unix_ms, item);
                None
            }
            Msg::Stop => self.quit(),
        }
    }

    fn quit(&mut self) -> Option<Command> {
        self.quit = true;
        Some(Command::Quit)
    }

    fn push_log(&mut self, unix_ms: u64, item: LogItem) {
        if self.log.len() == LOG_CAPACITY {
            self.log.pop_front();
        }
        self.log.push_back(LogLine { unix_ms, item });
    }

    fn note(&mut self, text: String) {
        let now = self.now_ms();
        self.push_log(now, LogItem::Note(text));
    }

    fn on_snapshot(&mut self, mut s: Snapshot) -> Option<Command> {
        let before = self.selected_job;
        order_jobs(&mut s.jobs);
        // By name, which a worker keeps across reconnects (its id does not),
        // so rows stay put when the coordinator restarts.
        s.workers
            .sort_by(|a, b| a.name.cmp(&b.name).then(a.id.cmp(&b.id)));
        let selected = self
            .selected_job
            .and_then(|id| s.jobs.iter().find(|j| j.id == id));
        if selected.is_none() {
            self.pinned = false;
        }
        // Unpinned, the selection follows the work: a running job over a
        // queued or finished one (the first in order is the busiest).
        let follow = !self.pinned
            && selected.is_none_or(|j| j.state != JobState::Running || j.paused)
            && s.jobs
                .first()
                .is_some_and(|j| j.state == JobState::Running && !j.paused);
        if selected.is_none() || follow {
            self.selected_job = s.jobs.first().map(|j| j.id);
        }
        // The selected worker is followed by its name, which it keeps when
        // it reconnects with a new id (after a coordinator restart, say).
        let name = (self.selected_worker).and_then(|id| self.worker_names.get(&id));
        let by_name = name.and_then(|n| s.workers.iter().find(|w| &w.name == n));
        let by_id = (self.selected_worker).filter(|&id| s.workers.iter().any(|w| w.id == id));
        self.selected_worker = (by_name.map(|w| w.id))
            .or(by_id)
            .or_else(|| s.workers.first().map(|w| w.id));
        for w in &s.workers {
            self.worker_names.insert(w.id, w.name.clone());
        }
        self.snapshot = Some(s);
        if self.selected_job != before {
            self.poll_mosaic()
        } else {
            None
        }
    }

    fn on_key(&mut self, key: KeyEvent) -> Option<Command> {
        if key.kind == KeyEventKind::Release {
            return None;
        }
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return self.quit();
        }
        if let Some(confirm) = self.confirm.take() {
            // Only an explicit `y` goes ahead; any other key dismisses.
            return match key.code {
                KeyCode::Char('y' | 'Y') => Some(match confirm {
                    Confirm::Cancel { job, .. } => Command::Cancel { job },
                    Confirm::Drain { worker, .. } => Command::Drain { worker },
                }),
                _ => None,
            };
        }
        if self.help {
            match key.code {
                KeyCode::Char('q') => return self.quit(),
                KeyCode::Char('?') | KeyCode::Esc | KeyCode::Enter => self.help = false,
                _ => {}
            }
            return None;
        }
        match key.code {
            KeyCode::Char('q') | KeyCode::Esc => self.quit(),
            KeyCode::Char('?') => {
                self.help = true;
                None
            }
            KeyCode::Up | KeyCode::Char('k') => self.move_selection(-1),
            KeyCode::Down | KeyCode::Char('j') => self.move_selection(1),
            KeyCode::PageUp => self.move_selection(-10),
            KeyCode::PageDown => self.move_selection(10),
            KeyCode::Home | KeyCode::Char('g') => self.move_selection(isize::MIN / 2),
            KeyCode::End | KeyCode::Char('G') => self.move_selection(isize::MAX / 2),
            KeyCode::Tab | KeyCode::BackTab => {
                self.pane = match self.pane {
                    Pane::Jobs => Pane::Workers,
                    Pane::Workers => Pane::Jobs,
                };
                None
            }
            KeyCode::Char('f') => {
                // Follow the running jobs again.
                self.pinned = false;
                let first = self.jobs().first().map(|j| j.id);
                if first.is_some() && first != self.selected_job {
                    self.selected_job = first;
                    return self.poll_mosaic();
                }
                None
            }
            KeyCode::Char('p') => {
                let job = self.selected_job_status()?;
                if job.state.is_final() {
                    let text = format!("job {} is {}: nothing to pause", job.id, job.state.name());
                    self.note(text);
                    return None;
                }
                Some(Command::Pause {
                    job: job.id,
                    paused: !job.paused,
                })
            }
            KeyCode::Char('c') => {
                let job = self.selected_job_status()?;
                if job.state.is_final() {
                    let text = format!("job {} is {} already", job.id, job.state.name());
                    self.note(text);
                    return None;
                }
                self.confirm = Some(Confirm::Cancel {
                    job: job.id,
                    name: job.name.clone(),
                });
                None
            }
            KeyCode::Char('d') => {
                let w = self.selected_worker_status()?;
                self.confirm = Some(Confirm::Drain {
                    worker: w.id,
                    name: w.name.clone(),
                });
                None
            }
            _ => None,
        }
    }

    /// Moves the selection of the focused pane by `delta` rows, clamped.
    fn move_selection(&mut self, delta: isize) -> Option<Command> {
        let (ids, selected): (Vec<u64>, Option<u64>) = match self.pane {
            Pane::Jobs => (
                self.jobs().iter().map(|j| j.id).collect(),
                self.selected_job,
            ),
            Pane::Workers => (
                self.workers().iter().map(|w| w.id).collect(),
                self.selected_worker,
            ),
        };
        if ids.is_empty() {
            return None;
        }
        let at = selected
            .and_then(|s| ids.iter().position(|&id| id == s))
            .unwrap_or(0) as isize;
        let new = ids[at.saturating_add(delta).clamp(0, ids.len() as isize - 1) as usize];
        match self.pane {
            Pane::Jobs => {
                let changed = self.selected_job != Some(new);
                self.selected_job = Some(new);
                self.pinned = true;
                if changed {
                    return self.poll_mosaic();
                }
                None
            }
            Pane::Workers => {
                self.selected_worker = Some(new);
                None
            }
        }
    }

    /// The frames the selected job's tasks are rendering now.
    fn running_frames(&self, job: u64) -> impl Iterator<Item = u32> + '_ {
        self.workers()
            .iter()
            .flat_map(|w| &w.tasks)
            .filter(move |t| t.job == job)
            .map(|t| t.frame)
    }

    /// The frame the mosaic should show for `job`: the first frame not yet
    /// done — the lowest frame being rendered, or the frame on screen while
    /// it still has tiles to go — else the last frame stitched.
    pub fn mosaic_frame(&self, job: u64) -> Option<u32> {
        if let Some(f) = self.running_frames(job).min() {
            return Some(f);
        }
        let shown = self.mosaic.as_ref().filter(|m| m.job == job);
        if let Some(m) = shown.filter(|m| !m.all_done() && m.error.is_none()) {
            return Some(m.frame);
        }
        let last_stitched = self
            .stitched
            .get(&job)
            .and_then(|f| f.iter().max().copied());
        match (last_stitched, shown.map(|m| m.frame)) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// Asks for the selected job's tiles — or, when the model cannot tell
    /// which frame to show, for its stitched frames first.
    fn poll_mosaic(&mut self) -> Option<Command> {
        if self.link != Link::Connected {
            return None;
        }
        let (id, frames_done) = self.selected_job_status().map(|j| (j.id, j.frames_done))?;
        if let Some(frame) = self.mosaic_frame(id) {
            return Some(Command::FetchTiles { job: id, frame });
        }
        if self.frames_asked.get(&id) != Some(&frames_done) {
            self.frames_asked.insert(id, frames_done);
            return Some(Command::FetchFrames { job: id });
        }
        None
    }
}

/// The order the jobs pane lists jobs in: running ones first, then queued
/// ones (higher priority first), each oldest first; then finished ones,
/// newest first. A running job is never off-screen below finished ones.
pub fn order_jobs(jobs: &mut [JobStatus]) {
    jobs.sort_by_key(|j| match j.state {
        JobState::Running if !j.paused => (0, 0, j.id),
        JobState::Running | JobState::Queued => (1, -i64::from(j.priority), j.id),
        _ => (2, 0, u64::MAX - j.id),
    });
}

/// `msg` with every name, error and note from the farm escaped for the
/// terminal (see `crate::shown`), before any of it reaches the model.
fn escaped(msg: Msg) -> Msg {
    match msg {
        Msg::Snapshot(mut s) => {
            s.jobs.iter_mut().for_each(crate::shown::job);
            s.workers.iter_mut().for_each(crate::shown::worker);
            Msg::Snapshot(s)
        }
        Msg::Event { unix_ms, mut event } => {
            crate::shown::event(&mut event);
            Msg::Event { unix_ms, event }
        }
        Msg::TilesFailed { job, frame, error } => Msg::TilesFailed {
            job,
            frame,
            error: crate::shown::text(&error),
        },
        Msg::Notice {
            unix_ms,
            text,
            error,
        } => Msg::Notice {
            unix_ms,
            text: crate::shown::text(&text),
            error,
        },
        Msg::Link(Link::Reconnecting { error }) => Msg::Link(Link::Reconnecting {
            error: crate::shown::text(&error),
        }),
        other => other,
    }
}
