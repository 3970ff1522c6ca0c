//! The traffic-control side of a switch port: the HTB tree that shapes a
//! link and emulates strict priority queues, and parsing of its counters.
//!
//! Tree (rate G, P priority classes):
//!
//! ```text
//! 1:   htb, unclassified traffic (ARP...) to the lowest class
//! └─ 1:1   rate G ceil G                  (the link)
//!    ├─ 1:10  prio P-1  rate tiny, ceil G (class 0, lowest)
//!    ├─ ...
//!    └─ 1:1(P-1)+  prio 0                 (class P-1, highest)
//! ```
//!
//! Every leaf has a token rate far below G and a one-packet burst, so
//! nearly everything it sends is borrowed from 1:1; HTB lends in order of
//! `prio` (0 first), which makes the classes strict priority queues. The
//! tiny own rate bounds how long a low class can delay a high one to about
//! one packet. u32 filters pick the class from the top three bits of the
//! IPv4 TOS byte, i.e. the class-selector DSCP that the Homa runtime writes
//! for each engine priority level (level L -> CS L -> TOS L<<5).

use crate::{Error, Result};
use serde::Serialize;

/// Minor number of the HTB class of priority class 0 (tc writes it in hex: 1:10).
pub const FIRST_CLASS: u32 = 0x10;

/// Shaping parameters of one port.
#[derive(Clone, Debug, PartialEq)]
pub struct PortShape {
    /// Link rate, bits per second.
    pub rate_bps: u64,
    /// Priority classes (1..=8).
    pub classes: u8,
    /// Packets each class's FIFO holds before it drops (the switch buffer).
    pub queue_packets: u32,
    /// Reserve the lowest class for TCP (IP protocol 6, whatever its DSCP)
    /// and spread the engine's levels over the classes above it: a switch
    /// that serves Homa's priorities before bulk TCP (the coexistence
    /// experiment's `split` set-up). Without it TCP, whose DSCP is 0,
    /// shares class 0 with Homa's lowest level.
    pub tcp_below: bool,
}

/// The priority class (0 = lowest) for engine priority level `level` (0..8)
/// when the port has `classes` classes: the 8 levels are spread evenly.
pub fn class_of_level(level: u8, classes: u8) -> u8 {
    let classes = classes.clamp(1, 8) as u32;
    ((level.min(7) as u32 * classes) / 8) as u8
}

/// The class of engine level `level` on a port shaped as `s`: with
/// [`PortShape::tcp_below`] (and at least two classes) class 0 is TCP's and
/// the levels spread over the others.
pub fn class_of_level_on(level: u8, s: &PortShape) -> u8 {
    if s.tcp_below && s.classes >= 2 {
        1 + class_of_level(level, s.classes - 1)
    } else {
        class_of_level(level, s.classes)
    }
}

/// Burst of the link class: one full frame (plus slack), or 20 µs at the
/// link rate if that is more. A token bucket lets a burst pass at once after
/// an idle period; a larger burst would let a several-packet message cross
/// an idle link faster than its wire time, which no real link does.
fn link_burst_bytes(rate_bps: u64) -> u64 {
    (rate_bps / 8 / 50_000).max(1_600)
}

/// `tc` batch lines that (re)build the tree on `dev`. The first line deletes
/// any existing root qdisc, so run the batch with `-force`.
pub fn shape_commands(dev: &str, s: &PortShape) -> Vec<String> {
    let classes = s.classes.clamp(1, 8) as u32;
    let rate = s.rate_bps.max(8_000);
    let burst = link_burst_bytes(rate);
    // The leaves' own rate: 1/1000 of the link, at least 8 kbit.
    let leaf_rate = (rate / 1000).max(8_000);
    let mut v = vec![
        format!("qdisc del dev {dev} root"),
        format!("qdisc add dev {dev} root handle 1: htb default {FIRST_CLASS:x}"),
        format!(
            "class add dev {dev} parent 1: classid 1:1 htb rate {rate}bit ceil {rate}bit burst {burst} cburst {burst}"
        ),
    ];
    for c in 0..classes {
        let minor = FIRST_CLASS + c;
        let prio = classes - 1 - c;
        v.push(format!(
            "class add dev {dev} parent 1:1 classid 1:{minor:x} htb rate {leaf_rate}bit ceil {rate}bit burst 1600 cburst {burst} prio {prio} quantum 1514"
        ));
        v.push(format!(
            "qdisc add dev {dev} parent 1:{minor:x} handle {}: pfifo limit {}",
            100 + c,
            s.queue_packets.max(1)
        ));
    }
    if s.tcp_below && classes >= 2 {
        // Consulted before the DSCP filters (a lower filter prio is tried
        // first): every TCP segment goes to the lowest class.
        v.push(format!(
            "filter add dev {dev} parent 1: protocol ip prio 1 u32 match ip protocol 6 0xff flowid 1:{FIRST_CLASS:x}"
        ));
    }
    for level in 0..8u8 {
        let minor = FIRST_CLASS + class_of_level_on(level, s) as u32;
        v.push(format!(
            "filter add dev {dev} parent 1: protocol ip prio 2 u32 match ip tos {} 0xe0 flowid 1:{minor:x}",
            (level as u32) << 5
        ));
    }
    v
}

/// Counters of one HTB class.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ClassStats {
    /// Priority class (0 = lowest); `None` for the link class 1:1.
    pub class: Option<u8>,
    pub bytes: u64,
    pub packets: u64,
    pub drops: u64,
}

impl ClassStats {
    /// `self - earlier`, counter by counter (saturating: a rebuilt tree
    /// restarts its counters).
    pub fn delta(&self, earlier: &ClassStats) -> ClassStats {
        ClassStats {
            class: self.class,
            bytes: self.bytes.saturating_sub(earlier.bytes),
            packets: self.packets.saturating_sub(earlier.packets),
            drops: self.drops.saturating_sub(earlier.drops),
        }
    }
}

/// Counters of every class of a port's tree, link class first, then
/// priority classes in ascending order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PortStats {
    pub link: ClassStats,
    pub classes: Vec<ClassStats>,
}

impl PortStats {
    pub fn delta(&self, earlier: &PortStats) -> PortStats {
        PortStats {
            link: self.link.delta(&earlier.link),
            classes: self
                .classes
                .iter()
                .map(|c| {
                    let e = earlier
                        .classes
                        .iter()
                        .find(|e| e.class == c.class)
                        .cloned()
                        .unwrap_or_default();
                    c.delta(&e)
                })
                .collect(),
        }
    }
    /// Drops in every class.
    pub fn drops(&self) -> u64 {
        self.classes.iter().map(|c| c.drops).sum()
    }
}

/// Parses the text of `tc -s class show dev D` for our tree. Unknown
/// classes are ignored; a class line without a following `Sent` line is an
/// error (the format changed under us).
pub fn parse_class_stats(text: &str) -> Result<PortStats> {
    let mut out = PortStats::default();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("class htb 1:") else {
            continue;
        };
        let minor: u32 = rest
            .split_whitespace()
            .next()
            .and_then(|m| u32::from_str_radix(m, 16).ok())
            .ok_or_else(|| Error::Parse(format!("class line {line:?}")))?;
        let sent = loop {
            match lines.next() {
                Some(l) if l.trim().starts_with("Sent ") => break l.trim().to_string(),
                Some(l) if l.trim().starts_with("class ") => {
                    return Err(Error::Parse(format!("no counters for class 1:{minor:x}")))
                }
                Some(_) => continue,
                None => return Err(Error::Parse(format!("no counters for class 1:{minor:x}"))),
            }
        };
        let words: Vec<&str> = sent.split_whitespace().collect();
        let num = |i: usize| -> Result<u64> {
            words
                .get(i)
                .map(|w| w.trim_matches(|c: char| !c.is_ascii_digit()))
                .and_then(|w| w.parse().ok())
                .ok_or_else(|| Error::Parse(format!("counters {sent:?}")))
        };
        // "Sent 1234 bytes 56 pkt (dropped 7, overlimits 8 requeues 0)"
        let mut stats = ClassStats {
            class: None,
            bytes: num(1)?,
            packets: num(3)?,
            drops: num(6)?,
        };
        // tc prints class ids in hex.
        if minor == 1 {
            out.link = stats;
        } else if (FIRST_CLASS..FIRST_CLASS + 8).contains(&minor) {
            stats.class = Some((minor - FIRST_CLASS) as u8);
            out.classes.push(stats);
        }
    }
    out.classes.sort_by_key(|c| c.class);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_spread_over_classes() {
        let all: Vec<u8> = (0..8).map(|l| class_of_level(l, 8)).collect();
        assert_eq!(all, vec![0, 1, 2, 3, 4, 5, 6, 7]);
        let one: Vec<u8> = (0..8).map(|l| class_of_level(l, 1)).collect();
        assert_eq!(one, vec![0; 8]);
        let four: Vec<u8> = (0..8).map(|l| class_of_level(l, 4)).collect();
        assert_eq!(four, vec![0, 0, 1, 1, 2, 2, 3, 3]);
        assert_eq!(class_of_level(200, 8), 7);
    }

    #[test]
    fn commands_build_strict_priority_tree() {
        let cmds = shape_commands(
            "v0",
            &PortShape {
                rate_bps: 1_000_000_000,
                classes: 8,
                queue_packets: 500,
                tcp_below: false,
            },
        );
        assert!(cmds[0].starts_with("qdisc del dev v0 root"));
        // Highest class (1:17) has prio 0, lowest (1:10) prio 7.
        assert!(cmds
            .iter()
            .any(|c| c.contains("classid 1:17 ") && c.contains("prio 0 ")));
        assert!(cmds
            .iter()
            .any(|c| c.contains("classid 1:10 ") && c.contains("prio 7 ")));
        assert!(cmds.iter().any(|c| c.contains("pfifo limit 500")));
        // TOS 0xe0 (engine level 7, CS7) goes to the highest class.
        assert!(cmds
            .iter()
            .any(|c| c.contains("match ip tos 224 0xe0 flowid 1:17")));
        assert_eq!(cmds.iter().filter(|c| c.starts_with("filter")).count(), 8);
        assert!(cmds.iter().any(|c| c.contains("rate 1000000000bit ceil")));
        assert!(!cmds.iter().any(|c| c.contains("ip protocol 6")));
    }

    #[test]
    fn tcp_below_takes_the_lowest_class_and_homa_the_rest() {
        let shape = PortShape {
            rate_bps: 100_000_000,
            classes: 8,
            queue_packets: 32,
            tcp_below: true,
        };
        let cmds = shape_commands("v0", &shape);
        // TCP first, to class 0 (1:10).
        let tcp = cmds
            .iter()
            .position(|c| c.contains("match ip protocol 6 0xff flowid 1:10"))
            .expect("a TCP filter");
        assert!(cmds[tcp].contains(" prio 1 "));
        // Homa level 0 (TOS 0, as TCP's) is class 1, level 7 class 7.
        assert!(cmds
            .iter()
            .any(|c| c.contains("prio 2 u32 match ip tos 0 0xe0 flowid 1:11")));
        assert!(cmds
            .iter()
            .any(|c| c.contains("match ip tos 224 0xe0 flowid 1:17")));
        let levels: Vec<u8> = (0..8).map(|l| class_of_level_on(l, &shape)).collect();
        assert_eq!(levels, vec![1, 1, 2, 3, 4, 5, 6, 7]);
        // One class: nothing to put below, TCP shares it.
        let one = PortShape {
            classes: 1,
            ..shape
        };
        assert!(!shape_commands("v0", &one)
            .iter()
            .any(|c| c.contains("ip protocol 6")));
        assert_eq!(class_of_level_on(7, &one), 0);
    }

    #[test]
    fn parses_tc_output() {
        let text = "class htb 1:11 parent 1:1 leaf 101: prio 6 rate 1Mbit ceil 100Mbit burst 15Kb cburst 15337b \n Sent 10 bytes 2 pkt (dropped 1, overlimits 0 requeues 0) \n backlog 0b 0p requeues 0\n\nclass htb 1:1 root rate 100Mbit ceil 100Mbit burst 15337b cburst 15337b \n Sent 2177997 bytes 151 pkt (dropped 0, overlimits 154236 requeues 0) \n\nclass htb 1:10 parent 1:1 leaf 100: prio 7 \n Sent 217785224 bytes 151170 pkt (dropped 741785, overlimits 77245 requeues 0) \n";
        let s = parse_class_stats(text).unwrap();
        assert_eq!(s.link.bytes, 2177997);
        assert_eq!(s.link.packets, 151);
        assert_eq!(s.classes.len(), 2);
        assert_eq!(s.classes[0].class, Some(0));
        assert_eq!(s.classes[0].drops, 741785);
        assert_eq!(s.classes[1].class, Some(1));
        assert_eq!(s.classes[1].packets, 2);
        assert_eq!(s.drops(), 741786);
        let d = s.delta(&PortStats::default());
        assert_eq!(d, s);
        assert!(parse_class_stats("class htb 1:10 parent\n").is_err());
        assert!(parse_class_stats("class htb 1:10 x\n Sent x bytes\n").is_err());
        assert_eq!(parse_class_stats("").unwrap(), PortStats::default());
    }
}
