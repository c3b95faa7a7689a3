//! The gateway cluster's load balancer (`lb_policy_name: quic_sni`): picks, for the session `udp_proxy` is opening,
//! an endpoint of the Service the connection's SNI names. The SNI comes from this module's UDP listener filter,
//! which ran for the same datagram on the same worker thread just before `udp_proxy` asked (`CURRENT`); the
//! endpoints carry their SNI in `filter_metadata["aether.quic_sni"]["sni"]`.

use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::Arc;

use quicsni::pick::Endpoints;

use crate::abi::{self, EnvoyBuffer, LbEnvoyPtr, ModuleBuffer};

pub const METADATA_FILTER: &str = "aether.quic_sni";
pub const METADATA_KEY: &str = "sni";

thread_local! {
    /// The SNI of the datagram the listener filter passed last on this worker, taken by the next host choice.
    pub static CURRENT: RefCell<Option<Arc<str>>> = const { RefCell::new(None) };
}

struct Lb {
    endpoints: Option<Vec<Endpoints>>,
    turn: usize,
}

fn empty() -> EnvoyBuffer {
    EnvoyBuffer {
        ptr: std::ptr::null(),
        length: 0,
    }
}

unsafe fn text<'a>(b: EnvoyBuffer) -> &'a str {
    if b.ptr.is_null() {
        return "";
    }
    std::str::from_utf8(std::slice::from_raw_parts(b.ptr, b.length)).unwrap_or("")
}

fn module_buffer(s: &str) -> ModuleBuffer {
    ModuleBuffer {
        ptr: s.as_ptr(),
        length: s.len(),
    }
}

/// Every priority's hosts with the SNI their metadata names (hosts without one serve no SNI).
unsafe fn read_endpoints(lb: LbEnvoyPtr) -> Vec<Endpoints> {
    (0..abi::envoy_dynamic_module_callback_lb_get_priority_set_size(lb) as u32)
        .map(|p| {
            let hosts = (0..abi::envoy_dynamic_module_callback_lb_get_hosts_count(lb, p)).filter_map(|i| {
                let (mut address, mut sni) = (empty(), empty());
                let known = abi::envoy_dynamic_module_callback_lb_get_host_address(lb, p, i, &mut address)
                    && abi::envoy_dynamic_module_callback_lb_get_host_metadata_string(
                        lb,
                        p,
                        i,
                        module_buffer(METADATA_FILTER),
                        module_buffer(METADATA_KEY),
                        &mut sni,
                    );
                known.then(|| (text(address).to_string(), text(sni).to_string()))
            });
            Endpoints::new(hosts.collect::<Vec<_>>())
        })
        .collect()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_lb_config_new(
    _config_envoy: *mut c_void,
    _name: EnvoyBuffer,
    _config: EnvoyBuffer,
) -> *mut c_void {
    // No configuration: the metadata names are fixed. Any non-null pointer is a success.
    std::ptr::NonNull::<u8>::dangling().as_ptr().cast()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_lb_config_destroy(_config: *mut c_void) {}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_lb_new(_config: *mut c_void, _lb_envoy: LbEnvoyPtr) -> *mut c_void {
    Box::into_raw(Box::new(Lb {
        endpoints: None,
        turn: 0,
    }))
    .cast()
}

/// # Safety
/// `lb` is a pointer returned by `on_lb_new`, not yet destroyed.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_lb_destroy(lb: *mut c_void) {
    drop(Box::from_raw(lb.cast::<Lb>()));
}

/// # Safety
/// Called by Envoy on the load balancer's worker.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_lb_on_host_membership_update(
    _lb_envoy: LbEnvoyPtr,
    lb: *mut c_void,
    _added: usize,
    _removed: usize,
) {
    (*lb.cast::<Lb>()).endpoints = None;
}

/// # Safety
/// Called by Envoy on the load balancer's worker, with output pointers valid for the call.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_lb_choose_host(
    lb_envoy: LbEnvoyPtr,
    lb: *mut c_void,
    _context: *mut c_void,
    priority_out: *mut u32,
    index_out: *mut u32,
) -> bool {
    let lb = &mut *lb.cast::<Lb>();
    let chosen = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| choose(lb_envoy, lb)));
    match chosen {
        Ok(Some((p, i))) => {
            *priority_out = p;
            *index_out = i as u32;
            true
        }
        _ => false,
    }
}

unsafe fn choose(lb_envoy: LbEnvoyPtr, lb: &mut Lb) -> Option<(u32, usize)> {
    // No SNI from the listener filter for this datagram: no host (udp_proxy counts the session as none healthy).
    let sni = CURRENT.with(|c| c.borrow_mut().take())?;
    let endpoints = lb.endpoints.get_or_insert_with(|| read_endpoints(lb_envoy));
    lb.turn = lb.turn.wrapping_add(1);
    for (p, by_priority) in endpoints.iter().enumerate() {
        let p = p as u32;
        let healthy: Vec<String> = (0..abi::envoy_dynamic_module_callback_lb_get_healthy_hosts_count(lb_envoy, p))
            .map(|i| {
                let mut address = empty();
                abi::envoy_dynamic_module_callback_lb_get_healthy_host_address(lb_envoy, p, i, &mut address);
                text(address).to_string()
            })
            .collect();
        if let Some(i) = by_priority.pick(&sni, healthy.iter().map(String::as_str), lb.turn) {
            return Some((p, i));
        }
    }
    None
}
