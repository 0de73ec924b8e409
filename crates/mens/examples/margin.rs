// Debug helper: top-2 logits at each teacher-forced position of a reference continuation.
use mens::cpu::{Session, SessionOptions};
use mens::runner::Logits;
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let model = std::sync::Arc::new(mens::model::Model::open(a[1].as_ref()).unwrap());
    let ids = |s: &str| {
        s.split(',')
            .map(|x| x.trim().parse::<u32>().unwrap())
            .collect::<Vec<_>>()
    };
    let (prompt, cont) = (ids(&a[2]), ids(&a[3]));
    let mut s = Session::new(
        model,
        SessionOptions {
            ctx: 256,
            batch: 256,
            logit_rows: 16,
            ..Default::default()
        },
    )
    .unwrap();
    let mut seq = prompt.clone();
    seq.extend_from_slice(&cont[..cont.len() - 1]);
    s.forward(
        &seq,
        Logits::All {
            from: prompt.len() - 1,
            f: &mut |i, l| {
                let mut v: Vec<(f32, usize)> = l.iter().cloned().zip(0..).collect();
                v.sort_by(|x, y| y.0.total_cmp(&x.0));
                let j = i + 1 - prompt.len();
                let mark = if v[0].1 as u32 != cont[j] {
                    "  <-- differs"
                } else {
                    ""
                };
                println!(
                    "{j:3} ref {:6} top {:6} {:.4} second {:6} {:.4} margin {:.4}{mark}",
                    cont[j],
                    v[0].1,
                    v[0].0,
                    v[1].1,
                    v[1].0,
                    v[0].0 - v[1].0
                );
            },
        },
    )
    .unwrap();
}
