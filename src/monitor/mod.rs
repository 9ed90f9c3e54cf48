//! `tessera monitor`: the farm live in a terminal — workers and their GPUs,
//! jobs with progress, ETA and cost, a mosaic of the selected frame's tiles
//! and an event log — with keys to pause, resume and cancel jobs and drain
//! workers.
//!
//! Model / update / view: [`app::App`] is plain data, changed only by
//! [`app::App::update`] from one channel of [`app::Msg`]s; [`view::render`]
//! draws it and only reads. This module is the I/O around them: the
//! terminal (raw mode and the alternate screen, restored on exit and on
//! panic), a thread reading keys, a task following the coordinator's feed
//! (and reconnecting with backoff when it drops), and a task with a second
//! client connection that carries out the [`app::Command`]s.

pub mod app;
pub mod view;

#[cfg(test)]
mod tests;

use std::io::Stdout;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use crossterm::event::{self, Event, KeyEventKind};
use crossterm::terminal::{
    disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen,
};
use crossterm::{cursor, execute};
use ratatui::backend::CrosstermBackend;
use ratatui::Terminal;
use tessera_protocol::codec::CodecError;
use tessera_protocol::messages::{ClientRequest, ClientResponse};
use tessera_protocol::ticket::Ticket;
use tokio::sync::mpsc;

use crate::client::{Client, Feed};
use app::{App, Command, Link, Msg};

/// The feed sends a snapshot every half second; this long without one
/// means the coordinator is gone even if the connection has not timed out.
const FEED_SILENCE: Duration = Duration::from_secs(3);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
const MOSAIC_POLL: Duration = Duration::from_millis(500);
const BACKOFF_FIRST: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

type Tx = mpsc::UnboundedSender<Msg>;

/// Runs the monitor until the operator quits.
pub async fn run(ticket: Ticket) -> anyhow::Result<()> {
    // A wrong ticket or an unreachable coordinator is a plain error, before
    // the screen changes.
    let feed = connect_feed(&ticket).await?;
    let commands = connect(&ticket).await?;

    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut screen = Screen::enter()?;
    let stop_keys = Arc::new(AtomicBool::new(false));
    let keys = read_keys(tx.clone(), stop_keys.clone());
    let (cmd_tx, cmd_rx) = mpsc::channel(16);
    let tasks = [
        tokio::spawn(follow_feed(ticket.clone(), Some(feed), tx.clone())),
        tokio::spawn(carry_out(ticket, Some(commands), cmd_rx, tx.clone())),
        tokio::spawn(tick(tx.clone())),
        tokio::spawn(stop_on_signal(tx.clone())),
    ];
    drop(tx);

    let mut app = App::new();
    // For the end-to-end test that a panic leaves the terminal usable.
    let panic_on_purpose = std::env::var_os("TESSERA_MONITOR_TEST_PANIC").is_some();
    let result = loop {
        if let Err(e) = screen.terminal.draw(|f| view::render(&app, f)) {
            break Err(anyhow::Error::from(e).context("cannot draw on the terminal"));
        }
        if panic_on_purpose && app.snapshot.is_some() {
            panic!("TESSERA_MONITOR_TEST_PANIC is set: the monitor panics on purpose");
        }
        let Some(msg) = rx.recv().await else {
            break Ok(());
        };
        // Apply everything already waiting, then draw once.
        let mut next = Some(msg);
        while let Some(msg) = next {
            match app.update(msg) {
                Some(Command::Quit) | None => {}
                Some(cmd) => {
                    if let Err(mpsc::error::TrySendError::Full(cmd)) = cmd_tx.try_send(cmd) {
                        if !matches!(
                            cmd,
                            Command::FetchTiles { .. } | Command::FetchFrames { .. }
                        ) {
                            app.update(notice("busy: the coordinator has not answered the last commands yet; try again", true));
                        }
                    }
                }
            }
            next = rx.try_recv().ok();
        }
        if app.quit {
            break Ok(());
        }
    };
    // The key thread may be stuck in a read on a terminal that hung up:
    // tell it to stop, but never wait for it (the process exits next).
    stop_keys.store(true, Ordering::Relaxed);
    drop(keys);
    for t in tasks {
        t.abort();
    }
    drop(screen);
    result
}

/// The terminal in raw mode on the alternate screen; dropping it (or a
/// panic anywhere) puts the terminal back as it was.
struct Screen {
    terminal: Terminal<CrosstermBackend<Stdout>>,
}

impl Screen {
    fn enter() -> anyhow::Result<Screen> {
        use std::io::IsTerminal;
        if !std::io::stdout().is_terminal() {
            anyhow::bail!(
                "the monitor draws on a terminal and stdout is not one; `tessera status` prints the same as text"
            );
        }
        install_panic_hook();
        enable_raw_mode().context("the monitor needs a terminal (raw mode failed)")?;
        let mut terminal = match Terminal::new(CrosstermBackend::new(std::io::stdout())) {
            Ok(t) => Screen { terminal: t },
            Err(e) => {
                restore_terminal();
                return Err(e.into());
            }
        };
        execute!(
            terminal.terminal.backend_mut(),
            EnterAlternateScreen,
            cursor::Hide
        )?;
        terminal.terminal.clear()?;
        Ok(terminal)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        restore_terminal();
    }
}

/// Leaves raw mode and the alternate screen and shows the cursor; harmless
/// when they were never entered.
fn restore_terminal() {
    let _ = disable_raw_mode();
    let _ = execute!(std::io::stdout(), LeaveAlternateScreen, cursor::Show);
}

/// On a panic — in the draw loop or in any task — restore the terminal
/// before the message is printed, so it is readable and the shell is
/// usable; then end the process, since a half-running monitor on a
/// restored terminal helps no one.
fn install_panic_hook() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        restore_terminal();
        previous(info);
        std::process::exit(101);
    }));
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn notice(text: impl Into<String>, error: bool) -> Msg {
    Msg::Notice {
        unix_ms: unix_ms(),
        text: text.into(),
        error,
    }
}

/// Key presses and resizes, from a thread: crossterm's reads block.
fn read_keys(tx: Tx, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let msg = match event::poll(Duration::from_millis(100)) {
                Ok(false) => continue,
                Ok(true) => match event::read() {
                    Ok(Event::Key(k)) if k.kind != KeyEventKind::Release => Msg::Key(k),
                    Ok(Event::Resize(..)) => Msg::Resize,
                    Ok(_) => continue,
                    Err(e) => {
                        let _ = tx.send(notice(format!("cannot read the keyboard: {e}"), true));
                        Msg::Stop
                    }
                },
                Err(e) => {
                    let _ = tx.send(notice(format!("cannot read the keyboard: {e}"), true));
                    Msg::Stop
                }
            };
            let stopping = matches!(msg, Msg::Stop);
            if tx.send(msg).is_err() || stopping {
                return;
            }
        }
    })
}

async fn tick(tx: Tx) {
    let mut every = tokio::time::interval(MOSAIC_POLL);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        every.tick().await;
        if tx.send(Msg::Tick).is_err() {
            return;
        }
    }
}

/// SIGTERM and SIGHUP (the SSH session closed) close the monitor cleanly.
async fn stop_on_signal(tx: Tx) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = hup.recv() => {}
    }
    let _ = tx.send(Msg::Stop);
}

async fn connect(ticket: &Ticket) -> anyhow::Result<Client> {
    match tokio::time::timeout(CONNECT_TIMEOUT, Client::connect(ticket)).await {
        Ok(client) => client,
        Err(_) => anyhow::bail!(
            "no answer from the coordinator at {} within {}s: is it running, and does this machine reach that address (UDP)?",
            ticket.addr,
            CONNECT_TIMEOUT.as_secs()
        ),
    }
}

async fn connect_feed(ticket: &Ticket) -> anyhow::Result<Feed> {
    let client = connect(ticket).await?;
    tokio::time::timeout(CONNECT_TIMEOUT, client.subscribe())
        .await
        .context("the coordinator did not open its feed")?
}

/// Follows the farm's feed; when it drops, says so and reconnects with
/// backoff until the coordinator is back.
async fn follow_feed(ticket: Ticket, mut feed: Option<Feed>, tx: Tx) {
    let mut backoff = BACKOFF_FIRST;
    let mut reconnecting = false;
    loop {
        let mut f = match feed.take() {
            Some(f) => f,
            None => match connect_feed(&ticket).await {
                Ok(f) => f,
                Err(e) => {
                    let error = format!("{e:#}");
                    if tx.send(Msg::Link(Link::Reconnecting { error })).is_err() {
                        return;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    continue;
                }
            },
        };
        backoff = BACKOFF_FIRST;
        let _ = tx.send(Msg::Link(Link::Connected));
        if reconnecting {
            let _ = tx.send(notice(format!("reconnected to {}", ticket.addr), false));
        }
        let error = loop {
            let msg = match tokio::time::timeout(FEED_SILENCE, f.next()).await {
                Err(_) => {
                    break format!(
                        "no word from the coordinator for {}s",
                        FEED_SILENCE.as_secs()
                    )
                }
                Ok(Err(e)) => break format!("{e:#}"),
                Ok(Ok(None)) => break "the coordinator closed the feed".into(),
                Ok(Ok(Some(ClientResponse::Snapshot(s)))) => Msg::Snapshot(s),
                Ok(Ok(Some(ClientResponse::Event { unix_ms, event }))) => {
                    Msg::Event { unix_ms, event }
                }
                Ok(Ok(Some(ClientResponse::Error(e)))) => break e.message,
                Ok(Ok(Some(_))) => continue,
            };
            if tx.send(msg).is_err() {
                return;
            }
        };
        reconnecting = true;
        let _ = tx.send(notice(
            format!("lost the coordinator: {error}; reconnecting"),
            true,
        ));
        if tx.send(Msg::Link(Link::Reconnecting { error })).is_err() {
            return;
        }
    }
}

/// Whether an error means the connection itself is gone (so the next
/// command should reconnect), as opposed to a refusal by the coordinator.
fn connection_broken(e: &anyhow::Error) -> bool {
    e.chain()
        .any(|c| c.is::<CodecError>() || c.is::<tokio::time::error::Elapsed>())
        || crate::exit::is_unreachable(e)
}

/// Carries out commands one at a time on a connection of its own, so that
/// a slow answer never holds up the feed; reconnects when it broke.
async fn carry_out(
    ticket: Ticket,
    mut client: Option<Client>,
    mut commands: mpsc::Receiver<Command>,
    tx: Tx,
) {
    while let Some(cmd) = commands.recv().await {
        let c = match &mut client {
            Some(c) => c,
            None => match connect(&ticket).await {
                Ok(c) => client.insert(c),
                Err(e) => {
                    if tx.send(failed(&cmd, &e)).is_err() {
                        return;
                    }
                    continue;
                }
            },
        };
        let result = match tokio::time::timeout(REQUEST_TIMEOUT, execute(c, &cmd)).await {
            Ok(r) => r,
            Err(elapsed) => Err(anyhow::Error::from(elapsed).context("no answer in time")),
        };
        let msg = match result {
            Ok(msg) => msg,
            Err(e) => {
                if connection_broken(&e) {
                    client = None;
                }
                failed(&cmd, &e)
            }
        };
        if tx.send(msg).is_err() {
            return;
        }
    }
}

async fn execute(c: &mut Client, cmd: &Command) -> anyhow::Result<Msg> {
    Ok(match *cmd {
        Command::Pause { job, paused } => {
            c.pause(job, paused).await?;
            let what = if paused {
                "paused: running tasks finish, no new ones start"
            } else {
                "resumed"
            };
            notice(format!("job {job} {what}"), false)
        }
        Command::Cancel { job } => {
            let s = c.cancel(job).await?;
            notice(format!("job {job} is {}", s.state.name()), false)
        }
        Command::Drain { worker } => {
            c.drain(worker).await?;
            notice(
                format!("worker {worker} is draining: it finishes its tasks, then leaves"),
                false,
            )
        }
        Command::FetchTiles { job, frame } => Msg::Tiles {
            job,
            frame,
            tiles: c.tiles(job, frame).await?,
        },
        Command::FetchFrames { job } => match c.call(&ClientRequest::Frames(job)).await? {
            ClientResponse::Frames(f) => Msg::Frames {
                job,
                frames: f.into_iter().map(|f| f.frame).collect(),
            },
            other => anyhow::bail!("unexpected reply {other:?}"),
        },
        // The run loop quits by itself; nothing to carry out.
        Command::Quit => Msg::Resize,
    })
}

/// What the model hears when a command failed.
fn failed(cmd: &Command, e: &anyhow::Error) -> Msg {
    let e = format!("{e:#}");
    match *cmd {
        Command::FetchTiles { job, frame } => Msg::TilesFailed {
            job,
            frame,
            error: format!("cannot fetch the tiles: {e}"),
        },
        Command::Pause { job, paused } => notice(
            format!(
                "cannot {} job {job}: {e}",
                if paused { "pause" } else { "resume" }
            ),
            true,
        ),
        Command::Cancel { job } => notice(format!("cannot cancel job {job}: {e}"), true),
        Command::Drain { worker } => notice(format!("cannot drain worker {worker}: {e}"), true),
        Command::FetchFrames { job } => {
            notice(format!("cannot list the frames of job {job}: {e}"), true)
        }
        Command::Quit => notice(e, true),
    }
}
