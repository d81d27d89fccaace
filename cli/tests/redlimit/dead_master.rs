//! `inspect` and `limited` on a Cluster one of whose masters cannot be read (killed, flagged
//! `fail?` or `fail`, with or without `cluster-require-full-coverage`): exit 1 naming the
//! master and its slots, never a list or a "no state" that leaves its tenants out.

use std::process::Output;
use std::time::{Duration, Instant};

use crate::support::RedisCluster;
use crate::text;

/// How long the nodes get to flag a dead master (`cluster-node-timeout` is 2 s here).
const FLAG_TIMEOUT: Duration = Duration::from_secs(30);

/// The slot ranges of the harness's three masters, in node order.
const RANGES: [&str; 3] = ["0-5460", "5461-10921", "10922-16383"];

/// Runs `redlimit --redis-cluster <node 0 first, then the others> args`.
fn on_cluster(cluster: &RedisCluster, args: &[&str]) -> Output {
    let urls = cluster.urls().join(",");
    let output = crate::redlimit_command()
        .args(["--redis-cluster", &urls])
        .args(args)
        .output();
    output.expect("run redlimit")
}

/// One tenant on each master (by the slot of its hash tag), each suspended through `redlimit`.
fn a_suspended_tenant_on_each_master(cluster: &RedisCluster) -> Vec<String> {
    let mut tenants = vec![String::new(); cluster.nodes().len()];
    for i in 0.. {
        let tenant = format!("t{i}");
        let node = cluster.node_for_key(&format!("{{{tenant}}}"));
        if tenants[node].is_empty() {
            tenants[node] = tenant;
        }
        if tenants.iter().all(|t| !t.is_empty()) {
            break;
        }
    }
    for tenant in &tenants {
        let output = on_cluster(cluster, &["suspend", tenant, "10m"]);
        crate::stdout_of_success(&output, &format!("suspend {tenant}"));
    }
    tenants
}

/// `CONFIG SET cluster-require-full-coverage no` on every node: the masters that live keep
/// serving their slots when one dies.
fn serve_without_full_coverage(cluster: &RedisCluster) {
    for node in cluster.nodes() {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-require-full-coverage")
            .arg("no")
            .query(&mut node.conn())
            .expect("CONFIG SET");
    }
}

/// The flags node `viewer` shows for the node on `port` in its `CLUSTER NODES`.
fn flags_seen_by(cluster: &RedisCluster, viewer: usize, port: u16) -> String {
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query(&mut cluster.nodes()[viewer].conn())
        .expect("CLUSTER NODES");
    let address = format!("127.0.0.1:{port}@");
    let line = nodes.lines().find(|line| line.contains(&address));
    let line = line.unwrap_or_else(|| panic!("no node on port {port}:\n{nodes}"));
    line.split_whitespace()
        .nth(2)
        .unwrap_or_default()
        .to_owned()
}

/// What is wrong with `output` for a scan that could not read masters `dead` (node indexes):
/// `None` when it exits 1 with nothing on stdout and a one-line error that says not every slot
/// was read and names each of them by its address and slot range.
fn unread_fault(output: &Output, cluster: &RedisCluster, dead: &[usize]) -> Option<String> {
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    let named = dead.iter().all(|&node| {
        let port = cluster.nodes()[node].port();
        stderr.contains(&format!("127.0.0.1:{port}")) && stderr.contains(RANGES[node])
    });
    let right = output.status.code() == Some(1)
        && stdout.is_empty()
        && stderr.starts_with("error: ")
        && stderr.lines().count() == 1
        && stderr.contains("not every slot")
        && named;
    let stdout_lines = stdout.lines().count();
    (!right).then(|| {
        format!(
            "{}, {stdout_lines} lines on stdout, {stderr:?}",
            output.status
        )
    })
}

/// Asserts [`unread_fault`] finds nothing wrong.
fn assert_names_unread(output: &Output, cluster: &RedisCluster, dead: &[usize], what: &str) {
    if let Some(fault) = unread_fault(output, cluster, dead) {
        panic!("{what}: expected exit 1 naming masters {dead:?} and their slots: {fault}");
    }
}

/// A master killed on a cluster that keeps serving without it: from the kill, through the
/// moment the others flag it `fail?` then `fail`, `limited` and `inspect` of its tenant exit 1
/// naming it and its slots; `inspect` of a tenant on a live master too (a partial scan proves
/// no absence).
#[test]
fn a_killed_master_is_named_not_left_out() {
    let mut cluster = RedisCluster::start();
    serve_without_full_coverage(&cluster);
    let tenants = a_suspended_tenant_on_each_master(&cluster);
    let listed = text(&on_cluster(&cluster, &["limited"]).stdout);
    assert_eq!(listed.lines().count(), 3, "{listed}");

    let dead_port = cluster.nodes()[2].port();
    cluster.node_mut(2).stop();
    let deadline = Instant::now() + FLAG_TIMEOUT;
    let (mut runs, mut faults) = (0, Vec::new());
    loop {
        let flags = flags_seen_by(&cluster, 0, dead_port);
        let commands = [
            ("limited", vec!["limited"]),
            ("inspect of its tenant", vec!["inspect", &tenants[2]]),
            ("inspect of a live tenant", vec!["inspect", &tenants[0]]),
        ];
        for (what, args) in commands {
            let output = on_cluster(&cluster, &args);
            if let Some(fault) = unread_fault(&output, &cluster, &[2]) {
                faults.push(format!("{what} (flags {flags}): {fault}"));
            }
        }
        runs += 1;
        // A few runs once the cluster has agreed the master failed.
        if flags.split(',').any(|flag| flag == "fail") && runs >= 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "master 2 not flagged fail after {FLAG_TIMEOUT:?}: {flags}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        faults.is_empty(),
        "{} of {} runs did not name the dead master:\n{}",
        faults.len(),
        runs * 3,
        faults.join("\n")
    );
    // The controls still reach a tenant on a live master.
    let output = on_cluster(&cluster, &["resume", &tenants[0]]);
    crate::stdout_of_success(&output, "resume on a live master");
}

/// With full coverage required (the default), the cluster answers `CLUSTERDOWN` once the
/// master fails: `inspect` of its tenant still exits 1 naming it, never 2 "unknown tenant".
#[test]
fn a_failed_master_is_named_while_the_cluster_is_down() {
    let mut cluster = RedisCluster::start();
    let tenants = a_suspended_tenant_on_each_master(&cluster);
    let dead_port = cluster.nodes()[1].port();
    cluster.node_mut(1).stop();
    let deadline = Instant::now() + FLAG_TIMEOUT;
    while !flags_seen_by(&cluster, 0, dead_port)
        .split(',')
        .any(|flag| flag == "fail")
    {
        assert!(Instant::now() < deadline, "master 1 not flagged fail");
        std::thread::sleep(Duration::from_millis(100));
    }
    let inspect = on_cluster(&cluster, &["inspect", &tenants[1]]);
    assert_names_unread(&inspect, &cluster, &[1], "inspect (cluster down)");
    let limited = on_cluster(&cluster, &["limited", "--json"]);
    assert_names_unread(&limited, &cluster, &[1], "limited --json (cluster down)");
}

/// A master only one node suspects (`fail?`: the other live master, with a long
/// `cluster-node-timeout`, does not yet, so no `fail` is agreed) is read like any other: here
/// it is dead, and `limited` and `inspect` of its tenant exit 1 naming it.
#[test]
fn a_master_flagged_fail_question_is_not_skipped() {
    let mut cluster = RedisCluster::start();
    serve_without_full_coverage(&cluster);
    let tenants = a_suspended_tenant_on_each_master(&cluster);
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("cluster-node-timeout")
        .arg(600_000)
        .query(&mut cluster.nodes()[1].conn())
        .expect("CONFIG SET");
    let dead_port = cluster.nodes()[2].port();
    cluster.node_mut(2).stop();
    let deadline = Instant::now() + FLAG_TIMEOUT;
    while flags_seen_by(&cluster, 0, dead_port) != "master,fail?" {
        assert!(Instant::now() < deadline, "master 2 not suspected");
        std::thread::sleep(Duration::from_millis(100));
    }
    let limited = on_cluster(&cluster, &["limited"]);
    assert_names_unread(&limited, &cluster, &[2], "limited (fail?)");
    let inspect = on_cluster(&cluster, &["inspect", &tenants[2]]);
    assert_names_unread(&inspect, &cluster, &[2], "inspect (fail?)");
    assert_eq!(flags_seen_by(&cluster, 0, dead_port), "master,fail?");
}
