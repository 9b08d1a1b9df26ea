//! Reading a stream's window results from nodes over the wire protocol, a page at a time
//! (`ResultsReq` / `ResultsRsp`), for `weir verify` and `weir query`: a client never holds more
//! than a page (up to [`PAGE`] results) of any node's stores.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use weir_engine::wire::StreamId;
use weir_engine::wire::msg::{ResultRow, ResultsReq, ResultsRsp};

use crate::client::{Failure, Target};

/// Results per page.
pub const PAGE: u32 = 50_000;

const ASK: Duration = Duration::from_secs(10);

fn fail(f: Failure) -> anyhow::Error {
    match f {
        Failure::Refused(e) => e,
        Failure::Unreachable(why) => anyhow::anyhow!(why),
    }
}

/// Calls `page` with every page of `stream`'s results on `addr`, store by store, in each
/// store's order (window start, then the series' order within the window).
pub fn pages(t: &Target, addr: SocketAddr, stream: StreamId, mut page: impl FnMut(&[ResultRow])) -> anyhow::Result<()> {
    pages_from(t, addr, stream, None, |rows| {
        page(rows);
        true
    })
}

/// Like [`pages`], from the windows starting at `from` in each store (a node seeks there: it
/// reads none before), going on to the next store when `page` returns false.
pub fn pages_from(
    t: &Target,
    addr: SocketAddr,
    stream: StreamId,
    from: Option<i64>,
    mut page: impl FnMut(&[ResultRow]) -> bool,
) -> anyhow::Result<()> {
    let first = || from.map_or_else(Vec::new, |s| weir_engine::state::page_from_window(stream, s));
    let mut store = 0u32;
    let mut after = first();
    loop {
        let req = ResultsReq { request: 1, stream, store, after: std::mem::take(&mut after), max: PAGE };
        let f = crate::client::request(t, addr, &req, ASK).map_err(fail)?;
        let rsp = f.to_owned::<ResultsRsp>().with_context(|| format!("{addr}'s answer"))?;
        if rsp.stores == 0 {
            return Ok(());
        }
        if !rsp.error.is_empty() {
            bail!("{addr}: {}", rsp.error);
        }
        let more = page(&rsp.results);
        match rsp.next {
            Some(n) if more => after = n,
            _ if store + 1 < rsp.stores => (store, after) = (store + 1, first()),
            _ => return Ok(()),
        }
    }
}
