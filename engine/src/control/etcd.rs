//! [`EtcdControl`]: the control store on etcd (v3 API, through the maintained `etcd-client`
//! crate), for clusters of several nodes: etcd's Raft majority makes every transaction
//! linearizable, its leases end keys of a node that stopped renewing them.
//!
//! Every call is blocking and bounded by the store's timeout: the caller's thread (a node's
//! supervisor) never waits longer for an etcd that is down or cut off.

use std::time::Duration;

use etcd_client::{Client, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp};

use super::{Compare, ControlError, ControlStore, Entry, LeaseId, Op, TxnOutcome};

/// The control store on an etcd cluster.
pub struct EtcdControl {
    client: Client,
    rt: tokio::runtime::Runtime,
    endpoint: String,
    timeout: Duration,
}

impl std::fmt::Debug for EtcdControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdControl").field("endpoint", &self.endpoint).finish()
    }
}

impl EtcdControl {
    /// Connects to the etcd members at `endpoints` (`http://host:port`); each call then takes
    /// at most `timeout`.
    pub fn connect(endpoints: &[String], timeout: Duration) -> Result<Self, ControlError> {
        let endpoint = endpoints.join(",");
        let unavailable =
            |reason: String| ControlError::Unavailable { endpoint: endpoint.clone(), op: "connect", reason };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| unavailable(format!("runtime: {e}")))?;
        let opts = ConnectOptions::new().with_connect_timeout(timeout).with_timeout(timeout);
        let client = rt
            .block_on(async { tokio::time::timeout(timeout, Client::connect(endpoints, Some(opts))).await })
            .map_err(|_| unavailable(format!("no answer within {timeout:?}")))?
            .map_err(|e| unavailable(e.to_string()))?;
        Ok(Self { client, rt, endpoint, timeout })
    }

    /// Runs `f` on a clone of the client, bounded by the timeout.
    fn call<T, F>(&self, op: &'static str, f: impl FnOnce(Client) -> F) -> Result<T, ControlError>
    where
        F: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let fut = f(self.client.clone());
        match self.rt.block_on(async { tokio::time::timeout(self.timeout, fut).await }) {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.error(op, e)),
            Err(_) => Err(ControlError::Unavailable {
                endpoint: self.endpoint.clone(),
                op,
                reason: format!("no answer within {:?}", self.timeout),
            }),
        }
    }

    fn error(&self, op: &'static str, e: etcd_client::Error) -> ControlError {
        let endpoint = self.endpoint.clone();
        match &e {
            // etcd's own refusals (a missing lease, a malformed request) are final; the rest
            // (unavailable, deadline, no leader, transport) may pass.
            etcd_client::Error::GRpcStatus(s)
                if matches!(
                    s.code(),
                    tonic::Code::InvalidArgument
                        | tonic::Code::NotFound
                        | tonic::Code::FailedPrecondition
                        | tonic::Code::OutOfRange
                        | tonic::Code::PermissionDenied
                        | tonic::Code::Unauthenticated
                ) =>
            {
                ControlError::Refused { endpoint, op, reason: s.message().to_string() }
            }
            etcd_client::Error::InvalidArgs(r) => ControlError::Refused { endpoint, op, reason: r.clone() },
            _ => ControlError::Unavailable { endpoint, op, reason: e.to_string() },
        }
    }
}

impl ControlStore for EtcdControl {
    fn grant(&self, ttl: Duration) -> Result<LeaseId, ControlError> {
        let secs = (ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)).max(1) as i64;
        self.call("grant", |mut c| async move { c.lease_grant(secs, None).await }).map(|r| LeaseId(r.id()))
    }

    fn keep_alive(&self, lease: LeaseId) -> Result<Option<Duration>, ControlError> {
        let r = self.call("keep-alive", |mut c| async move {
            let (mut keeper, mut stream) = c.lease_keep_alive(lease.0).await?;
            keeper.keep_alive().await?;
            stream.message().await
        });
        match r {
            // A TTL of 0 (or no answer on the stream): the lease has ended.
            Ok(r) => Ok(r.filter(|r| r.ttl() > 0).map(|r| Duration::from_secs(r.ttl() as u64))),
            Err(ControlError::Unavailable { reason, .. }) | Err(ControlError::Refused { reason, .. })
                if reason.contains("lease not found") =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    fn revoke(&self, lease: LeaseId) -> Result<(), ControlError> {
        match self.call("revoke", |mut c| async move { c.lease_revoke(lease.0).await }) {
            Ok(_) => Ok(()),
            // Ended already: what revoking wanted.
            Err(ControlError::Refused { reason, .. }) if reason.contains("not found") => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn get(&self, key: &str) -> Result<Option<Entry>, ControlError> {
        let k = key.to_string();
        let r = self.call("get", |mut c| async move { c.get(k, None).await })?;
        Ok(r.kvs().first().map(|kv| Entry {
            value: kv.value().to_vec(),
            mod_revision: kv.mod_revision(),
            lease: (kv.lease() != 0).then_some(LeaseId(kv.lease())),
        }))
    }

    fn list(&self, prefix: &str, limit: usize) -> Result<Vec<(String, Entry)>, ControlError> {
        let k = prefix.to_string();
        let opts = GetOptions::new().with_prefix().with_limit(i64::try_from(limit).unwrap_or(i64::MAX));
        let r = self.call("list", |mut c| async move { c.get(k, Some(opts)).await })?;
        Ok(r.kvs()
            .iter()
            .take(limit)
            .map(|kv| {
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                let e = Entry {
                    value: kv.value().to_vec(),
                    mod_revision: kv.mod_revision(),
                    lease: (kv.lease() != 0).then_some(LeaseId(kv.lease())),
                };
                (key, e)
            })
            .collect())
    }

    fn txn(&self, when: &[Compare], then: &[Op]) -> Result<TxnOutcome, ControlError> {
        let compares: Vec<etcd_client::Compare> = when
            .iter()
            .map(|c| match c {
                Compare::ModRevision(k, r) => etcd_client::Compare::mod_revision(k.as_str(), CompareOp::Equal, *r),
                Compare::LeaseIs(k, l) => etcd_client::Compare::lease(k.as_str(), CompareOp::Equal, l.0),
            })
            .collect();
        let ops: Vec<TxnOp> = then
            .iter()
            .map(|o| match o {
                Op::Put { key, value, lease } => {
                    let opts = lease.map(|l| PutOptions::new().with_lease(l.0));
                    TxnOp::put(key.as_str(), value.clone(), opts)
                }
                Op::Delete(key) => TxnOp::delete(key.as_str(), None),
            })
            .collect();
        let txn = Txn::new().when(compares).and_then(ops);
        let r = self.call("txn", |mut c| async move { c.txn(txn).await })?;
        let revision = r.header().map_or(0, |h| h.revision());
        Ok(TxnOutcome { succeeded: r.succeeded(), revision })
    }
}
