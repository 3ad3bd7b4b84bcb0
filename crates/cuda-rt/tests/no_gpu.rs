//! Device calls on any machine: an error, never a panic, when there is no driver or no such device.

use cuda_rt::{Error, Gpu, TensorMapDesc, TmaDataType, driver_present};

#[test]
fn device_calls_return_errors_instead_of_panicking() {
    let open = Gpu::open(1 << 20);
    assert!(
        matches!(
            open,
            Err(Error::NoDriver | Error::NoDevice | Error::InvalidOrdinal { .. })
        ),
        "{open:?}"
    );
    match Gpu::list() {
        Ok(devices) => assert!(!devices.is_empty()),
        Err(e) => assert!(matches!(e, Error::NoDriver | Error::NoDevice), "{e:?}"),
    }
    if !driver_present() {
        assert!(matches!(Gpu::count(), Err(Error::NoDriver)));
        assert!(matches!(Gpu::open(0), Err(Error::NoDriver)));
        let desc = TensorMapDesc::matrix(TmaDataType::F32, 0x1000, [64, 64], 256, [16, 16]);
        assert!(matches!(desc.encode(), Err(Error::NoDriver)));
        let message = Gpu::open(0).unwrap_err().to_string();
        assert!(message.contains("no NVIDIA driver"), "{message}");
    }
}
