//! A real etcd cluster of several members on 127.0.0.1 (or another address) for one test (Debian's `etcd`), its
//! members killed and started again by the test; every member is killed when it is dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The members of one etcd cluster.
pub struct Etcd {
    dir: PathBuf,
    name: String,
    client: Vec<u16>,
    peer: Vec<u16>,
    /// The address members listen on.
    host: String,
    members: Vec<Option<Child>>,
}

impl Etcd {
    /// Starts `n` members on 127.0.0.1 with their data under `dir`, and waits until the
    /// cluster answers.
    pub fn start(dir: &Path, n: usize) -> Etcd {
        Self::start_on(dir, n, "127.0.0.1")
    }

    /// [`Self::start`], the members listening on `host`.
    pub fn start_on(dir: &Path, n: usize, host: &str) -> Etcd {
        let ports = super::free_ports(2 * n);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let mut e = Etcd {
            dir: dir.to_path_buf(),
            name: format!("weir-test-{nanos}"),
            client: ports[..n].to_vec(),
            peer: ports[n..].to_vec(),
            host: host.to_string(),
            members: (0..n).map(|_| None).collect(),
        };
        for i in 0..n {
            e.start_member(i);
        }
        e.wait_ready(Duration::from_secs(30));
        e
    }

    /// The members' client URLs, as `[control] etcd` takes them.
    pub fn endpoints(&self) -> Vec<String> {
        self.client.iter().map(|p| format!("http://{}:{p}", self.host)).collect()
    }

    /// Starts member `i` (again: from its data directory).
    pub fn start_member(&mut self, i: usize) {
        let initial: Vec<String> =
            self.peer.iter().enumerate().map(|(j, p)| format!("m{j}=http://{}:{p}", self.host)).collect();
        let url = |p: u16| format!("http://{}:{p}", self.host);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("etcd-m{i}.log")))
            .unwrap();
        let child = Command::new("etcd")
            .args(["--name", &format!("m{i}")])
            .arg("--data-dir")
            .arg(self.dir.join(format!("etcd-m{i}")))
            .args(["--listen-client-urls", &url(self.client[i]), "--advertise-client-urls", &url(self.client[i])])
            .args(["--listen-peer-urls", &url(self.peer[i]), "--initial-advertise-peer-urls", &url(self.peer[i])])
            .args(["--initial-cluster", &initial.join(","), "--initial-cluster-token", &self.name])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd runs (Debian's etcd-server: scripts/install-deps --test)");
        self.members[i] = Some(child);
    }

    /// Kills member `i` with SIGKILL.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits until a majority answers a write.
    pub fn wait_ready(&self, limit: Duration) {
        let t0 = Instant::now();
        loop {
            let ok = weir_engine::control::EtcdControl::connect(&self.endpoints(), Duration::from_secs(1))
                .and_then(|s| {
                    use weir_engine::control::{ControlStore, Op};
                    s.txn(&[], &[Op::Put { key: "/ready".into(), value: b"1".to_vec(), lease: None }])
                })
                .is_ok();
            if ok {
                return;
            }
            assert!(t0.elapsed() < limit, "etcd did not answer within {limit:?}: see {}", self.dir.display());
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
