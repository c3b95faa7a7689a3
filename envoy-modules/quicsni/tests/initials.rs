//! The reader against RFC 9001's own sample (Appendix A.2) and against real aioquic clients' Initials
//! (testdata/aioquic-*.hex, written by `python -m aether.testing.quic_initials`).

use quicsni::{server_name_of_datagram, Connection, Error, Progress, Tracker, TrackerLimits};

const LIMIT: usize = 16 * 1024;

fn unhex(s: &str) -> Vec<u8> {
    let s = s.trim();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn testdata(name: &str) -> (String, Vec<Vec<u8>>) {
    let path = format!("{}/testdata/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    let sni = header.rsplit(" sni ").next().unwrap().to_string();
    (sni, lines.filter(|l| !l.is_empty()).map(unhex).collect())
}

fn rfc_a2() -> Vec<u8> {
    let path = format!("{}/testdata/rfc9001-a2-client-initial.hex", env!("CARGO_MANIFEST_DIR"));
    unhex(&std::fs::read_to_string(path).unwrap())
}

fn named(name: &str) -> Result<Progress, Error> {
    Ok(Progress::ServerName(name.to_string()))
}

#[test]
fn rfc9001_appendix_a2_client_initial_decrypts_to_example_com() {
    assert_eq!(server_name_of_datagram(&rfc_a2(), LIMIT), named("example.com"));
}

#[test]
fn every_single_byte_change_to_the_rfc_sample_is_refused() {
    let good = rfc_a2();
    for i in 0..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0x5a;
        let got = server_name_of_datagram(&bad, LIMIT);
        assert!(got.is_err(), "byte {i} changed, got {got:?}");
    }
}

#[test]
fn every_truncation_of_the_rfc_sample_is_refused_without_panic() {
    let good = rfc_a2();
    for n in 0..good.len() {
        assert!(server_name_of_datagram(&good[..n], LIMIT).is_err(), "{n} bytes");
    }
}

#[test]
fn aioquic_short_client_hello_in_one_initial() {
    let (sni, datagrams) = testdata("aioquic-short.hex");
    assert_eq!(datagrams.len(), 1);
    assert_eq!(server_name_of_datagram(&datagrams[0], LIMIT), named(&sni));
}

#[test]
fn aioquic_quic_v2_client_hello() {
    let (sni, datagrams) = testdata("aioquic-v2.hex");
    assert_eq!(datagrams[0][1..5], [0x6b, 0x33, 0x43, 0xcf]);
    assert_eq!(server_name_of_datagram(&datagrams[0], LIMIT), named(&sni));
}

#[test]
fn aioquic_without_server_name_is_refused() {
    let (_, datagrams) = testdata("aioquic-nosni.hex");
    assert_eq!(server_name_of_datagram(&datagrams[0], LIMIT), Err(Error::NoServerName));
}

#[test]
fn aioquic_long_client_hello_spans_three_initials() {
    let (sni, datagrams) = testdata("aioquic-long.hex");
    assert_eq!(datagrams.len(), 3);
    assert_eq!(server_name_of_datagram(&datagrams[0], LIMIT), Ok(Progress::NeedMore));
    let mut conn = Connection::new(LIMIT);
    assert_eq!(conn.feed(&datagrams[0]), Ok(Progress::NeedMore));
    assert_eq!(conn.feed(&datagrams[1]), Ok(Progress::NeedMore));
    assert_eq!(conn.feed(&datagrams[2]), named(&sni));
}

#[test]
fn aioquic_long_client_hello_in_reverse_order() {
    let (sni, datagrams) = testdata("aioquic-long.hex");
    let mut conn = Connection::new(LIMIT);
    assert_eq!(conn.feed(&datagrams[2]), Ok(Progress::NeedMore));
    assert_eq!(conn.feed(&datagrams[1]), Ok(Progress::NeedMore));
    assert_eq!(conn.feed(&datagrams[0]), named(&sni));
}

#[test]
fn a_crypto_bound_below_the_client_hello_refuses_it() {
    let (_, datagrams) = testdata("aioquic-long.hex");
    let mut conn = Connection::new(2048);
    let results: Vec<_> = datagrams.iter().map(|d| conn.feed(d)).collect();
    assert!(results.contains(&Err(Error::CryptoTooLarge(2048))), "{results:?}");
}

#[test]
fn after_a_retry_the_new_dcid_keys_take_over() {
    // Datagrams 0-2: the first flight (DCID 1); 3-5: after the Retry (the server's DCID, new Initial keys).
    let (sni, datagrams) = testdata("aioquic-retry.hex");
    assert_eq!(datagrams.len(), 6);
    assert_ne!(datagrams[0][6..14], datagrams[3][6..14], "the DCID changed");
    let mut conn = Connection::new(LIMIT);
    assert_eq!(conn.feed(&datagrams[0]), Ok(Progress::NeedMore));
    assert_eq!(conn.feed(&datagrams[3]), Ok(Progress::NeedMore));
    assert_eq!(conn.feed(&datagrams[4]), Ok(Progress::NeedMore));
    assert_eq!(conn.feed(&datagrams[5]), named(&sni));
}

#[test]
fn packets_that_are_not_client_initials() {
    let (_, datagrams) = testdata("aioquic-short.hex");
    let d = &datagrams[0];
    let mut short = d.clone();
    short[0] = 0x40;
    assert_eq!(server_name_of_datagram(&short, LIMIT), Err(Error::ShortHeader));
    let mut vn = d.clone();
    vn[1..5].copy_from_slice(&[0, 0, 0, 0]);
    assert_eq!(server_name_of_datagram(&vn, LIMIT), Err(Error::VersionNegotiation));
    let mut other = d.clone();
    other[1..5].copy_from_slice(&[0xff, 0, 0, 0x1d]);
    assert_eq!(
        server_name_of_datagram(&other, LIMIT),
        Err(Error::UnsupportedVersion(0xff00_001d))
    );
    assert_eq!(
        server_name_of_datagram(&d[..1199], LIMIT),
        Err(Error::DatagramTooSmall(1199))
    );
}

#[test]
fn the_tracker_keys_by_four_tuple_and_stays_bounded() {
    let (sni, long) = testdata("aioquic-long.hex");
    let (_, retry) = testdata("aioquic-retry.hex");
    let mut t: Tracker<u32> = Tracker::new(TrackerLimits {
        max_connections: 2,
        crypto_limit: LIMIT,
    });
    // Two connections interleaved.
    assert_eq!(t.feed(&1, &long[0]), Ok(Progress::NeedMore));
    assert_eq!(t.feed(&2, &retry[0]), Ok(Progress::NeedMore));
    assert_eq!(t.feed(&1, &long[1]), Ok(Progress::NeedMore));
    assert_eq!(t.feed(&1, &long[2]), named(&sni));
    assert_eq!(t.pending(), 1, "a decided connection is forgotten");
    // A third and fourth evict the oldest pending one (2), which then starts again from nothing.
    assert_eq!(t.feed(&3, &long[0]), Ok(Progress::NeedMore));
    assert_eq!(t.feed(&4, &long[0]), Ok(Progress::NeedMore));
    assert_eq!(t.pending(), 2);
    assert_eq!(t.evicted(), 1);
    assert_eq!(t.feed(&2, &retry[1]), Ok(Progress::NeedMore));
    for i in 0..10_000u32 {
        let _ = t.feed(&(100 + i), &long[0]);
    }
    assert_eq!(t.pending(), 2);
}
