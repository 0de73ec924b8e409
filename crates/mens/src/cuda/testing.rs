//! Single-kernel entry points for the kernel tests (`tests/cuda.rs`), each against a CPU reference
//! (`cuda::reference`). Not part of the backend's API.

use super::*;

/// Single-kernel entry points for the kernel tests (each against cuda::reference).
impl Device {
    /// `n` f16 values of `buf` from byte `at`, widened to f32.
    fn read_f16(&self, buf: &Buf, at: usize, n: usize) -> Result<Vec<f32>> {
        let mut h = vec![0u16; n];
        self.read(buf, at, &mut h)?;
        Ok(h.iter()
            .map(|&b| half::f16::from_bits(b).to_f32())
            .collect())
    }

    /// y = W · a with the decode matvec kernel; `a` is q8 (see reference::quantize_q8).
    pub fn test_matvec(&self, w: &QTensor, q: &[i8], ds: &[[f32; 2]]) -> Result<Vec<f32>> {
        self.test_matvec_as(w, q, ds, repack_on())
    }

    /// The same with `w` uploaded in the GPU layout ([`repack`], where its type has one) or not.
    pub fn test_matvec_as(
        &self,
        w: &QTensor,
        q: &[i8],
        ds: &[[f32; 2]],
        gpu_layout: bool,
    ) -> Result<Vec<f32>> {
        self.with_matrix(w, q, ds, gpu_layout, 1, |m, aq, ad, out| {
            launch!(self, (self.matvec_k(&[&m.seg])) as "matvec", (w.rows.div_ceil(4) as u32, 1), 128;
                m.seg, Seg::NONE, Seg::NONE, w.cols as i32, aq, ad, out, 0u64, 0i32)
        })
    }

    /// `w` uploaded (in the GPU layout or not), the q8 activations `q`, `ds` and an output of
    /// `rows` × `w.rows` NaNs; `run` launches with (matrix, aq, ad, out); the output read back.
    fn with_matrix(
        &self,
        w: &QTensor,
        q: &[i8],
        ds: &[[f32; 2]],
        layout: bool,
        rows: usize,
        run: impl FnOnce(&Mat, u64, u64, u64) -> Result<()>,
    ) -> Result<Vec<f32>> {
        self.with_matrix_on(w, q, ds, layout, &vec![f32::NAN; rows * w.rows], run)
    }

    /// The same with the output holding `init` before the launch (a kernel that adds to it).
    fn with_matrix_on(
        &self,
        w: &QTensor,
        q: &[i8],
        ds: &[[f32; 2]],
        layout: bool,
        init: &[f32],
        run: impl FnOnce(&Mat, u64, u64, u64) -> Result<()>,
    ) -> Result<Vec<f32>> {
        self.bind()?;
        let m = Mat::upload_as(self, w, layout)?;
        let (aq, ad) = (self.upload(q)?, self.upload(ds)?);
        let out = self.upload(init)?;
        run(&m, aq.ptr, ad.ptr, out.ptr)?;
        let mut y = vec![0f32; init.len()];
        self.read(&out, 0, &mut y)?;
        Ok(y)
    }

    /// y[b] = W · a[b] for `rows` activation rows at once with the batched decode kernel
    /// (`q`, `ds`: the rows' q8 values one after another); y is [rows][W rows].
    /// `mma`: the tensor-core kernel (on the activations rounded to f16) with that many column
    /// splits (0: the server's choice), else the dp4a one.
    pub fn test_matmul(
        &self,
        w: &QTensor,
        q: &[i8],
        ds: &[[f32; 2]],
        rows: usize,
        mma: Option<u32>,
    ) -> Result<Vec<f32>> {
        self.test_matmul_q8(w, q, ds, rows, mma, false)
    }

    /// y[b] = [W0; W1; W2] · a[b] for `rows` activation rows with the batched dp4a kernel over the
    /// three matrices stacked (Qwen3's Q/K/V in the batch; the types may differ), in tiles of
    /// `rows.min(4)` as the batch launches it; y is [rows][all the matrices' rows].
    pub fn test_matmul_stacked(
        &self,
        ws: [&QTensor; 3],
        q: &[i8],
        ds: &[[f32; 2]],
        rows: usize,
    ) -> Result<Vec<f32>> {
        self.with_stacked(ws, q, ds, rows, |segs, n, aq, ad, out| {
            let (k, grid, block) =
                self.matmul_q8(rows.min(4), rows, &[&segs[0], &segs[1], &segs[2]])?;
            launch!(self, (k) as "matmul_q8 (stacked)", grid, block;
                segs[0], segs[1], segs[2], ws[0].cols as i32, aq, ad, rows as i32, out, n as i32,
                0u64, 0u64, 0i32)
        })
    }

    /// `ws` uploaded (stacked: `n` rows in all), the q8 activations and an output of `rows` × n
    /// NaNs; `run` launches with (segments, n, aq, ad, out); the output read back.
    fn with_stacked(
        &self,
        ws: [&QTensor; 3],
        q: &[i8],
        ds: &[[f32; 2]],
        rows: usize,
        run: impl FnOnce([Seg; 3], usize, u64, u64, u64) -> Result<()>,
    ) -> Result<Vec<f32>> {
        self.bind()?;
        let mats = ws
            .iter()
            .map(|w| Mat::upload_as(self, w, repack_on()))
            .collect::<Result<Vec<_>>>()?;
        let n: usize = ws.iter().map(|w| w.rows).sum();
        let (aq, ad) = (self.upload(q)?, self.upload(ds)?);
        let out = self.upload(&vec![f32::NAN; rows * n])?;
        run(
            [mats[0].seg, mats[1].seg, mats[2].seg],
            n,
            aq.ptr,
            ad.ptr,
            out.ptr,
        )?;
        let mut y = vec![0f32; rows * n];
        self.read(&out, 0, &mut y)?;
        Ok(y)
    }

    /// Up to three stacked matrices by the decode step's matvec (`matvec_k`, a warp a row, as
    /// Qwen3's Q/K/V in a session): W · a for one activation row, [rows of all three].
    pub fn test_matvec_stacked(
        &self,
        ws: [&QTensor; 3],
        q: &[i8],
        ds: &[[f32; 2]],
    ) -> Result<Vec<f32>> {
        self.with_stacked(ws, q, ds, 1, |segs, n, aq, ad, out| {
            launch!(self, (self.matvec_k(&[&segs[0], &segs[1], &segs[2]])) as "matvec (stacked)", (n.div_ceil(4) as u32, 1), 128;
                segs[0], segs[1], segs[2], ws[0].cols as i32, aq, ad, out, 0u64, 0i32)
        })
    }

    /// RoPE and the f16 cache writes after Qwen3's Q/K norm, for rows `x` ([rows][Q | K | V]) at
    /// positions `pos`: each row alone by the session's `rope_store` and all at once by the
    /// batch's `rope_store_b` (each row its own slot of a paged cache). Per row, [Q | K | V] as
    /// the attention then reads them (Q rounded to f16, K and V from the cache): (session, batch).
    pub fn test_rope_stores(
        &self,
        x: &[f32],
        (n_head, n_kv_head, hd): (usize, usize, usize),
        neox: bool,
        rope: &RopeTable,
        pos: &[usize],
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        self.bind()?;
        let (qd, kvd) = (n_head * hd, n_kv_head * hd);
        let (row, b) = (qd + 2 * kvd, pos.len());
        let ctx = pos.iter().max().map_or(1, |p| p + 1);
        let (cos, sin) = (self.upload(&rope.cos)?, self.upload(&rope.sin)?);
        let mut alone = Vec::with_capacity(b * row);
        for (i, &p) in pos.iter().enumerate() {
            let qkv = self.upload(&x[i * row..(i + 1) * row])?;
            let (kc, vc) = (
                self.upload(&vec![0xFFFFu16; ctx * kvd])?,
                self.upload(&vec![0xFFFFu16; ctx * kvd])?,
            );
            let pp = self.upload(&[p as i32])?;
            launch!(self, rope_store, (1, 1), 256;
                qkv.ptr, 0u64, cos.ptr, sin.ptr, pp.ptr, n_head as i32, n_kv_head as i32, hd as i32,
                neox as i32, kc.ptr, vc.ptr, 0u64, 1i32, 0u64)?;
            let mut q = vec![0f32; qd];
            self.read(&qkv, 0, &mut q)?;
            alone.extend(q);
            alone.extend(self.read_f16(&kc, 2 * p * kvd, kvd)?);
            alone.extend(self.read_f16(&vc, 2 * p * kvd, kvd)?);
        }
        // Slot i's pages are i * max_pages ..; a page holds SPLIT rows.
        let max_pages = ctx.div_ceil(SPLIT);
        let page_bytes = (SPLIT * 2 * kvd) as u64;
        let table: Vec<i32> = (0..(b * max_pages) as i32).collect();
        let slots: Vec<i32> = (0..b as i32).collect();
        let ps: Vec<i32> = pos.iter().map(|&p| p as i32).collect();
        let (pages, slot, pp) = (
            self.upload(&table)?,
            self.upload(&slots)?,
            self.upload(&ps)?,
        );
        let qkv = self.upload(x)?;
        let q = self.upload(&vec![f32::NAN; b * qd])?;
        let pool = b * max_pages * SPLIT * kvd;
        let (kc, vc) = (
            self.upload(&vec![0xFFFFu16; pool])?,
            self.upload(&vec![0xFFFFu16; pool])?,
        );
        launch!(self, (self.fb()?.rope_store_b) as "rope_store_b", (b as u32, 1), 256;
            qkv.ptr, 0u64, cos.ptr, sin.ptr, pp.ptr, slot.ptr, pages.ptr, max_pages as i32, page_bytes,
            n_head as i32, n_kv_head as i32, hd as i32, neox as i32, q.ptr, kc.ptr, vc.ptr)?;
        let mut qs = vec![0f32; b * qd];
        self.read(&q, 0, &mut qs)?;
        let mut together = Vec::with_capacity(b * row);
        for (i, &p) in pos.iter().enumerate() {
            together.extend_from_slice(&qs[i * qd..(i + 1) * qd]);
            let at = (i * max_pages + p / SPLIT) * page_bytes as usize + (p % SPLIT) * 2 * kvd;
            together.extend(self.read_f16(&kc, at, kvd)?);
            together.extend(self.read_f16(&vc, at, kvd)?);
        }
        Ok((alone, together))
    }

    /// The same through the int8 tensor-core kernels (kernels/mmq.cu) where `w`'s type has
    /// them (Q4_K, Q6_K), else dp4a.
    pub fn test_matmul_mq(
        &self,
        w: &QTensor,
        q: &[i8],
        ds: &[[f32; 2]],
        rows: usize,
    ) -> Result<Vec<f32>> {
        self.test_matmul_q8(w, q, ds, rows, None, true)
    }

    fn test_matmul_q8(
        &self,
        w: &QTensor,
        q: &[i8],
        ds: &[[f32; 2]],
        rows: usize,
        mma: Option<u32>,
        mq: bool,
    ) -> Result<Vec<f32>> {
        self.bind()?;
        // The int8 tensor-core kernels read the GGUF layout.
        let m = Mat::upload_as(self, w, !mq && repack_on())?;
        let (aq, ad) = (self.upload(q)?, self.upload(ds)?);
        let out = self.upload(&vec![f32::NAN; rows * w.rows])?;
        if let Some(splits) = mma {
            let x16: Vec<u16> = q
                .iter()
                .enumerate()
                .map(|(i, &v)| half::f16::from_f32(v as f32 * ds[i / 32][0]).to_bits())
                .collect();
            let x = self.upload(&x16)?;
            let mut grid = self.h16_grid(w.rows, w.cols);
            if splits > 0 {
                grid.1 = splits;
            }
            let part = self.upload(&vec![0f32; rows * w.rows * grid.1 as usize])?;
            let counters = self.upload(&vec![0u32; grid.0 as usize])?;
            launch!(self, (self.matmul_h16(rows)?) as "matmul_h16", grid, 256;
                m.seg, Seg::NONE, Seg::NONE, w.cols as i32, x.ptr, rows as i32, out.ptr,
                w.rows as i32, 0u64, 0u64, 0i32, part.ptr, counters.ptr)?;
            let mut left = vec![1u32; grid.0 as usize];
            self.read(&counters, 0, &mut left)?;
            if left.iter().any(|&c| c != 0) {
                return Err(Error::InvalidArgument(format!(
                    "matmul tickets not reset: {left:?}"
                )));
            }
        } else {
            let (k, grid, block) = self.matmul_q8_with(rows, &[&m.seg], mq)?;
            launch!(self, (k) as "matmul_q8", grid, block;
                m.seg, Seg::NONE, Seg::NONE, w.cols as i32, aq.ptr, ad.ptr, rows as i32, out.ptr,
                w.rows as i32, 0u64, 0u64, 0i32)?;
        }
        let mut y = vec![0f32; rows * w.rows];
        self.read(&out, 0, &mut y)?;
        Ok(y)
    }

    /// `matvec_pair` (two rows a warp, the LM head's): W · a; and `matvec_pair_add` (the O
    /// projection's) into an output holding `x`: x + W · a.
    pub fn test_matvec_pair(
        &self,
        w: &QTensor,
        q: &[i8],
        ds: &[[f32; 2]],
        x: &[f32],
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let y = self.with_matrix(w, q, ds, repack_on(), 1, |m, aq, ad, out| {
            launch!(self, (self.matvec_pair_k(&m.seg)) as "matvec_pair", (w.rows.div_ceil(8) as u32, 1), 128;
                m.seg, w.cols as i32, aq, ad, out)
        })?;
        let sum = self.with_matrix_on(w, q, ds, repack_on(), x, |m, aq, ad, out| {
            launch!(self, (self.matvec_pair_add_k(&m.seg)) as "matvec_pair_add", (w.rows.div_ceil(8) as u32, 1), 128;
                m.seg, w.cols as i32, aq, ad, out)
        })?;
        Ok((y, sum))
    }

    /// The half-warp pair kernel (`matvec_pair_h_*`) on `w` in the GPU layout: W · a; None where
    /// the layout's type has none.
    pub fn test_matvec_pair_half(
        &self,
        w: &QTensor,
        q: &[i8],
        ds: &[[f32; 2]],
    ) -> Result<Option<Vec<f32>>> {
        let mut found = false;
        let y = self.with_matrix(w, q, ds, true, 1, |m, aq, ad, out| {
            let Some(k) = self.pair_half(&m.seg) else {
                return Ok(());
            };
            found = true;
            launch!(self, [k], (w.rows.div_ceil(16) as u32, 1), 128; m.seg, w.cols as i32, aq, ad, out)
        })?;
        Ok(found.then_some(y))
    }

    /// `matvec2` (two warps a row, 64 streams): W · a.
    pub fn test_matvec2(&self, w: &QTensor, q: &[i8], ds: &[[f32; 2]]) -> Result<Vec<f32>> {
        self.with_matrix(w, q, ds, repack_on(), 1, |m, aq, ad, out| {
            launch!(self, (self.matvec2_k(&m.seg)) as "matvec2", (w.rows.div_ceil(2) as u32, 1), 128;
                m.seg, w.cols as i32, aq, ad, out, 0i32)
        })
    }

    /// The batch matmul in `matvec2`'s order (split mode) for `rows` activation rows:
    /// [rows][w.rows].
    pub fn test_matmul_split(
        &self,
        w: &QTensor,
        q: &[i8],
        ds: &[[f32; 2]],
        rows: usize,
    ) -> Result<Vec<f32>> {
        self.with_matrix(w, q, ds, repack_on(), rows, |m, aq, ad, out| {
            let (k, grid, block) = self.matmul_q8_split(rows, &m.seg)?;
            launch!(self, (k) as "matmul_q8", grid, block;
                m.seg, Seg::NONE, Seg::NONE, w.cols as i32, aq, ad, rows as i32, out,
                w.rows as i32, 0u64, 0u64, MODE_SPLIT)
        })
    }

    /// W dequantized to f16 by the prefill kernel, widened to f32.
    pub fn test_dequant(&self, w: &QTensor) -> Result<Vec<f32>> {
        self.test_dequant_as(w, repack_on())
    }

    /// The same with `w` uploaded in the GPU layout ([`repack`], where its type has one) or not.
    pub fn test_dequant_as(&self, w: &QTensor, gpu_layout: bool) -> Result<Vec<f32>> {
        self.bind()?;
        let m = Mat::upload_as(self, w, gpu_layout)?;
        let n = w.rows * w.cols;
        let out = self.upload(&vec![0xFFFFu16; n])?;
        launch!(self, dequant_f16, ((n / 32).div_ceil(256) as u32, 1), 256;
            m.seg, w.cols as i32, out.ptr)?;
        self.read_f16(&out, 0, n)
    }

    /// rmsnorm(x) * w quantized to q8 by the decode kernel, dequantized back.
    pub fn test_rmsnorm_q8(&self, x: &[f32], w: &[f32], eps: f32) -> Result<Vec<f32>> {
        self.bind()?;
        let d = w.len();
        let (xb, wb) = (self.upload(x)?, self.upload(w)?);
        let aq = self.upload(&vec![0i8; d])?;
        let ad = self.upload(&vec![[f32::NAN; 2]; d / 32])?;
        launch!(self, rmsnorm_q8, norm_grid(1, d), 1024; xb.ptr, wb.ptr, eps, d as i32, aq.ptr, ad.ptr)?;
        let mut q = vec![0i8; d];
        let mut ds = vec![[0f32; 2]; d / 32];
        self.read(&aq, 0, &mut q)?;
        self.read(&ad, 0, &mut ds)?;
        Ok(q.iter()
            .enumerate()
            .map(|(i, &v)| v as f32 * ds[i / 32][0])
            .collect())
    }

    /// Index of the largest value (first on ties) by the argmax kernel.
    pub fn test_argmax(&self, x: &[f32]) -> Result<u32> {
        self.bind()?;
        let xb = self.upload(x)?;
        let partial = self.alloc(8 * ARGMAX_BLOCKS)?;
        let counter = self.upload(&[0u32])?;
        let (tok, out, pos) = (self.alloc(4)?, self.alloc(4)?, self.upload(&[0i32])?);
        launch!(self, argmax, (ARGMAX_BLOCKS as u32, 1), 1024;
            xb.ptr, x.len() as i32, partial.ptr, counter.ptr, tok.ptr, out.ptr, pos.ptr, 1i32)?;
        let mut r = [0i32; 2];
        self.read(&out, 0, &mut r[..1])?;
        self.read(&pos, 0, &mut r[1..])?;
        if r[1] != 1 {
            return Err(Error::Backend(format!("argmax advanced pos to {}", r[1])));
        }
        Ok(r[0] as u32)
    }
}

/// Entry points for the fused decode kernels' tests.
impl Device {
    fn dequant_q8(&self, aq: &Buf, ad: &Buf, n: usize) -> Result<Vec<f32>> {
        let mut q = vec![0i8; n];
        let mut ds = vec![[0f32; 2]; n / 32];
        self.read(aq, 0, &mut q)?;
        self.read(ad, 0, &mut ds)?;
        Ok(q.iter()
            .enumerate()
            .map(|(i, &v)| v as f32 * ds[i / 32][0])
            .collect())
    }

    /// silu(gate · a) * (up · a) by the decode gate/up kernel in blocks of `warps` warps (the one
    /// decode runs for these types, or with `any` the kernel for any types), quantized to q8 and
    /// read back dequantized.
    pub fn test_glu(
        &self,
        gate: &QTensor,
        up: &QTensor,
        q: &[i8],
        ds: &[[f32; 2]],
        any: bool,
        warps: u32,
    ) -> Result<Vec<f32>> {
        self.run_glu(gate, up, q, ds, warps, |g, u| {
            Ok(if any {
                ("matvec_glu_q8", self.f.matvec_glu_q8)
            } else {
                self.glu(g, u, 32 * warps)
            })
        })
    }

    /// The decode gate/up kernel `name` (a name in the kernel table) on `gate`, `up`, in blocks
    /// of `warps` warps.
    pub fn test_glu_named(
        &self,
        gate: &QTensor,
        up: &QTensor,
        q: &[i8],
        ds: &[[f32; 2]],
        name: &str,
        warps: u32,
    ) -> Result<Vec<f32>> {
        self.run_glu(gate, up, q, ds, warps, |_, _| {
            self.f
                .list()
                .into_iter()
                .find(|(n, _)| *n == name)
                .ok_or_else(|| Error::Backend(format!("no kernel {name}")))
        })
    }

    /// `gate`, `up` and the activations uploaded, the kernel `pick` chooses for the uploaded
    /// matrices run on them, its output dequantized.
    #[allow(clippy::type_complexity)]
    fn run_glu(
        &self,
        gate: &QTensor,
        up: &QTensor,
        q: &[i8],
        ds: &[[f32; 2]],
        warps: u32,
        pick: impl Fn(&Seg, &Seg) -> Result<(&'static str, sys::CUfunction)>,
    ) -> Result<Vec<f32>> {
        self.bind()?;
        let (g, u) = (Mat::upload(self, gate)?, Mat::upload(self, up)?);
        let (aq, ad) = (self.upload(q)?, self.upload(ds)?);
        let rows = gate.rows;
        let hq = self.upload(&vec![0i8; rows])?;
        let hd = self.upload(&vec![[f32::NAN; 2]; rows / 32])?;
        let f = pick(&g.seg, &u.seg)?;
        launch!(self, [f], ((rows / 32) as u32, 1), 32 * warps;
            g.seg, u.seg, gate.cols as i32, aq.ptr, ad.ptr, hq.ptr, hd.ptr, 0u64, 0u64, 0f32, 0u64)?;
        self.dequant_q8(&hq, &hd, rows)
    }

    /// The decode gate/up and Q/K/V kernels (the ones decode takes for these matrices) on
    /// rmsnorm(x) · w: fed by `rmsnorm_q8`'s output, then normalising x themselves (decode's
    /// fused form). Their raw output bytes, (fed, fused) for gate/up and for Q/K/V.
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    pub fn test_fused_norm(
        &self,
        x: &[f32],
        w: &[f32],
        eps: f32,
        (gate, up): (&QTensor, &QTensor),
        qkv: [&QTensor; 3],
        (n_head, n_kv_head, head_dim): (usize, usize, usize),
        rope: &RopeTable,
    ) -> Result<((Vec<u8>, Vec<u8>), (Vec<u8>, Vec<u8>))> {
        self.bind()?;
        let d = x.len();
        let (xb, wb) = (self.upload(x)?, self.upload(w)?);
        let aq = self.upload(&vec![0i8; d])?;
        let ad = self.upload(&vec![[f32::NAN; 2]; d / 32])?;
        let (g, u) = (Mat::upload(self, gate)?, Mat::upload(self, up)?);
        let m: Vec<Mat> = qkv
            .iter()
            .map(|t| Mat::upload(self, t))
            .collect::<Result<_>>()?;
        let (cos, sin) = (self.upload(&rope.cos)?, self.upload(&rope.sin)?);
        let p = self.upload(&[3i32])?;
        let f = gate.rows;
        let out = (n_head + 2 * n_kv_head) * head_dim;
        let read = |b: &Buf| -> Result<Vec<u8>> {
            let mut v = vec![0u8; b.bytes];
            self.read(b, 0, &mut v)?;
            Ok(v)
        };
        let mut glu = Vec::new();
        let mut rope_out = Vec::new();
        for fused in [false, true] {
            if !fused {
                launch!(self, rmsnorm_q8, norm_grid(1, d), 1024; xb.ptr, wb.ptr, eps, d as i32, aq.ptr, ad.ptr)?;
            }
            let nx = if fused { xb.ptr } else { 0 };
            let hq = self.upload(&vec![0i8; f])?;
            let hd = self.upload(&vec![[f32::NAN; 2]; f / 32])?;
            launch!(self, [self.glu(&g.seg, &u.seg, 256)], ((f / 32) as u32, 1), 256;
                g.seg, u.seg, d as i32, aq.ptr, ad.ptr, hq.ptr, hd.ptr, nx, wb.ptr, eps, 0u64)?;
            let mut bytes = read(&hq)?;
            bytes.extend(read(&hd)?);
            glu.push(bytes);
            let o = self.upload(&vec![f32::NAN; out])?;
            launch!(self, (self.qkv_rope_k(&[&m[0].seg, &m[1].seg, &m[2].seg])) as "qkv_rope", ((out / 2).div_ceil(4) as u32, 1), 128;
                m[0].seg, m[1].seg, m[2].seg, d as i32, aq.ptr, ad.ptr, 0u64, cos.ptr, sin.ptr,
                p.ptr, n_head as i32, n_kv_head as i32, head_dim as i32, 1i32, o.ptr, 0u64, 0u64,
                nx, wb.ptr, eps, 0u64)?;
            rope_out.push(read(&o)?);
        }
        let (g1, g0) = (glu.pop().unwrap(), glu.pop().unwrap());
        let (r1, r0) = (rope_out.pop().unwrap(), rope_out.pop().unwrap());
        Ok(((g0, g1), (r0, r1)))
    }

    /// The batch gate/up kernel for `rows` activation rows (one after another in `q`, `ds`):
    /// dp4a, or with `mq` the int8 tensor-core one where the types have it; [rows][gate rows],
    /// dequantized.
    pub fn test_glu_batch(
        &self,
        gate: &QTensor,
        up: &QTensor,
        q: &[i8],
        ds: &[[f32; 2]],
        rows: usize,
        mq: bool,
    ) -> Result<Vec<f32>> {
        self.bind()?;
        let layout = !mq && repack_on();
        let (g, u) = (
            Mat::upload_as(self, gate, layout)?,
            Mat::upload_as(self, up, layout)?,
        );
        let (aq, ad) = (self.upload(q)?, self.upload(ds)?);
        let f = gate.rows;
        let hq = self.upload(&vec![0i8; rows * f])?;
        let hd = self.upload(&vec![[f32::NAN; 2]; rows * f / 32])?;
        launch!(self, (self.glu_q8_b_with(rows, &g.seg, &u.seg, mq)?) as "glu_q8_b", ((f / 32) as u32, 1), 256;
            g.seg, u.seg, gate.cols as i32, aq.ptr, ad.ptr, rows as i32, hq.ptr, hd.ptr, 0u64)?;
        self.dequant_q8(&hq, &hd, rows * f)
    }

    /// Q/K/V matvec + bias + RoPE at position `pos` + cache write by the fused kernel: returns
    /// (q, k row, v row) as floats.
    #[allow(clippy::too_many_arguments)]
    pub fn test_qkv_rope(
        &self,
        w: [&QTensor; 3],
        bias: Option<&[f32]>,
        q8: (&[i8], &[[f32; 2]]),
        heads: (usize, usize, usize),
        neox: bool,
        rope: &RopeTable,
        pos: usize,
    ) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
        self.test_qkv_rope_as(w, bias, q8, heads, neox, rope, pos, false)
    }

    /// The same by the half-warp kernel (`qkv_rope_h`) with `half`, for matrices it takes.
    #[allow(clippy::too_many_arguments)]
    pub fn test_qkv_rope_as(
        &self,
        w: [&QTensor; 3],
        bias: Option<&[f32]>,
        q8: (&[i8], &[[f32; 2]]),
        (n_head, n_kv_head, head_dim): (usize, usize, usize),
        neox: bool,
        rope: &RopeTable,
        pos: usize,
        half: bool,
    ) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
        self.bind()?;
        let m: Vec<Mat> = w
            .iter()
            .map(|t| Mat::upload(self, t))
            .collect::<Result<_>>()?;
        let (aq, ad) = (self.upload(q8.0)?, self.upload(q8.1)?);
        let (qd, kvd) = (n_head * head_dim, n_kv_head * head_dim);
        let b = bias.map(|b| self.upload(b)).transpose()?;
        let (cos, sin) = (self.upload(&rope.cos)?, self.upload(&rope.sin)?);
        let p = self.upload(&[pos as i32])?;
        let qkv = self.upload(&vec![f32::NAN; qd + 2 * kvd])?;
        let kc = self.upload(&vec![0xFFFFu16; (pos + 1) * kvd])?;
        let vc = self.upload(&vec![0xFFFFu16; (pos + 1) * kvd])?;
        let pairs = (qd + 2 * kvd) / 2;
        let segs = [&m[0].seg, &m[1].seg, &m[2].seg];
        let (k, per_block) = if half {
            let k = self.qkv_half(&segs, w[0].cols, head_dim, Some(true));
            (
                k.ok_or_else(|| {
                    Error::Backend("no half-warp Q/K/V kernel for these types".into())
                })?,
                8,
            )
        } else {
            (("qkv_rope", self.qkv_rope_k(&segs)), 4)
        };
        launch!(self, [k], (pairs.div_ceil(per_block) as u32, 1), 128;
            m[0].seg, m[1].seg, m[2].seg, w[0].cols as i32, aq.ptr, ad.ptr, b.as_ref().map_or(0, |b| b.ptr),
            cos.ptr, sin.ptr, p.ptr, n_head as i32, n_kv_head as i32, head_dim as i32, neox as i32,
            qkv.ptr, kc.ptr, vc.ptr, 0u64, 0u64, 0f32, 0u64)?;
        let mut q = vec![0f32; qd];
        self.read(&qkv, 0, &mut q)?;
        let row = |c: &Buf| self.read_f16(c, 2 * pos * kvd, kvd);
        Ok((q, row(&kc)?, row(&vc)?))
    }

    /// SwiGLU of `ntok` rows of gate and up values given in f16 ([t][gate f | up f], as prefill's
    /// GEMM writes them) with the 8-wide kernel: h [t][f] as f32 (from its f16 output).
    pub fn test_swiglu_h16(&self, gu: &[half::f16], f: usize, ntok: usize) -> Result<Vec<f32>> {
        self.bind()?;
        let bits: Vec<u16> = gu.iter().map(|x| x.to_bits()).collect();
        let x = self.upload(&bits)?;
        let h = self.upload(&vec![0xFFFFu16; ntok * f])?;
        launch!(self, swiglu_h16, ((ntok * f / 8).div_ceil(256) as u32, 1), 256;
            x.ptr, f as i32, ntok as i32, h.ptr)?;
        self.read_f16(&h, 0, ntok * f)
    }

    /// `rows` rows of K and V values (f32, [rows][kv_dim] each) stored as cache rows of type `t`
    /// by the kv_quant kernel (positions 0..rows): the K and V cache bytes (kv_row_bytes a row).
    pub fn test_kv_quant(
        &self,
        t: KvType,
        k: &[f32],
        v: &[f32],
        kvd: usize,
    ) -> Result<(Vec<u8>, Vec<u8>)> {
        self.bind()?;
        let rows = k.len() / kvd;
        let row = 3 * kvd; // the kernels' qkv row: Q (here kv_dim wide), K, V
        let mut qkv = vec![f32::NAN; rows * row];
        for r in 0..rows {
            qkv[r * row + kvd..][..kvd].copy_from_slice(&k[r * kvd..][..kvd]);
            qkv[r * row + 2 * kvd..][..kvd].copy_from_slice(&v[r * kvd..][..kvd]);
        }
        let x = self.upload(&qkv)?;
        let rb = kv_row_bytes(t, kvd);
        let (kc, vc) = (
            self.upload(&vec![0xAAu8; rows * rb])?,
            self.upload(&vec![0xAAu8; rows * rb])?,
        );
        let p = self.upload(&[0i32])?;
        let f = self
            .kv_quant(t)
            .ok_or_else(|| Error::InvalidArgument("f16 has no quantizer".into()))?;
        launch!(self, [f], (rows as u32, 2), 256;
            x.ptr, row as i32, kvd as i32, kvd as i32, p.ptr, kc.ptr, vc.ptr, 0u64)?;
        let (mut ko, mut vo) = (vec![0u8; rows * rb], vec![0u8; rows * rb]);
        self.read(&kc, 0, &mut ko)?;
        self.read(&vc, 0, &mut vo)?;
        Ok((ko, vo))
    }

    /// One query (all heads) against `len` cached positions by the split decode attention kernel,
    /// a KV head's query heads in `groups` blocks, its output quantized to q8 and read back
    /// dequantized.
    pub fn test_attention(
        &self,
        q: &[f32],
        k: &[half::f16],
        v: &[half::f16],
        dims: (usize, usize, usize),
        len: usize,
        groups: usize,
    ) -> Result<Vec<f32>> {
        let b = |x: &[half::f16]| x.iter().flat_map(|h| h.to_le_bytes()).collect::<Vec<u8>>();
        let new_kv = vec![0f32; 2 * dims.1 * dims.2];
        Ok(self
            .test_attention_cache(q, &new_kv, &b(k), &b(v), KvType::F16, dims, len, groups)?
            .0)
    }

    /// As [`Device::test_attention`], on cache rows of type `t` (kv_row_bytes each). A quantized
    /// cache's last row is stored by the kernel from `new_kv` (that row's K, then V, as f32): the
    /// output, then the K and V cache bytes after the call. `groups`: blocks a KV head's query
    /// heads are spread over (1 for a quantized cache).
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    pub fn test_attention_cache(
        &self,
        q: &[f32],
        new_kv: &[f32],
        k: &[u8],
        v: &[u8],
        t: KvType,
        (n_head, n_kv_head, head_dim): (usize, usize, usize),
        len: usize,
        groups: usize,
    ) -> Result<(Vec<f32>, Vec<u8>, Vec<u8>)> {
        self.bind()?;
        let qb = self.upload(&[q, new_kv].concat())?;
        let (kc, vc) = (self.upload(k)?, self.upload(v)?);
        let p = self.upload(&[len as i32 - 1])?;
        let splits = len.div_ceil(SPLIT);
        let part_o = self.alloc(4 * splits * n_head * head_dim)?;
        let part_ml = self.alloc(8 * splits * n_head)?;
        let counters = self.upload(&vec![0u32; n_head.max(64)])?;
        let qd = n_head * head_dim;
        let aq = self.upload(&vec![0i8; qd])?;
        let ad = self.upload(&vec![[f32::NAN; 2]; qd / 32])?;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let args = (
            qb.ptr,
            kc.ptr,
            vc.ptr,
            p.ptr,
            n_head as i32,
            n_kv_head as i32,
            scale,
            part_o.ptr,
            part_ml.ptr,
            counters.ptr,
            aq.ptr,
            ad.ptr,
        );
        launch!(self, [self.attn_decode(head_dim, t)], ((n_kv_head * groups) as u32, splits as u32), 256;
            args.0, args.1, args.2, args.3, args.4, args.5, args.6, args.7, args.8, args.9, args.10, args.11)?;
        let out = self.dequant_q8(&aq, &ad, qd)?;
        let (mut ko, mut vo) = (vec![0u8; k.len()], vec![0u8; v.len()]);
        self.read(&kc, 0, &mut ko)?;
        self.read(&vc, 0, &mut vo)?;
        Ok((out, ko, vo))
    }
    /// `t` queries (rows of `q_dim`, at positions pos0..pos0 + t) against `pos0 + t` cached
    /// positions by the prefill attention kernel; output widened from f16.
    pub fn test_flash(
        &self,
        q: &[f32],
        k: &[half::f16],
        v: &[half::f16],
        dims: (usize, usize, usize),
        pos0: usize,
        t: usize,
    ) -> Result<Vec<f32>> {
        let b = |x: &[half::f16]| x.iter().flat_map(|h| h.to_le_bytes()).collect::<Vec<u8>>();
        self.test_flash_cache(q, &b(k), &b(v), KvType::F16, dims, pos0, t)
    }

    /// As [`Device::test_flash`], on cache rows of type `kt` (kv_row_bytes each).
    #[allow(clippy::too_many_arguments)]
    pub fn test_flash_cache(
        &self,
        q: &[f32],
        k: &[u8],
        v: &[u8],
        kt: KvType,
        (n_head, n_kv_head, head_dim): (usize, usize, usize),
        pos0: usize,
        t: usize,
    ) -> Result<Vec<f32>> {
        self.bind()?;
        let (qd, kvd) = (n_head * head_dim, n_kv_head * head_dim);
        let row = qd + 2 * kvd;
        let mut qkv = vec![0f32; t * row];
        for i in 0..t {
            qkv[i * row..i * row + qd].copy_from_slice(&q[i * qd..(i + 1) * qd]);
        }
        let qb = self.upload(&qkv)?;
        let (kc, vc) = (self.upload(k)?, self.upload(v)?);
        let p = self.upload(&[pos0 as i32])?;
        let out = self.upload(&vec![0xFFFFu16; t * qd])?;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let grid = (t.div_ceil(FA_Q) as u32, n_head as u32);
        let args = (
            qb.ptr,
            kc.ptr,
            vc.ptr,
            p.ptr,
            t as i32,
            n_head as i32,
            n_kv_head as i32,
            scale,
            out.ptr,
        );
        launch!(self, [self.flash_prefill(head_dim, kt)], grid, 256;
            args.0, args.1, args.2, args.3, args.4, args.5, args.6, args.7, args.8)?;
        self.read_f16(&out, 0, t * qd)
    }
}

/// A deferred norm's input as the kernels leave it (kernels/common.cuh, parts_lane): q8 of x · w
/// (values, and (d, s) a group of 32) and each group's sum of squares of x, in NP_REPS copies of
/// NP_MAX groups.
#[derive(Debug, Clone)]
pub struct DeferredNorm {
    pub q: Vec<i8>,
    pub ds: Vec<[f32; 2]>,
    pub sums: Vec<f32>,
}

impl DeferredNorm {
    /// q8 of x · w, dequantized.
    pub fn values(&self) -> Vec<f32> {
        self.q
            .iter()
            .enumerate()
            .map(|(i, &v)| v as f32 * self.ds[i / 32][0])
            .collect()
    }

    /// Group `g`'s sum of squares in copy `copy`.
    pub fn sum(&self, copy: usize, g: usize) -> f32 {
        self.sums[copy * NP_MAX + g]
    }

    /// Whether `other` holds the same bits: values, scales, and every copy of the sums of the
    /// `dim / 32` groups (the rest of a copy is not written).
    pub fn same_bits(&self, other: &DeferredNorm) -> bool {
        let groups = self.ds.len();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        self.q == other.q
            && bits(self.ds.as_flattened()) == bits(other.ds.as_flattened())
            && (0..NP_REPS).all(|c| {
                let at = c * NP_MAX..c * NP_MAX + groups;
                bits(&self.sums[at.clone()]) == bits(&other.sums[at])
            })
    }
}

/// Entry points for the deferred norm's tests.
impl Device {
    fn alloc_deferred(&self, dim: usize) -> Result<(Buf, Buf, Buf)> {
        Ok((
            self.upload(&vec![0i8; dim])?,
            self.upload(&vec![[f32::NAN; 2]; dim / 32])?,
            self.upload(&vec![f32::NAN; NP_REPS * NP_MAX])?,
        ))
    }

    fn read_deferred(&self, (q, ds, sums): &(Buf, Buf, Buf), dim: usize) -> Result<DeferredNorm> {
        let mut n = DeferredNorm {
            q: vec![0; dim],
            ds: vec![[0.0; 2]; dim / 32],
            sums: vec![0.0; NP_REPS * NP_MAX],
        };
        self.read(q, 0, &mut n.q)?;
        self.read(ds, 0, &mut n.ds)?;
        self.read(sums, 0, &mut n.sums)?;
        Ok(n)
    }

    /// The residual matvec before a deferred norm (`matvec_add_nq`, or with `pair` the row-pair
    /// kernel `matvec_pair_add_nq`) on the residual `x`, with the next norm's weight `nw`:
    /// x + W · a, and the norm's input its clusters make. `w.rows` a multiple of 32.
    pub fn test_matvec_add_nq(
        &self,
        w: &QTensor,
        q: &[i8],
        ds: &[[f32; 2]],
        x: &[f32],
        nw: &[f32],
        pair: bool,
    ) -> Result<(Vec<f32>, DeferredNorm)> {
        let dim = w.rows;
        let nwb = self.upload(nw)?;
        let bufs = self.alloc_deferred(dim)?;
        let y = self.with_matrix_on(w, q, ds, repack_on(), x, |m, aq, ad, out| {
            let rows_a_block = if pair { 8 } else { 4 };
            launch!(self, (self.matvec_add_nq_k(&m.seg, pair)) as "matvec_add_nq", ((dim / rows_a_block) as u32, 1), 128;
                m.seg, w.cols as i32, aq, ad, out, nwb.ptr, bufs.0.ptr, bufs.1.ptr, bufs.2.ptr)
        })?;
        Ok((y, self.read_deferred(&bufs, dim)?))
    }

    /// `rmsnorm_q8d` (the first layer's deferred norm) on x with weight `nw`.
    pub fn test_rmsnorm_q8d(&self, x: &[f32], nw: &[f32]) -> Result<DeferredNorm> {
        let (bufs, _) = self.run_rmsnorm_q8d(x, nw)?;
        self.read_deferred(&bufs, x.len())
    }

    /// `rmsnorm_q8d` on x with weight `nw` into new buffers: (nq, nd, np), and the weight's.
    fn run_rmsnorm_q8d(&self, x: &[f32], nw: &[f32]) -> Result<((Buf, Buf, Buf), Buf)> {
        self.bind()?;
        let dim = x.len();
        let (xb, nwb) = (self.upload(x)?, self.upload(nw)?);
        let bufs = self.alloc_deferred(dim)?;
        launch!(self, rmsnorm_q8d, norm_grid(1, dim), 1024;
            xb.ptr, nwb.ptr, dim as i32, bufs.0.ptr, bufs.1.ptr, bufs.2.ptr)?;
        Ok((bufs, nwb))
    }

    /// silu(gate · n) * (up · n), n = rmsnorm(x) · nw, by the decode gate/up kernel fed by a
    /// deferred norm (`rmsnorm_q8d`'s output; the kernel scales each row by the groups' sums), in
    /// the blocks decode takes, by the half-warp kernel with `half` (None where these matrices have
    /// none); dequantized.
    pub fn test_glu_deferred(
        &self,
        gate: &QTensor,
        up: &QTensor,
        x: &[f32],
        nw: &[f32],
        eps: f32,
        half: bool,
    ) -> Result<Option<Vec<f32>>> {
        let dim = x.len();
        let ((nq, nd, np), nwb) = self.run_rmsnorm_q8d(x, nw)?;
        let (g, u) = (Mat::upload(self, gate)?, Mat::upload(self, up)?);
        let f = gate.rows;
        let threads = glu_threads(f / 32, self.sms);
        let k = if half {
            match self.glu_half(&g.seg, &u.seg, dim, threads, Some(true)) {
                Some(k) => k,
                None => return Ok(None),
            }
        } else {
            self.glu(&g.seg, &u.seg, threads)
        };
        let hq = self.upload(&vec![0i8; f])?;
        let hd = self.upload(&vec![[f32::NAN; 2]; f / 32])?;
        launch!(self, [k], ((f / 32) as u32, 1), threads;
            g.seg, u.seg, dim as i32, nq.ptr, nd.ptr, hq.ptr, hd.ptr, 0u64, nwb.ptr, eps, np.ptr)?;
        self.dequant_q8(&hq, &hd, f).map(Some)
    }
}

impl GpuModel {
    /// Layer `li`'s expert FFN (kernels/moe.cu) over the rows of `x` (rows × dim, the residual
    /// before the FFN's norm): its output rows, and each row's experts and their weights.
    pub fn test_moe(&self, li: usize, x: &[f32]) -> Result<(Vec<f32>, Vec<u32>, Vec<f32>)> {
        let (dev, c) = (&self.dev, &self.config);
        dev.bind()?;
        let (d, t) = (c.dim, x.len() / c.dim);
        let k = c
            .experts
            .ok_or_else(|| Error::Model("not a mixture-of-experts model".into()))?
            .n_used;
        let bufs = super::moe::MoeBufs::new(dev, c, t)?.expect("experts");
        let (xb, out) = (dev.upload(x)?, dev.upload(&vec![f32::NAN; t * d])?);
        bufs.run(dev, c, &self.layers[li], t, xb.ptr, out.ptr, false)?;
        dev.sync()?;
        let mut y = vec![0f32; t * d];
        dev.read(&out, 0, &mut y)?;
        let (ids, wts) = bufs.routes(dev, t, k)?;
        Ok((y, ids, wts))
    }
}
