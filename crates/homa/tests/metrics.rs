//! `Endpoint::publish_metrics` (`metrics` feature, on for the crate's own
//! tests): what a `metrics` recorder receives after a round trip.

use homa::Endpoint;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use std::collections::HashMap;
use std::time::Duration;

/// (name, sorted labels) -> value, of everything `publish_metrics` emitted.
type Seen = HashMap<(String, Vec<(String, String)>), DebugValue>;

fn publish(eps: &[&Endpoint]) -> Seen {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        for ep in eps {
            ep.publish_metrics();
        }
    });
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect();
            labels.sort();
            ((key.name().to_string(), labels), value)
        })
        .collect()
}

fn get<'a>(seen: &'a Seen, name: &str, ep: &Endpoint, extra: &[(&str, &str)]) -> &'a DebugValue {
    let mut labels = vec![("endpoint".to_string(), ep.local_addr().to_string())];
    labels.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    labels.sort();
    seen.get(&(name.to_string(), labels))
        .unwrap_or_else(|| panic!("{name} {extra:?} not published"))
}

fn counter(seen: &Seen, name: &str, ep: &Endpoint, extra: &[(&str, &str)]) -> u64 {
    match get(seen, name, ep, extra) {
        DebugValue::Counter(v) => *v,
        other => panic!("{name} is not a counter: {other:?}"),
    }
}

#[test]
fn publish_metrics_reports_engine_socket_and_runtime_counters() {
    let cfg = Endpoint::builder().poll(Duration::from_micros(20));
    let server = cfg.bind("127.0.0.1:0").unwrap();
    let client = cfg.bind("127.0.0.1:0").unwrap();
    let s = server.clone();
    let worker = std::thread::spawn(move || {
        for _ in 0..3 {
            let req = s.recv_request().unwrap();
            let (m, r) = req.into_parts();
            r.reply(m.into_bytes()).unwrap();
        }
    });
    for i in 0..3u8 {
        let reply = client.call(server.local_addr(), vec![i; 100]).unwrap();
        assert_eq!(reply.to_vec(), vec![i; 100]);
    }
    worker.join().unwrap();

    let seen = publish(&[&server, &client]);
    // Engine counters, per endpoint.
    assert_eq!(counter(&seen, "homa_requests_delivered", &server, &[]), 3);
    assert_eq!(counter(&seen, "homa_responses_delivered", &client, &[]), 3);
    assert_eq!(counter(&seen, "homa_requests_delivered", &client, &[]), 0);
    let data_sent = counter(&seen, "homa_packets_sent", &client, &[("type", "data")]);
    assert!(data_sent >= 3, "{data_sent}");
    assert_eq!(
        data_sent,
        client.metrics().sent(homa_proto::wire::PacketType::Data)
    );
    assert!(counter(&seen, "homa_packets_received", &server, &[("type", "data")]) >= 3);
    assert_eq!(
        counter(
            &seen,
            "homa_packets_dropped",
            &server,
            &[("reason", "malformed")]
        ),
        0
    );
    assert!(counter(&seen, "homa_data_bytes_sent", &client, &[]) >= 300);
    // The socket layer and the runtime.
    assert!(counter(&seen, "homa_socket_packets_sent", &client, &[]) >= 3);
    assert!(counter(&seen, "homa_socket_send_calls", &server, &[]) >= 1);
    let waits = counter(&seen, "homa_runtime_found_polling", &client, &[])
        + counter(&seen, "homa_runtime_slept", &client, &[]);
    assert!(waits >= 1, "the client waited three times");
    // Gauges of the engine's tables.
    match get(&seen, "homa_peers", &client, &[]) {
        DebugValue::Gauge(v) => assert_eq!(v.into_inner(), 1.0),
        other => panic!("homa_peers is not a gauge: {other:?}"),
    }
    assert!(matches!(
        get(&seen, "homa_client_rpcs", &client, &[]),
        DebugValue::Gauge(_)
    ));
    // Every metric is named homa_* and labelled with its endpoint.
    assert!(seen.len() > 60, "{} metrics", seen.len());
    for (name, labels) in seen.keys() {
        assert!(name.starts_with("homa_"), "{name}");
        assert!(labels.iter().any(|(k, _)| k == "endpoint"), "{name}");
    }
    // Published again later: absolute values, not sums.
    let again = publish(&[&server]);
    assert_eq!(counter(&again, "homa_requests_delivered", &server, &[]), 3);
}
