//! The NVML reading of a real GPU: found by the PCI bus id CUDA gives, with a plausible SM
//! clock (idle or busy) and board power.

use std::time::Duration;

use cuda_rt::{Gpu, Telemetry};

#[test]
#[ignore = "needs a CUDA GPU"]
fn nvml_reads_the_clock_and_power_of_the_cuda_gpu() {
    let gpu = Gpu::open(0).unwrap_or_else(|e| panic!("this test needs a CUDA GPU: {e}"));
    let telemetry = Telemetry::open().expect("a machine with a CUDA GPU has NVML");
    let sampling = telemetry.start(&gpu);
    std::thread::sleep(Duration::from_millis(50));
    let reading = sampling
        .finish()
        .unwrap_or_else(|| panic!("no sample of {}", gpu.info().pci_bus_id));
    println!(
        "{} ({}): {reading:?}",
        gpu.info().name,
        gpu.info().pci_bus_id
    );
    assert!(reading.samples >= 5, "{reading:?}");
    assert!(
        (100.0..4000.0).contains(&reading.sm_clock_mhz),
        "{reading:?}"
    );
    assert!((5.0..2000.0).contains(&reading.power_w), "{reading:?}");
}
