//! The model on the device: every weight uploaded once in its GGUF block format.

use super::*;
use std::collections::HashMap;
use std::sync::OnceLock;

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
    /// Mixture of experts (Qwen3-MoE): the router, in the file's layout; `gate`, `up` and `down`
    /// then hold every expert's rows stacked (expert e's from row e · ffn_dim, or e · dim).
    pub(super) router: Option<Mat>,
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
    /// An f16 copy of the layers' matrices ([`GpuModel::make_f16_copy`]), when one was made.
    f16: OnceLock<F16Copy>,
}

/// The layers' matrices dequantized to f16 once, stacked as the GEMMs read them (Q/K/V, O,
/// gate/up, down): the cuBLAS steps then skip the per-step dequantization (about 8 ms of a
/// 64-row 7B step on the H200) and read the copy with the same bits.
struct F16Copy {
    /// First matrix's device pointer → (matrices stacked, the copy's device pointer).
    by_first: HashMap<u64, (usize, u64)>,
    _bufs: Vec<Buf>,
    bytes: usize,
}

/// A layer's matrices as the GEMMs stack them (an expert layer's FFN runs its own kernels:
/// attention's only).
fn gemm_groups(l: &GpuLayer) -> Vec<Vec<&Mat>> {
    let mut g = vec![vec![&l.q, &l.k, &l.v], vec![&l.o]];
    if l.router.is_none() {
        g.extend([vec![&l.gate, &l.up], vec![&l.down]]);
    }
    g
}

fn group_bytes(g: &[&Mat]) -> usize {
    g.iter().map(|m| 2 * m.seg.rows as usize * m.cols).sum()
}

impl GpuModel {
    /// Upload `m`'s weights (once, quantized as stored). `progress` is called after each layer.
    pub fn upload(dev: Arc<Device>, m: &Model, mut progress: impl FnMut(usize)) -> Result<Self> {
        let c = &m.config;
        let g = c.n_head / c.n_kv_head;
        if let Some(f) = c.cuda_missing_feature() {
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
        if !c.dim.is_multiple_of(32) || !c.ffn_dim.is_multiple_of(32) {
            return Err(Error::Model(
                "the CUDA backend needs dimensions that are multiples of 32".into(),
            ));
        }
        // The GGUF bytes, and the GPU layouts' row padding where the upload repacks.
        let tied = m.gguf.tensor("output.weight").is_none();
        let mut mats = vec![&m.embedding];
        if !tied {
            mats.push(&m.output);
        }
        for l in &m.layers {
            mats.extend([&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down]);
        }
        let pad: u64 = if repack_on() {
            mats.iter().map(|t| repack::padding(t)).sum()
        } else {
            0
        };
        let need = m.weight_bytes() + pad;
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
                // The file's layout (the router kernel reads every type but the repacked ones).
                router: match &l.moe {
                    Some(moe) => Some(Mat::upload_as(&dev, &moe.router, false)?),
                    None => None,
                },
            });
            progress(i + 1);
        }
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
            f16: OnceLock::new(),
            config: c.clone(),
            dev,
        })
    }

    /// Bytes an f16 copy of the layers' matrices takes.
    pub fn f16_copy_bytes(&self) -> usize {
        let groups = self.layers.iter().map(gemm_groups);
        groups
            .flat_map(|g| g.into_iter().map(|m| group_bytes(&m)))
            .sum()
    }

    /// Make the f16 copy of the layers' matrices, if it fits with `keep_free` bytes of device
    /// memory left beside it: its size, or None where it does not fit (nothing allocated).
    /// Made once; later calls give the size of the copy made.
    pub fn make_f16_copy(&self, keep_free: u64) -> Result<Option<usize>> {
        if let Some(c) = self.f16.get() {
            return Ok(Some(c.bytes));
        }
        let bytes = self.f16_copy_bytes();
        let (free, _) = self.dev.mem_info()?;
        if bytes as u64 + keep_free > free {
            return Ok(None);
        }
        let dev = &self.dev;
        let (mut by_first, mut bufs) = (HashMap::new(), Vec::new());
        for l in &self.layers {
            for g in gemm_groups(l) {
                let buf = dev.alloc(group_bytes(&g))?;
                let mut at = 0;
                for m in &g {
                    let chunks = m.seg.rows as usize * m.cols / 32;
                    launch!(dev, dequant_f16, (chunks.div_ceil(256) as u32, 1), 256;
                        m.seg, m.cols as i32, buf.at(at))?;
                    at += 2 * m.seg.rows as usize * m.cols;
                }
                by_first.insert(g[0].seg.w, (g.len(), buf.ptr));
                bufs.push(buf);
            }
        }
        dev.sync()?;
        let _ = self.f16.set(F16Copy {
            by_first,
            _bufs: bufs,
            bytes,
        });
        Ok(Some(bytes))
    }

    /// Whether an f16 copy of the layers' matrices was made.
    pub fn has_f16_copy(&self) -> bool {
        self.f16.get().is_some()
    }

    /// The f16 copy of `mats` stacked (as [`gemm_groups`] stacks them), if one was made.
    pub(super) fn f16_of(&self, mats: &[&Mat]) -> Option<u64> {
        let &(n, ptr) = self.f16.get()?.by_first.get(&mats.first()?.seg.w)?;
        (n == mats.len()).then_some(ptr)
    }

    pub(super) fn head(&self) -> &Mat {
        self.output.as_ref().unwrap_or(&self.embedding)
    }
}
