//! Fuzz chat templates: the input is a template source, a NUL, then message contents separated by
//! NULs; rendered and tokenized in process with the micro Qwen2 model's tokenizer (fuel and output
//! caps apply; memory is bounded by the helper process in the shipped binary, not here).
#![no_main]
use libfuzzer_sys::fuzz_target;
use mens::chat::{ChatTemplate, Message};
use mens::gguf::Gguf;
use mens::tokenizer::Tokenizer;
use std::sync::OnceLock;

fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let g = Gguf::from_bytes(include_bytes!("../seeds/micro-qwen2.gguf").to_vec()).unwrap();
        Tokenizer::from_gguf(&g).unwrap()
    })
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.split('\0');
    let source = parts.next().unwrap_or_default().to_string();
    let roles = ["system", "user", "assistant", "tool"];
    let msgs: Vec<Message> = parts
        .enumerate()
        .map(|(i, c)| Message::new(roles[i % roles.len()], c))
        .collect();
    let t = ChatTemplate::new(Some(source), "<s>".into(), "</s>".into());
    let _ = t.tokens(tokenizer(), &msgs, true, 4096);
});
