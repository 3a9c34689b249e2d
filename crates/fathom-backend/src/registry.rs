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

/// The model features beyond the common ops that a device's backend runs:
/// what its [`Backend::runs_hybrid`], [`Backend::runs_gpt_oss`] and
/// [`Backend::runs_scaled_rows`] answer (they read [`Features::of`]), known
/// before a backend is opened, so that `inspect` refuses a model the
/// device would refuse at load, by the same rule
/// (`fathom_engine::check_runs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// Linear-attention layers, gated attention and partial rope (Qwen3.5).
    pub hybrid: bool,
    /// Attention sinks, YaRN rope, the clamped SwiGLU and expert biases.
    pub gpt_oss: bool,
    /// Values normed without a weight, layer output scales and a logit
    /// softcap (Gemma 4).
    pub scaled_rows: bool,
}

impl Features {
    /// None of them: what a tensor-parallel group runs yet
    /// ([`crate::parallel::TensorParallel`] keeps the trait's answers).
    pub const NONE: Features = Features {
        hybrid: false,
        gpt_oss: false,
        scaled_rows: false,
    };

    /// The features of the backend that runs a model on `devices` of
    /// `device` (one, or a tensor-parallel group); none where this build
    /// runs no models (rocm and metal are planning targets).
    pub const fn of(device: Device, devices: usize) -> Features {
        let all = Features {
            hybrid: true,
            gpt_oss: true,
            scaled_rows: true,
        };
        match device {
            _ if devices > 1 => Features::NONE,
            Device::Cpu | Device::Cuda => all,
            Device::Rocm | Device::Metal => Features::NONE,
        }
    }
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
