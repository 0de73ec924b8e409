//! Fuzz request parsing and chat rendering: a request body for `/v1/chat/completions` (first byte
//! even) or `/v1/completions` against the micro Qwen2 model's tokenizer and ChatML template, in
//! process. Any panic, abort or out-of-memory is a bug; an error answer is fine.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mens::chat::ChatTemplate;
use mens::gguf::Gguf;
use mens::tokenizer::Tokenizer;
use std::sync::OnceLock;

fn model() -> &'static (Tokenizer, ChatTemplate) {
    static M: OnceLock<(Tokenizer, ChatTemplate)> = OnceLock::new();
    M.get_or_init(|| {
        let g = Gguf::from_bytes(include_bytes!("../seeds/micro-qwen2.gguf").to_vec()).unwrap();
        let tok = Tokenizer::from_gguf(&g).unwrap();
        let t = ChatTemplate::from_gguf(&g, &tok).unwrap();
        (tok, t)
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, body)) = data.split_first() else { return };
    let (tok, t) = model();
    let _ = mens_server::prepare(first % 2 == 0, body, tok, t, 512);
});
