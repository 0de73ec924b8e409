//! A mixture-of-experts FFN on the device (Qwen3-MoE; kernels/moe.cu): one sequence of kernels
//! for any number of rows, which the decode step, the batched step and the prompt passes run
//! where a dense layer runs its gate/up and down matrices.

use super::model::GpuLayer;
use super::*;

/// Bytes of the scratch for `rows` rows of a mixture-of-experts model (none for a dense one).
pub(super) fn moe_bytes(c: &Config, rows: usize) -> usize {
    let Some(x) = c.experts else { return 0 };
    let (d, f, e, k) = (c.dim, c.ffn_dim, x.n_expert, x.n_used);
    let routes = rows * k;
    rows * (4 * d + d + 8 * d / 32 + 4 * e)
        + routes * (12 + f + 8 * f / 32 + 4 * d)
        + tiles_bytes(e, routes)
}

/// Routes a tile of the prompt kernels takes, at most (TILE in kernels/moe.cu).
const TILE: usize = 8;

/// Bytes of the tile list for `routes` routes among `e` experts: a (first, count) pair a tile, and
/// the count.
fn tiles_bytes(e: usize, routes: usize) -> usize {
    8 * max_tiles(e, routes) + 16
}

/// Tiles `routes` routes among `e` experts make at most: a partial tile an expert at worst.
fn max_tiles(e: usize, routes: usize) -> usize {
    routes / TILE + e.min(routes)
}

/// The scratch of the FFN over up to `rows` rows: the normed input (f32 and q8), the router's
/// logits, each row's routes (expert, weight), the routes grouped by expert, each route's
/// SwiGLU output (q8) and its expert's output.
pub(super) struct MoeBufs {
    rows: usize,
    xn: Buf,
    aq: Buf,
    ad: Buf,
    logits: Buf,
    ids: Buf,
    wts: Buf,
    order: Buf,
    /// The prompt kernels' tiles (moe_sort): (first index into `order`, routes) pairs, then the
    /// count in `ntiles`.
    tiles: Buf,
    ntiles: Buf,
    hq: Buf,
    hd: Buf,
    y: Buf,
}

impl MoeBufs {
    /// The scratch for up to `rows` rows, or None for a dense model.
    pub(super) fn new(dev: &Device, c: &Config, rows: usize) -> Result<Option<Self>> {
        let Some(x) = c.experts else { return Ok(None) };
        if x.n_expert > 1024 || x.n_used > 64 {
            return Err(Error::Model(
                "the CUDA backend routes among at most 1024 experts, 64 a token".into(),
            ));
        }
        let (d, f, e, k) = (c.dim, c.ffn_dim, x.n_expert, x.n_used);
        let (rows, a) = (rows.max(1), |n: usize| dev.alloc(n));
        let routes = rows * k;
        Ok(Some(MoeBufs {
            rows,
            xn: a(4 * rows * d)?,
            aq: a(rows * d)?,
            ad: a(8 * rows * d / 32)?,
            logits: a(4 * rows * e)?,
            ids: a(4 * routes)?,
            wts: a(4 * routes)?,
            order: a(4 * routes)?,
            tiles: a(8 * max_tiles(e, routes))?,
            ntiles: a(16)?,
            hq: a(routes * f)?,
            hd: a(8 * routes * f / 32)?,
            y: a(4 * routes * d)?,
        }))
    }

    /// The FFN of layer `l` over the first `t` rows of the residual `x` (its norm included):
    /// into `out` (t rows of the model's width), added to what `out` holds when `add`. The
    /// kernels it queued.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run(
        &self,
        dev: &Device,
        c: &Config,
        l: &GpuLayer,
        t: usize,
        x: u64,
        out: u64,
        add: bool,
    ) -> Result<usize> {
        let (Some(xp), Some(router)) = (c.experts, l.router.as_ref()) else {
            return Err(Error::Backend(
                "a dense layer has no experts to route to".into(),
            ));
        };
        if t == 0 || t > self.rows {
            return Err(Error::Backend(format!(
                "the expert FFN takes 1 to {} rows, got {t}",
                self.rows
            )));
        }
        let (d, f, e, k) = (
            c.dim as i32,
            c.ffn_dim as i32,
            xp.n_expert as i32,
            xp.n_used as i32,
        );
        let (rows, routes) = (t as u32, (t * xp.n_used) as u32);
        launch!(dev, moe_norm, (rows, 1), 256;
            x, l.ffn_norm.ptr, c.rms_eps, d, self.xn.ptr, self.aq.ptr, self.ad.ptr)?;
        launch!(dev, moe_router, ((xp.n_expert as u32).div_ceil(4), rows), 128;
            router.seg, d, self.xn.ptr, self.aq.ptr, self.ad.ptr, self.logits.ptr)?;
        launch!(dev, moe_topk, (rows, 1), 256;
            self.logits.ptr, e, k, self.ids.ptr, self.wts.ptr)?;
        if t == 1 {
            // One row's routes are distinct experts: a block a route, no grouping.
            launch!(dev, moe_glu, ((c.ffn_dim / 32) as u32, routes), 256;
                l.gate.seg, l.up.seg, d, f, self.aq.ptr, self.ad.ptr, self.ids.ptr, k,
                self.hq.ptr, self.hd.ptr)?;
            launch!(dev, moe_down, ((c.dim as u32).div_ceil(4), routes), 128;
                l.down.seg, f, d, self.hq.ptr, self.hd.ptr, self.ids.ptr, self.y.ptr)?;
        } else {
            // Several rows: the routes grouped by expert in tiles, each weight row read once a
            // tile (the same bits a route gets alone). Blocks past the tiles made return at once.
            launch!(dev, moe_sort, (1, 1), 1024;
                self.ids.ptr, routes as i32, e, self.order.ptr, self.tiles.ptr, self.ntiles.ptr)?;
            let most = max_tiles(xp.n_expert, t * xp.n_used) as u32;
            launch!(dev, moe_glu_tiles, ((c.ffn_dim / 32) as u32, most), 256;
                l.gate.seg, l.up.seg, d, f, self.aq.ptr, self.ad.ptr, self.ids.ptr, self.order.ptr,
                self.tiles.ptr, self.ntiles.ptr, k, self.hq.ptr, self.hd.ptr)?;
            launch!(dev, moe_down_tiles, ((c.dim as u32).div_ceil(4), most), 128;
                l.down.seg, f, d, self.hq.ptr, self.hd.ptr, self.ids.ptr, self.order.ptr,
                self.tiles.ptr, self.ntiles.ptr, self.y.ptr)?;
        }
        launch!(dev, moe_combine, ((c.dim as u32).div_ceil(256), rows), 256;
            self.y.ptr, self.wts.ptr, k, d, out, add as i32)?;
        Ok(6 + (t > 1) as usize)
    }

    /// The last run's first `t` rows' routes: each row's experts and their weights.
    pub(super) fn routes(&self, dev: &Device, t: usize, k: usize) -> Result<(Vec<u32>, Vec<f32>)> {
        let (mut ids, mut wts) = (vec![0i32; t * k], vec![0f32; t * k]);
        dev.read(&self.ids, 0, &mut ids)?;
        dev.read(&self.wts, 0, &mut wts)?;
        Ok((ids.into_iter().map(|e| e as u32).collect(), wts))
    }
}
