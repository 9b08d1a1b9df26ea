//! The loads recorded with an ingest-log stream on its nodes. `weir load` describes itself with
//! each partition's first batch (the parameters its rows are a pure function of, as JSON), and
//! each partition's ledger on its node counts the rows every producer appended and whether it
//! ended; so `weir verify` knows every row the stream was sent without being told, and a second
//! `weir load` starts its event time after the first one's last window.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use weir_engine::operator::generator::{Generator, GeneratorSpec};
use weir_engine::operator::window::WindowSpec;
use weir_engine::wire::StreamId;
use weir_engine::wire::msg::{ProducersCursor, ProducersReq, ProducersRsp};

use crate::client::{Failure, Target};

/// The version of the description's format.
const FORMAT: u32 = 1;

/// What a `weir load` says of itself with a partition's first batch.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Description {
    /// Format version ([`FORMAT`]).
    pub weir_load: u32,
    pub seed: u64,
    pub keys: u64,
    pub ts_start: i64,
    pub rows_per_ms: u64,
    pub out_of_order: f64,
    pub max_disorder_ms: i64,
}

impl Description {
    pub fn of(g: &GeneratorSpec) -> Self {
        Self {
            weir_load: FORMAT,
            seed: g.seed,
            keys: g.keys,
            ts_start: g.ts_start,
            rows_per_ms: g.rows_per_ms,
            out_of_order: g.out_of_order,
            max_disorder_ms: g.max_disorder_ms,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a description is JSON")
    }

    /// The generator of the rows, from a description's bytes.
    pub fn parse(bytes: &[u8]) -> Result<GeneratorSpec, String> {
        let d: Description = serde_json::from_slice(bytes).map_err(|e| format!("not a weir load description: {e}"))?;
        if d.weir_load != FORMAT {
            return Err(format!("a weir load description of format {}, this weir reads {FORMAT}", d.weir_load));
        }
        let g = GeneratorSpec {
            seed: d.seed,
            keys: d.keys,
            ts_start: d.ts_start,
            rows_per_ms: d.rows_per_ms,
            out_of_order: d.out_of_order,
            max_disorder_ms: d.max_disorder_ms,
        };
        g.validate().map_err(|e| e.to_string())?;
        Ok(g)
    }
}

/// One load's share of one partition, as its ledger recorded it.
#[derive(Clone, Debug)]
pub struct Load {
    pub producer: u64,
    pub generator: GeneratorSpec,
    /// Rows appended: offsets `0..rows` of the partition's generator.
    pub rows: u64,
    /// The watermark of its end-of-load marker, once it sent it.
    pub ended: Option<i64>,
}

impl Load {
    /// Event time past every row of the load on partition `p`: the end of the window holding its
    /// last row (the load's end-of-load marker says as much), or its marker when later.
    pub fn end(&self, p: u32, window: WindowSpec) -> i64 {
        let last = Generator::new(self.generator, p).max_ts_before(self.rows);
        let end = if self.rows == 0 { i64::MIN } else { window.last_start(last).saturating_add(window.size_ms) };
        end.max(self.ended.unwrap_or(i64::MIN))
    }
}

const ASK: Duration = Duration::from_secs(10);

/// The ledgers of `stream`'s partitions on `addr`, page by page, merged into one answer.
pub fn ledgers(t: &Target, addr: SocketAddr, stream: StreamId) -> anyhow::Result<ProducersRsp> {
    let mut all: Option<ProducersRsp> = None;
    let mut from = ProducersCursor::default();
    loop {
        let req = ProducersReq { request: 1, stream, from };
        let f = crate::client::request(t, addr, &req, ASK).map_err(|f| match f {
            Failure::Refused(e) => e,
            Failure::Unreachable(why) => anyhow::anyhow!("{addr}: {why}"),
        })?;
        let page = f.to_owned::<ProducersRsp>().with_context(|| format!("{addr}'s answer to a producers request"))?;
        if !page.error.is_empty() {
            bail!("{addr}: {}", page.error);
        }
        let next = page.next;
        match &mut all {
            None => all = Some(page),
            Some(all) => {
                for part in page.partitions {
                    match all.partitions.iter_mut().find(|p| p.partition == part.partition) {
                        Some(p) => {
                            p.producers.extend(part.producers);
                            p.durable = p.durable.max(part.durable);
                        }
                        None => all.partitions.push(part),
                    }
                }
            }
        }
        match next {
            Some(n) if n > from => from = n,
            Some(n) => bail!("{addr} answered a producers page from {from:?} with the next at {n:?}"),
            None => break,
        }
    }
    let mut all = all.expect("at least one page");
    all.next = None;
    Ok(all)
}

/// The loads of each partition `0..owners.len()`, in the order they were sent, from the ledger on
/// the node that runs the partition's source (`owners[p]`). A producer that appended rows
/// without a description `weir load` wrote is an error: nobody can say what its rows were.
pub fn loads(t: &Target, stream: StreamId, owners: &[SocketAddr]) -> anyhow::Result<Vec<Vec<Load>>> {
    let mut asked: BTreeMap<SocketAddr, ProducersRsp> = BTreeMap::new();
    let mut out = Vec::with_capacity(owners.len());
    for (p, addr) in owners.iter().enumerate() {
        if !asked.contains_key(addr) {
            asked.insert(*addr, ledgers(t, *addr, stream)?);
        }
        let Some(part) = asked[addr].partitions.iter().find(|x| x.partition == p as u32) else {
            out.push(Vec::new());
            continue;
        };
        let mut loads = Vec::new();
        for r in &part.producers {
            let generator = match Description::parse(&r.description) {
                Ok(g) => g,
                Err(_) if r.rows == 0 => continue,
                Err(why) => bail!(
                    "partition {p} on {addr} holds {} rows of producer {:#x}, which did not describe them ({why}): \
                     only rows that weir load sent can be verified",
                    r.rows,
                    r.producer
                ),
            };
            loads.push(Load { producer: r.producer, generator, rows: r.rows, ended: r.ended });
        }
        out.push(loads);
    }
    Ok(out)
}
