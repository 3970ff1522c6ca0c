//! Helpers shared by the engine tests on the test network.

use homa_proto::RpcId;
use homa_testnet::{pattern, EngineNet, HostId, TestApp};

/// One millisecond of virtual time.
pub const MS: u64 = 1_000_000;

/// Host `c` sends `len` bytes to `s` and waits (at most 50 ms) for the answer.
pub fn rpc(net: &mut EngineNet<TestApp>, c: HostId, s: HostId, len: usize) -> RpcId {
    let id = net.send_request(c, s, pattern(len, 1)).unwrap();
    let limit = net.now() + 50 * MS;
    assert!(
        net.run_until_cond(limit, |n| n.app(c).finished_at(id).is_some()),
        "rpc {id:?} did not finish"
    );
    id
}
