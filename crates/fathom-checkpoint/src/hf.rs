//! Hugging Face and MLX checkpoint directories: `config.json` plus
//! `model.safetensors` or a sharded `model.safetensors.index.json`.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;

use crate::safetensors::{clip, invalid, json_error, parse_raw, show, too_large, RawJson};
use crate::{CheckpointError, ErrorKind, SafetensorsFile, StTensor};

const CONFIG: &str = "config.json";
const TOKENIZER: &str = "tokenizer.json";
const INDEX: &str = "model.safetensors.index.json";
const SINGLE: &str = "model.safetensors";
const EXTENSION: &str = ".safetensors";

/// What the index's `weight_map` must be, for messages.
const WEIGHT_MAP: &str = "a non-empty object mapping tensor names to shard file names";

/// `config.json` and the index are kB to a few MB, `tokenizer.json` tens of
/// MB at most; the bound keeps a wrong or hostile file from being read whole
/// into memory.
const MAX_JSON_BYTES: u64 = 100_000_000;

/// Group sizes and bit widths MLX's affine quantization supports; anything
/// else would make the packed-weight sizes meaningless downstream.
const MLX_GROUP_SIZES: [u64; 3] = [32, 64, 128];
const MLX_BITS: [u64; 6] = [2, 3, 4, 5, 6, 8];

/// MLX affine quantization settings from `config.json`'s `quantization`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlxQuantization {
    pub group_size: u32,
    pub bits: u32,
}

/// A Hugging Face / MLX checkpoint directory, headers only.
#[derive(Debug, Clone)]
pub struct HfCheckpoint {
    pub dir: PathBuf,
    /// The whole `config.json`.
    pub config: serde_json::Value,
    /// MLX quantization, when `config.json` has a `quantization` (or
    /// `quantization_config` with `group_size` and `bits`) object.
    pub quantization: Option<MlxQuantization>,
    /// Safetensors files in index order (one for an unsharded checkpoint).
    pub files: Vec<SafetensorsFile>,
    /// Every tensor of every file, `file` pointing into `files`.
    pub tensors: Vec<StTensor>,
}

impl HfCheckpoint {
    /// Reads `config.json` and the safetensors headers only, so a sharded
    /// checkpoint of tens of GB opens as fast as a small one. Files are
    /// found through the index if there is one, else `model.safetensors`,
    /// else every `*.safetensors` in the directory, sorted by name.
    pub fn open(dir: &Path) -> Result<Self, CheckpointError> {
        let config_path = dir.join(CONFIG);
        let config_text = read_json_text(&config_path)?;
        let config: Value =
            serde_json::from_str(&config_text).map_err(|e| json_error(&config_path, CONFIG, &e))?;
        if !config.is_object() {
            return Err(invalid(
                &config_path,
                CONFIG,
                json_type(&config),
                "a JSON object",
            ));
        }
        let quantization = mlx_quantization(&config_path, &config)?;

        let index_path = dir.join(INDEX);
        let single_path = dir.join(SINGLE);
        let mut files = if exists(&index_path)? {
            open_indexed(dir, &index_path)?
        } else if exists(&single_path)? {
            vec![SafetensorsFile::open(&single_path)?]
        } else {
            safetensors_in(dir)?
                .iter()
                .map(|name| SafetensorsFile::open(&dir.join(name)))
                .collect::<Result<_, _>>()?
        };

        let total = files.iter().map(|f| f.tensors.len()).sum();
        let mut owner = HashSet::with_capacity(total);
        for file in &files {
            for tensor in &file.tensors {
                if !owner.insert(&tensor.name) {
                    return Err(CheckpointError::new(
                        &file.path,
                        ErrorKind::DuplicateTensor {
                            name: tensor.name.clone(),
                        },
                    ));
                }
            }
        }
        for (index, file) in files.iter_mut().enumerate() {
            for tensor in &mut file.tensors {
                tensor.file = index;
            }
        }
        let mut tensors = Vec::with_capacity(total);
        for file in &files {
            tensors.extend_from_slice(&file.tensors);
        }

        Ok(HfCheckpoint {
            dir: dir.to_path_buf(),
            config,
            quantization,
            files,
            tensors,
        })
    }

    /// `tokenizer.json`'s text (bounded in size like `config.json`), or
    /// `None` when the directory has none: what the spec counts the
    /// vocabulary from, with [`crate::tokenizer_json::read`].
    pub fn tokenizer_json(&self) -> Result<Option<String>, CheckpointError> {
        let path = self.dir.join(TOKENIZER);
        if !exists(&path)? {
            return Ok(None);
        }
        read_json_text(&path).map(Some)
    }

    /// The config that describes the language model: `text_config` when
    /// present (multimodal checkpoints nest it), else the root.
    pub fn text_config(&self) -> &serde_json::Value {
        self.config.get("text_config").unwrap_or(&self.config)
    }
}

/// Reads a small JSON file as text, bounded in size.
fn read_json_text(path: &Path) -> Result<String, CheckpointError> {
    let io = |e| CheckpointError::io(path, e);
    let file = crate::open_regular(path)?;
    // Room for the whole file at once (a tokenizer.json is several MB):
    // no doubling and copying while it is read.
    let len = file.metadata().map_err(io)?.len();
    let mut bytes = Vec::with_capacity(len.min(MAX_JSON_BYTES) as usize);
    file.take(MAX_JSON_BYTES.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io)?;
    let len = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if len > MAX_JSON_BYTES {
        return Err(too_large(path, "file size", len, MAX_JSON_BYTES));
    }
    String::from_utf8(bytes).map_err(|e| {
        CheckpointError::new(
            path,
            ErrorKind::InvalidUtf8 {
                field: "JSON text".into(),
                offset: u64::try_from(e.utf8_error().valid_up_to()).unwrap_or(u64::MAX),
            },
        )
    })
}

fn exists(path: &Path) -> Result<bool, CheckpointError> {
    path.try_exists().map_err(|e| CheckpointError::io(path, e))
}

/// MLX writes `quantization` (and, for Hugging Face tools, the same object
/// as `quantization_config`). A `quantization_config` carrying
/// `quant_method` is another scheme (GPTQ, AWQ, fp8, ...) whose
/// `group_size`/`bits` follow other rules, so it is not read here.
fn mlx_quantization(
    path: &Path,
    config: &Value,
) -> Result<Option<MlxQuantization>, CheckpointError> {
    for key in ["quantization", "quantization_config"] {
        let Some(section) = config.get(key) else {
            continue;
        };
        if section.is_null() {
            continue;
        }
        let Some(section) = section.as_object() else {
            return Err(invalid(
                path,
                key,
                show(section),
                "an object with group_size and bits",
            ));
        };
        if section.contains_key("quant_method") {
            continue;
        }
        let (group_size, bits) = (section.get("group_size"), section.get("bits"));
        if group_size.is_none() && bits.is_none() {
            continue;
        }
        // Other keys are per-layer overrides keyed by module path, or
        // settings such as `mode`; the global pair is what sizes weights.
        return Ok(Some(MlxQuantization {
            group_size: one_of(
                path,
                &format!("{key}.group_size"),
                group_size,
                &MLX_GROUP_SIZES,
            )?,
            bits: one_of(path, &format!("{key}.bits"), bits, &MLX_BITS)?,
        }));
    }
    Ok(None)
}

fn one_of(
    path: &Path,
    field: &str,
    value: Option<&Value>,
    allowed: &[u64],
) -> Result<u32, CheckpointError> {
    let expected = || {
        let list: Vec<String> = allowed.iter().map(u64::to_string).collect();
        format!("one of {}", list.join(", "))
    };
    let Some(value) = value else {
        return Err(invalid(path, field, "missing", expected()));
    };
    value
        .as_u64()
        .filter(|v| allowed.contains(v))
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| invalid(path, field, show(value), expected()))
}

/// Opens the shards named by the index, each once, in order of first
/// appearance, and checks every tensor is in the shard the index names.
fn open_indexed(dir: &Path, index_path: &Path) -> Result<Vec<SafetensorsFile>, CheckpointError> {
    let text = read_json_text(index_path)?;
    let weight_map = read_weight_map(index_path, &text)?;

    let mut shard_names: Vec<&str> = Vec::new();
    let mut shard_of: HashMap<&str, usize> = HashMap::new();
    let mut placements = Vec::with_capacity(weight_map.len());
    for (tensor, shard) in &weight_map {
        let next = shard_names.len();
        let index = *shard_of.entry(shard).or_insert(next);
        if index == next {
            shard_names.push(shard);
        }
        placements.push((tensor.as_ref(), index));
    }

    let mut files = Vec::with_capacity(shard_names.len());
    for name in &shard_names {
        let file = SafetensorsFile::open(&dir.join(name)).map_err(|e| match e.kind {
            ErrorKind::Io(ref io) if io.kind() == std::io::ErrorKind::NotFound => {
                CheckpointError::new(
                    index_path,
                    ErrorKind::MissingShard {
                        shard: (*name).to_owned(),
                    },
                )
            }
            _ => e,
        })?;
        files.push(file);
    }

    // (tensor, shard index) for every tensor the shards hold.
    let mut held = HashSet::with_capacity(placements.len());
    for (index, file) in files.iter().enumerate() {
        held.extend(file.tensors.iter().map(|t| (t.name.as_str(), index)));
    }
    for (tensor, index) in placements {
        if !held.contains(&(tensor, index)) {
            let shard = shard_names.get(index).copied().unwrap_or_default();
            return Err(invalid(
                index_path,
                format!("weight_map[{}]", clip(tensor)),
                format!("{:?}", clip(shard)),
                "the shard that holds this tensor",
            ));
        }
    }
    Ok(files)
}

/// The index's `weight_map` as (tensor, shard file name) pairs in file
/// order, with repeated tensors and unsafe shard names rejected. Borrowed
/// from `text` unless the fallback parse had to unescape them.
fn read_weight_map<'a>(index_path: &Path, text: &'a str) -> Result<WeightMap<'a>, CheckpointError> {
    let pairs = match typed_weight_map(text) {
        Some(pairs) => pairs,
        None => raw_weight_map(index_path, text)?,
    };
    if pairs.is_empty() {
        return Err(invalid(index_path, "weight_map", "{}", WEIGHT_MAP));
    }

    // Found before the loop, which reports it at its position.
    let mut seen = HashSet::with_capacity(pairs.len());
    let repeat = pairs
        .iter()
        .position(|(tensor, _)| !seen.insert(tensor.as_ref()));

    let mut weight_map = Vec::with_capacity(pairs.len());
    for (i, (tensor, shard)) in pairs.into_iter().enumerate() {
        let field = || format!("weight_map[{}]", clip(&tensor));
        let shard = match shard {
            Ok(shard) => shard,
            Err(value) => {
                return Err(invalid(
                    index_path,
                    field(),
                    show(&value),
                    "a shard file name",
                ))
            }
        };
        if !is_plain_file_name(&shard) {
            return Err(invalid(
                index_path,
                field(),
                format!("{:?}", clip(&shard)),
                "a plain file name inside the checkpoint directory",
            ));
        }
        if repeat == Some(i) {
            return Err(CheckpointError::new(
                index_path,
                ErrorKind::DuplicateTensor {
                    name: tensor.into_owned(),
                },
            ));
        }
        weight_map.push((tensor, shard));
    }
    Ok(weight_map)
}

/// (tensor, shard file name) pairs.
type WeightMap<'a> = Vec<(Cow<'a, str>, Cow<'a, str>)>;

/// `weight_map` pairs before checks; a value that is not a string is kept
/// as `Err` for the message.
type RawPairs<'a> = Vec<(Cow<'a, str>, Result<Cow<'a, str>, Value>)>;

/// The fast path for the index: `weight_map` read as borrowed strings, with
/// no allocation per tensor. It accepts only an index whose `weight_map`
/// appears once and is an object of unescaped string keys and values; for
/// anything else, JSON syntax errors included, it gives `None` and
/// [`raw_weight_map`] parses the index again to report exactly what is
/// wrong. Other top-level keys are parsed as the fallback parses them.
fn typed_weight_map(text: &str) -> Option<RawPairs<'_>> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let TypedIndex(pairs) = TypedIndex::deserialize(&mut deserializer).ok()?;
    deserializer.end().ok()?;
    Some(
        pairs
            .into_iter()
            .map(|(tensor, shard)| (Cow::Borrowed(tensor), Ok(Cow::Borrowed(shard))))
            .collect(),
    )
}

/// The fallback: the index as generic JSON, every string owned.
fn raw_weight_map(index_path: &Path, text: &str) -> Result<RawPairs<'static>, CheckpointError> {
    let entries = match parse_raw::<RawJson<Value>>(index_path, INDEX, text)? {
        RawJson::Object(entries) => entries,
        RawJson::Other(kind) => {
            return Err(invalid(
                index_path,
                INDEX,
                kind,
                "a JSON object with a weight_map",
            ))
        }
    };
    let mut weight_map = None;
    for (key, value) in entries {
        if key != "weight_map" {
            continue;
        }
        if weight_map.is_some() {
            return Err(CheckpointError::new(
                index_path,
                ErrorKind::DuplicateKey { key },
            ));
        }
        weight_map = Some(value);
    }
    let pairs = match weight_map {
        Some(RawJson::Object(pairs)) => pairs,
        Some(RawJson::Other(kind)) => {
            return Err(invalid(index_path, "weight_map", kind, WEIGHT_MAP))
        }
        None => return Err(invalid(index_path, "weight_map", "missing", WEIGHT_MAP)),
    };
    Ok(pairs
        .into_iter()
        .map(|(tensor, shard)| {
            let shard = match shard {
                Value::String(shard) => Ok(Cow::Owned(shard)),
                other => Err(other),
            };
            (Cow::Owned(tensor), shard)
        })
        .collect())
}

/// The index as [`typed_weight_map`] reads it: the `weight_map` pairs.
struct TypedIndex<'a>(Vec<(&'a str, &'a str)>);

impl<'de> Deserialize<'de> for TypedIndex<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct IndexVisitor;
        impl<'de> Visitor<'de> for IndexVisitor {
            type Value = TypedIndex<'de>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an index object with one weight_map")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut weight_map = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key != "weight_map" {
                        map.next_value::<RawJson<Value>>()?;
                    } else if weight_map.is_none() {
                        weight_map = Some(map.next_value::<BorrowedPairs>()?.0);
                    } else {
                        return Err(de::Error::custom("weight_map given twice"));
                    }
                }
                weight_map
                    .map(TypedIndex)
                    .ok_or_else(|| de::Error::custom("no weight_map"))
            }
        }
        deserializer.deserialize_map(IndexVisitor)
    }
}

/// A JSON object of string values, keys and values borrowed from the text.
struct BorrowedPairs<'a>(Vec<(&'a str, &'a str)>);

impl<'de> Deserialize<'de> for BorrowedPairs<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PairsVisitor;
        impl<'de> Visitor<'de> for PairsVisitor {
            type Value = BorrowedPairs<'de>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of unescaped strings")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut pairs = Vec::new();
                while let Some(pair) = map.next_entry::<&str, &str>()? {
                    pairs.push(pair);
                }
                Ok(BorrowedPairs(pairs))
            }
        }
        deserializer.deserialize_map(PairsVisitor)
    }
}

/// A name the index may use for a shard: exactly one normal path component,
/// so `dir.join(name)` cannot leave the directory (no `..`, no separators,
/// no absolute paths or drive prefixes).
fn is_plain_file_name(name: &str) -> bool {
    if name.contains(['/', '\\', '\0']) {
        return false;
    }
    let mut components = Path::new(name).components();
    matches!(
        (components.next(), components.next()),
        (Some(Component::Normal(only)), None) if only == name
    )
}

/// Every `*.safetensors` file of `dir`, sorted by name: the fallback for
/// directories with neither an index nor `model.safetensors`.
fn safetensors_in(dir: &Path) -> Result<Vec<String>, CheckpointError> {
    let io = |e| CheckpointError::io(dir, e);
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        // Checkpoint writers use ASCII names; others cannot be shards.
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if name.ends_with(EXTENSION) && entry.path().is_file() {
            names.push(name);
        }
    }
    if names.is_empty() {
        return Err(CheckpointError::io(
            dir,
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("no safetensors weights: expected {INDEX}, {SINGLE} or *{EXTENSION} files beside {CONFIG}"),
            ),
        ));
    }
    names.sort();
    Ok(names)
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
