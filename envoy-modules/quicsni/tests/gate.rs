//! The gateway filter's decision per 4-tuple (`quicsni::gate`) on real aioquic Initials.

use quicsni::gate::{parse_exported, Count, Gate, Verdict};
use quicsni::TrackerLimits;

fn flight(name: &str) -> (String, Vec<Vec<u8>>) {
    let path = format!("{}/testdata/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let sni = lines.next().unwrap().rsplit(" sni ").next().unwrap().to_string();
    let datagrams = lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            (0..l.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&l[i..i + 2], 16).unwrap())
                .collect()
        })
        .collect();
    (sni, datagrams)
}

fn gate(exported: &str) -> Gate<u32> {
    Gate::new(parse_exported(exported.as_bytes()), TrackerLimits::default(), 4)
}

#[test]
fn an_exported_name_passes_and_its_later_datagrams_pass_without_reading() {
    let (sni, long) = flight("aioquic-long.hex");
    let mut g = gate(&format!("a.example, {}\nb.example", sni.to_uppercase()));
    assert_eq!(g.on_datagram(&1, &long[0]), (Verdict::Drop, Some(Count::Pending)));
    assert_eq!(g.on_datagram(&1, &long[1]), (Verdict::Drop, Some(Count::Pending)));
    assert_eq!(g.on_datagram(&1, &long[2]), (Verdict::Pass, Some(Count::Forwarded)));
    // Retransmissions of the first two, and a short-header packet, now pass as the same connection.
    assert_eq!(g.on_datagram(&1, &long[0]), (Verdict::Pass, None));
    assert_eq!(g.on_datagram(&1, &[0x40, 1, 2, 3]), (Verdict::Pass, None));
    // The connection's SNI is kept for the load balancer (lower-cased, as exported); no other key has one.
    assert_eq!(g.sni(&1).map(|s| &**s), Some(sni.as_str()));
    assert_eq!(g.sni(&2), None);
    assert_eq!(g.lookup(&1).map(|s| s.map(|s| s.to_string())), Some(Some(sni.clone())));
    assert_eq!(g.lookup(&2), None);
}

#[test]
fn an_unknown_name_and_a_refusal_drop_and_stay_dropped() {
    let (_, short) = flight("aioquic-short.hex");
    let (_, nosni) = flight("aioquic-nosni.hex");
    let mut g = gate("other.example");
    assert_eq!(g.on_datagram(&1, &short[0]), (Verdict::Drop, Some(Count::UnknownSni)));
    assert_eq!(g.on_datagram(&1, &short[0]), (Verdict::Drop, None));
    assert_eq!(g.lookup(&1), Some(None)); // decided, dropped: no SNI for the load balancer
    assert_eq!(g.on_datagram(&2, &nosni[0]), (Verdict::Drop, Some(Count::Refused)));
    assert_eq!(
        g.on_datagram(&3, &[0x40, 1, 2, 3]),
        (Verdict::Drop, Some(Count::Refused))
    );
}

#[test]
fn decisions_are_bounded_oldest_first() {
    let (sni, short) = flight("aioquic-short.hex");
    let mut g = gate(&sni);
    for k in 0..5u32 {
        assert_eq!(g.on_datagram(&k, &short[0]), (Verdict::Pass, Some(Count::Forwarded)));
    }
    // Four kept: 0 was forgotten, so its next datagram is read again.
    assert_eq!(g.on_datagram(&4, &short[0]), (Verdict::Pass, None));
    assert_eq!(g.on_datagram(&0, &short[0]), (Verdict::Pass, Some(Count::Forwarded)));
}
