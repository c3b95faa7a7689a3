//! `aether_quic_sni`: an Envoy 1.40 dynamic module with one UDP listener filter, chained before `udp_proxy` on
//! the east-west gateway's UDP 18009. It reads the SNI of each new QUIC connection from the client's Initial
//! packets (`quicsni`, public keys only) and passes the connection's datagrams on, unopened, only when that SNI is
//! exported; every other datagram is dropped and counted. It never terminates QUIC and holds no key.
//!
//! Filter config (a `google.protobuf.StringValue`): the exported SNIs, comma or whitespace separated.
//! Counters: `quic_sni_forwarded`, `quic_sni_unknown`, `quic_sni_refused`, `quic_sni_pending`.

pub mod abi;
pub mod lb;

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use abi::{ConfigEnvoyPtr, EnvoyBuffer, FilterEnvoyPtr, ModuleBuffer, Status};
use quicsni::gate::{self, Count, Gate, Verdict};
use quicsni::TrackerLimits;

/// Decisions kept per worker: 262,144 4-tuples (about 100 bytes each).
const MAX_DECIDED: usize = 1 << 18;
const COUNTERS: [&str; 4] = [
    "quic_sni_forwarded",
    "quic_sni_unknown",
    "quic_sni_refused",
    "quic_sni_pending",
];

struct Config {
    exported: std::collections::HashSet<String>,
    counters: [Option<usize>; 4],
}

type Key = (Vec<u8>, u32);

struct Filter {
    config: *const Config,
    gate: Gate<Key>,
    scratch: Vec<u8>,
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const std::ffi::c_char {
    c"v0.2.0".as_ptr()
}

/// # Safety
/// Called by Envoy with its config pointer and buffers valid for the call.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_udp_listener_filter_config_new(
    config_envoy: ConfigEnvoyPtr,
    _name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> *mut c_void {
    let bytes = if config.ptr.is_null() {
        &[][..]
    } else {
        std::slice::from_raw_parts(config.ptr, config.length)
    };
    let mut counters = [None; 4];
    for (slot, name) in counters.iter_mut().zip(COUNTERS) {
        let mut id = 0usize;
        let buf = ModuleBuffer {
            ptr: name.as_ptr(),
            length: name.len(),
        };
        if abi::envoy_dynamic_module_callback_udp_listener_filter_config_define_counter(config_envoy, buf, &mut id) == 0
        {
            *slot = Some(id);
        }
    }
    Box::into_raw(Box::new(Config {
        exported: gate::parse_exported(bytes),
        counters,
    }))
    .cast()
}

/// # Safety
/// `config` is a pointer returned by `..._config_new`, not yet destroyed.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_udp_listener_filter_config_destroy(config: *mut c_void) {
    drop(Box::from_raw(config.cast::<Config>()));
}

/// # Safety
/// `config` is a live config pointer; Envoy destroys every filter before its config.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_udp_listener_filter_new(
    config: *mut c_void,
    _filter_envoy: FilterEnvoyPtr,
) -> *mut c_void {
    let config = config.cast::<Config>().cast_const();
    let gate = Gate::new((*config).exported.clone(), TrackerLimits::default(), MAX_DECIDED);
    Box::into_raw(Box::new(Filter {
        config,
        gate,
        scratch: Vec::new(),
    }))
    .cast()
}

/// # Safety
/// `filter` is a pointer returned by `..._filter_new`, not yet destroyed.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_udp_listener_filter_destroy(filter: *mut c_void) {
    drop(Box::from_raw(filter.cast::<Filter>()));
}

/// # Safety
/// Called by Envoy on the filter's worker with the datagram current.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_udp_listener_filter_on_data(
    filter_envoy: FilterEnvoyPtr,
    filter: *mut c_void,
) -> Status {
    let filter = &mut *filter.cast::<Filter>();
    // A panic must not cross into Envoy: the datagram is dropped instead.
    catch_unwind(AssertUnwindSafe(|| on_data(filter_envoy, filter))).unwrap_or(Status::StopIteration)
}

unsafe fn on_data(filter_envoy: FilterEnvoyPtr, filter: &mut Filter) -> Status {
    let mut addr = EnvoyBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };
    let mut port = 0u32;
    if !abi::envoy_dynamic_module_callback_udp_listener_filter_get_peer_address(filter_envoy, &mut addr, &mut port) {
        return Status::StopIteration;
    }
    let key: Key = (std::slice::from_raw_parts(addr.ptr, addr.length).to_vec(), port);
    // A decided connection's datagrams are passed or dropped without being read or copied.
    if let Some(sni) = filter.gate.lookup(&key) {
        let verdict = if sni.is_some() { Verdict::Pass } else { Verdict::Drop };
        lb::CURRENT.with(|c| *c.borrow_mut() = sni.cloned());
        return status(verdict);
    }
    let n = abi::envoy_dynamic_module_callback_udp_listener_filter_get_datagram_data_chunks_size(filter_envoy);
    let mut chunks = vec![
        EnvoyBuffer {
            ptr: std::ptr::null(),
            length: 0
        };
        n
    ];
    if n == 0
        || !abi::envoy_dynamic_module_callback_udp_listener_filter_get_datagram_data_chunks(
            filter_envoy,
            chunks.as_mut_ptr(),
        )
    {
        return Status::StopIteration;
    }
    filter.scratch.clear();
    for c in &chunks {
        filter
            .scratch
            .extend_from_slice(std::slice::from_raw_parts(c.ptr, c.length));
    }
    let (verdict, count) = filter.gate.on_datagram(&key, &filter.scratch);
    if let Some(count) = count {
        let slot = match count {
            Count::Forwarded => 0,
            Count::UnknownSni => 1,
            Count::Refused => 2,
            Count::Pending => 3,
        };
        if let Some(id) = (*filter.config).counters[slot] {
            abi::envoy_dynamic_module_callback_udp_listener_filter_increment_counter(filter_envoy, id, 1);
        }
    }
    handoff(filter, &key, verdict)
}

/// A passed datagram leaves its connection's SNI for the load balancer (`lb::CURRENT`): `udp_proxy` runs next on
/// this worker and, when it opens a session for the datagram, asks the gateway cluster's load balancer for a host.
fn handoff(filter: &Filter, key: &Key, verdict: Verdict) -> Status {
    let sni = match verdict {
        Verdict::Pass => filter.gate.sni(key).cloned(),
        Verdict::Drop => None,
    };
    lb::CURRENT.with(|c| *c.borrow_mut() = sni);
    status(verdict)
}

fn status(verdict: Verdict) -> Status {
    match verdict {
        Verdict::Pass => Status::Continue,
        Verdict::Drop => Status::StopIteration,
    }
}
