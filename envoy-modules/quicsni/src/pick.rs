//! The gateway load balancer's choice, pure: among a cluster's healthy endpoints, one of those the connection's
//! SNI names. Each endpoint is tagged with the SNIs it serves (one metadata string, comma or space separated): an
//! address may serve several (one pod, two Service ports), and the translator writes one endpoint per address.

use std::collections::HashMap;

/// The cluster's endpoints by address, with the SNIs each serves (rebuilt when the hosts change).
#[derive(Debug, Default)]
pub struct Endpoints {
    by_address: HashMap<String, Vec<String>>,
}

impl Endpoints {
    /// `hosts`: (address as Envoy prints it, its SNIs) pairs; SNIs compare lower-cased.
    pub fn new<A: Into<String>, S: AsRef<str>>(hosts: impl IntoIterator<Item = (A, S)>) -> Self {
        let mut by_address: HashMap<String, Vec<String>> = HashMap::new();
        for (address, snis) in hosts {
            let names = crate::gate::parse_exported(snis.as_ref().as_bytes());
            by_address.entry(address.into()).or_default().extend(names);
        }
        Endpoints { by_address }
    }

    pub fn is_empty(&self) -> bool {
        self.by_address.is_empty()
    }

    /// The index (into `healthy`, Envoy's healthy hosts in order) of the endpoint for `sni`, rotating over the
    /// candidates by `turn`; `None` when no healthy endpoint serves `sni` (never another Service's endpoint).
    pub fn pick<'a>(&self, sni: &str, healthy: impl IntoIterator<Item = &'a str>, turn: usize) -> Option<usize> {
        let candidates: Vec<usize> = healthy
            .into_iter()
            .enumerate()
            .filter(|(_, address)| {
                self.by_address
                    .get(*address)
                    .is_some_and(|snis| snis.iter().any(|s| s == sni))
            })
            .map(|(i, _)| i)
            .collect();
        if candidates.is_empty() {
            None
        } else {
            Some(candidates[turn % candidates.len()])
        }
    }
}
