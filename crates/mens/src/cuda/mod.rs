//! CUDA backend (feature `cuda`): the same model and sampler, run on an NVIDIA GPU.
//!
//! - Own kernels (kernels.cu) compiled at run time by NVRTC and cached on disk; the driver, NVRTC
//!   and cuBLAS are loaded with dlopen (cudarc's `dynamic-loading`), so a `cuda` build needs no
//!   toolkit and starts on a machine without a GPU ([`Device::open`] then says so).
//! - Weights are uploaded once in their GGUF block formats; the KV cache (f16) and every buffer are
//!   allocated once per session.
//! - Decode: one CUDA graph per token (embedding, 9 kernels per layer, LM head, argmax, the 4-byte
//!   copy of the sampled id), captured once and replayed; the position lives in device memory.
//! - Prefill: weights dequantized to f16 per layer and multiplied with cuBLAS (tensor cores);
//!   attention as two batched cuBLAS GEMMs around a causal softmax kernel.
//! - Sampling on the device: greedy (argmax) and top-k ≤ 64 / top-p / min-p / temperature; repetition
//!   penalties fall back to the host sampler (the logits are copied then).

use crate::engine::Logits;
use crate::error::{Error, Result};
use crate::gguf::TensorType;
use crate::model::{Config, Model};
use crate::rope::{RopeStyle, RopeTable};
use crate::sample::Sampler;
use crate::weights::QTensor;
use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{result as drv, sys, CudaContext};
use std::ffi::c_void;
use std::sync::Arc;

pub mod reference;

const SRC: &str = include_str!("kernels.cu");
/// Keys per decode attention split (SPLIT in kernels.cu).
const SPLIT: usize = 64;
const MAXG: usize = 8;
/// Candidates kept per logits slice by on-device top-k sampling (KMAX in kernels.cu).
pub const TOPK_MAX: usize = 64;
const TOPK_BLOCKS: usize = 64;
const ARGMAX_BLOCKS: usize = 32;
/// Queries per attention sub-batch in prefill (bounds the score buffer).
const ATT_QUERIES: usize = 512;
/// Queries per block of the flash prefill attention kernel (FA_Q in kernels.cu).
const FA_Q: usize = 64;

/// Which prefill attention runs: two batched cuBLAS GEMMs around a softmax kernel (default,
/// faster on the H200 at long prompts), or the flash-attention style kernel
/// (`MENS_CUDA_PREFILL_ATTN=flash`: no score buffer).
fn flash_prefill() -> bool {
    std::env::var("MENS_CUDA_PREFILL_ATTN").is_ok_and(|v| v == "flash")
}

fn err(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Backend(format!("CUDA: {what}: {e:?}"))
}

macro_rules! kernels {
    ($($name:ident),* $(,)?) => {
        #[allow(non_snake_case)]
        struct Funcs { $($name: sys::CUfunction,)* }
        impl Funcs {
            fn names() -> Vec<&'static str> {
                vec![$(stringify!($name),)*]
            }
            fn list(&self) -> Vec<(&'static str, sys::CUfunction)> {
                vec![$((stringify!($name), self.$name),)*]
            }
            fn load(module: sys::CUmodule) -> Result<Self> {
                Ok(Funcs { $($name: unsafe {
                    drv::module::get_function(module, std::ffi::CString::new(stringify!($name)).unwrap())
                }.map_err(|e| err(concat!("kernel ", stringify!($name)), e))?,)* })
            }
        }
    };
}
kernels!(
    matvec,
    matvec_glu_q8,
    rmsnorm_q8,
    add_rmsnorm_f16,
    dequant_f16,
    embed,
    rope_store,
    attn_decode64,
    attn_decode128,
    qkv_rope,
    softmax_causal,
    unpermute_f16,
    flash_prefill64,
    flash_prefill128,
    swiglu_f16,
    argmax,
    topk_partial,
    sample_final,
);

/// One GPU: context, stream, kernels and cuBLAS handle.
pub struct Device {
    ctx: Arc<CudaContext>,
    stream: sys::CUstream,
    f: Funcs,
    blas: blas_sys::cublasHandle_t,
    pub name: String,
    pub arch: (i32, i32),
    pub total_mem: u64,
    /// When profiling: an event recorded after each launch, with the kernel's name.
    prof: std::sync::Mutex<Option<Vec<(&'static str, sys::CUevent)>>>,
}

// SAFETY: the raw handles are used from one thread at a time (sessions are &mut); the context is
// bound to the calling thread before every use.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

/// Run `f`, turning a panic (cudarc panics when a CUDA library cannot be dlopen'ed) into None,
/// without printing it.
fn quietly<T>(f: impl FnOnce() -> T + std::panic::UnwindSafe) -> Option<T> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(f);
    std::panic::set_hook(hook);
    r.ok()
}

/// Number of CUDA devices, or a clear error when there is no driver or no GPU.
fn init_context(ordinal: usize) -> Result<Arc<CudaContext>> {
    // Ask first whether libcuda loads at all (no panic to catch, nothing printed from another thread).
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::Backend(
            "no CUDA device was found (the CUDA driver library libcuda.so could not be loaded)"
                .into(),
        ));
    }
    match quietly(|| CudaContext::new(ordinal)) {
        Some(Ok(c)) => Ok(c),
        Some(Err(e)) => Err(Error::Backend(format!(
            "no CUDA device was found (the driver reports {e:?})"
        ))),
        None => Err(Error::Backend(
            "no CUDA device was found (the CUDA driver library libcuda.so could not be loaded)"
                .into(),
        )),
    }
}

fn cache_dir() -> std::path::PathBuf {
    if let Some(d) = std::env::var_os("MENS_CUDA_CACHE") {
        return d.into();
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("mens").join("cuda")
}

/// PTX for this GPU: from the disk cache (keyed by source hash and arch) or compiled by NVRTC.
fn ptx_for(arch: (i32, i32)) -> Result<Vec<u8>> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    SRC.hash(&mut h);
    let key = format!("kernels-{:016x}-sm{}{}.ptx", h.finish(), arch.0, arch.1);
    let path = cache_dir().join(&key);
    if let Ok(b) = std::fs::read(&path) {
        if b.last() == Some(&0) {
            return Ok(b);
        }
    }
    let bytes = compile_ptx(arch)?;
    if std::fs::create_dir_all(cache_dir()).is_ok() {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &bytes).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    }
    Ok(bytes)
}

/// Compile kernels.cu with NVRTC for `arch` (no GPU needed, only libnvrtc): the PTX text,
/// NUL-terminated.
pub fn compile_ptx(arch: (i32, i32)) -> Result<Vec<u8>> {
    let arch_s: &'static str = Box::leak(format!("sm_{}{}", arch.0, arch.1).into_boxed_str());
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error::Backend(
            "CUDA: NVRTC (libnvrtc.so) could not be loaded; put the CUDA libraries on LD_LIBRARY_PATH".into(),
        ));
    }
    let r = quietly(|| {
        cudarc::nvrtc::compile_ptx_with_opts(
            SRC,
            cudarc::nvrtc::CompileOptions {
                arch: Some(arch_s),
                options: vec!["-std=c++14".into()],
                ..Default::default()
            },
        )
    });
    let ptx = match r {
        Some(Ok(p)) => p,
        Some(Err(e)) => return Err(err("NVRTC could not compile the kernels", e)),
        None => {
            return Err(Error::Backend(
                "CUDA: NVRTC (libnvrtc.so) could not be loaded; put the CUDA libraries on LD_LIBRARY_PATH".into(),
            ))
        }
    };
    let mut bytes = ptx.to_src().into_bytes();
    bytes.push(0);
    Ok(bytes)
}

/// The names of the kernels the backend loads.
pub fn kernel_names() -> Vec<&'static str> {
    Funcs::names()
}

impl Device {
    /// Open GPU `ordinal`: a clear error when there is no driver, no GPU, or no NVRTC.
    pub fn open(ordinal: usize) -> Result<Arc<Device>> {
        let ctx = init_context(ordinal)?;
        let arch = ctx
            .compute_capability()
            .map_err(|e| err("compute capability", e))?;
        let name = ctx.name().unwrap_or_else(|_| "CUDA device".into());
        let total_mem = ctx.total_mem().map_err(|e| err("memory", e))? as u64;
        let ptx = ptx_for(arch)?;
        let module = unsafe { drv::module::load_data(ptx.as_ptr() as *const c_void) }
            .map_err(|e| err("loading the kernels", e))?;
        let f = Funcs::load(module)?;
        if std::env::var_os("MENS_CUDA_VERBOSE").is_some() {
            use sys::CUfunction_attribute as A;
            for (name, func) in f.list() {
                let get =
                    |a| unsafe { drv::function::get_function_attribute(func, a) }.unwrap_or(-1);
                eprintln!(
                    "mens: kernel {name}: {} registers, {} bytes local, {} bytes shared",
                    get(A::CU_FUNC_ATTRIBUTE_NUM_REGS),
                    get(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES),
                    get(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
                );
            }
        }
        let stream = drv::stream::create(drv::stream::StreamKind::NonBlocking)
            .map_err(|e| err("stream", e))?;
        if !unsafe { blas_sys::is_culib_present() } {
            return Err(Error::Backend(
                "CUDA: cuBLAS (libcublas.so) could not be loaded; put the CUDA libraries on LD_LIBRARY_PATH".into(),
            ));
        }
        let handle = match quietly(blas::create_handle) {
            Some(Ok(h)) => h,
            Some(Err(e)) => return Err(err("cuBLAS", e)),
            None => {
                return Err(Error::Backend(
                    "CUDA: cuBLAS (libcublas.so) could not be loaded; put the CUDA libraries on LD_LIBRARY_PATH".into(),
                ))
            }
        };
        unsafe { blas::set_stream(handle, stream as _) }.map_err(|e| err("cuBLAS stream", e))?;
        Ok(Arc::new(Device {
            ctx,
            stream,
            f,
            blas: handle,
            name,
            arch,
            total_mem,
            prof: std::sync::Mutex::new(None),
        }))
    }

    fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|e| err("bind", e))
    }

    /// Free and total device memory in bytes.
    pub fn mem_info(&self) -> Result<(u64, u64)> {
        self.bind()?;
        let (f, t) = drv::mem_get_info().map_err(|e| err("memory info", e))?;
        Ok((f as u64, t as u64))
    }

    pub fn sync(&self) -> Result<()> {
        unsafe { drv::stream::synchronize(self.stream) }.map_err(|e| err("kernel execution", e))
    }

    pub fn alloc(&self, bytes: usize) -> Result<Buf> {
        self.bind()?;
        let ptr = unsafe { drv::malloc_sync(bytes.max(16)) }.map_err(|e| {
            Error::Memory(format!(
                "the CUDA device could not allocate {} MiB: {e:?}",
                bytes >> 20
            ))
        })?;
        Ok(Buf { ptr, bytes })
    }

    pub fn upload<T: Copy>(&self, data: &[T]) -> Result<Buf> {
        let b = self.alloc(std::mem::size_of_val(data))?;
        self.write(&b, 0, data)?;
        Ok(b)
    }

    /// Copy `data` to `b` at byte offset `off` (synchronous).
    pub fn write<T: Copy>(&self, b: &Buf, off: usize, data: &[T]) -> Result<()> {
        let n = std::mem::size_of_val(data);
        assert!(off + n <= b.bytes.max(16), "write past the buffer");
        if n == 0 {
            return Ok(());
        }
        unsafe {
            drv::memcpy_htod_async(b.ptr + off as u64, data, self.stream)
                .map_err(|e| err("copy to device", e))?;
        }
        self.sync()
    }

    /// Copy from `b` at byte offset `off` into `out` (synchronous).
    pub fn read<T: Copy>(&self, b: &Buf, off: usize, out: &mut [T]) -> Result<()> {
        let n = std::mem::size_of_val(out);
        assert!(off + n <= b.bytes.max(16), "read past the buffer");
        self.sync()?;
        unsafe { drv::memcpy_dtoh_sync(out, b.ptr + off as u64) }
            .map_err(|e| err("copy from device", e))
    }

    /// Launch `f` on the device's stream. `args` are pointers to each argument's value.
    fn launch(
        &self,
        name: &'static str,
        f: sys::CUfunction,
        grid: (u32, u32),
        block: u32,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        unsafe { drv::launch_kernel(f, (grid.0, grid.1, 1), (block, 1, 1), 0, self.stream, args) }
            .map_err(|e| err("kernel launch", e))?;
        if let Some(events) = self.prof.lock().unwrap().as_mut() {
            let e = drv::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
                .map_err(|e| err("event", e))?;
            unsafe { drv::event::record(e, self.stream) }.map_err(|e| err("event", e))?;
            events.push((name, e));
        }
        Ok(())
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        let _ = self.bind();
        unsafe {
            let _ = blas::destroy_handle(self.blas);
            let _ = drv::stream::destroy(self.stream);
        }
    }
}

/// Device memory, freed on drop.
pub struct Buf {
    pub ptr: u64,
    pub bytes: usize,
}

impl Buf {
    fn at(&self, off: usize) -> u64 {
        self.ptr + off as u64
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        unsafe {
            let _ = drv::free_sync(self.ptr);
        }
    }
}

/// Kernel arguments: a tuple of values whose addresses go to cuLaunchKernel.
trait ArgPtrs {
    fn ptrs(&mut self) -> Vec<*mut c_void>;
}
macro_rules! arg_ptrs {
    ($($t:ident $i:tt),+) => {
        impl<$($t),+> ArgPtrs for ($($t,)+) {
            fn ptrs(&mut self) -> Vec<*mut c_void> {
                vec![$(&mut self.$i as *mut $t as *mut c_void),+]
            }
        }
    };
}
arg_ptrs!(A 0, B 1, C 2);
arg_ptrs!(A 0, B 1, C 2, D 3);
arg_ptrs!(A 0, B 1, C 2, D 3, E 4);
arg_ptrs!(A 0, B 1, C 2, D 3, E 4, F 5);
arg_ptrs!(A 0, B 1, C 2, D 3, E 4, F 5, G 6);
arg_ptrs!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7);
arg_ptrs!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8);
arg_ptrs!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9);
arg_ptrs!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10);
arg_ptrs!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10, L 11);
arg_ptrs!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10, L 11, M 12);
arg_ptrs!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10, L 11, M 12, N 13, O 14, P 15, Q 16);

/// `launch!(dev, kernel, grid, block; args...)`: the argument values must have the kernel's C
/// types (u64 for pointers, i32 for int, f32 for float, `Seg` for a matrix).
macro_rules! launch {
    ($dev:expr, $f:ident as $name:literal, $grid:expr, $block:expr; $($a:expr),+ $(,)?) => {{
        let mut vals = ($($a,)+);
        let mut p = ArgPtrs::ptrs(&mut vals);
        $dev.launch($name, $dev.f.$f, $grid, $block, &mut p)
    }};
    ($dev:expr, $f:ident, $grid:expr, $block:expr; $($a:expr),+ $(,)?) => {{
        let mut vals = ($($a,)+);
        let mut p = ArgPtrs::ptrs(&mut vals);
        $dev.launch(stringify!($f), $dev.f.$f, $grid, $block, &mut p)
    }};
}

/// A weight matrix as the kernels see it (kernels.cu's `Seg`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Seg {
    w: u64,
    row_bytes: u64,
    ty: i32,
    rows: i32,
}

impl Seg {
    const NONE: Seg = Seg {
        w: 0,
        row_bytes: 0,
        ty: 0,
        rows: 0,
    };
}

const SUPPORTED: &[TensorType] = &[
    TensorType::F32,
    TensorType::F16,
    TensorType::BF16,
    TensorType::Q4_0,
    TensorType::Q4_1,
    TensorType::Q5_0,
    TensorType::Q5_1,
    TensorType::Q8_0,
    TensorType::Q4K,
    TensorType::Q5K,
    TensorType::Q6K,
];

/// A quantized matrix on the device.
pub struct Mat {
    _buf: Buf,
    seg: Seg,
    pub cols: usize,
}

impl Mat {
    pub fn upload(dev: &Device, t: &QTensor) -> Result<Mat> {
        if !SUPPORTED.contains(&t.ttype) {
            return Err(Error::Model(format!(
                "tensor type {} is not supported by the CUDA backend",
                t.ttype.name()
            )));
        }
        if t.cols % 32 != 0 {
            return Err(Error::Model(format!(
                "the CUDA backend needs rows of a multiple of 32 values, got {}",
                t.cols
            )));
        }
        let buf = dev.upload(t.data())?;
        let seg = Seg {
            w: buf.ptr,
            row_bytes: t.row_bytes() as u64,
            ty: t.ttype.id() as i32,
            rows: t.rows as i32,
        };
        Ok(Mat {
            _buf: buf,
            seg,
            cols: t.cols,
        })
    }
}

struct GpuLayer {
    attn_norm: Buf,
    q: Mat,
    k: Mat,
    v: Mat,
    bias: Option<Buf>,
    o: Mat,
    ffn_norm: Buf,
    gate: Mat,
    up: Mat,
    down: Mat,
}

/// The model's weights on one GPU.
pub struct GpuModel {
    pub dev: Arc<Device>,
    pub config: Config,
    embedding: Mat,
    /// None when tied to the embedding.
    output: Option<Mat>,
    output_norm: Buf,
    layers: Vec<GpuLayer>,
    pub weight_bytes: u64,
}

impl GpuModel {
    /// Upload `m`'s weights (once, quantized as stored). `progress` is called after each layer.
    pub fn upload(dev: Arc<Device>, m: &Model, mut progress: impl FnMut(usize)) -> Result<Self> {
        let c = &m.config;
        let g = c.n_head / c.n_kv_head;
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
            config: c.clone(),
            dev,
        })
    }

    fn head(&self) -> &Mat {
        self.output.as_ref().unwrap_or(&self.embedding)
    }
}

/// How a session samples on the device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DeviceSampling {
    Greedy,
    TopK {
        k: usize,
        temp: f32,
        top_p: f32,
        min_p: f32,
        seed: u64,
    },
    /// Penalties or a top-k above TOPK_MAX: the logits go to the host sampler.
    Host,
}

impl DeviceSampling {
    pub fn of(s: &Sampler) -> Self {
        let c = &s.config;
        if c.penalised() {
            DeviceSampling::Host
        } else if s.is_greedy() {
            DeviceSampling::Greedy
        } else if c.top_k > TOPK_MAX {
            DeviceSampling::Host
        } else {
            DeviceSampling::TopK {
                // top-k 0 (off) keeps the 64 most likely tokens.
                k: if c.top_k == 0 { TOPK_MAX } else { c.top_k },
                temp: c.temperature,
                top_p: c.top_p,
                min_p: c.min_p,
                seed: c.seed,
            }
        }
    }
}

/// One sequence on the GPU: KV cache, every buffer, the decode graph.
pub struct CudaSession {
    pub model: Arc<GpuModel>,
    ctx: usize,
    ubatch: usize,
    tokens: Vec<u32>,
    kc: Buf,
    vc: Buf,
    cos: Buf,
    sin: Buf,
    // decode
    x: Buf,
    qkv: Buf,
    aq: Buf,
    ad: Buf,
    hq: Buf,
    hd: Buf,
    part_o: Buf,
    part_ml: Buf,
    logits: Buf,
    partial: Buf,
    counter: Buf,
    tok: Buf,
    out: Buf,
    pos: Buf,
    rng_ctr: Buf,
    cand: Buf,
    // prefill
    xb16: Buf,
    w16: Buf,
    tmp: Buf,
    gu: Buf,
    h16: Buf,
    qperm: Buf,
    scores: Buf,
    probs: Buf,
    o: Buf,
    toks: Buf,
    pinned: *mut i32,
    graph: Option<sys::CUgraphExec>,
    /// The token id the device holds as the next step's input (sampled there).
    dev_tok: Option<u32>,
    /// Whether the device's pos equals tokens.len() (false after truncate/reset).
    pos_synced: bool,
    host_logits: Vec<f32>,
    logits_valid: bool,
    /// Kernels in the decode graph.
    pub graph_kernels: usize,
}

/// Values of the largest group of layer matrices dequantized at once in prefill.
fn max_group_values(c: &Config) -> usize {
    let qkv = (c.q_dim() + 2 * c.kv_dim()) * c.dim;
    qkv.max(c.dim * c.q_dim())
        .max(2 * c.ffn_dim * c.dim)
        .max(c.dim * c.ffn_dim)
}

/// Bytes a CUDA session of `ctx` tokens and prefill batch `ubatch` allocates on the device.
pub fn session_bytes(c: &Config, ctx: usize, ubatch: usize) -> u64 {
    let max_group = max_group_values(c);
    let (d, q, kv, f, v) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim, c.vocab_size);
    let row = q + 2 * kv;
    let splits = ctx.div_ceil(SPLIT);
    let b = ubatch;
    let kvc = 2 * c.n_layer * ctx * kv * 2;
    let rope = 2 * ctx * c.head_dim / 2 * 4;
    let dec = 4 * (b * d + b * row)
        + d.max(q) * 2
        + f * 2
        + splits * c.n_head * (c.head_dim + 2) * 4
        + v * 4;
    let pre = 2 * b * d.max(q)
        + 2 * max_group
        + 4 * b * d
        + 4 * b * 2 * f
        + 2 * b * f
        + 2 * b * q
        + c.n_head * b.min(ATT_QUERIES) * ctx * 6
        + 4 * b * q
        + 4 * b;
    (kvc + rope + dec + pre + TOPK_BLOCKS * TOPK_MAX * 8 + 4096) as u64
}

impl CudaSession {
    /// A session of `ctx` tokens; prompts are processed `ubatch` tokens at a time.
    pub fn new(model: Arc<GpuModel>, ctx: usize, ubatch: usize) -> Result<Self> {
        let c = model.config.clone();
        if ctx == 0 || ubatch == 0 || ctx > i32::MAX as usize / 2 {
            return Err(Error::InvalidArgument(
                "context and batch must be > 0".into(),
            ));
        }
        let ubatch = ubatch.min(ctx);
        let max_group = max_group_values(&c);
        let need = session_bytes(&c, ctx, ubatch);
        let dev = model.dev.clone();
        let (free, _) = dev.mem_info()?;
        if need + (256 << 20) > free {
            return Err(Error::Memory(format!(
                "a CUDA session of {ctx} tokens needs {} MiB (KV cache and buffers) but {} has {} MiB free",
                need >> 20,
                dev.name,
                free >> 20
            )));
        }
        let (d, q, kv, f, v) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim, c.vocab_size);
        let row = q + 2 * kv;
        let splits = ctx.div_ceil(SPLIT);
        let b = ubatch;
        let rope = RopeTable::new(ctx, c.head_dim, c.rope_base);
        let a = |n: usize| dev.alloc(n);
        let kc = a(c.n_layer * ctx * kv * 2)?;
        let vc = a(c.n_layer * ctx * kv * 2)?;
        let pinned =
            unsafe { drv::malloc_host(16, 0) }.map_err(|e| err("pinned memory", e))? as *mut i32;
        let s = CudaSession {
            cos: dev.upload(&rope.cos)?,
            sin: dev.upload(&rope.sin)?,
            x: a(4 * b * d)?,
            qkv: a(4 * b * row)?,
            aq: a(d.max(q))?,
            ad: a(8 * d.max(q) / 32)?,
            hq: a(f)?,
            hd: a(8 * f / 32)?,
            part_o: a(4 * splits * c.n_head * c.head_dim)?,
            part_ml: a(8 * splits * c.n_head)?,
            logits: a(4 * v)?,
            partial: a(8 * ARGMAX_BLOCKS)?,
            counter: dev.upload(&[0u32; 1 + 64])?,
            tok: a(4)?,
            out: a(4)?,
            pos: a(4)?,
            rng_ctr: dev.upload(&[0u64])?,
            cand: a(8 * TOPK_BLOCKS * TOPK_MAX)?,
            xb16: a(2 * b * d.max(q))?,
            w16: a(2 * max_group)?,
            tmp: a(4 * b * d)?,
            gu: a(4 * b * 2 * f)?,
            h16: a(2 * b * f)?,
            qperm: a(2 * b * q)?,
            scores: a(4 * c.n_head * b.min(ATT_QUERIES) * ctx)?,
            probs: a(2 * c.n_head * b.min(ATT_QUERIES) * ctx)?,
            o: a(4 * b * q)?,
            toks: a(4 * b)?,
            kc,
            vc,
            pinned,
            graph: None,
            dev_tok: None,
            pos_synced: false,
            host_logits: vec![0f32; v],
            logits_valid: false,
            graph_kernels: 0,
            tokens: Vec::with_capacity(ctx),
            ctx,
            ubatch,
            model,
        };
        let mut s = s;
        // Record the decode graph now, so the first token does not pay for it.
        s.capture()?;
        Ok(s)
    }

    pub fn ctx(&self) -> usize {
        self.ctx
    }
    pub fn pos(&self) -> usize {
        self.tokens.len()
    }
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }
    pub fn reset(&mut self) {
        self.truncate(0);
    }
    pub fn truncate(&mut self, n: usize) {
        self.tokens.truncate(n);
        self.logits_valid = false;
        self.pos_synced = false;
        self.dev_tok = None;
    }
    pub fn kv_cache_bytes(&self) -> usize {
        self.kc.bytes + self.vc.bytes
    }

    fn layer_cache(&self, li: usize) -> (u64, u64) {
        let c = &self.model.config;
        let per = (self.ctx * c.kv_dim() * 2) as u64;
        (self.kc.ptr + li as u64 * per, self.vc.ptr + li as u64 * per)
    }

    fn check(&self, tokens: &[u32]) -> Result<()> {
        crate::engine::check_tokens(self.pos(), self.ctx, tokens, self.model.config.vocab_size)
    }

    /// Run `tokens` after the cached ones. `Logits::Last` leaves the last token's logits on the
    /// device (and its greedy choice); `Logits::All` hands each position's logits to the callback
    /// (positions before `from` are prefilled in batches, the rest decoded one by one).
    pub fn forward(&mut self, tokens: &[u32], logits: Logits) -> Result<()> {
        self.check(tokens)?;
        self.model.dev.bind()?;
        match logits {
            Logits::Last => {
                if tokens.len() == 1 {
                    self.decode(tokens[0])
                } else {
                    self.prefill(tokens)
                }
            }
            Logits::All { from, f } => {
                let from = from.min(tokens.len());
                if from > 0 {
                    self.prefill(&tokens[..from])?;
                }
                for (i, &t) in tokens.iter().enumerate().skip(from) {
                    self.decode(t)?;
                    f(i, self.logits()?);
                }
                Ok(())
            }
        }
    }

    /// The last position's logits, copied to the host.
    pub fn logits(&mut self) -> Result<&[f32]> {
        if !self.logits_valid {
            let dev = &self.model.dev;
            dev.read(&self.logits, 0, &mut self.host_logits)?;
            self.logits_valid = true;
        }
        Ok(&self.host_logits)
    }

    /// Pick the next token: on the device when the sampler allows it (one 4-byte read-back),
    /// otherwise on the host from copied logits.
    pub fn sample(&mut self, sampler: &mut Sampler) -> Result<u32> {
        match DeviceSampling::of(sampler) {
            DeviceSampling::Greedy => {
                // The decode graph / prefill already ran argmax and copied the id.
                self.model.dev.sync()?;
                let t = unsafe { *self.pinned } as u32;
                self.dev_tok = Some(t);
                Ok(t)
            }
            DeviceSampling::TopK {
                k,
                temp,
                top_p,
                min_p,
                seed,
            } => {
                let t = self.sample_device(k, temp, top_p, min_p, seed)?;
                self.dev_tok = Some(t);
                Ok(t)
            }
            DeviceSampling::Host => {
                self.logits()?;
                let t = sampler.sample(&mut self.host_logits, &self.tokens);
                self.logits_valid = false; // penalties changed the copy
                Ok(t)
            }
        }
    }

    fn sample_device(
        &mut self,
        k: usize,
        temp: f32,
        top_p: f32,
        min_p: f32,
        seed: u64,
    ) -> Result<u32> {
        let dev = self.model.dev.clone();
        let v = self.model.config.vocab_size as i32;
        let slice = (v as usize).div_ceil(TOPK_BLOCKS) as i32;
        let k = k as i32;
        launch!(dev, topk_partial, (TOPK_BLOCKS as u32, 1), 256;
            self.logits.ptr, v, k, slice, self.cand.ptr)?;
        launch!(dev, sample_final, (1, 1), 256;
            self.cand.ptr, (TOPK_BLOCKS as i32) * k, k, temp, top_p, min_p, seed,
            self.rng_ctr.ptr, self.tok.ptr, self.out.ptr, self.pos.ptr, 0i32)?;
        unsafe {
            drv::memcpy_dtoh_async(
                std::slice::from_raw_parts_mut(self.pinned, 1),
                self.out.ptr,
                dev.stream,
            )
        }
        .map_err(|e| err("copy from device", e))?;
        dev.sync()?;
        Ok(unsafe { *self.pinned } as u32)
    }

    /// The LM head on the q8 activations in `aq`, then argmax (advancing pos by `advance`) and the
    /// copy of the chosen id to pinned host memory.
    fn head(&self, advance: i32) -> Result<()> {
        let m = &self.model;
        let dev = &m.dev;
        let c = &m.config;
        let h = m.head().seg;
        let rows = c.vocab_size;
        launch!(dev, matvec as "matvec (LM head)", (rows.div_ceil(4) as u32, 1), 128;
            h, Seg::NONE, Seg::NONE, c.dim as i32, self.aq.ptr, self.ad.ptr, self.logits.ptr, 0u64, 0i32)?;
        launch!(dev, argmax, (ARGMAX_BLOCKS as u32, 1), 1024;
            self.logits.ptr, rows as i32, self.partial.ptr, self.counter.ptr, self.tok.ptr,
            self.out.ptr, self.pos.ptr, advance)?;
        unsafe {
            drv::memcpy_dtoh_async(
                std::slice::from_raw_parts_mut(self.pinned, 1),
                self.out.ptr,
                dev.stream,
            )
        }
        .map_err(|e| err("copy from device", e))
    }

    /// Every kernel of one decode step (what the graph holds).
    fn decode_kernels(&self) -> Result<usize> {
        let m = &self.model;
        let dev = &m.dev;
        let c = &m.config;
        let (d, q, kv, f) = (c.dim as i32, c.q_dim(), c.kv_dim(), c.ffn_dim as i32);
        let row = q + 2 * kv;
        let eps = c.rms_eps;
        let neox = (c.rope_style == RopeStyle::Neox) as i32;
        let splits = self.ctx.div_ceil(SPLIT) as u32;
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        let mut n = 0;
        launch!(dev, embed, (1, 1), 128; m.embedding.seg, d, self.tok.ptr, self.x.ptr)?;
        launch!(dev, rmsnorm_q8, (1, 1), 1024;
            self.x.ptr, m.layers[0].attn_norm.ptr, eps, d, self.aq.ptr, self.ad.ptr)?;
        n += 2;
        for (li, l) in m.layers.iter().enumerate() {
            let (kc, vc) = self.layer_cache(li);
            let bias = l.bias.as_ref().map_or(0, |b| b.ptr);
            launch!(dev, qkv_rope, ((row / 2).div_ceil(4) as u32, 1), 128;
                l.q.seg, l.k.seg, l.v.seg, d, self.aq.ptr, self.ad.ptr, bias, self.cos.ptr,
                self.sin.ptr, self.pos.ptr, c.n_head as i32, c.n_kv_head as i32,
                c.head_dim as i32, neox, self.qkv.ptr, kc, vc)?;
            let args = (
                self.qkv.ptr,
                kc,
                vc,
                self.pos.ptr,
                c.n_head as i32,
                c.n_kv_head as i32,
                scale,
                self.part_o.ptr,
                self.part_ml.ptr,
                self.counter.at(4),
                self.aq.ptr,
                self.ad.ptr,
            );
            if c.head_dim == 64 {
                launch!(dev, attn_decode64, (c.n_kv_head as u32, splits), 256;
                    args.0, args.1, args.2, args.3, args.4, args.5, args.6, args.7, args.8,
                    args.9, args.10, args.11)?;
            } else {
                launch!(dev, attn_decode128, (c.n_kv_head as u32, splits), 256;
                    args.0, args.1, args.2, args.3, args.4, args.5, args.6, args.7, args.8,
                    args.9, args.10, args.11)?;
            }
            launch!(dev, matvec as "matvec (attn_output + residual)", ((c.dim).div_ceil(4) as u32, 1), 128;
                l.o.seg, Seg::NONE, Seg::NONE, q as i32, self.aq.ptr, self.ad.ptr, self.x.ptr, 0u64, 1i32)?;
            launch!(dev, rmsnorm_q8, (1, 1), 1024;
                self.x.ptr, l.ffn_norm.ptr, eps, d, self.aq.ptr, self.ad.ptr)?;
            launch!(dev, matvec_glu_q8, ((c.ffn_dim / 32) as u32, 1), 1024;
                l.gate.seg, l.up.seg, d, self.aq.ptr, self.ad.ptr, self.hq.ptr, self.hd.ptr)?;
            launch!(dev, matvec as "matvec (ffn_down + residual)", ((c.dim).div_ceil(4) as u32, 1), 128;
                l.down.seg, Seg::NONE, Seg::NONE, f, self.hq.ptr, self.hd.ptr, self.x.ptr, 0u64, 1i32)?;
            let norm = m
                .layers
                .get(li + 1)
                .map_or(&m.output_norm, |n| &n.attn_norm);
            launch!(dev, rmsnorm_q8, (1, 1), 1024;
                self.x.ptr, norm.ptr, eps, d, self.aq.ptr, self.ad.ptr)?;
            n += 7;
        }
        self.head(1)?;
        Ok(n + 2)
    }

    /// One token: set the input id (unless the device already holds it), replay the graph.
    fn decode(&mut self, token: u32) -> Result<()> {
        let dev = self.model.dev.clone();
        if self.dev_tok != Some(token) {
            dev.write(&self.tok, 0, &[token as i32])?;
        }
        if !self.pos_synced {
            dev.write(&self.pos, 0, &[self.tokens.len() as i32])?;
            self.pos_synced = true;
        }
        if self.graph.is_none() {
            self.capture()?;
        }
        unsafe { drv::graph::launch(self.graph.unwrap(), dev.stream) }
            .map_err(|e| err("graph launch", e))?;
        self.tokens.push(token);
        self.dev_tok = None;
        self.logits_valid = false;
        Ok(())
    }

    fn capture(&mut self) -> Result<()> {
        let dev = self.model.dev.clone();
        dev.sync()?;
        unsafe {
            drv::stream::begin_capture(
                dev.stream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(|e| err("graph capture", e))?;
        let r = self.decode_kernels();
        let g = unsafe { drv::stream::end_capture(dev.stream) };
        let n = r?;
        let g = g.map_err(|e| err("graph capture", e))?;
        let exec = unsafe { drv::graph::instantiate(g, sys::CUgraphInstantiate_flags(0)) }
            .map_err(|e| err("graph instantiate", e))?;
        unsafe {
            let _ = drv::graph::destroy(g);
        }
        self.graph = Some(exec);
        self.graph_kernels = n;
        Ok(())
    }

    /// f16 GEMM: out[t][o0..] (f32, row stride `ldo`) = x16[t] · W^T for the stacked matrices.
    fn linear(&self, mats: &[&Mat], x16: u64, t: usize, out: u64, ldo: usize) -> Result<()> {
        let dev = &self.model.dev;
        let cols = mats[0].cols;
        let mut rows = 0usize;
        for m in mats {
            let n = m.seg.rows as usize * cols;
            let chunks = n / 32;
            launch!(dev, dequant_f16, (chunks.div_ceil(256) as u32, 1), 256;
                m.seg, cols as i32, self.w16.at(2 * rows * cols))?;
            rows += m.seg.rows as usize;
        }
        let (one, zero) = (1f32, 0f32);
        unsafe {
            blas::gemm_ex(
                dev.blas,
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                rows as i32,
                t as i32,
                cols as i32,
                &one as *const f32 as *const c_void,
                self.w16.ptr as *const c_void,
                blas_sys::cudaDataType::CUDA_R_16F,
                cols as i32,
                x16 as *const c_void,
                blas_sys::cudaDataType::CUDA_R_16F,
                cols as i32,
                &zero as *const f32 as *const c_void,
                out as *mut c_void,
                blas_sys::cudaDataType::CUDA_R_32F,
                ldo as i32,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| err("cuBLAS GEMM", e))
    }

    /// Causal attention of `t` new queries (Q grouped by KV head in `qperm`) against the first
    /// pos0 + t cache entries of layer `li`, into xb16 as [t][q_dim] f16. Queries go in
    /// sub-batches of ATT_QUERIES so that the score buffer stays n_head × ATT_QUERIES × ctx.
    fn attention_prefill(&self, li: usize, t: usize, pos0: usize) -> Result<()> {
        let m = &self.model;
        let dev = &m.dev;
        let c = &m.config;
        let (kc, vc) = self.layer_cache(li);
        let g = c.n_head / c.n_kv_head;
        let hd = c.head_dim;
        let scale = 1.0 / (hd as f32).sqrt();
        let (one, zero) = (1f32, 0f32);
        let op = |x| {
            if x {
                blas_sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas_sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let f16 = blas_sys::cudaDataType::CUDA_R_16F;
        let f32t = blas_sys::cudaDataType::CUDA_R_32F;
        for t0 in (0..t).step_by(ATT_QUERIES) {
            let n = ATT_QUERIES.min(t - t0);
            let l = pos0 + t0 + n; // keys the last query of this sub-batch sees
            let rows = n * g;
            // Per KV head: Q rows of this sub-batch start at t0 * g; batch strides cover all t.
            let q = self.qperm.ptr + (2 * t0 * g * hd) as u64;
            let o = self.o.ptr + (4 * t0 * g * hd) as u64;
            unsafe {
                // S[kvh] (col-major l × rows) = K[kvh]ᵀ-view · Q[kvh]
                blas::gemm_strided_batched_ex(
                    dev.blas,
                    op(true),
                    op(false),
                    l as i32,
                    rows as i32,
                    hd as i32,
                    &scale as *const f32 as *const c_void,
                    kc as *const c_void,
                    f16,
                    c.kv_dim() as i32,
                    hd as i64,
                    q as *const c_void,
                    f16,
                    hd as i32,
                    (t * g * hd) as i64,
                    &zero as *const f32 as *const c_void,
                    self.scores.ptr as *mut c_void,
                    f32t,
                    l as i32,
                    (rows * l) as i64,
                    c.n_kv_head as i32,
                    blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .map_err(|e| err("cuBLAS batched GEMM (scores)", e))?;
            launch!(dev, softmax_causal, ((c.n_kv_head * rows) as u32, 1), 256;
                self.scores.ptr, self.probs.ptr, l as i32, l as i32, g as i32, n as i32,
                self.pos.ptr, t0 as i32)?;
            unsafe {
                // O[kvh] (col-major hd × rows) = V[kvh] (hd × l view) · P[kvh] (l × rows)
                blas::gemm_strided_batched_ex(
                    dev.blas,
                    op(false),
                    op(false),
                    hd as i32,
                    rows as i32,
                    l as i32,
                    &one as *const f32 as *const c_void,
                    vc as *const c_void,
                    f16,
                    c.kv_dim() as i32,
                    hd as i64,
                    self.probs.ptr as *const c_void,
                    f16,
                    l as i32,
                    (rows * l) as i64,
                    &zero as *const f32 as *const c_void,
                    o as *mut c_void,
                    f32t,
                    hd as i32,
                    (t * g * hd) as i64,
                    c.n_kv_head as i32,
                    blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .map_err(|e| err("cuBLAS batched GEMM (values)", e))?;
        }
        let n = t * c.q_dim();
        launch!(dev, unpermute_f16, (n.div_ceil(256) as u32, 1), 256;
            self.o.ptr, self.xb16.ptr, c.n_head as i32, c.n_kv_head as i32, hd as i32, t as i32)
    }

    /// Causal attention of the `t` new queries (rotated, in `qkv`) against the first pos0 + t
    /// cache entries of layer `li` (flash-attention kernel), into xb16 as [t][q_dim] f16.
    fn attention_flash(&self, li: usize, t: usize) -> Result<()> {
        let m = &self.model;
        let dev = &m.dev;
        let c = &m.config;
        let (kc, vc) = self.layer_cache(li);
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        let grid = (t.div_ceil(FA_Q) as u32, c.n_head as u32);
        let args = (
            self.qkv.ptr,
            kc,
            vc,
            self.pos.ptr,
            t as i32,
            c.n_head as i32,
            c.n_kv_head as i32,
            scale,
            self.xb16.ptr,
        );
        if c.head_dim == 64 {
            launch!(dev, flash_prefill64, grid, 256;
                args.0, args.1, args.2, args.3, args.4, args.5, args.6, args.7, args.8)
        } else {
            launch!(dev, flash_prefill128, grid, 256;
                args.0, args.1, args.2, args.3, args.4, args.5, args.6, args.7, args.8)
        }
    }

    /// A prompt, `ubatch` tokens at a time; leaves the last token's logits and greedy id.
    fn prefill(&mut self, tokens: &[u32]) -> Result<()> {
        let chunks: Vec<&[u32]> = tokens.chunks(self.ubatch).collect();
        for (i, ch) in chunks.iter().enumerate() {
            self.prefill_chunk(ch, i + 1 == chunks.len())?;
        }
        self.dev_tok = None;
        self.logits_valid = false;
        self.pos_synced = true;
        Ok(())
    }

    fn prefill_chunk(&mut self, toks: &[u32], last: bool) -> Result<()> {
        let m = self.model.clone();
        let dev = &m.dev;
        let c = &m.config;
        let t = toks.len();
        let pos0 = self.tokens.len();
        let (d, q, kv, f) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim);
        let row = q + 2 * kv;
        let eps = c.rms_eps;
        let neox = (c.rope_style == RopeStyle::Neox) as i32;
        let ids: Vec<i32> = toks.iter().map(|&x| x as i32).collect();
        dev.write(&self.toks, 0, &ids)?;
        dev.write(&self.pos, 0, &[pos0 as i32])?;
        launch!(dev, embed, (t as u32, 1), 128; m.embedding.seg, d as i32, self.toks.ptr, self.x.ptr)?;
        launch!(dev, add_rmsnorm_f16, (t as u32, 1), 256;
            self.x.ptr, 0u64, m.layers[0].attn_norm.ptr, eps, d as i32, self.xb16.ptr)?;
        for (li, l) in m.layers.iter().enumerate() {
            let (kc, vc) = self.layer_cache(li);
            self.linear(&[&l.q, &l.k, &l.v], self.xb16.ptr, t, self.qkv.ptr, row)?;
            let bias = l.bias.as_ref().map_or(0, |b| b.ptr);
            launch!(dev, rope_store, (t as u32, 1), 256;
                self.qkv.ptr, bias, self.cos.ptr, self.sin.ptr, self.pos.ptr, c.n_head as i32,
                c.n_kv_head as i32, c.head_dim as i32, neox, kc, vc, self.qperm.ptr, t as i32)?;
            if flash_prefill() {
                self.attention_flash(li, t)?;
            } else {
                self.attention_prefill(li, t, pos0)?;
            }
            self.linear(&[&l.o], self.xb16.ptr, t, self.tmp.ptr, d)?;
            launch!(dev, add_rmsnorm_f16, (t as u32, 1), 256;
                self.x.ptr, self.tmp.ptr, l.ffn_norm.ptr, eps, d as i32, self.xb16.ptr)?;
            self.linear(&[&l.gate, &l.up], self.xb16.ptr, t, self.gu.ptr, 2 * f)?;
            let n = t * f;
            launch!(dev, swiglu_f16, (n.div_ceil(256) as u32, 1), 256;
                self.gu.ptr, f as i32, t as i32, self.h16.ptr)?;
            self.linear(&[&l.down], self.h16.ptr, t, self.tmp.ptr, d)?;
            let norm = m
                .layers
                .get(li + 1)
                .map_or(&m.output_norm, |n| &n.attn_norm);
            launch!(dev, add_rmsnorm_f16, (t as u32, 1), 256;
                self.x.ptr, self.tmp.ptr, norm.ptr, eps, d as i32, self.xb16.ptr)?;
        }
        if last {
            launch!(dev, rmsnorm_q8, (1, 1), 1024;
                self.x.at(4 * (t - 1) * d), m.output_norm.ptr, eps, d as i32, self.aq.ptr, self.ad.ptr)?;
            self.head(t as i32)?;
        }
        self.tokens.extend_from_slice(toks);
        Ok(())
    }

    /// Time each kernel of `steps` decode steps run one launch at a time (outside the graph,
    /// so each also pays its launch): (kernel, calls per step, microseconds per step), slowest first.
    /// The steps decode the device's own greedy tokens; the session's tokens are not extended, so
    /// the cache entries written here are overwritten by the next forward pass.
    pub fn profile_decode(&mut self, steps: usize) -> Result<Vec<(&'static str, usize, f64)>> {
        let dev = self.model.dev.clone();
        dev.bind()?;
        dev.write(&self.pos, 0, &[self.tokens.len() as i32])?;
        let mut totals: Vec<(&'static str, usize, f64)> = Vec::new();
        for _ in 0..steps.max(1) {
            let start = drv::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
                .map_err(|e| err("event", e))?;
            unsafe { drv::event::record(start, dev.stream) }.map_err(|e| err("event", e))?;
            *dev.prof.lock().unwrap() = Some(Vec::new());
            let r = self.decode_kernels();
            let events = dev.prof.lock().unwrap().take().unwrap_or_default();
            r?;
            dev.sync()?;
            let mut prev = start;
            for (name, e) in &events {
                let ms = unsafe { drv::event::elapsed(prev, *e) }.map_err(|e| err("event", e))?;
                match totals.iter_mut().find(|t| t.0 == *name) {
                    Some(t) => {
                        t.1 += 1;
                        t.2 += ms as f64 * 1e3;
                    }
                    None => totals.push((name, 1, ms as f64 * 1e3)),
                }
                prev = *e;
            }
            unsafe {
                let _ = drv::event::destroy(start);
                for (_, e) in events {
                    let _ = drv::event::destroy(e);
                }
            }
        }
        let n = steps.max(1);
        for t in totals.iter_mut() {
            t.1 /= n;
            t.2 /= n as f64;
        }
        totals.sort_by(|a, b| b.2.total_cmp(&a.2));
        // The profiled steps advanced the device's position: put it back.
        self.pos_synced = false;
        self.dev_tok = None;
        self.logits_valid = false;
        Ok(totals)
    }
}

impl Drop for CudaSession {
    fn drop(&mut self) {
        let _ = self.model.dev.bind();
        let _ = self.model.dev.sync();
        unsafe {
            if let Some(g) = self.graph.take() {
                let _ = drv::graph::exec_destroy(g);
            }
            let _ = drv::free_host(self.pinned as *mut c_void);
        }
    }
}

/// Single-kernel entry points for the kernel tests (each against cuda::reference).
impl Device {
    /// y = W · a with the decode matvec kernel; `a` is q8 (see reference::quantize_q8).
    pub fn test_matvec(&self, w: &QTensor, q: &[i8], ds: &[[f32; 2]]) -> Result<Vec<f32>> {
        self.bind()?;
        let m = Mat::upload(self, w)?;
        let (aq, ad) = (self.upload(q)?, self.upload(ds)?);
        let out = self.upload(&vec![f32::NAN; w.rows])?;
        launch!(self, matvec, (w.rows.div_ceil(4) as u32, 1), 128;
            m.seg, Seg::NONE, Seg::NONE, w.cols as i32, aq.ptr, ad.ptr, out.ptr, 0u64, 0i32)?;
        let mut y = vec![0f32; w.rows];
        self.read(&out, 0, &mut y)?;
        Ok(y)
    }

    /// W dequantized to f16 by the prefill kernel, widened to f32.
    pub fn test_dequant(&self, w: &QTensor) -> Result<Vec<f32>> {
        self.bind()?;
        let m = Mat::upload(self, w)?;
        let n = w.rows * w.cols;
        let out = self.upload(&vec![0xFFFFu16; n])?;
        launch!(self, dequant_f16, ((n / 32).div_ceil(256) as u32, 1), 256;
            m.seg, w.cols as i32, out.ptr)?;
        let mut h = vec![0u16; n];
        self.read(&out, 0, &mut h)?;
        Ok(h.iter()
            .map(|&b| half::f16::from_bits(b).to_f32())
            .collect())
    }

    /// rmsnorm(x) * w quantized to q8 by the decode kernel, dequantized back.
    pub fn test_rmsnorm_q8(&self, x: &[f32], w: &[f32], eps: f32) -> Result<Vec<f32>> {
        self.bind()?;
        let d = w.len();
        let (xb, wb) = (self.upload(x)?, self.upload(w)?);
        let aq = self.upload(&vec![0i8; d])?;
        let ad = self.upload(&vec![[f32::NAN; 2]; d / 32])?;
        launch!(self, rmsnorm_q8, (1, 1), 1024; xb.ptr, wb.ptr, eps, d as i32, aq.ptr, ad.ptr)?;
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

impl crate::engine::Runner for CudaSession {
    fn ctx(&self) -> usize {
        self.ctx
    }
    fn tokens(&self) -> &[u32] {
        &self.tokens
    }
    fn forward(&mut self, tokens: &[u32], logits: Logits) -> Result<()> {
        CudaSession::forward(self, tokens, logits)
    }
    fn sample(&mut self, sampler: &mut Sampler) -> Result<u32> {
        CudaSession::sample(self, sampler)
    }
    fn truncate(&mut self, n: usize) {
        CudaSession::truncate(self, n)
    }
    fn kv_cache_bytes(&self) -> usize {
        CudaSession::kv_cache_bytes(self)
    }
    fn bytes(&self) -> usize {
        session_bytes(&self.model.config, self.ctx, self.ubatch) as usize
    }
    fn launches_per_token(&self) -> Option<(usize, usize)> {
        Some((1, self.graph_kernels))
    }
    fn profile_decode(&mut self, steps: usize) -> Result<Vec<(&'static str, usize, f64)>> {
        CudaSession::profile_decode(self, steps)
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

    /// silu(gate · a) * (up · a) by the fused kernel, quantized to q8 and read back dequantized.
    pub fn test_glu(
        &self,
        gate: &QTensor,
        up: &QTensor,
        q: &[i8],
        ds: &[[f32; 2]],
    ) -> Result<Vec<f32>> {
        self.bind()?;
        let (g, u) = (Mat::upload(self, gate)?, Mat::upload(self, up)?);
        let (aq, ad) = (self.upload(q)?, self.upload(ds)?);
        let rows = gate.rows;
        let hq = self.upload(&vec![0i8; rows])?;
        let hd = self.upload(&vec![[f32::NAN; 2]; rows / 32])?;
        launch!(self, matvec_glu_q8, ((rows / 32) as u32, 1), 1024;
            g.seg, u.seg, gate.cols as i32, aq.ptr, ad.ptr, hq.ptr, hd.ptr)?;
        self.dequant_q8(&hq, &hd, rows)
    }

    /// Q/K/V matvec + bias + RoPE at position `pos` + cache write by the fused kernel: returns
    /// (q, k row, v row) as floats.
    #[allow(clippy::too_many_arguments)]
    pub fn test_qkv_rope(
        &self,
        w: [&QTensor; 3],
        bias: Option<&[f32]>,
        q8: (&[i8], &[[f32; 2]]),
        (n_head, n_kv_head, head_dim): (usize, usize, usize),
        neox: bool,
        rope: &RopeTable,
        pos: usize,
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
        launch!(self, qkv_rope, (pairs.div_ceil(4) as u32, 1), 128;
            m[0].seg, m[1].seg, m[2].seg, w[0].cols as i32, aq.ptr, ad.ptr, b.as_ref().map_or(0, |b| b.ptr),
            cos.ptr, sin.ptr, p.ptr, n_head as i32, n_kv_head as i32, head_dim as i32, neox as i32,
            qkv.ptr, kc.ptr, vc.ptr)?;
        let mut q = vec![0f32; qd];
        self.read(&qkv, 0, &mut q)?;
        let row = |c: &Buf| -> Result<Vec<f32>> {
            let mut h = vec![0u16; kvd];
            self.read(c, 2 * pos * kvd, &mut h)?;
            Ok(h.iter()
                .map(|&x| half::f16::from_bits(x).to_f32())
                .collect())
        };
        Ok((q, row(&kc)?, row(&vc)?))
    }

    /// One query (all heads) against `len` cached positions by the split decode attention kernel,
    /// its output quantized to q8 and read back dequantized.
    pub fn test_attention(
        &self,
        q: &[f32],
        k: &[half::f16],
        v: &[half::f16],
        (n_head, n_kv_head, head_dim): (usize, usize, usize),
        len: usize,
    ) -> Result<Vec<f32>> {
        self.bind()?;
        let qb = self.upload(q)?;
        let (kc, vc) = (self.upload(k)?, self.upload(v)?);
        let p = self.upload(&[len as i32 - 1])?;
        let splits = len.div_ceil(SPLIT);
        let part_o = self.alloc(4 * splits * n_head * head_dim)?;
        let part_ml = self.alloc(8 * splits * n_head)?;
        let counters = self.upload(&[0u32; 64])?;
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
        if head_dim == 64 {
            launch!(self, attn_decode64, (n_kv_head as u32, splits as u32), 256;
                args.0, args.1, args.2, args.3, args.4, args.5, args.6, args.7, args.8, args.9, args.10, args.11)?;
        } else {
            launch!(self, attn_decode128, (n_kv_head as u32, splits as u32), 256;
                args.0, args.1, args.2, args.3, args.4, args.5, args.6, args.7, args.8, args.9, args.10, args.11)?;
        }
        self.dequant_q8(&aq, &ad, qd)
    }
    /// `t` queries (rows of `q_dim`, at positions pos0..pos0 + t) against `pos0 + t` cached
    /// positions by the prefill attention kernel; output widened from f16.
    pub fn test_flash(
        &self,
        q: &[f32],
        k: &[half::f16],
        v: &[half::f16],
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
        if head_dim == 64 {
            launch!(self, flash_prefill64, grid, 256;
                args.0, args.1, args.2, args.3, args.4, args.5, args.6, args.7, args.8)?;
        } else {
            launch!(self, flash_prefill128, grid, 256;
                args.0, args.1, args.2, args.3, args.4, args.5, args.6, args.7, args.8)?;
        }
        let mut h = vec![0u16; t * qd];
        self.read(&out, 0, &mut h)?;
        Ok(h.iter()
            .map(|&x| half::f16::from_bits(x).to_f32())
            .collect())
    }
}
