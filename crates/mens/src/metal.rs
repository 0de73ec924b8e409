//! Metal backend (feature `metal`, Apple Silicon): the same model on candle's Metal device, with
//! candle's Metal kernels for quantized matmul, RMS norm, RoPE and softmax. No shader of our own:
//! nothing here can be run on this project's machines, so the backend is type-checked in CI
//! (`cargo check --target aarch64-apple-darwin --features metal`) and never measured.
//!
//! - Weights are handed to candle in their GGUF block formats (`QStorage::from_data`), once.
//! - The KV cache is one preallocated tensor per layer, written in place with `slice_set`.
//! - GQA without copies: the query heads of one KV head are one matrix, multiplied against that
//!   head's cache slice.
//! - The token embedding is read on the host from the mapped file (a row per token) instead of
//!   being expanded to f32 on the device (candle's examples do that: hundreds of MiB).
//! - Greedy sampling reads back one token id (argmax on the device).

use crate::error::{Error, Result};
use crate::gguf::TensorType;
use crate::model::{Config, Model};
use crate::rope::{RopeStyle, RopeTable};
use crate::sample::Sampler;
use crate::weights::QTensor;
use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor as CandleQ};
use candle_core::{DType, Device, Module, Tensor, D};
use std::borrow::Cow;
use std::sync::Arc;

fn be(e: candle_core::Error) -> Error {
    Error::Backend(format!("Metal: {e}"))
}

fn ggml(t: TensorType) -> GgmlDType {
    match t {
        TensorType::F32 => GgmlDType::F32,
        TensorType::F16 => GgmlDType::F16,
        TensorType::BF16 => GgmlDType::BF16,
        TensorType::Q4_0 => GgmlDType::Q4_0,
        TensorType::Q4_1 => GgmlDType::Q4_1,
        TensorType::Q5_0 => GgmlDType::Q5_0,
        TensorType::Q5_1 => GgmlDType::Q5_1,
        TensorType::Q8_0 => GgmlDType::Q8_0,
        TensorType::Q2K => GgmlDType::Q2K,
        TensorType::Q3K => GgmlDType::Q3K,
        TensorType::Q4K => GgmlDType::Q4K,
        TensorType::Q5K => GgmlDType::Q5K,
        TensorType::Q6K => GgmlDType::Q6K,
    }
}

fn qmat(dev: &Device, t: &QTensor) -> Result<QMatMul> {
    let st = QStorage::from_data(Cow::Borrowed(t.data()), dev, ggml(t.ttype)).map_err(be)?;
    QMatMul::from_qtensor(CandleQ::new(st, (t.rows, t.cols)).map_err(be)?).map_err(be)
}

fn vector(dev: &Device, v: &[f32]) -> Result<Tensor> {
    Tensor::from_slice(v, v.len(), dev).map_err(be)
}

struct Layer {
    attn_norm: Tensor,
    q: QMatMul,
    k: QMatMul,
    v: QMatMul,
    /// Q, K and V biases (Qwen2).
    bias: Option<(Tensor, Tensor, Tensor)>,
    o: QMatMul,
    ffn_norm: Tensor,
    gate: QMatMul,
    up: QMatMul,
    down: QMatMul,
}

/// The model's weights on the Metal device.
pub struct MetalModel {
    pub device: Device,
    pub host: Arc<Model>,
    layers: Vec<Layer>,
    output_norm: Tensor,
    output: QMatMul,
}

impl MetalModel {
    /// The default Metal device, or a clear error on a machine without one.
    pub fn device() -> Result<Device> {
        Device::new_metal(0).map_err(|e| Error::Backend(format!("no Metal device was found ({e})")))
    }

    pub fn upload(device: Device, m: Arc<Model>) -> Result<Self> {
        let c = &m.config;
        if m.layers.iter().any(|l| l.qk_norm.is_some()) {
            return Err(Error::Model(format!(
                "{:?} (per-head Q/K norms) runs on the CPU backend only so far: use --backend cpu",
                c.arch
            )));
        }
        if let Some(f) = c.cpu_only_feature() {
            return Err(Error::Model(format!(
                "{:?} ({f}) runs on the CPU backend only so far: use --backend cpu",
                c.arch
            )));
        }
        let (qd, kd) = (c.q_dim(), c.kv_dim());
        let mut layers = Vec::with_capacity(c.n_layer);
        for l in &m.layers {
            let bias = match &l.qkv_bias {
                Some(b) => Some((
                    vector(&device, &b[..qd])?,
                    vector(&device, &b[qd..qd + kd])?,
                    vector(&device, &b[qd + kd..])?,
                )),
                None => None,
            };
            layers.push(Layer {
                attn_norm: vector(&device, &l.attn_norm)?,
                q: qmat(&device, &l.q)?,
                k: qmat(&device, &l.k)?,
                v: qmat(&device, &l.v)?,
                bias,
                o: qmat(&device, &l.o)?,
                ffn_norm: vector(&device, &l.ffn_norm)?,
                gate: qmat(&device, &l.gate)?,
                up: qmat(&device, &l.up)?,
                down: qmat(&device, &l.down)?,
            });
        }
        Ok(MetalModel {
            output_norm: vector(&device, &m.output_norm)?,
            output: qmat(&device, &m.output)?,
            layers,
            device,
            host: m,
        })
    }

    fn config(&self) -> &Config {
        &self.host.config
    }
}

/// One sequence on the Metal device.
pub struct MetalSession {
    pub model: Arc<MetalModel>,
    ctx: usize,
    tokens: Vec<u32>,
    /// Per layer, [1, n_kv_head, ctx, head_dim] (f32), allocated once.
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    cos: Tensor,
    sin: Tensor,
    /// The last position's logits, on the device.
    logits: Option<Tensor>,
    host_logits: Vec<f32>,
    embed_rows: Vec<f32>,
}

/// Bytes of a Metal session's KV cache (f32 entries).
pub fn kv_cache_bytes(c: &Config, ctx: usize) -> u64 {
    (2 * c.n_layer * ctx * c.kv_dim() * 4) as u64
}

impl MetalSession {
    pub fn new(model: Arc<MetalModel>, ctx: usize) -> Result<Self> {
        let c = model.config().clone();
        if ctx == 0 {
            return Err(Error::InvalidArgument("context must be > 0".into()));
        }
        let dev = &model.device;
        let shape = (1, c.n_kv_head, ctx, c.head_dim);
        let zeros = || Tensor::zeros(shape, DType::F32, dev).map_err(be);
        let k = (0..c.n_layer)
            .map(|_| zeros())
            .collect::<Result<Vec<_>>>()?;
        let v = (0..c.n_layer)
            .map(|_| zeros())
            .collect::<Result<Vec<_>>>()?;
        let rope = RopeTable::of(&model.host, ctx);
        let half = c.head_dim / 2;
        let cos = Tensor::from_slice(&rope.cos, (ctx, half), dev).map_err(be)?;
        let sin = Tensor::from_slice(&rope.sin, (ctx, half), dev).map_err(be)?;
        Ok(MetalSession {
            ctx,
            tokens: Vec::with_capacity(ctx),
            k,
            v,
            cos,
            sin,
            logits: None,
            host_logits: vec![0f32; c.vocab_size],
            embed_rows: Vec::new(),
            model,
        })
    }

    fn check(&self, tokens: &[u32]) -> Result<()> {
        crate::runner::check_tokens(
            self.tokens.len(),
            self.ctx,
            tokens,
            self.model.config().vocab_size,
        )
    }

    /// Run `tokens` after the cached ones; leaves the last position's logits on the device.
    fn run(&mut self, tokens: &[u32]) -> Result<()> {
        let m = self.model.clone();
        let c = m.config();
        let dev = &m.device;
        let (t, d, hd) = (tokens.len(), c.dim, c.head_dim);
        let (nh, nkv) = (c.n_head, c.n_kv_head);
        let g = nh / nkv;
        let pos0 = self.tokens.len();
        let len = pos0 + t;
        // Embedding rows from the mapped file.
        self.embed_rows.resize(t * d, 0.0);
        for (i, &tok) in tokens.iter().enumerate() {
            m.host
                .embedding
                .dequantize_row(tok as usize, &mut self.embed_rows[i * d..(i + 1) * d]);
        }
        let mut x = Tensor::from_slice(&self.embed_rows, (1, t, d), dev).map_err(be)?;
        let cos = self.cos.narrow(0, pos0, t).map_err(be)?;
        let sin = self.sin.narrow(0, pos0, t).map_err(be)?;
        let scale = 1.0 / (hd as f64).sqrt();
        // Causal mask for a prompt chunk: query i sees keys 0..=pos0 + i.
        let mask = if t > 1 {
            let mut m = vec![0f32; t * len];
            for i in 0..t {
                for j in pos0 + i + 1..len {
                    m[i * len + j] = f32::NEG_INFINITY;
                }
            }
            Some(Tensor::from_slice(&m, (1, 1, t, len), dev).map_err(be)?)
        } else {
            None
        };
        let rope = |x: &Tensor| -> Result<Tensor> {
            match c.rope_style {
                RopeStyle::Neox => candle_nn::rotary_emb::rope(x, &cos, &sin),
                RopeStyle::Normal => candle_nn::rotary_emb::rope_i(x, &cos, &sin),
            }
            .map_err(be)
        };
        for (li, l) in m.layers.iter().enumerate() {
            let h = candle_nn::ops::rms_norm(&x, &l.attn_norm, c.rms_eps).map_err(be)?;
            let mut q = l.q.forward(&h).map_err(be)?;
            let mut k = l.k.forward(&h).map_err(be)?;
            let mut v = l.v.forward(&h).map_err(be)?;
            if let Some((bq, bk, bv)) = &l.bias {
                q = q.broadcast_add(bq).map_err(be)?;
                k = k.broadcast_add(bk).map_err(be)?;
                v = v.broadcast_add(bv).map_err(be)?;
            }
            let heads = |x: Tensor, n: usize| -> Result<Tensor> {
                x.reshape((1, t, n, hd))
                    .and_then(|x| x.transpose(1, 2))
                    .and_then(|x| x.contiguous())
                    .map_err(be)
            };
            let q = rope(&heads(q, nh)?)?;
            let k = rope(&heads(k, nkv)?)?;
            let v = heads(v, nkv)?;
            // Into the preallocated cache, in place.
            self.k[li].slice_set(&k, 2, pos0).map_err(be)?;
            self.v[li].slice_set(&v, 2, pos0).map_err(be)?;
            let kc = self.k[li]
                .narrow(2, 0, len)
                .map_err(be)?
                .squeeze(0)
                .map_err(be)?;
            let vc = self.v[li]
                .narrow(2, 0, len)
                .map_err(be)?
                .squeeze(0)
                .map_err(be)?;
            // [nh, t, hd] = [nkv, g * t, hd]: each KV head's queries as one matrix.
            let qg = q.reshape((nkv, g * t, hd)).map_err(be)?;
            let mut att = qg
                .matmul(&kc.transpose(1, 2).map_err(be)?)
                .and_then(|a| a.affine(scale, 0.0))
                .map_err(be)?;
            if let Some(mask) = &mask {
                att = att
                    .reshape((nkv, g, t, len))
                    .and_then(|a| a.broadcast_add(mask.squeeze(0)?.squeeze(0)?.as_ref()))
                    .and_then(|a| a.reshape((nkv, g * t, len)))
                    .map_err(be)?;
            }
            let att = candle_nn::ops::softmax_last_dim(&att).map_err(be)?;
            let o = att
                .matmul(&vc)
                .and_then(|o| o.reshape((1, nh, t, hd)))
                .and_then(|o| o.transpose(1, 2))
                .and_then(|o| o.reshape((1, t, nh * hd)))
                .map_err(be)?;
            x = (x + l.o.forward(&o).map_err(be)?).map_err(be)?;
            let h = candle_nn::ops::rms_norm(&x, &l.ffn_norm, c.rms_eps).map_err(be)?;
            let gate = l.gate.forward(&h).and_then(|g| g.silu()).map_err(be)?;
            let up = l.up.forward(&h).map_err(be)?;
            let ffn = l.down.forward(&(gate * up).map_err(be)?).map_err(be)?;
            x = (x + ffn).map_err(be)?;
        }
        let last = x.narrow(1, t - 1, 1).map_err(be)?;
        let h = candle_nn::ops::rms_norm(&last, &m.output_norm, c.rms_eps).map_err(be)?;
        self.logits = Some(
            m.output
                .forward(&h)
                .and_then(|l| l.flatten_all())
                .map_err(be)?,
        );
        self.tokens.extend_from_slice(tokens);
        Ok(())
    }

    fn host_logits(&mut self) -> Result<&[f32]> {
        let l = self
            .logits
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument("no forward pass yet".into()))?;
        self.host_logits = l.to_vec1::<f32>().map_err(be)?;
        Ok(&self.host_logits)
    }
}

impl crate::runner::Runner for MetalSession {
    fn ctx(&self) -> usize {
        self.ctx
    }
    fn sibling(&self, ctx: usize) -> Result<Box<dyn crate::runner::Runner>> {
        Ok(Box::new(MetalSession::new(self.model.clone(), ctx)?))
    }
    fn max_step_tokens(&self) -> usize {
        self.ctx
    }
    fn slot_tokens(&self, _slot: usize) -> &[u32] {
        &self.tokens
    }
    fn step(&mut self, parts: &mut [crate::runner::Part]) -> Result<()> {
        crate::runner::no_hidden(parts, "metal")?;
        let p = crate::runner::single(parts)?;
        let tokens = p.tokens;
        self.check(tokens)?;
        let Some(from) = p.logits.start() else {
            return self.run(tokens);
        };
        let from = from.min(tokens.len());
        if from > 0 {
            self.run(&tokens[..from])?;
        }
        for (i, &t) in tokens.iter().enumerate().skip(from) {
            self.run(&[t])?;
            p.logits.give(i, self.host_logits()?);
        }
        Ok(())
    }
    fn sample_slot(&mut self, _slot: usize, sampler: &mut Sampler) -> Result<u32> {
        if sampler.is_greedy() && !sampler.needs_logits() {
            // One id read back.
            let l = self
                .logits
                .as_ref()
                .ok_or_else(|| Error::InvalidArgument("no forward pass yet".into()))?;
            return l
                .argmax(D::Minus1)
                .and_then(|i| i.to_scalar::<u32>())
                .map_err(be);
        }
        self.host_logits()?;
        sampler.sample(&mut self.host_logits, &self.tokens)
    }
    fn truncate_slot(&mut self, _slot: usize, n: usize) {
        self.tokens.truncate(n);
        self.logits = None;
    }
    fn memory(&self) -> crate::runner::Memory {
        crate::runner::Memory {
            kv_cache: kv_cache_bytes(self.model.config(), self.ctx) as usize,
            buffers: 2 * self.ctx * self.model.config().head_dim / 2 * 4,
        }
    }
}
