//! Feeds arbitrary bytes to the safetensors header parser: any input must
//! yield `Ok` or a typed error, never a panic, hang or huge allocation.

#![no_main]

use std::path::Path;

use fathom_checkpoint::SafetensorsFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = SafetensorsFile::parse(Path::new("fuzz.safetensors"), data, data.len() as u64);
});
