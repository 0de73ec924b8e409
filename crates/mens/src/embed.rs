//! Embeddings: a sequence's final hidden states (after the output norm, before the LM head) pooled
//! into one vector and normalised, as llama.cpp's `--embeddings` computes them (`build_pooling` over
//! `result_norm`; the server's `common_embd_normalize`).

use crate::error::{Error, Result};

/// How a sequence's rows become one vector (llama.cpp's `--pooling`; a GGUF's
/// `{arch}.pooling_type`: 0 none, 1 mean, 2 cls, 3 last).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// Every token's row (llama-server's `/embedding` only).
    None,
    /// The mean of the rows.
    Mean,
    /// The first token's row.
    Cls,
    /// The last token's row (decoder embedding models: Qwen3-Embedding).
    Last,
}

impl Pooling {
    /// A GGUF's `pooling_type` value; None for an unknown one (rank: a reranker's head).
    pub fn from_gguf(v: u64) -> Option<Pooling> {
        match v {
            0 => Some(Pooling::None),
            1 => Some(Pooling::Mean),
            2 => Some(Pooling::Cls),
            3 => Some(Pooling::Last),
            _ => None,
        }
    }

    pub fn parse(s: &str) -> Result<Pooling> {
        match s {
            "none" => Ok(Pooling::None),
            "mean" => Ok(Pooling::Mean),
            "cls" => Ok(Pooling::Cls),
            "last" => Ok(Pooling::Last),
            _ => Err(Error::InvalidArgument(format!(
                "pooling {s:?}: expected none, mean, cls or last"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pooling::None => "none",
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }
}

/// Scale `v` in place as llama-server's `embd_normalize`: -1 none, 0 max-abs to the int16 range,
/// 2 Euclidean (the default), p > 0 the p-norm (sums in f64, as llama.cpp).
pub fn normalize(v: &mut [f32], p: i32) {
    let sum: f64 = match p {
        -1 => 1.0,
        0 => v.iter().fold(0f64, |m, &x| m.max(x.abs() as f64)) / 32760.0,
        2 => v
            .iter()
            .map(|&x| (x as f64) * (x as f64))
            .sum::<f64>()
            .sqrt(),
        p => v
            .iter()
            .map(|&x| (x.abs() as f64).powi(p))
            .sum::<f64>()
            .powf(1.0 / p as f64),
    };
    let norm = if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 };
    v.iter_mut().for_each(|x| *x *= norm);
}

/// A request's pooled rows, fed position by position as the prefill passes hand them over.
#[derive(Debug, Clone)]
pub struct Pool {
    pub pooling: Pooling,
    /// Mean: the running sum (f64); cls, last: the row; none: every row.
    acc: Vec<f64>,
    rows: Vec<f32>,
    n: usize,
}

impl Pool {
    pub fn new(pooling: Pooling) -> Pool {
        Pool {
            pooling,
            acc: Vec::new(),
            rows: Vec::new(),
            n: 0,
        }
    }

    /// Start again (a preempted request feeds its prompt anew).
    pub fn clear(&mut self) {
        self.acc.clear();
        self.rows.clear();
        self.n = 0;
    }

    /// Position `i`'s row; positions come in order, each once.
    pub fn add(&mut self, i: usize, row: &[f32]) {
        match self.pooling {
            Pooling::Mean => {
                if self.acc.is_empty() {
                    self.acc.resize(row.len(), 0.0);
                }
                self.acc
                    .iter_mut()
                    .zip(row)
                    .for_each(|(a, &x)| *a += x as f64);
            }
            Pooling::Cls if i == 0 => self.rows = row.to_vec(),
            Pooling::Cls => {}
            Pooling::Last => {
                self.rows.clear();
                self.rows.extend_from_slice(row);
            }
            Pooling::None => self.rows.extend_from_slice(row),
        }
        self.n += 1;
    }

    /// Rows fed so far.
    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The pooled vector (none: the rows one after another), not normalised.
    pub fn finish(&mut self) -> Vec<f32> {
        match self.pooling {
            Pooling::Mean => {
                let n = self.n.max(1) as f64;
                self.acc.iter().map(|&a| (a / n) as f32).collect()
            }
            _ => std::mem::take(&mut self.rows),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_and_norms_follow_llama_cpp() {
        let rows = [[1.0f32, -2.0], [3.0, 4.0], [-1.0, 0.5]];
        let pooled = |p| {
            let mut pool = Pool::new(p);
            for (i, r) in rows.iter().enumerate() {
                pool.add(i, r);
            }
            assert_eq!(pool.len(), 3);
            pool.finish()
        };
        assert_eq!(pooled(Pooling::Mean), vec![1.0, 2.5 / 3.0]);
        assert_eq!(pooled(Pooling::Cls), vec![1.0, -2.0]);
        assert_eq!(pooled(Pooling::Last), vec![-1.0, 0.5]);
        assert_eq!(pooled(Pooling::None), vec![1.0, -2.0, 3.0, 4.0, -1.0, 0.5]);

        let mut v = vec![3.0f32, -4.0];
        normalize(&mut v, 2);
        assert_eq!(v, vec![0.6, -0.8]);
        // Taxicab: each value times 1/7 (llama.cpp multiplies by the norm's inverse).
        let mut v = vec![3.0f32, -4.0];
        normalize(&mut v, 1);
        assert_eq!(
            v,
            vec![3.0 * (1.0f64 / 7.0) as f32, -4.0 * (1.0f64 / 7.0) as f32]
        );
        assert!((v[0] - 3.0 / 7.0).abs() < 1e-7);
        let mut v = vec![3.0f32, -4.0];
        normalize(&mut v, 3);
        let p3 = (27.0f64 + 64.0).powf(1.0 / 3.0);
        assert_eq!(v, vec![3.0 * (1.0 / p3) as f32, -4.0 * (1.0 / p3) as f32]);
        let mut v = vec![3.0f32, -4.0];
        normalize(&mut v, 0);
        assert_eq!(v, vec![3.0 * 8190.0, -32760.0]);
        let mut v = vec![3.0f32, -4.0];
        normalize(&mut v, -1);
        assert_eq!(v, vec![3.0, -4.0]);
        let mut z = vec![0.0f32; 3];
        normalize(&mut z, 2);
        assert_eq!(z, vec![0.0; 3]);
        assert_eq!(Pooling::parse("last").unwrap(), Pooling::Last);
        assert!(Pooling::parse("rank").is_err());
        assert_eq!(Pooling::from_gguf(1), Some(Pooling::Mean));
        assert_eq!(Pooling::from_gguf(4), None);
    }
}
