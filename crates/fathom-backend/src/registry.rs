//! The backends this build has, by device kind, and the one place a plan
//! becomes a backend: the engine asks [`open`], the CLI asks [`devices`]
//! what `--device` can reach.

use fathom_plan::{Device, MemoryPlan};

use crate::cpu::CpuBackend;
use crate::cuda::nccl::NcclSum;
use crate::cuda::{self, CudaBackend};
use crate::hybrid::Hybrid;
use crate::parallel::TensorParallel;
use crate::{Backend, BackendError, KvLayout};

/// A device kind as this build sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceKind {
    pub device: Device,
    /// Whether this binary runs models there (cuda: the `cuda` feature;
    /// rocm and metal are planning targets only). Whether such a device
    /// is present is NVML's question (asked without a context).
    pub runs: bool,
}

/// Every device kind the plan knows, in `Device::ALL` order.
pub fn devices() -> Vec<DeviceKind> {
    Device::ALL
        .into_iter()
        .map(|device| DeviceKind {
            device,
            runs: match device {
                Device::Cpu => true,
                Device::Cuda => cuda::BUILT,
                Device::Rocm | Device::Metal => false,
            },
        })
        .collect()
}

/// The backend for `plan`'s device, allocating what the plan lists for it;
/// under tensor parallelism one CUDA rank a device (`0 .. N`, each with
/// one device's plan) and NCCL between them; a placement that puts part of
/// the model on the host adds the CPU backend for it (`host_kv`: the host
/// layers' KV), driven with the device's as one ([`Hybrid`]).
pub fn open(
    plan: &MemoryPlan,
    kv: KvLayout,
    host_kv: Option<KvLayout>,
) -> Result<Box<dyn Backend>, BackendError> {
    let inputs = &plan.inputs;
    let device_err = |message: String| BackendError::Device {
        backend: inputs.device.name(),
        message,
    };
    match inputs.device {
        Device::Cpu => Ok(Box::new(CpuBackend::new(
            inputs.threads as usize,
            &plan.activation_detail,
            kv,
        )?)),
        Device::Cuda => {
            let layout = plan.device_layout.as_ref().ok_or_else(|| {
                device_err("the plan carries no device layout (it was not made for cuda)".into())
            })?;
            let rank = |d| CudaBackend::new(d, &plan.activation_detail, kv.clone(), layout);
            let split = plan.placement.as_ref().filter(|p| p.is_split());
            if let Some(placed) = split {
                let host_kv = host_kv.ok_or_else(|| {
                    device_err("the plan splits the model but no host KV layout came".into())
                })?;
                let host = CpuBackend::new(inputs.threads as usize, &placed.host_arena, host_kv)?;
                return Ok(Box::new(Hybrid::new(host, rank(0)?)));
            }
            match plan.tensor_parallel.as_ref().map_or(1, |tp| tp.size) as usize {
                1 => Ok(Box::new(rank(0)?)),
                n => {
                    let present = cuda::device_count();
                    if present < n {
                        return Err(device_err(format!(
                            "--tensor-parallel {n} needs {n} CUDA devices; this machine has {present}"
                        )));
                    }
                    let ranks = (0..n).map(rank).collect::<Result<Vec<_>, _>>()?;
                    Ok(Box::new(TensorParallel::new(ranks, NcclSum::new(n)?)?))
                }
            }
        }
        other => Err(device_err(format!(
            "the {} backend cannot run models yet: use --device cpu (other devices are \
             planning targets for `fathom inspect`)",
            other.name()
        ))),
    }
}
