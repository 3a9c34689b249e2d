//! Finding a GPU without holding it: `--device auto` asks [`probe`] and
//! [`device_count`], which never panic and leave nothing allocated.

use cudarc::driver::{result, sys};

/// A GPU as `--device auto` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    pub free: u64,
    pub total: u64,
}

/// The first CUDA device, or `None` when there is no driver, no device,
/// or any call fails. Never panics. Reading free memory needs a context:
/// this retains the device's primary context and releases it again (on the
/// order of 0.3 s; nothing stays allocated).
pub fn probe() -> Option<DeviceInfo> {
    std::panic::catch_unwind(probe_device).ok().flatten()
}

/// CUDA devices the driver lists (0 without a driver). Never panics.
pub fn device_count() -> usize {
    let count = || {
        // SAFETY: only tries to open libcuda by its names; runs none of it.
        if !unsafe { sys::is_culib_present() } {
            return 0;
        }
        result::init()
            .and_then(|_| result::device::get_count())
            .map_or(0, |n| n.max(0) as usize)
    };
    std::panic::catch_unwind(count).unwrap_or(0)
}

pub(super) fn probe_device() -> Option<DeviceInfo> {
    // SAFETY: only tries to open libcuda by its names; runs none of it.
    if !unsafe { sys::is_culib_present() } {
        return None;
    }
    result::init().ok()?;
    if result::device::get_count().ok()? < 1 {
        return None;
    }
    let dev = result::device::get(0).ok()?;
    let name = result::device::get_name(dev).ok()?;
    // SAFETY: `dev` is a device handle the driver just returned.
    let total = unsafe { result::device::total_mem(dev) }.ok()? as u64;
    // SAFETY: retain/set-current/release pair on the device's primary
    // context; the context is released before returning.
    let free = unsafe {
        let ctx = result::primary_ctx::retain(dev).ok()?;
        let free = sys::cuCtxSetCurrent(ctx)
            .result()
            .and_then(|_| result::mem_get_info())
            .map(|(f, _)| f as u64);
        let _ = result::primary_ctx::release(dev);
        free.ok()?
    };
    Some(DeviceInfo { name, free, total })
}
