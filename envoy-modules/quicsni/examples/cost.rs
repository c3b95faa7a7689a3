//! The reader's CPU cost per client Initial, on the captured aioquic datagrams (testdata/):
//! `cargo run --release --example cost [ITERATIONS]`. Prints nanoseconds per Initial datagram opened.

use std::time::Instant;

use quicsni::{Connection, Progress};

fn datagrams(name: &str) -> Vec<Vec<u8>> {
    let path = format!("{}/testdata/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(path).expect("testdata");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            (0..l.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&l[i..i + 2], 16).unwrap())
                .collect()
        })
        .collect()
}

fn per_initial(name: &str, iterations: u32) -> f64 {
    let flight = datagrams(name);
    let start = Instant::now();
    for _ in 0..iterations {
        let mut conn = Connection::new(16 * 1024);
        let mut last = Ok(Progress::NeedMore);
        for d in &flight {
            last = conn.feed(std::hint::black_box(d));
        }
        assert!(matches!(last, Ok(Progress::ServerName(_))), "{name}: {last:?}");
    }
    start.elapsed().as_nanos() as f64 / f64::from(iterations) / flight.len() as f64
}

fn main() {
    let iterations: u32 = std::env::args().nth(1).map_or(20_000, |a| a.parse().expect("a count"));
    for name in ["aioquic-short.hex", "aioquic-long.hex", "aioquic-v2.hex"] {
        println!(
            "{name}: {:.0} ns per Initial datagram ({iterations} flights)",
            per_initial(name, iterations)
        );
    }
}
