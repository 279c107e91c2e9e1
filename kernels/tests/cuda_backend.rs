//! The CUDA backend fails cleanly, never panics: on a machine without a GPU (CI) opening a
//! device is a typed error that says what is missing; with a GPU it opens and an absurd ordinal
//! is refused. Either way the answer must agree with `is_available()`.
#![cfg(feature = "cuda")]

use pagewarden_kernels::cuda::{device_count, CudaBackend, CudaError, PtxSource};
use pagewarden_kernels::Device;

#[test]
fn opening_a_device_agrees_with_is_available() {
    let available = CudaBackend::is_available();
    match CudaBackend::with_ptx_source(0, PtxSource::Nvrtc) {
        Ok(gpu) => {
            assert!(available, "opened cuda:0 but is_available() said no");
            assert!(gpu.arch().starts_with("compute_"), "{}", gpu.arch());
        }
        Err(e) => {
            assert!(!available, "is_available() but cuda:0 failed: {e}");
            let msg = e.to_string();
            assert!(
                matches!(
                    e,
                    CudaError::NoDriver | CudaError::NoSuchDevice { .. } | CudaError::Driver { .. }
                ),
                "unexpected error kind: {msg}"
            );
            assert!(
                msg.contains("cuda") || msg.contains("CUDA"),
                "unhelpful message: {msg}"
            );
        }
    }
}

#[test]
fn an_absent_ordinal_is_an_error_not_a_panic() {
    let e = CudaBackend::new(4096).expect_err("no machine has 4097 GPUs");
    match e {
        CudaError::NoDriver => assert!(device_count().is_err()),
        CudaError::NoSuchDevice { ordinal, count } => {
            assert_eq!(ordinal, 4096);
            assert_eq!(Ok(count), device_count().map_err(|e| e.to_string()));
        }
        other => panic!("unexpected error: {other}"),
    }
}

#[test]
fn the_device_flag_accepts_cuda_in_this_build() {
    let d: Device = "cuda:1".parse().expect("parse");
    assert_eq!(d.check_compiled(), Ok(Device::Cuda(1)));
}
