//! Response heads as the server's connection wrapper sees them: hyper's
//! bare parse-error answers are replaced by the same status with an OpenAI
//! error body. Any input gives no replacement or a well-formed one, never
//! a panic.

#![no_main]

use fathom_server::wire::replacement;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(out) = replacement(data) {
        let text = std::str::from_utf8(&out).expect("the replacement is UTF-8");
        let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
        assert!(head.starts_with("HTTP/1."));
        assert!(head.contains(&format!("content-length: {}\r\n", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
        assert!(v["error"]["code"].is_string());
    }
});
