//! Fuzzes the GGUF header parser: no input may panic, and whatever it
//! accepts must keep the promises callers rely on (every tensor's data lies
//! inside the file, sizes are consistent).

#![no_main]

use std::path::Path;

use fathom_checkpoint::GgufFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let file_size = data.len() as u64;
    let Ok(f) = GgufFile::parse(Path::new("fuzz.gguf"), data, file_size) else {
        return;
    };
    assert!(f.alignment.is_power_of_two());
    for t in &f.tensors {
        assert_eq!(t.offset % f.alignment, 0);
        let end = f
            .data_offset
            .checked_add(t.offset)
            .and_then(|b| b.checked_add(t.n_bytes));
        assert!(end.is_some_and(|end| end <= file_size), "{t:?}");
        assert!(t.n_bytes == 0 || t.n_elements > 0);
    }
});
