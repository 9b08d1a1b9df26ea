//! The metrics endpoint: `GET /metrics` over HTTP/1.1, served by hyper on a small runtime of its
//! own, so a slow or hostile client holds one connection and nothing else.
//!
//! Limits: at most [`MAX_CONNECTIONS`] connections at once (more wait in the listen queue) and
//! [`MAX_PER_ADDR`] from one address (more are closed at once), one request per connection, a
//! request's head within [`HEAD_TIMEOUT`] and [`MAX_HEAD`] bytes, a connection for at most
//! [`CONN_TIMEOUT`]. Only the request line matters; bodies are not read. A client that holds its
//! connections holds at most its address's share: a scraper elsewhere is still served.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

use crate::metrics::Board;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Connections served at once from one IP address.
pub const MAX_PER_ADDR: usize = 8;
/// Time for a request's line and headers to arrive.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest life of one connection.
pub const CONN_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request head (line and headers).
pub const MAX_HEAD: usize = 16 << 10;

/// Serves `board` at `addr` (`GET /metrics`) on a thread of its own, for the process's life.
pub fn serve(addr: SocketAddr, board: Arc<Board>) -> anyhow::Result<()> {
    let listener = std::net::TcpListener::bind(addr).with_context(|| format!("metrics: cannot listen on {addr}"))?;
    listener.set_nonblocking(true).context("metrics: listener")?;
    tracing::info!(%addr, "serving Prometheus metrics at /metrics");
    std::thread::Builder::new()
        .name("weir-metrics".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("weir-metrics-io")
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => return tracing::error!(error = %e, "metrics: no runtime; not serving"),
            };
            rt.block_on(accept_loop(listener, board));
        })
        .context("metrics thread")?;
    Ok(())
}

async fn accept_loop(listener: std::net::TcpListener, board: Arc<Board>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => return tracing::error!(error = %e, "metrics: listener; not serving"),
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let per_addr: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>> = Arc::default();
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else { return };
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // E.g. out of file descriptors: wait a little rather than spin.
                tracing::warn!(error = %e, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let ip = peer.ip();
        {
            let mut held = per_addr.lock().unwrap_or_else(|e| e.into_inner());
            let n = held.entry(ip).or_insert(0);
            if *n >= MAX_PER_ADDR {
                drop(stream);
                continue;
            }
            *n += 1;
        }
        let (board, per_addr) = (board.clone(), per_addr.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| answer(req, board.clone()));
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .max_buf_size(MAX_HEAD)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(CONN_TIMEOUT, conn).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "metrics connection"),
                Err(_) => tracing::debug!(%peer, "metrics connection past its time limit"),
            }
            let mut held = per_addr.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = held.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    held.remove(&ip);
                }
            }
            drop(permit);
        });
    }
}

async fn answer(req: Request<hyper::body::Incoming>, board: Arc<Board>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, kind, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => {
            (StatusCode::OK, "application/openmetrics-text; version=1.0.0; charset=utf-8", board.render())
        }
        (&Method::GET, _) => (StatusCode::NOT_FOUND, "text/plain", "weir serves /metrics\n".to_string()),
        _ => (StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET /metrics\n".to_string()),
    };
    let mut rsp = Response::new(Full::new(Bytes::from(body)));
    *rsp.status_mut() = status;
    rsp.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(kind));
    Ok(rsp)
}
