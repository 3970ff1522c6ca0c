//! The endpoint's counters published through the `metrics` crate facade
//! (`metrics` feature), for applications that export their metrics that way
//! (Prometheus, StatsD... through whichever recorder they install).

use crate::{Endpoint, RuntimeStats, SocketStats};
use homa_proto::wire::PacketType;
use homa_proto::{DropReason, EndpointStats, Metrics};
use metrics::{counter, gauge, Label};

impl Endpoint {
    /// Publishes this endpoint's counters to the installed `metrics`
    /// recorder, as they are now: call it when metrics are scraped or from
    /// a periodic task (it takes the engine lock a few times, like
    /// [`Self::metrics`]; it is not meant for every RPC). Without a
    /// recorder it does nothing.
    ///
    /// Every metric carries the label `endpoint` = the bound address
    /// (`"127.0.0.1:4000"`), so several endpoints of one process stay
    /// apart. Counters are set to their absolute values (`Counter::absolute`).
    ///
    /// | metric | kind | from |
    /// |---|---|---|
    /// | `homa_packets_sent`, `homa_packets_received` (label `type`: `data`, `grant`, `resend`, `rpc_unknown`, `busy`, `need_ack`, `ack`, `cutoffs`) | counter | [`Metrics`](crate::Metrics) |
    /// | `homa_packets_dropped` (label `reason`: [`DropReason::name`]) | counter | `Metrics::drops` |
    /// | `homa_bytes_sent`, `homa_bytes_received`, `homa_data_bytes_sent`, `homa_data_bytes_received`, `homa_retransmitted_packets`, `homa_retransmitted_bytes`, `homa_resend_in_flight`, `homa_resends_sent`, `homa_restarts`, `homa_grants_sent`, `homa_granted_bytes`, `homa_timeouts`, `homa_requests_delivered`, `homa_responses_delivered`, `homa_rpcs_failed`, `homa_pool_waits`, `homa_pool_timeouts`, `homa_acks_processed`, `homa_control_dropped`, `homa_rtt_samples`, `homa_congestion_onsets`, `homa_unsched_window_cuts`, `homa_rtt_samples_congested`, `homa_rtt_samples_above_mid`, `homa_onramp_holds`, `homa_onramp_held_ns`, `homa_onramp_parked`, `homa_onramp_grant_holds`, `homa_onramp_grants_held_ns`, `homa_streams_opened`, `homa_streams_failed`, `homa_stream_bytes_sent`, `homa_stream_bytes_received` | counter | the `Metrics` field of the same name |
    /// | `homa_client_rpcs`, `homa_server_rpcs`, `homa_peers`, `homa_tombstones`, `homa_pool_bpages_in_use`, `homa_granted_messages`, `homa_incoming_bytes`, `homa_pool_waiters`, `homa_sendable_messages`, `homa_streams`, `homa_stream_bytes_held` | gauge | [`EndpointStats`](crate::EndpointStats) |
    /// | `homa_socket_<field>` for each field of [`SocketStats`](crate::SocketStats) (`homa_socket_send_calls`, `homa_socket_packets_sent`...) | counter | `SocketStats` |
    /// | `homa_runtime_<field>` for each field of [`RuntimeStats`](crate::RuntimeStats) (`homa_runtime_found_polling`, `homa_runtime_slept`...) | counter | `RuntimeStats` |
    pub fn publish_metrics(&self) {
        // Destructured without `..`: a counter added to any of these
        // structs fails to compile here until it is published (and named
        // in the table above).
        let m = self.metrics();
        let Metrics {
            packets_sent: _,
            packets_received: _,
            drops: _,
            bytes_sent,
            bytes_received,
            data_bytes_sent,
            data_bytes_received,
            retransmitted_packets,
            retransmitted_bytes,
            resend_in_flight,
            resends_sent,
            restarts,
            grants_sent,
            granted_bytes,
            timeouts,
            requests_delivered,
            responses_delivered,
            rpcs_failed,
            pool_waits,
            pool_timeouts,
            acks_processed,
            control_dropped,
            rtt_samples,
            congestion_onsets,
            unsched_window_cuts,
            rtt_samples_congested,
            rtt_samples_above_mid,
            onramp_holds,
            onramp_held_ns,
            onramp_parked,
            onramp_grant_holds,
            onramp_grants_held_ns,
            streams_opened,
            streams_failed,
            stream_bytes_sent,
            stream_bytes_received,
        } = m;
        let EndpointStats {
            client_rpcs,
            server_rpcs,
            peers,
            tombstones,
            pool_bpages_in_use,
            pool_empty: _, // pool_bpages_in_use says as much
            granted_messages,
            incoming_bytes,
            pool_waiters,
            sendable_messages,
            streams,
            stream_bytes_held,
        } = self.engine_stats();
        let SocketStats {
            recv_batches,
            recv_empty,
            packets_received,
            gro_datagrams,
            gro_switches,
            landed,
            landing_switches,
            landing_failed,
            bytes_received: socket_bytes_received,
            truncated,
            bad_source,
            send_calls,
            packets_sent,
            gso_sends,
            lone_sends,
            bytes_sent: socket_bytes_sent,
            send_would_block,
            send_errors,
            send_too_big,
            icmp_errors,
            injected_rx_drops,
            injected_tx_drops,
        } = self.socket_stats();
        let RuntimeStats {
            found_polling,
            slept,
            doorbell_rings,
            background_drives,
            poll_yields,
            poll_shared_cpu,
        } = self.runtime_stats();

        let ep = self.local_addr().to_string();
        let labels = |extra: Option<(&'static str, &'static str)>| {
            let mut v = vec![Label::new("endpoint", ep.clone())];
            if let Some((k, val)) = extra {
                v.push(Label::new(k, val));
            }
            v
        };
        for t in PacketType::ALL {
            let l = Some(("type", t.name()));
            counter!("homa_packets_sent", labels(l)).absolute(m.sent(t));
            counter!("homa_packets_received", labels(l)).absolute(m.received(t));
        }
        for reason in DropReason::ALL {
            counter!(
                "homa_packets_dropped",
                labels(Some(("reason", reason.name())))
            )
            .absolute(m.drops(reason));
        }
        for (name, value) in [
            ("homa_bytes_sent", bytes_sent),
            ("homa_bytes_received", bytes_received),
            ("homa_data_bytes_sent", data_bytes_sent),
            ("homa_data_bytes_received", data_bytes_received),
            ("homa_retransmitted_packets", retransmitted_packets),
            ("homa_retransmitted_bytes", retransmitted_bytes),
            ("homa_resend_in_flight", resend_in_flight),
            ("homa_resends_sent", resends_sent),
            ("homa_restarts", restarts),
            ("homa_grants_sent", grants_sent),
            ("homa_granted_bytes", granted_bytes),
            ("homa_timeouts", timeouts),
            ("homa_requests_delivered", requests_delivered),
            ("homa_responses_delivered", responses_delivered),
            ("homa_rpcs_failed", rpcs_failed),
            ("homa_pool_waits", pool_waits),
            ("homa_pool_timeouts", pool_timeouts),
            ("homa_acks_processed", acks_processed),
            ("homa_control_dropped", control_dropped),
            ("homa_rtt_samples", rtt_samples),
            ("homa_congestion_onsets", congestion_onsets),
            ("homa_unsched_window_cuts", unsched_window_cuts),
            ("homa_rtt_samples_congested", rtt_samples_congested),
            ("homa_rtt_samples_above_mid", rtt_samples_above_mid),
            ("homa_onramp_holds", onramp_holds),
            ("homa_onramp_held_ns", onramp_held_ns),
            ("homa_onramp_parked", onramp_parked),
            ("homa_onramp_grant_holds", onramp_grant_holds),
            ("homa_onramp_grants_held_ns", onramp_grants_held_ns),
            ("homa_streams_opened", streams_opened),
            ("homa_streams_failed", streams_failed),
            ("homa_stream_bytes_sent", stream_bytes_sent),
            ("homa_stream_bytes_received", stream_bytes_received),
            ("homa_socket_recv_batches", recv_batches),
            ("homa_socket_recv_empty", recv_empty),
            ("homa_socket_packets_received", packets_received),
            ("homa_socket_gro_datagrams", gro_datagrams),
            ("homa_socket_gro_switches", gro_switches),
            ("homa_socket_landed", landed),
            ("homa_socket_landing_switches", landing_switches),
            ("homa_socket_landing_failed", landing_failed),
            ("homa_socket_bytes_received", socket_bytes_received),
            ("homa_socket_truncated", truncated),
            ("homa_socket_bad_source", bad_source),
            ("homa_socket_send_calls", send_calls),
            ("homa_socket_packets_sent", packets_sent),
            ("homa_socket_gso_sends", gso_sends),
            ("homa_socket_lone_sends", lone_sends),
            ("homa_socket_bytes_sent", socket_bytes_sent),
            ("homa_socket_send_would_block", send_would_block),
            ("homa_socket_send_errors", send_errors),
            ("homa_socket_send_too_big", send_too_big),
            ("homa_socket_icmp_errors", icmp_errors),
            ("homa_socket_injected_rx_drops", injected_rx_drops),
            ("homa_socket_injected_tx_drops", injected_tx_drops),
            ("homa_runtime_found_polling", found_polling),
            ("homa_runtime_slept", slept),
            ("homa_runtime_doorbell_rings", doorbell_rings),
            ("homa_runtime_background_drives", background_drives),
            ("homa_runtime_poll_yields", poll_yields),
            ("homa_runtime_poll_shared_cpu", poll_shared_cpu),
        ] {
            counter!(name, labels(None)).absolute(value);
        }
        for (name, value) in [
            ("homa_client_rpcs", client_rpcs as f64),
            ("homa_server_rpcs", server_rpcs as f64),
            ("homa_peers", peers as f64),
            ("homa_tombstones", tombstones as f64),
            ("homa_pool_bpages_in_use", pool_bpages_in_use as f64),
            ("homa_granted_messages", granted_messages as f64),
            ("homa_incoming_bytes", incoming_bytes as f64),
            ("homa_pool_waiters", pool_waiters as f64),
            ("homa_sendable_messages", sendable_messages as f64),
            ("homa_streams", streams as f64),
            ("homa_stream_bytes_held", stream_bytes_held as f64),
        ] {
            gauge!(name, labels(None)).set(value);
        }
    }
}
