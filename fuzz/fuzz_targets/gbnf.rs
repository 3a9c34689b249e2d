//! GBNF grammars (the `grammar` request field): conversion to Lark gives
//! Lark text or an error message, never a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = fathom_server::gbnf::to_lark(text) {
        assert!(!e.is_empty());
    }
});
