// Debug helper: every position's logits of a token sequence (CPU, one prefill pass), as raw f32
// rows to a file. Usage: logits_all MODEL IDS OUT
use mens::cpu::{Session, SessionOptions};
use mens::runner::Logits;
use std::io::Write;
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let model = std::sync::Arc::new(mens::model::Model::open(a[1].as_ref()).unwrap());
    let ids: Vec<u32> = a[2].split(',').map(|x| x.trim().parse().unwrap()).collect();
    let mut s = Session::new(
        model,
        SessionOptions {
            ctx: 1024,
            batch: 512,
            logit_rows: 512,
            ..Default::default()
        },
    )
    .unwrap();
    let mut f = std::fs::File::create(&a[3]).unwrap();
    s.forward(
        &ids,
        Logits::All {
            from: 0,
            f: &mut |_, l| {
                let b: Vec<u8> = l.iter().flat_map(|x| x.to_le_bytes()).collect();
                f.write_all(&b).unwrap();
            },
        },
    )
    .unwrap();
}
