//! A private three-master Redis Cluster.

use std::thread;
use std::time::{Duration, Instant};

use super::{info_field, RedisServer, TlsSetup};

/// Number of masters in the cluster.
const MASTERS: usize = 3;
/// Number of hash slots in Redis Cluster.
const SLOTS: u16 = 16384;
/// How long `wait_ok` waits for the cluster to settle. A restarted master
/// alone waits 2 s before it calls itself ok again.
const OK_TIMEOUT: Duration = Duration::from_secs(30);

/// Three cluster-enabled `redis-server` masters (no replicas) sharing all
/// 16384 slots, each on its own port and in its own temporary directory.
///
/// Dropping it kills every node.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three nodes, splits the slots between them, joins them with
    /// `CLUSTER MEET`, and waits until every node reports the cluster ok.
    pub fn start() -> RedisCluster {
        Self::start_nodes(RedisServer::start_cluster_node)
    }

    /// The same over TLS: clients and the cluster bus use TLS with `tls`'s certificates (each
    /// node keeps a plain port for the harness). Clients connect to [`tls_urls`](Self::tls_urls).
    pub fn start_tls(tls: &TlsSetup) -> RedisCluster {
        Self::start_nodes(|| RedisServer::start_tls_cluster_node(tls))
    }

    fn start_nodes(start: impl Fn() -> RedisServer) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..MASTERS).map(|_| start()).collect();
        let cluster = RedisCluster { nodes };
        cluster.assign_slots();
        cluster.meet();
        cluster.wait_ok();
        cluster
    }

    /// The nodes, in the order their slot ranges go (node 0 has slot 0).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Node `i`, mutably (to stop or restart it by hand).
    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// `redis://127.0.0.1:<port>/` of every node, for `ClusterClient::new`.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// `rediss://127.0.0.1:<tls port>/` of every node of a TLS cluster.
    pub fn tls_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::tls_url).collect()
    }

    /// The index in [`nodes`](Self::nodes) of the master that serves `key`'s
    /// slot, from `CLUSTER KEYSLOT` and `CLUSTER NODES` (asked on a plain
    /// connection, a TLS node shows its plain port there).
    pub fn node_for_key(&self, key: &str) -> usize {
        let mut conn = self.any_conn();
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut conn)
            .expect("CLUSTER KEYSLOT");
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut conn)
            .expect("CLUSTER NODES");
        let port = master_port_for_slot(&nodes, slot)
            .unwrap_or_else(|| panic!("no master serves slot {slot}; CLUSTER NODES:\n{nodes}"));
        self.nodes
            .iter()
            .position(|node| node.port() == port || node.client_port() == port)
            .unwrap_or_else(|| panic!("slot {slot} is served by port {port}, which is not ours"))
    }

    /// A connection to the first node that accepts one (some may be stopped).
    fn any_conn(&self) -> redis::Connection {
        self.nodes
            .iter()
            .find_map(|node| {
                node.client()
                    .get_connection_with_timeout(Duration::from_secs(1))
                    .ok()
            })
            .expect("no cluster node accepts connections")
    }

    /// `SCRIPT FLUSH` on every node.
    pub fn script_flush_all(&self) {
        self.nodes.iter().for_each(RedisServer::script_flush);
    }

    /// `FLUSHALL` on every master.
    pub fn flushall(&self) {
        self.nodes.iter().for_each(RedisServer::flushall);
    }

    /// Kills node `i` with SIGKILL, starts it again with the same port and
    /// nodes config file so it rejoins with its slots (but no keys), and
    /// waits for the cluster to be ok again.
    pub fn restart_node(&mut self, i: usize) {
        self.nodes[i].restart();
        self.wait_ok();
    }

    /// Waits until every node reports `cluster_state:ok`, all 16384 slots ok
    /// and all nodes known; panics with each node's `CLUSTER INFO` after 30 s.
    pub fn wait_ok(&self) {
        let deadline = Instant::now() + OK_TIMEOUT;
        while !self.nodes.iter().all(|node| self.node_is_ok(node)) {
            if Instant::now() >= deadline {
                panic!("cluster not ok after {OK_TIMEOUT:?}:\n{}", self.describe());
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether `node` sees a healthy cluster: state ok, every slot served by
    /// a reachable master, and every other node known.
    fn node_is_ok(&self, node: &RedisServer) -> bool {
        let Some(info) = cluster_info(node) else {
            return false;
        };
        info_field(&info, "cluster_state") == Some("ok")
            && info_field(&info, "cluster_slots_ok") == Some(&SLOTS.to_string())
            && info_field(&info, "cluster_known_nodes") == Some(&self.nodes.len().to_string())
    }

    /// Gives node `i` the i-th third of the slots (before the nodes meet, so
    /// there is nothing to conflict with) and a distinct config epoch.
    fn assign_slots(&self) {
        let count = self.nodes.len() as u16;
        for (i, node) in self.nodes.iter().enumerate() {
            let i = i as u16;
            let first = SLOTS / count * i;
            let last = if i + 1 == count {
                SLOTS - 1
            } else {
                SLOTS / count * (i + 1) - 1
            };
            let mut conn = node.conn();
            let _: () = redis::cmd("CLUSTER")
                .arg("SET-CONFIG-EPOCH")
                .arg(i + 1)
                .query(&mut conn)
                .expect("CLUSTER SET-CONFIG-EPOCH");
            let _: () = redis::cmd("CLUSTER")
                .arg("ADDSLOTS")
                .arg((first..=last).collect::<Vec<u16>>())
                .query(&mut conn)
                .expect("CLUSTER ADDSLOTS");
        }
    }

    /// Introduces every node to node 0; gossip does the rest.
    fn meet(&self) {
        let mut conn = self.nodes[0].conn();
        for node in &self.nodes[1..] {
            let _: () = redis::cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(node.client_port())
                .query(&mut conn)
                .expect("CLUSTER MEET");
        }
    }

    /// Every node's `CLUSTER INFO` and log tail, for failure messages.
    fn describe(&self) -> String {
        self.nodes
            .iter()
            .map(|node| {
                format!(
                    "--- node on port {} ---\n{}\n--- log tail ---\n{}",
                    node.port(),
                    cluster_info(node).unwrap_or_else(|| "(unreachable)".into()),
                    node.log_tail(10)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Moving one slot between two masters by hand, as `redis-cli --cluster reshard` does:
/// [`begin_slot_migration`](RedisCluster::begin_slot_migration), then
/// [`migrate_keys`](RedisCluster::migrate_keys) batch by batch, then
/// [`finish_slot_migration`](RedisCluster::finish_slot_migration).
impl RedisCluster {
    /// The slot of `key` (`CLUSTER KEYSLOT`).
    pub fn slot_of(&self, key: &str) -> u16 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut self.any_conn())
            .expect("CLUSTER KEYSLOT")
    }

    /// Node `i`'s id (`CLUSTER MYID`).
    pub fn node_id(&self, i: usize) -> String {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut self.nodes[i].conn())
            .expect("CLUSTER MYID")
    }

    /// Opens the move of `slot` from node `from` to node `to`: `CLUSTER SETSLOT <slot>
    /// IMPORTING <from>` on the target first, then `MIGRATING <to>` on the source (the order
    /// `redis-cli` uses, so the source never sends an `ASK` that the target would refuse).
    pub fn begin_slot_migration(&self, slot: u16, from: usize, to: usize) {
        let (from_id, to_id) = (self.node_id(from), self.node_id(to));
        let setslot = |node: usize, state: &str, id: &str| {
            let _: () = redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg(state)
                .arg(id)
                .query(&mut self.nodes[node].conn())
                .unwrap_or_else(|e| panic!("CLUSTER SETSLOT {slot} {state} on node {node}: {e}"));
        };
        setslot(to, "IMPORTING", &from_id);
        setslot(from, "MIGRATING", &to_id);
    }

    /// Moves up to `batch` keys of `slot` from node `from` to node `to` with one `MIGRATE`;
    /// returns how many it moved (0 once the slot is empty on the source).
    pub fn migrate_keys(&self, slot: u16, from: usize, to: usize, batch: usize) -> usize {
        let mut source = self.nodes[from].conn();
        let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(batch)
            .query(&mut source)
            .expect("CLUSTER GETKEYSINSLOT");
        if keys.is_empty() {
            return 0;
        }
        let _: redis::Value = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(self.nodes[to].client_port())
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys)
            .query(&mut source)
            .expect("MIGRATE");
        keys.len()
    }

    /// Closes the move: `CLUSTER SETSLOT <slot> NODE <to>` on the target, the source, then
    /// every other master, and waits until every node agrees the cluster is ok.
    pub fn finish_slot_migration(&self, slot: u16, from: usize, to: usize) {
        let to_id = self.node_id(to);
        let others = (0..self.nodes.len()).filter(|&i| i != from && i != to);
        for node in [to, from].into_iter().chain(others) {
            let _: () = redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("NODE")
                .arg(&to_id)
                .query(&mut self.nodes[node].conn())
                .unwrap_or_else(|e| panic!("CLUSTER SETSLOT {slot} NODE on node {node}: {e}"));
        }
        self.wait_ok();
    }

    /// How many keys node `i` holds in `slot` (`CLUSTER COUNTKEYSINSLOT`).
    pub fn keys_in_slot(&self, i: usize, slot: u16) -> u64 {
        redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(slot)
            .query(&mut self.nodes[i].conn())
            .expect("CLUSTER COUNTKEYSINSLOT")
    }
}

/// The hash slot of `key` as Redis Cluster computes it: CRC16 (XMODEM) of the hash tag (the
/// part between the first `{` and the next `}`, when not empty) or of the whole key, mod 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    let mut crc: u16 = 0;
    for &byte in tagged.unwrap_or(key) {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % SLOTS
}

/// `CLUSTER INFO` of `node`, `None` if it cannot be reached.
fn cluster_info(node: &RedisServer) -> Option<String> {
    let mut conn = node
        .client()
        .get_connection_with_timeout(Duration::from_secs(1))
        .ok()?;
    redis::cmd("CLUSTER").arg("INFO").query(&mut conn).ok()
}

/// The port of the master that `CLUSTER NODES` says serves `slot`.
///
/// A line looks like
/// `<id> 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460 5462`.
fn master_port_for_slot(cluster_nodes: &str, slot: u16) -> Option<u16> {
    cluster_nodes.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (address, flags) = (fields.get(1)?, fields.get(2)?);
        if !flags.split(',').any(|flag| flag == "master") {
            return None;
        }
        let serves = fields
            .iter()
            .skip(8)
            .any(|range| slot_range_contains(range, slot));
        let port = address.split('@').next()?.rsplit(':').next()?;
        serves.then(|| port.parse().ok()).flatten()
    })
}

/// Whether a `CLUSTER NODES` slot field (`"5"` or `"0-5460"`; migration
/// markers like `"[5->-id]"` never match) contains `slot`.
fn slot_range_contains(range: &str, slot: u16) -> bool {
    let (first, last) = range.split_once('-').unwrap_or((range, range));
    match (first.parse::<u16>(), last.parse::<u16>()) {
        (Ok(first), Ok(last)) => (first..=last).contains(&slot),
        _ => false,
    }
}
