//! `tessera`: the one binary of the farm — coordinator, worker, the client
//! commands artists and scripts use, and the one-command demo.

mod cmd;
mod demo;
mod fleet;
mod monitor;

use tessera_client::{
    build, client, exit, follow, openjd, progress, report, share, shown, uproject,
};

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "tessera",
    version,
    about = "A distributed render farm for rented GPUs"
)]
struct Cli {
    #[command(subcommand)]
    command: cmd::Command,
}

fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Every control character a log line holds is written as an escape: a
    // worker's or a job's name (chosen by a rented machine or a client)
    // must not forge log lines or reach a terminal as an escape sequence.
    // So no colours either.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| EscapingWriter(std::io::stderr()))
        .with_ansi(false)
        .with_target(false)
        .init();
}

/// Writes each log record with its control characters escaped, its final
/// newline kept (the formatter writes one record per call).
struct EscapingWriter<W>(W);

impl<W: std::io::Write> std::io::Write for EscapingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let (body, newline) = match buf.split_last() {
            Some((b'\n', body)) => (body, true),
            _ => (buf, false),
        };
        let text = String::from_utf8_lossy(body);
        let mut line = tessera_protocol::text::escape_controls(&text).into_owned();
        if newline {
            line.push('\n');
        }
        self.0.write_all(line.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

fn main() {
    let cli = Cli::parse();
    let server = cli.command.is_server();
    // The monitor owns the terminal: log lines would scribble over it.
    let monitor = cli.command.is_monitor();
    // A client command whose output is piped into `head` ends quietly (exit
    // 141, as other Unix tools do) when the pipe closes, instead of
    // panicking in println!. Not for processes that write to their
    // children's pipes (coordinator, worker, demo, fleet), where a closed
    // pipe is an error to handle.
    let owns_children = cli.command.owns_children();
    if !owns_children {
        // SAFETY: restoring a signal's default disposition at start, before
        // any thread exists.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    init_logging(match (server, monitor) {
        (true, _) => "info",
        (_, true) => "off",
        _ => "warn",
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // The coordinator counts blocking calls made on these threads.
        .on_thread_park(tessera_coordinator::watch::runtime_thread)
        .on_thread_unpark(tessera_coordinator::watch::runtime_thread)
        .build()
        .expect("tokio runtime");
    let ran = runtime.block_on(async {
        let ran = cmd::run(cli.command).await;
        client::close_all().await;
        ran
    });
    match ran {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            // One line: the reason, with its causes.
            eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
            std::process::exit(exit::for_error(&e));
        }
    }
}

pub(crate) async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("signal handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
