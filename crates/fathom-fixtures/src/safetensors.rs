use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use serde_json::{json, Map, Value};

use crate::random::{write_elements, Fill, Rng, WEIGHTS};
use crate::{DType, Data, TensorDef};

/// Writes a safetensors file with the tensors' data laid out in the order
/// given, and returns the file size. `metadata` becomes `__metadata__`
/// (omitted when empty).
pub fn write_safetensors(
    path: &Path,
    tensors: &[TensorDef],
    metadata: &[(&str, &str)],
    data: Data,
) -> io::Result<u64> {
    let (header, data_len) = header(tensors, metadata)?;
    let total = 8 + header.len() as u64 + data_len;
    let mut out = BufWriter::new(File::create(path)?);
    out.write_all(&(header.len() as u64).to_le_bytes())?;
    out.write_all(&header)?;
    if let Data::Random { seed } = data {
        for tensor in tensors {
            let fill = match tensor.dtype {
                DType::F32 => Fill::F32,
                DType::F16 => Fill::F16,
                DType::BF16 => Fill::BF16,
                DType::U32 => Fill::Bits32,
            };
            let mut rng = Rng::for_tensor(seed, &tensor.name);
            write_elements(&mut out, fill, tensor.numel(), &mut rng, WEIGHTS)?;
        }
    }
    let file = out.into_inner().map_err(io::IntoInnerError::into_error)?;
    // For sparse data this leaves the tensor bytes as a hole.
    file.set_len(total)?;
    Ok(total)
}

/// The JSON header, padded with spaces to a multiple of 8 bytes as the
/// reference writer does so the data that follows stays aligned.
fn header(tensors: &[TensorDef], metadata: &[(&str, &str)]) -> io::Result<(Vec<u8>, u64)> {
    let mut map = Map::new();
    if !metadata.is_empty() {
        let meta = metadata
            .iter()
            .map(|(k, v)| (k.to_string(), Value::from(*v)))
            .collect();
        map.insert("__metadata__".into(), Value::Object(meta));
    }
    let mut offset = 0u64;
    for tensor in tensors {
        let end = offset + tensor.byte_len();
        let entry = json!({
            "dtype": tensor.dtype.name(),
            "shape": tensor.shape,
            "data_offsets": [offset, end],
        });
        if map.insert(tensor.name.clone(), entry).is_some() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("tensor {:?} is listed twice", tensor.name),
            ));
        }
        offset = end;
    }
    let mut bytes = serde_json::to_vec(&Value::Object(map))?;
    bytes.resize(bytes.len().next_multiple_of(8), b' ');
    Ok((bytes, offset))
}
