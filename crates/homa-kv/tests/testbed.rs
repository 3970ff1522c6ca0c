//! The store as real processes on the namespace testbed (root only; skips
//! with a message otherwise): `homa kv up --testbed`'s layout, a client in
//! host 0's namespace writing and reading back through shaped links.

use homa_kv::testbed::{start_cluster, TestbedSpec, PREFIX};
use homa_kv::KvClient;

#[test]
fn a_store_on_the_testbed_serves_a_client_in_a_namespace() {
    if !homa_testbed::cmd::is_root() {
        eprintln!("skipped: the namespace testbed needs root");
        return;
    }
    let c = start_cluster(&TestbedSpec {
        masters: 1,
        backups: 3,
        replicas: 3,
        gbps: 1.0,
        program: Some(env!("CARGO_BIN_EXE_homa-kv").into()),
    })
    .unwrap();
    // One process per node, each in its own host's namespace.
    let hosts: Vec<usize> = c.nodes.iter().map(|n| n.host).collect();
    assert_eq!(hosts, vec![0, 1, 2, 3, 4]);
    let coord = c.coordinator();
    let got = homa_testbed::netns::run_in(&c.ns(0), move || {
        let kv = KvClient::connect(coord).map_err(|e| homa_testbed::Error::bench(e.to_string()))?;
        let mut out = Vec::new();
        for i in 0..50u32 {
            let key = format!("k{i}");
            kv.put(key.as_bytes(), format!("v{i}").into_bytes())
                .map_err(|e| homa_testbed::Error::bench(e.to_string()))?;
            let v = kv
                .get(key.as_bytes())
                .map_err(|e| homa_testbed::Error::bench(e.to_string()))?;
            out.push(v.map(|v| v.value));
        }
        Ok(out)
    })
    .unwrap();
    for (i, v) in got.iter().enumerate() {
        assert_eq!(v.as_deref(), Some(format!("v{i}").as_bytes()));
    }
    drop(c);
    homa_testbed::testbed::down(PREFIX).unwrap();
}
