//! Rotary position embeddings: how a head's dimensions are paired, and the cos/sin table every
//! backend builds once per session.

/// The largest head dimension the kernels take (attention keeps a head's accumulator on the stack).
pub const MAX_HEAD_DIM: usize = 256;

/// How rotary embeddings pair the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs (i, i + d/2): GPT-NeoX and Qwen2.
    Neox,
    /// Pairs (2i, 2i+1): Llama as converted to GGUF.
    Normal,
}

/// cos/sin for every (position, frequency): [ctx, head_dim/2] each. Built once per session.
pub struct RopeTable {
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    half: usize,
}

impl RopeTable {
    /// `factors` (Llama 3.1's `rope_freqs`): pair i's frequency is divided by `factors[i]`.
    pub fn new(ctx: usize, head_dim: usize, base: f32, factors: Option<&[f32]>) -> Self {
        Self::scaled(ctx, head_dim, base, factors, 1.0)
    }

    /// The table of a model's global layers: its base, frequency factors and linear scaling.
    pub fn of(m: &crate::model::Model, ctx: usize) -> Self {
        let c = &m.config;
        Self::scaled(
            ctx,
            c.head_dim,
            c.rope_base,
            m.rope_freqs.as_deref(),
            c.rope_scale,
        )
    }

    /// The table of a model's sliding-window layers (their own base, no scaling), if it has any.
    pub fn of_sliding(m: &crate::model::Model, ctx: usize) -> Option<Self> {
        let c = &m.config;
        let s = c.sliding.as_ref()?;
        Some(Self::new(ctx, c.head_dim, s.rope_base, None))
    }

    /// As [`Self::new`], positions multiplied by `scale` (linear RoPE scaling; 1 = none).
    pub fn scaled(
        ctx: usize,
        head_dim: usize,
        base: f32,
        factors: Option<&[f32]>,
        scale: f32,
    ) -> Self {
        let half = head_dim / 2;
        let mut cos = vec![0f32; ctx * half];
        let mut sin = vec![0f32; ctx * half];
        for p in 0..ctx {
            for i in 0..half {
                let div = factors.map_or(1.0, |f| f[i] as f64);
                let freq = 1.0 / (base as f64).powf(2.0 * i as f64 / head_dim as f64) / div;
                let a = p as f64 * scale as f64 * freq;
                cos[p * half + i] = a.cos() as f32;
                sin[p * half + i] = a.sin() as f32;
            }
        }
        RopeTable { cos, sin, half }
    }

    /// Rotate `v`, already rotated for some position p, to p + `delta` (|delta| < the table's
    /// positions): a cached key moved to another position.
    pub fn rotate_by(&self, v: &mut [f32], delta: isize, style: RopeStyle) {
        let half = self.half;
        let p = delta.unsigned_abs();
        let c = &self.cos[p * half..(p + 1) * half];
        let s = &self.sin[p * half..(p + 1) * half];
        let sign = if delta < 0 { -1.0 } else { 1.0 };
        for i in 0..half {
            let (a, b) = match style {
                RopeStyle::Neox => (i, i + half),
                RopeStyle::Normal => (2 * i, 2 * i + 1),
            };
            let (x0, x1) = (v[a], v[b]);
            let si = sign * s[i];
            v[a] = x0 * c[i] - x1 * si;
            v[b] = x0 * si + x1 * c[i];
        }
    }

    #[inline]
    pub fn rotate(&self, v: &mut [f32], pos: usize, style: RopeStyle) {
        let half = self.half;
        let c = &self.cos[pos * half..(pos + 1) * half];
        let s = &self.sin[pos * half..(pos + 1) * half];
        match style {
            RopeStyle::Neox => {
                let (a, b) = v.split_at_mut(half);
                for i in 0..half {
                    let (x0, x1) = (a[i], b[i]);
                    a[i] = x0 * c[i] - x1 * s[i];
                    b[i] = x0 * s[i] + x1 * c[i];
                }
            }
            RopeStyle::Normal => {
                for i in 0..half {
                    let (x0, x1) = (v[2 * i], v[2 * i + 1]);
                    v[2 * i] = x0 * c[i] - x1 * s[i];
                    v[2 * i + 1] = x0 * s[i] + x1 * c[i];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Linear scaling by 1/4: position 8 turns as far as position 2 does without it.
    #[test]
    fn linear_scaling_divides_positions() {
        let plain = RopeTable::new(16, 8, 10000.0, None);
        let scaled = RopeTable::scaled(16, 8, 10000.0, None, 0.25);
        assert_eq!(&scaled.cos[8 * 4..9 * 4], &plain.cos[2 * 4..3 * 4]);
        assert_eq!(&scaled.sin[8 * 4..9 * 4], &plain.sin[2 * 4..3 * 4]);
        assert_ne!(&scaled.cos[3 * 4..4 * 4], &plain.cos[3 * 4..4 * 4]);
    }
}
