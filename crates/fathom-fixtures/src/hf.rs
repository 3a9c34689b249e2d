use std::fs;
use std::io;
use std::path::Path;

use serde_json::{json, Map, Value};

use crate::{write_safetensors, Data, ModelDef, TensorDef};

/// Writes a Hugging Face model directory: `config.json` and either
/// `model.safetensors` (`shards == 1`) or `shards` files named
/// `model-0000i-of-0000N.safetensors` plus `model.safetensors.index.json`.
///
/// Tensors are split in order into shards of roughly equal bytes; every shard
/// gets at least one tensor, so `shards` may not exceed the tensor count.
pub fn write_hf_dir(model: &ModelDef, dir: &Path, shards: usize, data: Data) -> io::Result<()> {
    let tensors = &model.tensors;
    if shards == 0 || shards > tensors.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} shards requested for {} tensors; need 1..={}",
                shards,
                tensors.len(),
                tensors.len()
            ),
        ));
    }
    fs::create_dir_all(dir)?;
    fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&model.config)?,
    )?;
    let metadata = [("format", "pt")];
    if shards == 1 {
        write_safetensors(&dir.join("model.safetensors"), tensors, &metadata, data)?;
        return Ok(());
    }

    let assignment = assign_shards(tensors, shards);
    let mut weight_map = Map::new();
    for shard in 0..shards {
        let file = format!("model-{:05}-of-{:05}.safetensors", shard + 1, shards);
        let members: Vec<TensorDef> = tensors
            .iter()
            .zip(&assignment)
            .filter(|(_, &s)| s == shard)
            .map(|(t, _)| t.clone())
            .collect();
        for tensor in &members {
            weight_map.insert(tensor.name.clone(), Value::from(file.clone()));
        }
        write_safetensors(&dir.join(&file), &members, &metadata, data)?;
    }
    let index = json!({
        "metadata": { "total_size": model.total_bytes() },
        "weight_map": weight_map,
    });
    fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::to_string_pretty(&index)?,
    )?;
    Ok(())
}

/// Shard of each tensor: the one its starting byte falls in when the total is
/// cut into equal parts, held back so shard numbers never skip and every
/// shard gets at least one tensor.
fn assign_shards(tensors: &[TensorDef], shards: usize) -> Vec<usize> {
    let total: u64 = tensors.iter().map(TensorDef::byte_len).sum::<u64>().max(1);
    let n = tensors.len();
    let mut start = 0u64;
    let mut previous = 0usize;
    let mut assignment = Vec::with_capacity(n);
    for (i, tensor) in tensors.iter().enumerate() {
        let even = (u128::from(start) * shards as u128 / u128::from(total)) as usize;
        let needed = (shards + i).saturating_sub(n);
        let shard = even.max(needed).max(previous).min(previous + 1);
        assignment.push(shard);
        previous = shard;
        start += tensor.byte_len();
    }
    assignment
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    fn tensors(sizes: &[u64]) -> Vec<TensorDef> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &s)| TensorDef::new(format!("t{i}"), &[s], DType::F32))
            .collect()
    }

    #[test]
    fn shards_are_contiguous_and_none_is_empty() {
        for (sizes, shards) in [
            (vec![1, 1, 1, 1], 4),
            (vec![1000, 1, 1, 1], 3),
            (vec![1, 1, 1, 1000], 3),
            (vec![5; 100], 7),
        ] {
            let a = assign_shards(&tensors(&sizes), shards);
            assert_eq!(a[0], 0);
            assert_eq!(*a.last().unwrap(), shards - 1);
            assert!(a.windows(2).all(|w| w[1] == w[0] || w[1] == w[0] + 1));
        }
    }

    #[test]
    fn shards_are_roughly_equal() {
        let a = assign_shards(&tensors(&[5; 100]), 4);
        for shard in 0..4 {
            assert_eq!(a.iter().filter(|&&s| s == shard).count(), 25);
        }
    }
}
