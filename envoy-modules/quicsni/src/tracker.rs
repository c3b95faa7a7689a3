//! Many connections' reading state, keyed by the caller's session key (the 4-tuple), bounded: at most
//! `max_connections` at once (the oldest is evicted first) and `crypto_limit` bytes of CRYPTO stream each.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

use crate::{Connection, Error, Progress};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrackerLimits {
    pub max_connections: usize,
    pub crypto_limit: usize,
}

impl Default for TrackerLimits {
    /// 4,096 connections mid-handshake, 16 KiB of ClientHello each: 64 MiB at worst.
    fn default() -> Self {
        TrackerLimits {
            max_connections: 4096,
            crypto_limit: 16 * 1024,
        }
    }
}

pub struct Tracker<K> {
    limits: TrackerLimits,
    conns: HashMap<K, (u64, Connection)>,
    order: VecDeque<(K, u64)>,
    seq: u64,
    evicted: u64,
}

impl<K: Hash + Eq + Clone> Tracker<K> {
    pub fn new(limits: TrackerLimits) -> Self {
        Tracker {
            limits,
            conns: HashMap::new(),
            order: VecDeque::new(),
            seq: 0,
            evicted: 0,
        }
    }

    /// Connections waiting for more of their ClientHello.
    pub fn pending(&self) -> usize {
        self.conns.len()
    }

    /// Connections dropped to keep the bound.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Feeds one datagram of the connection `key`. A result other than `NeedMore` forgets the connection:
    /// the caller keeps the decision (forward to the SNI's cluster, or drop and count) with its session.
    pub fn feed(&mut self, key: &K, datagram: &[u8]) -> Result<Progress, Error> {
        if !self.conns.contains_key(key) {
            self.make_room();
            self.seq += 1;
            self.conns
                .insert(key.clone(), (self.seq, Connection::new(self.limits.crypto_limit)));
            self.order.push_back((key.clone(), self.seq));
        }
        let (_, conn) = self.conns.get_mut(key).expect("inserted above");
        let result = conn.feed(datagram);
        if !matches!(result, Ok(Progress::NeedMore)) {
            self.conns.remove(key);
        }
        if self.order.len() > 2 * self.limits.max_connections.max(1) {
            let conns = &self.conns;
            self.order
                .retain(|(k, s)| conns.get(k).is_some_and(|(seq, _)| seq == s));
        }
        result
    }

    /// Forgets a connection (its session ended).
    pub fn forget(&mut self, key: &K) {
        self.conns.remove(key);
    }

    fn make_room(&mut self) {
        while self.conns.len() >= self.limits.max_connections.max(1) {
            let Some((k, s)) = self.order.pop_front() else { return };
            if self.conns.get(&k).is_some_and(|(seq, _)| *seq == s) {
                self.conns.remove(&k);
                self.evicted += 1;
            }
        }
    }
}
