//! Log output of the `weir` command (libraries only emit through `tracing`; this binary
//! installs the subscriber). `WEIR_LOG` (or `RUST_LOG`) selects what is logged, e.g.
//! `WEIR_LOG=weir_wire=debug`; the default is `info`.

use std::fmt;
use std::io::IsTerminal;

use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

fn filter() -> EnvFilter {
    EnvFilter::try_from_env("WEIR_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info"))
}

fn ansi() -> bool {
    std::io::stderr().is_terminal()
}

/// Logs to stderr (colours only on a terminal).
pub fn init() {
    tracing_subscriber::fmt().with_env_filter(filter()).with_ansi(ansi()).with_writer(std::io::stderr).init();
}

/// Logs to stderr from `warn` up unless `WEIR_LOG` or `RUST_LOG` chooses: a command with a live
/// line (`weir load`) keeps the terminal to it and says what happened in its summary.
pub fn init_quiet() {
    let f = EnvFilter::try_from_env("WEIR_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(f).with_ansi(ansi()).with_writer(std::io::stderr).init();
}

/// `weir run`'s logs: on an interactive terminal, without `WEIR_LOG` or `RUST_LOG`, the screen is
/// the live status's: warnings and errors show, and everything from `info` up goes to
/// `<data_dir>/weir.log`; elsewhere (a pipe, a file, CI) the log goes to stderr as usual.
/// Returns the log file, when there is one.
pub fn init_run(data_dir: &std::path::Path) -> Option<std::path::PathBuf> {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let chosen = std::env::var_os("WEIR_LOG").is_some() || std::env::var_os("RUST_LOG").is_some();
    if chosen || !std::io::stdout().is_terminal() {
        init();
        return None;
    }
    let path = data_dir.join("weir.log");
    let file = std::fs::create_dir_all(data_dir)
        .and_then(|()| std::fs::OpenOptions::new().create(true).append(true).open(&path));
    let Ok(file) = file else {
        init();
        return None;
    };
    let screen = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_filter(EnvFilter::new("warn"));
    let log = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(std::sync::Mutex::new(file))
        .with_filter(EnvFilter::new("info"));
    tracing_subscriber::registry().with(screen).with(log).init();
    Some(path)
}

/// Logs to stderr, every line starting with `prefix` (`node=2 stream=bench`): a node's engine threads log
/// without knowing which node they serve, and several nodes often share one terminal or file.
pub fn init_prefixed(prefix: String) {
    let inner = tracing_subscriber::fmt::format();
    tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_ansi(ansi())
        .with_writer(std::io::stderr)
        .event_format(Prefixed { prefix, inner: inner.with_ansi(ansi()) })
        .init();
}

struct Prefixed<F> {
    prefix: String,
    inner: F,
}

impl<S, N, F> FormatEvent<S, N> for Prefixed<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        write!(writer, "{} ", self.prefix)?;
        self.inner.format_event(ctx, writer, event)
    }
}
