//! The filter's decision per client 4-tuple, pure: pass a connection on only once its ClientHello names an
//! exported SNI; drop (and count) everything else, never defaulting. A decision sticks to its 4-tuple (bounded:
//! the oldest decisions are forgotten first).

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::Arc;

use crate::{Progress, Tracker, TrackerLimits};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Drop,
}

/// What one datagram adds to the counters (one per connection decided, one per datagram held back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// A new connection whose SNI is exported: passed on.
    Forwarded,
    /// A ClientHello whose SNI no exported Service has.
    UnknownSni,
    /// A datagram that yields no SNI (`quicsni::Error`): not QUIC v1/v2 Initial, malformed, no server_name.
    Refused,
    /// A datagram of a ClientHello not yet complete: dropped (the client retransmits it after the decision).
    Pending,
}

pub struct Gate<K> {
    exported: HashSet<String>,
    tracker: Tracker<K>,
    /// Per 4-tuple: the decision's sequence number and, for a passed connection, its SNI.
    decided: HashMap<K, (u64, Option<Arc<str>>)>,
    order: VecDeque<(K, u64)>,
    seq: u64,
    max_decided: usize,
}

impl<K: Hash + Eq + Clone> Gate<K> {
    pub fn new(exported: HashSet<String>, limits: TrackerLimits, max_decided: usize) -> Self {
        Gate {
            exported,
            tracker: Tracker::new(limits),
            decided: HashMap::new(),
            order: VecDeque::new(),
            seq: 0,
            max_decided: max_decided.max(1),
        }
    }

    /// The verdict already taken for `key`, if any: the caller need not even copy the datagram.
    pub fn decided(&self, key: &K) -> Option<Verdict> {
        self.decided
            .get(key)
            .map(|(_, sni)| if sni.is_some() { Verdict::Pass } else { Verdict::Drop })
    }

    /// The exported SNI a passed connection named (`None` for a dropped or undecided one): what the gateway's
    /// load balancer picks the Service's endpoint by.
    pub fn sni(&self, key: &K) -> Option<&Arc<str>> {
        self.decided.get(key).and_then(|(_, sni)| sni.as_ref())
    }

    /// One lookup for a decided connection's datagram: `None` undecided, `Some(None)` dropped, `Some(Some(sni))`
    /// passed with its SNI.
    pub fn lookup(&self, key: &K) -> Option<Option<&Arc<str>>> {
        self.decided.get(key).map(|(_, sni)| sni.as_ref())
    }

    pub fn on_datagram(&mut self, key: &K, datagram: &[u8]) -> (Verdict, Option<Count>) {
        if let Some(verdict) = self.decided(key) {
            return (verdict, None);
        }
        match self.tracker.feed(key, datagram) {
            Ok(Progress::NeedMore) => (Verdict::Drop, Some(Count::Pending)),
            Ok(Progress::ServerName(name)) if self.exported.contains(&name) => {
                self.decide(key, Some(Arc::from(name)));
                (Verdict::Pass, Some(Count::Forwarded))
            }
            Ok(Progress::ServerName(_)) => {
                self.decide(key, None);
                (Verdict::Drop, Some(Count::UnknownSni))
            }
            Err(_) => {
                self.decide(key, None);
                (Verdict::Drop, Some(Count::Refused))
            }
        }
    }

    fn decide(&mut self, key: &K, sni: Option<Arc<str>>) {
        while self.decided.len() >= self.max_decided {
            let Some((k, s)) = self.order.pop_front() else { break };
            if self.decided.get(&k).is_some_and(|(seq, _)| *seq == s) {
                self.decided.remove(&k);
            }
        }
        self.seq += 1;
        self.decided.insert(key.clone(), (self.seq, sni));
        self.order.push_back((key.clone(), self.seq));
    }
}

/// The filter's configuration string: the exported SNIs, separated by commas, spaces or newlines.
pub fn parse_exported(config: &[u8]) -> HashSet<String> {
    String::from_utf8_lossy(config)
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(|s| s.to_ascii_lowercase())
        .collect()
}
