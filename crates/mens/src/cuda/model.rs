//! The model on the device: every weight uploaded once in its GGUF block format.

use super::*;

pub(super) struct GpuLayer {
    pub(super) attn_norm: Buf,
    pub(super) q: Mat,
    pub(super) k: Mat,
    pub(super) v: Mat,
    pub(super) bias: Option<Buf>,
    /// Per-head RMSNorm weights of Q and K (Qwen3).
    pub(super) qk_norm: Option<(Buf, Buf)>,
    pub(super) o: Mat,
    pub(super) ffn_norm: Buf,
    pub(super) gate: Mat,
    pub(super) up: Mat,
    pub(super) down: Mat,
}

/// The model's weights on one GPU.
pub struct GpuModel {
    pub dev: Arc<Device>,
    pub config: Config,
    pub(super) embedding: Mat,
    /// None when tied to the embedding.
    pub(super) output: Option<Mat>,
    pub(super) output_norm: Buf,
    pub(super) layers: Vec<GpuLayer>,
    pub weight_bytes: u64,
    /// RoPE frequency divisors (Llama 3.1), for the session's cos/sin table.
    pub rope_freqs: Option<Vec<f32>>,
}

impl GpuModel {
    /// Upload `m`'s weights (once, quantized as stored). `progress` is called after each layer.
    pub fn upload(dev: Arc<Device>, m: &Model, mut progress: impl FnMut(usize)) -> Result<Self> {
        let c = &m.config;
        let g = c.n_head / c.n_kv_head;
        if let Some(f) = c.cpu_only_feature() {
            return Err(Error::Model(format!(
                "{:?} ({f}) runs on the CPU backend only so far: use --backend cpu",
                c.arch
            )));
        }
        if !(c.head_dim == 64 || c.head_dim == 128) || g > MAXG {
            return Err(Error::Model(format!(
                "the CUDA backend supports head dimensions 64 and 128 and at most {MAXG} query heads per KV head (this model: {} and {g})",
                c.head_dim
            )));
        }
        if c.n_kv_head > 64 {
            return Err(Error::Model(
                "the CUDA backend supports at most 64 KV heads".into(),
            ));
        }
        if c.dim % 32 != 0 || c.ffn_dim % 32 != 0 {
            return Err(Error::Model(
                "the CUDA backend needs dimensions that are multiples of 32".into(),
            ));
        }
        let need = m.weight_bytes();
        let (free, _) = dev.mem_info()?;
        if need > free {
            return Err(Error::Memory(format!(
                "the weights need {} MiB but {} has {} MiB free",
                need >> 20,
                dev.name,
                free >> 20
            )));
        }
        let mut layers = Vec::with_capacity(c.n_layer);
        for (i, l) in m.layers.iter().enumerate() {
            layers.push(GpuLayer {
                attn_norm: dev.upload(&l.attn_norm)?,
                q: Mat::upload(&dev, &l.q)?,
                k: Mat::upload(&dev, &l.k)?,
                v: Mat::upload(&dev, &l.v)?,
                bias: l.qkv_bias.as_ref().map(|b| dev.upload(b)).transpose()?,
                qk_norm: match &l.qk_norm {
                    Some((q, k)) => Some((dev.upload(q)?, dev.upload(k)?)),
                    None => None,
                },
                o: Mat::upload(&dev, &l.o)?,
                ffn_norm: dev.upload(&l.ffn_norm)?,
                gate: Mat::upload(&dev, &l.gate)?,
                up: Mat::upload(&dev, &l.up)?,
                down: Mat::upload(&dev, &l.down)?,
            });
            progress(i + 1);
        }
        let tied = m.gguf.tensor("output.weight").is_none();
        Ok(GpuModel {
            embedding: Mat::upload(&dev, &m.embedding)?,
            output: if tied {
                None
            } else {
                Some(Mat::upload(&dev, &m.output)?)
            },
            output_norm: dev.upload(&m.output_norm)?,
            layers,
            weight_bytes: need,
            rope_freqs: m.rope_freqs.clone(),
            config: c.clone(),
            dev,
        })
    }

    pub(super) fn head(&self) -> &Mat {
        self.output.as_ref().unwrap_or(&self.embedding)
    }
}
