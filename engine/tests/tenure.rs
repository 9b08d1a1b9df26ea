//! An engine whose node may have lost its cluster membership (its lease in etcd) acknowledges
//! no ingest append, though the rows are durable on it: the producer sends them again where the
//! partition runs (appends are idempotent), so no acknowledged row can be one a node that the
//! cluster replaced took in.

mod util;

use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_engine::cluster::Tenure;
use weir_engine::operator::window::WindowSpec;
use weir_engine::spec::SourceKind;
use weir_engine::wire::msg::{Ingest, IngestAck, IngestOutcome};
use weir_engine::wire::{Batch, Version};

#[test]
fn a_node_without_its_membership_acknowledges_no_append_and_acknowledges_it_once_it_holds_again() {
    let mut spec = util::bounded_spec(1, 1, 1, 0, WindowSpec::tumbling(10));
    spec.source = SourceKind::IngestLog;
    let dir = tempfile::tempdir().unwrap();
    let tenure = Arc::new(Tenure::default());
    let (engine, mut client) = util::ingest_engine(&spec, dir.path(), |cfg| cfg.tenure = Some(tenure.clone()));
    let mut batch = Batch::default();
    for ts in 0..20 {
        batch.push(ts, 1, 1.0);
    }
    let send = |client: &mut weir_engine::wire::transport::client::BlockingClient, request: u64| {
        let msg = Ingest {
            stream: spec.id,
            partition: 0,
            request,
            producer: 7,
            seq: 0,
            batch: batch.clone(),
            idle_watermark_ms: None,
            description: None,
        };
        client.send(&msg).unwrap();
        client.recv().unwrap().to_owned::<IngestAck>().unwrap().outcome
    };
    // Its lease ended a moment ago.
    tenure.set(Some(Instant::now()));
    match send(&mut client, 1) {
        IngestOutcome::Rejected { reason, retryable: true } => assert!(reason.contains("holds no lease"), "{reason}"),
        other => panic!("acknowledged without a membership: {other:?}"),
    }
    // Held again: the same batch is acknowledged, stored once.
    tenure.set(Some(Instant::now() + Duration::from_secs(60)));
    let outcome = send(&mut client, 2);
    assert_eq!(outcome, IngestOutcome::Durable { first: Version(0), last: Version(19), duplicate: true });
    engine.stop();
    engine.wait().unwrap();
}
