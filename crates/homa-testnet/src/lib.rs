//! # homa-testnet
//!
//! A deterministic, discrete-event, in-memory network. It serves two purposes:
//! deterministic protocol tests of `homa_proto::Endpoint` (with seeded faults),
//! and the network model of the packet-level simulator.
//!
//! * [`Fabric`] (module [`net`]) is the network: hosts, switches, unidirectional
//!   links whose sending side is an output port with 8 strict-priority FIFO
//!   queues, store-and-forward serialization at the link rate, propagation
//!   latency, switch forwarding latency, per-destination routes with
//!   equal-cost candidates (packet spraying), buffer limits, statistics, and
//!   the event loop. It is generic: whatever is attached to it implements
//!   [`Hosts`].
//! * [`EngineNet`] (module [`driver`]) attaches one `Endpoint` and one [`App`]
//!   per host.
//! * [`clock`]: every host's engine reads its own clock ([`HostClock`]: an
//!   offset and a rate error against the network's time), so that
//!   unsynchronised hosts can be simulated.
//! * [`faults`] holds the seeded fault model (loss, duplication, reordering,
//!   corruption, partitions; crashes are in the driver).
//!
//! Same seed, same inputs: bit-identical runs. Time is virtual (u64 ns).
//!
//! ```
//! use homa_testnet::{EngineNet, Fabric, TestApp, Reply};
//! use homa_proto::Config;
//!
//! // Four hosts on one 25 Gbps switch, 1 µs links, 250 ns switching.
//! let fabric = Fabric::star(4, 25_000_000_000, 1_000, 250).with_seed(42);
//! let mut net = EngineNet::uniform(fabric, Config::default(), |_| TestApp::new(Reply::Echo)).unwrap();
//! let id = net.send_request(0, 3, bytes::Bytes::from_static(b"hello")).unwrap();
//! assert!(net.run_until_cond(1_000_000_000, |n| n.app(0).finished_at(id).is_some()));
//! assert_eq!(net.app(0).response(id), Some(&b"hello"[..]));
//! ```

#![forbid(unsafe_code)]

pub mod apps;
pub mod clock;
pub mod driver;
pub mod faults;
pub mod net;
mod sched;
pub mod timeline;

pub use apps::{pattern, Record, Reply, TestApp};
pub use clock::HostClock;
pub use driver::{App, DriverStats, EngineNet, HostCtx};
pub use faults::{Cut, FaultConfig, FaultStats, Partition};
pub use net::{
    addr_host, host_addr, Ecmp, Fabric, HostId, Hosts, LinkId, LinkInfo, LinkStats, NetStats, Node,
    Packet, QueueReport, SwitchId, TwoLevel, PRIORITIES,
};
pub use sched::Time;
