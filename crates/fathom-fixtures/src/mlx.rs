use std::collections::HashMap;

use serde_json::json;

use crate::{DType, ModelDef, TensorDef};

/// The checkpoint as `mlx_lm.convert -q` writes it: a mixture of experts is
/// first stacked per layer into `mlp.switch_mlp.{gate,up,down}_proj.weight`
/// `[n_expert, out, in]` (MLX's SwitchGLU), then every Linear or Embedding
/// weight whose input width is a multiple of `group_size` becomes `U32`
/// words `[.., out, in * bits / 32]` with F16 `scales` and `biases`
/// `[.., out, in / group_size]`. Norms, biases, other tensors and widths that
/// do not divide stay as they were.
///
/// Real conversions may keep some layers (e.g. MoE routers) at other bit
/// widths via per-layer overrides in `quantization`; this one is uniform.
pub fn mlx_quantize(model: &ModelDef, bits: u32, group_size: u32) -> ModelDef {
    assert!(
        (1..=8).contains(&bits) && group_size > 0,
        "MLX quantizes to 1..=8 bits in groups of at least 1, not {bits} bits in groups of {group_size}"
    );
    let (bits, group_size) = (u64::from(bits), u64::from(group_size));
    let tensors = stack_experts(&model.tensors)
        .into_iter()
        .flat_map(|tensor| quantize(tensor, bits, group_size))
        .collect();
    let mut config = model.config.clone();
    let quantization = json!({"group_size": group_size, "bits": bits});
    config["quantization"] = quantization.clone();
    config["quantization_config"] = quantization;
    ModelDef {
        name: model.name,
        config,
        tensors,
        gguf_arch: model.gguf_arch,
    }
}

/// `…mlp.experts.E.P.weight` → `…mlp.switch_mlp.P.weight` `[n_expert, ..]`,
/// placed where the layer's first expert was.
fn stack_experts(tensors: &[TensorDef]) -> Vec<TensorDef> {
    let mut out: Vec<TensorDef> = Vec::new();
    let mut stacked: HashMap<String, usize> = HashMap::new();
    for tensor in tensors {
        let Some((layer, rest)) = tensor.name.split_once(".mlp.experts.") else {
            out.push(tensor.clone());
            continue;
        };
        let Some((_, proj)) = rest.split_once('.') else {
            out.push(tensor.clone());
            continue;
        };
        let name = format!("{layer}.mlp.switch_mlp.{proj}");
        match stacked.get(&name) {
            Some(&at) => out[at].shape[0] += 1,
            None => {
                stacked.insert(name.clone(), out.len());
                let shape: Vec<u64> = [1].iter().chain(&tensor.shape).copied().collect();
                out.push(TensorDef::new(name, &shape, tensor.dtype));
            }
        }
    }
    out
}

fn quantize(tensor: TensorDef, bits: u64, group_size: u64) -> Vec<TensorDef> {
    let in_features = *tensor.shape.last().unwrap_or(&0);
    let matrix = matches!(tensor.shape.len(), 2 | 3);
    let fits = in_features.is_multiple_of(group_size) && (in_features * bits).is_multiple_of(32);
    let prefix = match tensor.name.strip_suffix(".weight") {
        Some(prefix) if matrix && fits && in_features > 0 => prefix.to_string(),
        _ => return vec![tensor],
    };
    let outer = &tensor.shape[..tensor.shape.len() - 1];
    let with_last = |last: u64| -> Vec<u64> { outer.iter().copied().chain([last]).collect() };
    let groups = with_last(in_features / group_size);
    vec![
        TensorDef::new(
            tensor.name.clone(),
            &with_last(in_features * bits / 32),
            DType::U32,
        ),
        TensorDef::new(format!("{prefix}.scales"), &groups, DType::F16),
        TensorDef::new(format!("{prefix}.biases"), &groups, DType::F16),
    ]
}
