//! OpenAI request bodies: the first byte picks the route, the rest is the
//! body. Parsing must give a request or a 4xx error, never a panic.

#![no_main]

use fathom_server::api::{parse, Route};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&first, body)) = data.split_first() else {
        return;
    };
    let route = if first & 1 == 0 {
        Route::Chat
    } else {
        Route::Completion
    };
    if let Err(e) = parse(route, body, 1) {
        assert!((400..500).contains(&e.status), "{e:?}");
        assert!(!e.message.is_empty());
    }
});
