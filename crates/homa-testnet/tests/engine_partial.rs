//! Incremental delivery (`Config::partial_delivery_bytes`,
//! `Endpoint::deliver_response_partially`) on the deterministic test
//! network: long messages are readable in order while they arrive, their
//! bytes are exactly the sender's (also under loss, duplication,
//! reordering and corruption), and a message that stops fails its reader
//! with the prefix that arrived.

use homa_proto::{Config, PartialState, RpcId, SendError};
use homa_testnet::{pattern, EngineNet, Fabric, FaultConfig, Record, Reply, TestApp};

const MS: u64 = 1_000_000;

fn net(n: usize, seed: u64, reply: Reply, partial_requests: u32) -> EngineNet<TestApp> {
    let fabric = Fabric::star(n, 25_000_000_000, 1_000, 250).with_seed(seed);
    let cfg = Config::default()
        .with_resend_interval_ns(MS / 2)
        .with_rpc_timeout_ns(20 * MS)
        .with_partial_delivery_bytes(partial_requests);
    EngineNet::uniform(fabric, cfg, |_| TestApp::new(reply)).unwrap()
}

/// Host `c` sends `req` to host 0 and asks for its response incrementally.
fn call_partial(net: &mut EngineNet<TestApp>, c: usize, req: bytes::Bytes) -> RpcId {
    net.with_host(c, |_, ctx| {
        let id = ctx.send_request(0, req)?;
        ctx.endpoint()
            .unwrap()
            .deliver_response_partially(id)
            .map(|_| id)
    })
    .unwrap()
}

#[test]
fn a_long_request_is_read_while_it_arrives() {
    let mut net = net(2, 1, Reply::Echo, 100_000);
    let req = pattern(1_000_000, 3);
    let small = pattern(50_000, 4);
    let id = net.send_request(1, 0, req.clone()).unwrap();
    let short = net.send_request(1, 0, small.clone()).unwrap();
    assert!(net.run_until_cond(100 * MS, |n| {
        [id, short]
            .iter()
            .all(|&i| n.app(1).finished_at(i).is_some())
    }));
    // Both answered with the right bytes; the short one below the
    // threshold was delivered whole (no partial message for it).
    assert_eq!(net.app(1).response(id), Some(&req[..]));
    assert_eq!(net.app(1).response(short), Some(&small[..]));
    let server = net.app(0);
    assert_eq!(server.partials_done.len(), 1, "{:?}", server.partials_done);
    // 1 MB at 25 Gbit/s: hundreds of packets, read in many steps before the end.
    let (_, early) = server.partials_done[0];
    assert!(early > 50, "only {early} reads before the end");
    assert!(server.reading.is_empty());
    assert!(net.endpoint(0).stats().pool_empty);
}

#[test]
fn a_response_is_read_while_it_arrives() {
    let mut net = net(2, 2, Reply::Fixed(600_000), u32::MAX);
    let id = call_partial(&mut net, 1, pattern(100, 1));
    assert!(net.run_until_cond(100 * MS, |n| n.app(1).finished_at(id).is_some()));
    assert_eq!(
        net.app(1).response(id),
        Some(&pattern(600_000, id_seed(&net))[..])
    );
    let (_, early) = net.app(1).partials_done[0];
    assert!(early > 20, "only {early} reads before the end");
    assert_eq!(net.endpoint(1).stats().client_rpcs, 0);
    assert!(net.endpoint(1).stats().pool_empty);
}

/// `Reply::Fixed` answers with `pattern(n, rpc.id)`: the server's RPC id.
fn id_seed(net: &EngineNet<TestApp>) -> u64 {
    net.app(0).requests().next().unwrap().0.id
}

#[test]
fn a_one_packet_response_asked_for_partially_comes_complete() {
    let mut net = net(2, 3, Reply::Fixed(500), u32::MAX);
    let id = call_partial(&mut net, 1, pattern(100, 1));
    assert!(net.run_until_cond(10 * MS, |n| n.app(1).finished_at(id).is_some()));
    assert_eq!(net.app(1).response(id).map(<[u8]>::len), Some(500));
    assert_eq!(net.app(1).partials_done.len(), 1);
    assert_eq!(net.app(1).partials_done[0].1, 0);
}

#[test]
fn partial_messages_survive_loss_duplication_reordering_and_corruption() {
    for seed in 1..=3 {
        let mut net = net(4, seed, Reply::Echo, 20_000);
        net.fabric_mut().set_faults(FaultConfig {
            loss: 0.03,
            duplicate: 0.03,
            reorder: 0.05,
            reorder_max_ns: 20_000,
            corrupt: 0.02,
        });
        let mut ids = Vec::new();
        for c in 1..4 {
            for (k, len) in [30_000usize, 100, 250_000, 64_000, 700_000]
                .into_iter()
                .enumerate()
            {
                let req = pattern(len, seed * 1000 + (c * 10 + k) as u64);
                let id = if k % 2 == 0 {
                    call_partial(&mut net, c, req.clone())
                } else {
                    net.send_request(c, 0, req.clone()).unwrap()
                };
                ids.push((c, id, req));
            }
        }
        assert!(net.run_until_cond(3_000 * MS, |n| {
            ids.iter()
                .all(|(c, id, _)| n.app(*c).finished_at(*id).is_some())
        }));
        for (c, id, req) in &ids {
            assert_eq!(
                net.app(*c).response(*id),
                Some(&req[..]),
                "seed {seed} client {c} {id:?}"
            );
        }
        let fs = *net.fabric().fault_stats();
        assert!(fs.lost > 0 && fs.duplicated > 0 && fs.reordered > 0 && fs.corrupted > 0);
        // Every request at or above 20 KB went to the server incrementally,
        // and was executed once.
        assert_eq!(net.app(0).partials_done.len(), 3 * 4);
        assert_eq!(net.app(0).requests().count(), ids.len());
        for h in 0..4 {
            assert!(net.app(h).reading.is_empty());
            assert!(net.endpoint(h).stats().pool_empty, "host {h}");
        }
    }
}

#[test]
fn a_response_that_stops_fails_its_reader_with_the_prefix() {
    // The server crashes while its 2 MB response is on the way: the client
    // has read part of it; the RPC then times out and the partial message
    // fails, keeping what arrived.
    let fabric = Fabric::star(2, 25_000_000_000, 1_000, 250).with_seed(5);
    let cfg = Config::default()
        .with_max_message_length(4_000_000)
        .with_resend_interval_ns(MS / 2)
        .with_rpc_timeout_ns(20 * MS);
    let mut net =
        EngineNet::uniform(fabric, cfg, |_| TestApp::new(Reply::Fixed(2_000_000))).unwrap();
    let id = call_partial(&mut net, 1, pattern(100, 1));
    assert!(net.run_until_cond(10 * MS, |n| n
        .app(1)
        .reading
        .first()
        .is_some_and(|r| r.data.len() > 100_000)));
    net.crash(0, None);
    assert!(net.run_until_cond(200 * MS, |n| n.app(1).finished_at(id).is_some()));
    let app = net.app(1);
    let got = app
        .log
        .iter()
        .find_map(|(_, r)| match r {
            Record::PartialFailed { received, .. } => Some(*received),
            _ => None,
        })
        .expect("the partial message failed");
    assert!((100_000..2_000_000).contains(&got), "{got}");
    assert!(app.failure(id).is_some());
    assert!(net.endpoint(1).stats().pool_empty);
}

#[test]
fn a_cancelled_rpc_fails_its_partial_response_and_frees_everything() {
    let mut net = net(2, 6, Reply::Fixed(900_000), u32::MAX);
    let id = call_partial(&mut net, 1, pattern(100, 1));
    assert!(net.run_until_cond(10 * MS, |n| n
        .app(1)
        .reading
        .first()
        .is_some_and(|r| r.message.readable() > 50_000)));
    let readable = net.app(1).reading[0].message.readable();
    net.with_host(1, |_, ctx| ctx.cancel(id));
    net.run_for(MS);
    let app = net.app(1);
    assert!(app.reading.is_empty());
    assert!(app.log.iter().any(
        |(_, r)| matches!(r, Record::PartialFailed { received, .. } if *received >= readable)
    ));
    assert_eq!(net.endpoint(1).stats().client_rpcs, 0);
    assert!(net.endpoint(1).stats().pool_empty);
}

#[test]
fn a_server_may_abandon_a_request_it_is_still_reading() {
    // Manual replies: the server holds nothing; abandoning the partial
    // request frees its RPC and pool space at once.
    let mut net = net(2, 7, Reply::Manual, 100_000);
    let id = net.send_request(1, 0, pattern(800_000, 9)).unwrap();
    assert!(net.run_until_cond(10 * MS, |n| n
        .app(0)
        .reading
        .first()
        .is_some_and(|r| r.message.readable() > 50_000)));
    let rpc = net.app(0).reading[0].rpc.unwrap();
    assert_eq!(
        net.app(0).reading[0].message.state(),
        PartialState::Receiving
    );
    // Too early to answer.
    assert_eq!(
        net.send_response(0, rpc, pattern(10, 1)),
        Err(SendError::RequestIncomplete)
    );
    net.with_host(0, |_, ctx| ctx.endpoint().unwrap().abandon(rpc));
    net.run_for(MS);
    assert!(net.app(0).reading.is_empty());
    assert!(
        net.app(0).log.iter().any(
            |(_, r)| matches!(r, Record::PartialFailed { received, .. } if *received > 50_000)
        ),
        "the reader saw the failure"
    );
    // The client's request is not executed: it fails after the timeout.
    assert!(net.run_until_cond(200 * MS, |n| n.app(1).finished_at(id).is_some()));
    assert!(net.app(1).failure(id).is_some());
    assert!(net.endpoint(0).stats().pool_empty);
}
