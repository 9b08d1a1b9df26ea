//! The `[control]` table: the etcd cluster that holds the cluster's control state (who is a
//! member, who leads, where each task runs).

use std::time::Duration;

use anyhow::bail;
use serde::Deserialize;

/// Cluster control, as written.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct ControlFile {
    /// The etcd members' client URLs (`"http://10.0.0.5:2379"`), one or a list.
    #[serde(deserialize_with = "one_or_many")]
    pub etcd: Vec<String>,
    /// A node's lease: a node cut off from etcd's majority stops its tasks within it, and the
    /// others may move them once it has ended (whole seconds, at least 2).
    #[serde(default = "default_lease", deserialize_with = "super::de_duration")]
    pub lease: Duration,
    /// How long one call to etcd may take before the node counts it as failed.
    #[serde(default = "default_timeout", deserialize_with = "super::de_duration")]
    pub timeout: Duration,
}

fn default_lease() -> Duration {
    Duration::from_secs(3)
}

fn default_timeout() -> Duration {
    Duration::from_millis(500)
}

fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => s.split(',').map(|s| s.trim().to_string()).collect(),
        OneOrMany::Many(v) => v,
    })
}

impl ControlFile {
    /// Checks what the types cannot.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.etcd.is_empty() || self.etcd.iter().any(|e| e.trim().is_empty()) {
            bail!("control.etcd: the etcd members' URLs, e.g. [\"http://127.0.0.1:2379\"]");
        }
        if self.lease < Duration::from_secs(2) || self.lease.subsec_nanos() != 0 {
            bail!(
                "control.lease = {}: whole seconds, at least 2s (etcd's leases are in seconds)",
                humantime::format_duration(self.lease)
            );
        }
        // A round makes five calls; the next renewal must be answered before the last one's
        // bound (the lease less a tenth) runs out, even when every call is slow.
        if self.timeout.is_zero() || self.timeout * 5 >= self.lease * 9 / 10 {
            bail!(
                "control.timeout = {}: above zero and under a fifth of nine tenths of control.lease ({})",
                humantime::format_duration(self.timeout),
                humantime::format_duration(self.lease * 9 / 50)
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_control_table_takes_one_url_or_several_and_refuses_a_lease_etcd_cannot_keep() {
        let one: ControlFile = toml::from_str("etcd = \"http://a:2379, http://b:2379\"").unwrap();
        assert_eq!(one.etcd, ["http://a:2379", "http://b:2379"]);
        assert_eq!(one.lease, Duration::from_secs(3));
        one.validate().unwrap();
        let short: ControlFile = toml::from_str("etcd = [\"http://a:2379\"]\nlease = \"1500ms\"").unwrap();
        let e = short.validate().unwrap_err().to_string();
        assert!(e.contains("control.lease = 1s 500ms: whole seconds, at least 2s"), "{e}");
        let slow: ControlFile = toml::from_str("etcd = [\"http://a:2379\"]\ntimeout = \"600ms\"").unwrap();
        let e = slow.validate().unwrap_err().to_string();
        assert!(e.contains("under a fifth of nine tenths of control.lease (540ms)"), "{e}");
        assert!(toml::from_str::<ControlFile>("etcd = []").unwrap().validate().is_err());
    }
}
