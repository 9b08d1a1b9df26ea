//! `weir report`: a self-contained HTML page (plots inline as SVG, no script or style from
//! elsewhere) of a load and, with a status log, of the checkpoints during it: throughput over
//! time, ack latency percentiles over time and by percentile, checkpoint durations per phase,
//! and a table of the figures. The plots are also written as SVG files beside the page.

mod data;
mod plots;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

/// Options of `weir report`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Example:\n  \
    weir status --config examples/load-three-node.toml --watch --status-log status.jsonl &\n  \
    weir load --config examples/load-three-node.toml --rate 2M --duration 30s --hdr-log load.hlog\n  \
    weir report --hdr-log load.hlog --status-log status.jsonl --out report\n\n\
    Writes report/index.html and the plots as report/*.svg. Exit codes: 0 written, 2 an error \
    (a file missing or not what it should be).")]
pub struct ReportArgs {
    /// The HdrHistogram interval log of a `weir load --hdr-log`.
    #[arg(long, value_name = "FILE")]
    hdr_log: PathBuf,
    /// A `weir status --watch --status-log` file (JSON lines) of the same time: checkpoints.
    #[arg(long, value_name = "FILE")]
    status_log: Option<PathBuf>,
    /// Directory to write the page and plots to (created).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// The page's title.
    #[arg(long, default_value = "weir load report")]
    title: String,
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// Runs `weir report`.
#[allow(clippy::print_stdout)]
pub fn run(args: &ReportArgs) -> anyhow::Result<ExitCode> {
    let load = data::load(&args.hdr_log)?;
    let cps = match &args.status_log {
        Some(p) => Some(data::checkpoints(p)?),
        None => None,
    };
    std::fs::create_dir_all(&args.out).with_context(|| format!("cannot create {}", args.out.display()))?;
    let mut figures = vec![
        ("throughput", "Events acknowledged per second", plots::throughput(&load)?),
        ("latency", "Ack latency per second: p50, p90, p99 and max", plots::latency_over_time(&load)?),
        ("distribution", "Ack latency of the whole load by percentile", plots::distribution(&load)?),
    ];
    if let Some(c) = &cps {
        let zero = load.start_ms.or_else(|| c.first().map(|c| c.started_ms)).unwrap_or(0.0);
        figures.push(("checkpoints", "Committed checkpoints: durations per phase", plots::checkpoints(c, zero)?));
    }
    for (name, _, svg) in &figures {
        let path = args.out.join(format!("{name}.svg"));
        std::fs::write(&path, svg).with_context(|| format!("cannot write {}", path.display()))?;
    }
    // The figures' table.
    let h = &load.total;
    let seconds: f64 = load.intervals.iter().map(|i| i.length_s).sum();
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let mut rows = vec![
        ("events acknowledged".to_string(), h.len().to_string()),
        ("seconds".into(), format!("{seconds:.1}")),
        ("events per second".into(), format!("{:.0}", h.len() as f64 / seconds.max(1e-9))),
        (
            "ack latency ms p50 / p90 / p99 / p99.9 / max".into(),
            format!(
                "{:.2} / {:.2} / {:.2} / {:.2} / {:.2}",
                ms(0.5),
                ms(0.9),
                ms(0.99),
                ms(0.999),
                h.max() as f64 / 1000.0
            ),
        ),
    ];
    if let Some(c) = &cps {
        let committed: Vec<&data::Checkpoint> = c.iter().filter(|c| c.committed).collect();
        rows.push((
            "checkpoints committed / failed".into(),
            format!("{} / {}", committed.len(), c.len() - committed.len()),
        ));
        if let Some(m) = median(committed.iter().map(|c| c.end_to_end_ms).collect()) {
            rows.push(("checkpoint trigger to commit, median ms".into(), format!("{m:.1}")));
        }
        let bytes: u64 = committed.iter().map(|c| c.upload_bytes).sum();
        rows.push(("bytes uploaded".into(), bytes.to_string()));
    }
    let mut html = String::new();
    let title = escape(&args.title);
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>\n<style>\
         body{{font-family:sans-serif;max-width:900px;margin:2em auto;color:#222}}\
         table{{border-collapse:collapse}}td{{padding:2px 12px;border-bottom:1px solid #ddd}}\
         figure{{margin:1.5em 0}}figcaption{{color:#555}}</style></head>\n<body>\n<h1>{title}</h1>\n<table>\n"
    );
    for (k, v) in &rows {
        let _ = writeln!(html, "<tr><td>{}</td><td>{}</td></tr>", escape(k), escape(v));
    }
    let _ = writeln!(html, "</table>");
    let _ = writeln!(
        html,
        "<p>From <code>{}</code>{}.</p>",
        escape(&args.hdr_log.display().to_string()),
        args.status_log
            .as_ref()
            .map_or(String::new(), |p| format!(" and <code>{}</code>", escape(&p.display().to_string())))
    );
    for (name, caption, svg) in &figures {
        // The SVG inline (without its XML declaration): the page needs no other file.
        let body = svg.find("<svg").map_or(svg.as_str(), |i| &svg[i..]);
        let _ = writeln!(html, "<figure id=\"{name}\">{body}<figcaption>{}</figcaption></figure>", escape(caption));
    }
    if cps.is_none() {
        let _ = writeln!(html, "<p>No status log: pass <code>--status-log</code> for the checkpoints' plot.</p>");
    }
    // Says on the page what a browser made of it: the plots drawn, and script errors (the
    // headless test reads these).
    let _ = writeln!(
        html,
        "<script>\nvar weirErrors=0;window.addEventListener('error',function(){{weirErrors++;}});\n\
         window.addEventListener('load',function(){{var n=0;document.querySelectorAll('figure svg').forEach(function(s){{\
         var b=s.getBBox();if(b.width>0&&b.height>0&&s.querySelector('polyline,path'))n++;}});\
         document.body.setAttribute('data-plots',n);document.body.setAttribute('data-errors',weirErrors);}});\n</script>\n</body></html>"
    );
    let page = args.out.join("index.html");
    std::fs::write(&page, html).with_context(|| format!("cannot write {}", page.display()))?;
    println!("{} ({} plots)", page.display(), figures.len());
    Ok(ExitCode::SUCCESS)
}
