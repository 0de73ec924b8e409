//! Fuzz the whole load path of an untrusted GGUF file: header, metadata, tensor table, tokenizer,
//! chat template, model. Any panic, abort or out-of-memory is a bug; errors are fine.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = mens::load_untrusted(data);
});
