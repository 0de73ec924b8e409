//! CUDA backend (feature `cuda`): the same model and sampler, run on an NVIDIA GPU.
//!
//! - Own kernels (`kernels/*.cu`, joined into one source) compiled at run time by NVRTC and cached on disk; the driver, NVRTC
//!   and cuBLAS are loaded with dlopen (cudarc's `dynamic-loading`), so a `cuda` build needs no
//!   toolkit and starts on a machine without a GPU ([`Device::open`] then says so).
//! - Weights are uploaded once in their GGUF block formats; the KV cache (f16) and every buffer are
//!   allocated once per session.
//! - Decode: one CUDA graph per token (embedding, 5 kernels per layer, and on models over 1024 wide
//!   an RMSNorm before the Q/K/V and the gate/up kernels, which make it themselves on narrower ones;
//!   the final norm, LM head, argmax, the 4-byte copy of the sampled id), captured once and
//!   replayed; the position lives in device memory.
//! - Prefill: weights dequantized to f16 per layer and multiplied with cuBLAS (tensor cores);
//!   attention as two batched cuBLAS GEMMs around a causal softmax kernel.
//! - Sampling on the device: greedy (argmax) and top-k ≤ 64 / top-p / min-p / temperature; repetition
//!   penalties fall back to the host sampler (the logits are copied then).

use crate::error::{Error, Result};
use crate::gguf::TensorType;
use crate::model::{Config, KvType, Model};
use crate::repack;
use crate::rope::{RopeStyle, RopeTable};
use crate::runner::Logits;
use crate::sample::Sampler;
use crate::weights::QTensor;
use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{result as drv, sys, CudaContext};
use std::ffi::c_void;
use std::sync::Arc;

pub mod reference;

/// The kernels' source, in two modules. The main one: the files of `kernels/` every run needs
/// (decode, prefill, sampling), joined in this order, compiled and loaded when the device opens.
const SRC: &str = concat!(
    include_str!("kernels/common.cuh"),
    include_str!("kernels/matvec.cu"),
    include_str!("kernels/elementwise.cu"),
    include_str!("kernels/prefill.cu"),
    include_str!("kernels/attention.cu"),
    include_str!("kernels/sample.cu"),
    include_str!("kernels/moe.cu"),
);
/// The batched steps' kernels (several sequences a step: the server, speculation's verify pass):
/// compiled with `-DMENS_BATCH_MODULE` (the shared files then give their device functions, not
/// their kernels) and loaded on first use. They are 84% of the machine code the driver makes from
/// the PTX at a first load (ptxas -v times), 46 s on the H200 for both modules together, which a
/// single-sequence run no longer waits for (docs/benchmarks.md, session 32).
const SRC_BATCH: &str = concat!(
    include_str!("kernels/common.cuh"),
    include_str!("kernels/matvec.cu"),
    include_str!("kernels/attention.cu"),
    include_str!("kernels/sample.cu"),
    include_str!("kernels/batch.cu"),
    include_str!("kernels/mmq.cu"),
);

/// Which of the two kernel modules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Module {
    Main,
    Batch,
}
impl Module {
    fn src(self) -> &'static str {
        match self {
            Module::Main => SRC,
            Module::Batch => SRC_BATCH,
        }
    }
    fn defines(self) -> Vec<String> {
        let mut d = defines();
        if self == Module::Batch {
            d.push("-DMENS_BATCH_MODULE".into());
        }
        d
    }
}

/// Keys per decode attention split (SPLIT in kernels/common.cuh).
const SPLIT: usize = 64;
const MAXG: usize = 8;
/// Candidates kept per logits slice by on-device top-k sampling (KMAX in kernels/sample.cu).
pub const TOPK_MAX: usize = 64;
const TOPK_BLOCKS: usize = 64;
const ARGMAX_BLOCKS: usize = 32;
/// Queries per attention sub-batch in prefill, at most (bounds the score buffer).
const ATT_QUERIES: usize = 512;
/// The prefill score buffer's size, at most (f32 scores and f16 probabilities, 6 bytes each):
/// at long contexts the sub-batches shrink (to 16 queries at the least) rather than the buffer
/// growing with the context, so a quantized cache's saving buys context on a GPU too.
const SCORE_BYTES: usize = 1 << 30;

/// Queries per prefill attention sub-batch for a session of `ctx` tokens taking prompts `ubatch`
/// tokens at a time.
fn att_queries(c: &Config, ctx: usize, ubatch: usize) -> usize {
    (SCORE_BYTES / (6 * c.n_head * ctx).max(1))
        .clamp(16, ATT_QUERIES)
        .min(ubatch)
}
/// Queries per block of the flash prefill attention kernel (FA_Q in kernels/attention.cu).
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
    ($funcs:ident: $($name:ident),* $(,)?) => {
        #[allow(non_snake_case)]
        pub(crate) struct $funcs { $($name: sys::CUfunction,)* }
        impl $funcs {
            fn names() -> Vec<&'static str> {
                vec![$(stringify!($name),)*]
            }
            #[allow(dead_code)] // the main module's, for MENS_CUDA_VERBOSE
            fn list(&self) -> Vec<(&'static str, sys::CUfunction)> {
                vec![$((stringify!($name), self.$name),)*]
            }
            fn load(module: sys::CUmodule) -> Result<Self> {
                Ok($funcs { $($name: unsafe {
                    drv::module::get_function(module, std::ffi::CString::new(stringify!($name)).unwrap())
                }.map_err(|e| err(concat!("kernel ", stringify!($name)), e))?,)* })
            }
        }
    };
}
kernels!(Funcs:
    matvec,
    matvec2,
    matvec_r,
    matvec2_r,
    matvec_pair,
    matvec_pair_r,
    matvec_pair_add,
    matvec_pair_add_r,
    matvec_add_nq,
    matvec_add_nq_r,
    matvec_pair_add_nq,
    matvec_pair_add_nq_r,
    rmsnorm_q8d,
    rmsnorm_q8s,
    qkv_rope_r,
    matvec_glu_q8,
    matvec_glu_q8_q4k,
    matvec_glu_q8_q6k,
    matvec_glu_q8_q5_0r,
    matvec_glu_q8_q8_0r,
    matvec_glu_q8_q4kr,
    matvec_glu_q8_q4kr_5,
    matvec_glu_q8_q6kr,
    matvec_glu_q8_q4kr_h,
    matvec_pair_h_q4kr,
    matvec_pair_h_q6kr,
    qkv_rope_h,
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
    swiglu_h16,
    argmax,
    topk_partial,
    sample_final,
    penalize,
    qk_norm,
    attn_decode64_q8,
    attn_decode128_q8,
    attn_decode64_q4,
    attn_decode128_q4,
    flash_prefill64_q8,
    flash_prefill128_q8,
    flash_prefill64_q4,
    flash_prefill128_q4,
    kv_quant_q8,
    kv_quant_q4,
    kv_to_f16_q8,
    kv_to_f16_q4,
    shift_k,
    moe_norm,
    moe_router,
    moe_topk,
    moe_sort,
    moe_glu,
    moe_down,
    moe_glu_tiles,
    moe_down_tiles,
    moe_combine,
);
kernels!(BatchFuncs:
    matmul_q8_1,
    matmul_q8_2,
    matmul_q8_4,
    matmul_q8_8,
    glu_q8_b_1,
    glu_q8_b_2,
    glu_q8_b_4,
    glu_q8_b_8,
    matmul_q8_1_q4k,
    matmul_q8_2_q4k,
    matmul_q8_4_q4k,
    matmul_q8_8_q4k,
    glu_q8_b_1_q4k,
    glu_q8_b_2_q4k,
    glu_q8_b_4_q4k,
    glu_q8_b_8_q4k,
    matmul_q8_1_q6k,
    matmul_q8_2_q6k,
    matmul_q8_4_q6k,
    matmul_q8_8_q6k,
    glu_q8_b_1_q6k,
    glu_q8_b_2_q6k,
    glu_q8_b_4_q6k,
    glu_q8_b_8_q6k,
    matmul_q8_1_q4kr,
    matmul_q8_2_q4kr,
    matmul_q8_4_q4kr,
    matmul_q8_8_q4kr,
    glu_q8_b_1_q4kr,
    glu_q8_b_2_q4kr,
    glu_q8_b_4_q4kr,
    glu_q8_b_8_q4kr,
    matmul_q8_1_q6kr,
    matmul_q8_2_q6kr,
    matmul_q8_4_q6kr,
    matmul_q8_8_q6kr,
    glu_q8_b_1_q6kr,
    glu_q8_b_2_q6kr,
    glu_q8_b_4_q6kr,
    glu_q8_b_8_q6kr,
    matmul_q8_1_q5_0r,
    matmul_q8_2_q5_0r,
    matmul_q8_4_q5_0r,
    matmul_q8_8_q5_0r,
    glu_q8_b_1_q5_0r,
    glu_q8_b_2_q5_0r,
    glu_q8_b_4_q5_0r,
    glu_q8_b_8_q5_0r,
    matmul_q8_1_q8_0r,
    matmul_q8_2_q8_0r,
    matmul_q8_4_q8_0r,
    matmul_q8_8_q8_0r,
    glu_q8_b_1_q8_0r,
    glu_q8_b_2_q8_0r,
    glu_q8_b_4_q8_0r,
    glu_q8_b_8_q8_0r,
    matmul_mq_q4k,
    matmul_mq_q6k,
    glu_mq_q4k,
    glu_mq_q6k,
    qkv_rope_b_1,
    qkv_rope_b_2,
    qkv_rope_b_4,
    qkv_rope_b_8,
    attn_decode64_b,
    attn_decode128_b,
    argmax_b,
    matmul_h16_1,
    matmul_h16_2,
    matmul_h16_4,
    matmul_h16_8,
    rope_store_b,
    attn_decode64_b_q8,
    attn_decode128_b_q8,
    attn_decode64_b_q4,
    attn_decode128_b_q4,
    kv_pages_copy,
);

/// Bytes of one KV cache row of `kvd` values (kv_row_bytes in kernels/common.cuh): f16, or the
/// q8_0 / q4_0 quants, then the f16 block scales, padded to 16 bytes.
pub fn kv_row_bytes(t: KvType, kvd: usize) -> usize {
    match t {
        KvType::F16 => 2 * kvd,
        KvType::Q8_0 => (kvd + kvd / 16).next_multiple_of(16),
        KvType::Q4_0 => (kvd / 2 + kvd / 16).next_multiple_of(16),
    }
}

/// The cache types the CUDA kernels read: K and V of one type (as llama.cpp's CUDA build without
/// GGML_CUDA_FA_ALL_QUANTS), whole 32-value blocks per head for the quantized ones.
pub fn check_cache(c: &Config, cache: (KvType, KvType)) -> Result<KvType> {
    if cache.0 != cache.1 {
        return Err(Error::InvalidArgument(format!(
            "the CUDA backend needs K and V of one cache type (f16, q8_0 or q4_0 for both; this run: {}/{}), as llama.cpp's CUDA build; mixed types run on --backend cpu",
            cache.0.name(),
            cache.1.name()
        )));
    }
    if cache.0 != KvType::F16 && !c.head_dim.is_multiple_of(32) {
        return Err(Error::InvalidArgument(format!(
            "a {} KV cache needs a head size that is a multiple of 32 (this model: {})",
            cache.0.name(),
            c.head_dim
        )));
    }
    Ok(cache.0)
}

/// Weight rows per block of the tensor-core matmul (MT in kernels/batch.cu).
const H16_ROWS: usize = 16;
/// Rows × column splits the tensor-core matmul keeps partial sums for, per activation row.
const H16_PART_ROWS: usize = 65536;

/// cuBLAS's workspace (its guide asks for at least 32 MiB on Hopper).
const BLAS_WORKSPACE: usize = 32 << 20;

/// A profiled launch: kernel name, the event recorded after it, the bytes it moves.
type Marked = (&'static str, sys::CUevent, u64);

/// The weight formats with decode kernels of their own: Q4_K and Q6_K by their GGUF ids, and the
/// GPU layouts of [`repack`] (Q5_0 and Q8_0 only in theirs: in the GGUF layout, with
/// `MENS_CUDA_REPACK=0`, they take the kernels for any type).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Q4K,
    Q6K,
    Q4KR,
    Q6KR,
    Q5_0R,
    Q8_0R,
    Other,
}

fn kind(ty: u32) -> Kind {
    match ty {
        repack::Q4_KR => Kind::Q4KR,
        repack::Q6_KR => Kind::Q6KR,
        repack::Q5_0R => Kind::Q5_0R,
        repack::Q8_0R => Kind::Q8_0R,
        t => match TensorType::from_id(t) {
            Some(TensorType::Q4K) => Kind::Q4K,
            Some(TensorType::Q6K) => Kind::Q6K,
            _ => Kind::Other,
        },
    }
}

/// One GPU: context, stream, kernels and cuBLAS handle.
pub struct Device {
    ctx: Arc<CudaContext>,
    stream: sys::CUstream,
    f: Funcs,
    /// The batch module's kernels, loaded on first use ([`Device::fb`]).
    fb: std::sync::OnceLock<std::result::Result<BatchFuncs, String>>,
    blas: blas_sys::cublasHandle_t,
    /// cuBLAS's workspace, set once so that a GEMM captured into a graph allocates nothing.
    blas_ws: u64,
    pub name: String,
    pub arch: (i32, i32),
    pub total_mem: u64,
    /// Streaming multiprocessors.
    pub sms: usize,
    /// When profiling: an event recorded after each launch, with the kernel's name.
    prof: std::sync::Mutex<Option<Vec<Marked>>>,
    /// Bytes the next launch moves, for the profile (see [`Device::moves`]).
    moving: std::sync::atomic::AtomicU64,
    /// Launches queued now belong to the decode graph (see [`Device::decode_graph`]).
    in_graph: std::sync::atomic::AtomicBool,
    /// Those launches use programmatic dependent launch.
    pdl: std::sync::atomic::AtomicBool,
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

/// PTX for this GPU: from the disk cache (keyed by source hash, NVRTC defines and arch) or
/// compiled by NVRTC and stored there. Public so that a cache can be filled on a machine without
/// a GPU and carried to one (`scripts/cuda-build.sh`).
pub fn ptx_for(arch: (i32, i32), m: Module) -> Result<Vec<u8>> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    m.src().hash(&mut h);
    m.defines().hash(&mut h);
    let key = format!("kernels-{:016x}-sm{}{}.ptx", h.finish(), arch.0, arch.1);
    let path = cache_dir().join(&key);
    if let Ok(b) = std::fs::read(&path) {
        if b.last() == Some(&0) {
            return Ok(b);
        }
    }
    let bytes = compile_ptx(arch, m)?;
    if std::fs::create_dir_all(cache_dir()).is_ok() {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &bytes).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    }
    Ok(bytes)
}

/// Extra NVRTC options for tuning runs (`MENS_CUDA_DEFINES="-DH16_MINB=2"`): only `-D` ones.
fn defines() -> Vec<String> {
    std::env::var("MENS_CUDA_DEFINES")
        .unwrap_or_default()
        .split_whitespace()
        .filter(|d| d.starts_with("-D"))
        .map(String::from)
        .collect()
}

/// Compile the kernels with NVRTC for `arch` (no GPU needed, only libnvrtc): the PTX text,
/// NUL-terminated.
pub fn compile_ptx(arch: (i32, i32), m: Module) -> Result<Vec<u8>> {
    let arch_s: &'static str = Box::leak(format!("sm_{}{}", arch.0, arch.1).into_boxed_str());
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error::Backend(
            "CUDA: NVRTC (libnvrtc.so) could not be loaded; put the CUDA libraries on LD_LIBRARY_PATH".into(),
        ));
    }
    let r = quietly(|| {
        cudarc::nvrtc::compile_ptx_with_opts(
            m.src(),
            cudarc::nvrtc::CompileOptions {
                arch: Some(arch_s),
                options: [vec!["-std=c++14".to_string()], m.defines()].concat(),
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

/// The names of the kernels the backend loads from module `m`.
pub fn kernel_names(m: Module) -> Vec<&'static str> {
    match m {
        Module::Main => Funcs::names(),
        Module::Batch => BatchFuncs::names(),
    }
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
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .unwrap_or(100)
            .max(1) as usize;
        let ptx = ptx_for(arch, Module::Main)?;
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
        let blas_ws =
            unsafe { drv::malloc_sync(BLAS_WORKSPACE) }.map_err(|e| err("cuBLAS workspace", e))?;
        unsafe { blas_sys::cublasSetWorkspace_v2(handle, blas_ws as *mut c_void, BLAS_WORKSPACE) }
            .result()
            .map_err(|e| err("cuBLAS workspace", e))?;
        Ok(Arc::new(Device {
            ctx,
            stream,
            f,
            fb: std::sync::OnceLock::new(),
            blas: handle,
            blas_ws,
            name,
            arch,
            total_mem,
            sms,
            prof: std::sync::Mutex::new(None),
            in_graph: std::sync::atomic::AtomicBool::new(false),
            pdl: std::sync::atomic::AtomicBool::new(false),
            moving: std::sync::atomic::AtomicU64::new(0),
        }))
    }

    /// Queue what `f` launches as the decode graph's kernels after the embedding: `MENS_CUDA_OMIT`
    /// applies to them, and on sm_90 and later they use programmatic dependent launch (unless
    /// `MENS_CUDA_PDL=0`): each kernel's blocks are placed while the one before it drains, and
    /// wait for it at `pdl_wait()` (kernels/common.cuh). On the H200: decode +1.3–2.9% on the
    /// 0.5B and 1.5B, +0.3% on the 7B (docs/benchmarks.md, session 28). Only for kernels that
    /// call `pdl_wait()`.
    fn decode_graph<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        // Not while profiling: the events between the kernels would sit between them.
        let pdl = self.arch.0 >= 9
            && std::env::var("MENS_CUDA_PDL").map_or(true, |v| v != "0")
            && self.prof.lock().unwrap().is_none();
        use std::sync::atomic::Ordering::Relaxed;
        self.in_graph.store(true, Relaxed);
        self.pdl.store(pdl, Relaxed);
        let r = f();
        self.in_graph.store(false, Relaxed);
        self.pdl.store(false, Relaxed);
        r
    }

    fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|e| err("bind", e))
    }

    /// The batch module's kernels (SRC_BATCH): compiled (or read from the cache) and loaded by the
    /// first caller; a failure is kept and returned to every caller.
    pub(crate) fn fb(&self) -> Result<&BatchFuncs> {
        self.fb
            .get_or_init(|| {
                let load = || -> Result<BatchFuncs> {
                    self.bind()?;
                    let ptx = ptx_for(self.arch, Module::Batch)?;
                    let module = unsafe { drv::module::load_data(ptx.as_ptr() as *const c_void) }
                        .map_err(|e| err("loading the batch kernels", e))?;
                    BatchFuncs::load(module)
                };
                load().map_err(|e| match e {
                    Error::Backend(m) => m,
                    e => e.to_string(),
                })
            })
            .as_ref()
            .map_err(|m| Error::Backend(m.clone()))
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

    /// Copy `bytes` from device address `from` to `to` (both inside buffers of this device), in
    /// stream order with the work queued before and after.
    pub(crate) fn copy(&self, to: u64, from: u64, bytes: usize) -> Result<()> {
        unsafe { drv::memcpy_dtod_async(to, from, bytes, self.stream) }
            .map_err(|e| err("copy on device", e))
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
    /// Grid of the f16 tensor-core matmul over `rows` × `cols` weights: row tiles of
    /// [`H16_ROWS`], and the columns split when there are fewer than three tiles per SM (each
    /// split at least 32 chunks of 32, four per warp; splits × rows ≤ [`H16_PART_ROWS`]).
    fn h16_grid(&self, rows: usize, cols: usize) -> (u32, u32) {
        let tiles = rows.div_ceil(H16_ROWS);
        let splits = (3 * self.sms)
            .div_ceil(tiles)
            .min(cols / 32 / 32)
            .min(H16_PART_ROWS / rows.max(1))
            .clamp(1, 16);
        (tiles as u32, splits as u32)
    }

    /// Run `launch` (which launches kernels one by one) `steps` times with an event after every
    /// launch: per kernel name, calls, microseconds and bytes moved per run, slowest first.
    fn time_kernels(
        &self,
        steps: usize,
        mut launch: impl FnMut() -> Result<usize>,
    ) -> Result<Vec<crate::runner::KernelTime>> {
        let mut totals: Vec<crate::runner::KernelTime> = Vec::new();
        let n = steps.max(1);
        for _ in 0..n {
            let start = drv::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
                .map_err(|e| err("event", e))?;
            unsafe { drv::event::record(start, self.stream) }.map_err(|e| err("event", e))?;
            *self.prof.lock().unwrap() = Some(Vec::new());
            let r = launch();
            let events = self.prof.lock().unwrap().take().unwrap_or_default();
            let r = r.and_then(|_| self.sync());
            let mut prev = start;
            for &(name, e, bytes) in &events {
                if r.is_err() {
                    break;
                }
                let ms = unsafe { drv::event::elapsed(prev, e) }.map_err(|e| err("event", e))?;
                match totals.iter_mut().find(|t| t.name == name) {
                    Some(t) => {
                        t.calls += 1;
                        t.us += ms as f64 * 1e3;
                        t.bytes += bytes;
                    }
                    None => totals.push(crate::runner::KernelTime {
                        name,
                        calls: 1,
                        us: ms as f64 * 1e3,
                        bytes,
                    }),
                }
                prev = e;
            }
            unsafe {
                let _ = drv::event::destroy(start);
                for (_, e, _) in events {
                    let _ = drv::event::destroy(e);
                }
            }
            r?;
        }
        for t in totals.iter_mut() {
            t.calls /= n;
            t.us /= n as f64;
            t.bytes /= n as u64;
        }
        totals.sort_by(|a, b| b.us.total_cmp(&a.us));
        Ok(totals)
    }

    /// The decode matvec, its two-warps-a-row form and Q/K/V + RoPE for these matrices: the
    /// kernels that also read the Q5_0R and Q8_0R layouts (`_r`) where one of them has one, else
    /// those without (two cases more in their switch cost the 1.5B and the 7B 2-3% of their
    /// decode: docs/benchmarks.md, session 35).
    fn small_layouts(segs: &[&Seg]) -> bool {
        segs.iter()
            .any(|s| s.rows > 0 && matches!(kind(s.ty as u32), Kind::Q5_0R | Kind::Q8_0R))
    }
    fn plain_or_r(segs: &[&Seg], plain: sys::CUfunction, r: sys::CUfunction) -> sys::CUfunction {
        if Self::small_layouts(segs) {
            r
        } else {
            plain
        }
    }
    pub(crate) fn matvec_k(&self, segs: &[&Seg]) -> sys::CUfunction {
        Self::plain_or_r(segs, self.f.matvec, self.f.matvec_r)
    }
    pub(crate) fn matvec2_k(&self, seg: &Seg) -> sys::CUfunction {
        Self::plain_or_r(&[seg], self.f.matvec2, self.f.matvec2_r)
    }
    pub(crate) fn matvec_pair_k(&self, seg: &Seg) -> sys::CUfunction {
        Self::plain_or_r(&[seg], self.f.matvec_pair, self.f.matvec_pair_r)
    }
    pub(crate) fn matvec_pair_add_k(&self, seg: &Seg) -> sys::CUfunction {
        Self::plain_or_r(&[seg], self.f.matvec_pair_add, self.f.matvec_pair_add_r)
    }
    /// The residual matvec that also makes the next deferred norm's input (`matvec_add_nq_t`):
    /// two rows a warp where `pair`, else one.
    pub(crate) fn matvec_add_nq_k(&self, seg: &Seg, pair: bool) -> sys::CUfunction {
        let f = &self.f;
        match pair {
            true => Self::plain_or_r(&[seg], f.matvec_pair_add_nq, f.matvec_pair_add_nq_r),
            false => Self::plain_or_r(&[seg], f.matvec_add_nq, f.matvec_add_nq_r),
        }
    }
    pub(crate) fn qkv_rope_k(&self, segs: &[&Seg]) -> sys::CUfunction {
        Self::plain_or_r(segs, self.f.qkv_rope, self.f.qkv_rope_r)
    }

    /// The decode gate/up kernel for these matrices in blocks of `threads`: one kernel per common
    /// type (its own registers), or the kernel for any types.
    fn glu(&self, gate: &Seg, up: &Seg, threads: u32) -> (&'static str, sys::CUfunction) {
        let f = &self.f;
        if gate.ty != up.ty {
            return ("matvec_glu_q8", f.matvec_glu_q8);
        }
        match kind(gate.ty as u32) {
            Kind::Q4KR if five_glu_blocks(gate.rows as usize / 32, threads, self.sms) => {
                ("matvec_glu_q8_q4kr_5", f.matvec_glu_q8_q4kr_5)
            }
            Kind::Q4KR => ("matvec_glu_q8_q4kr", f.matvec_glu_q8_q4kr),
            Kind::Q6KR => ("matvec_glu_q8_q6kr", f.matvec_glu_q8_q6kr),
            Kind::Q4K => ("matvec_glu_q8_q4k", f.matvec_glu_q8_q4k),
            Kind::Q6K => ("matvec_glu_q8_q6k", f.matvec_glu_q8_q6k),
            Kind::Q5_0R => ("matvec_glu_q8_q5_0r", f.matvec_glu_q8_q5_0r),
            Kind::Q8_0R => ("matvec_glu_q8_q8_0r", f.matvec_glu_q8_q8_0r),
            Kind::Other => ("matvec_glu_q8", f.matvec_glu_q8),
        }
    }

    /// The half-warp gate/up kernel (`glu_q8<T, true>`: the same bits) for these matrices
    /// (`cols` wide) in blocks of `threads`, where it has one (Q4_KR, up to 16 warps, not the
    /// five-blocks kernel's grid) and `on` (None: where `half_saves`).
    pub(crate) fn glu_half(
        &self,
        gate: &Seg,
        up: &Seg,
        cols: usize,
        threads: u32,
        on: Option<bool>,
    ) -> Option<(&'static str, sys::CUfunction)> {
        let fits = gate.ty == up.ty
            && kind(gate.ty as u32) == Kind::Q4KR
            && threads <= 512
            && !five_glu_blocks(gate.rows as usize / 32, threads, self.sms);
        (fits && on.unwrap_or_else(|| half_saves(cols / 32)))
            .then_some(("matvec_glu_q8_q4kr_h", self.f.matvec_glu_q8_q4kr_h))
    }

    /// The half-warp pair kernel (four rows a warp, 16 a block; `matvec_pair`'s bits) for
    /// `seg`, where its type has one.
    pub(crate) fn pair_half(&self, seg: &Seg) -> Option<(&'static str, sys::CUfunction)> {
        match kind(seg.ty as u32) {
            Kind::Q4KR => Some(("matvec_pair_h_q4kr", self.f.matvec_pair_h_q4kr)),
            Kind::Q6KR => Some(("matvec_pair_h_q6kr", self.f.matvec_pair_h_q6kr)),
            _ => None,
        }
    }

    /// The half-warp Q/K/V kernel (two RoPE pairs a warp; `qkv_rope`'s bits) where Q, K and V
    /// are all Q4_KR or Q6_KR, `cols` wide, and `on` (None: where `half_saves`). A warp's two
    /// pairs must share a head (one segment, one type, the half-warps' shuffles in step): heads
    /// of a multiple of 4 values.
    pub(crate) fn qkv_half(
        &self,
        segs: &[&Seg],
        cols: usize,
        head_dim: usize,
        on: Option<bool>,
    ) -> Option<(&'static str, sys::CUfunction)> {
        let fits = head_dim.is_multiple_of(4)
            && segs
                .iter()
                .all(|s| matches!(kind(s.ty as u32), Kind::Q4KR | Kind::Q6KR));
        (fits && on.unwrap_or_else(|| half_saves(cols / 32)))
            .then_some(("qkv_rope_h", self.f.qkv_rope_h))
    }

    /// Decode attention for head size `hd` over a cache of type `t`.
    fn attn_decode(&self, hd: usize, t: KvType) -> (&'static str, sys::CUfunction) {
        let f = &self.f;
        match (hd == 64, t) {
            (true, KvType::F16) => ("attn_decode64", f.attn_decode64),
            (false, KvType::F16) => ("attn_decode128", f.attn_decode128),
            (true, KvType::Q8_0) => ("attn_decode64_q8", f.attn_decode64_q8),
            (false, KvType::Q8_0) => ("attn_decode128_q8", f.attn_decode128_q8),
            (true, KvType::Q4_0) => ("attn_decode64_q4", f.attn_decode64_q4),
            (false, KvType::Q4_0) => ("attn_decode128_q4", f.attn_decode128_q4),
        }
    }

    /// The same for a batch of sequences.
    fn attn_decode_b(&self, hd: usize, t: KvType) -> Result<(&'static str, sys::CUfunction)> {
        let f = self.fb()?;
        Ok(match (hd == 64, t) {
            (true, KvType::F16) => ("attn_decode64_b", f.attn_decode64_b),
            (false, KvType::F16) => ("attn_decode128_b", f.attn_decode128_b),
            (true, KvType::Q8_0) => ("attn_decode64_b_q8", f.attn_decode64_b_q8),
            (false, KvType::Q8_0) => ("attn_decode128_b_q8", f.attn_decode128_b_q8),
            (true, KvType::Q4_0) => ("attn_decode64_b_q4", f.attn_decode64_b_q4),
            (false, KvType::Q4_0) => ("attn_decode128_b_q4", f.attn_decode128_b_q4),
        })
    }

    /// Flash prefill attention for head size `hd` over a cache of type `t`.
    fn flash_prefill(&self, hd: usize, t: KvType) -> (&'static str, sys::CUfunction) {
        let f = &self.f;
        match (hd == 64, t) {
            (true, KvType::F16) => ("flash_prefill64", f.flash_prefill64),
            (false, KvType::F16) => ("flash_prefill128", f.flash_prefill128),
            (true, KvType::Q8_0) => ("flash_prefill64_q8", f.flash_prefill64_q8),
            (false, KvType::Q8_0) => ("flash_prefill128_q8", f.flash_prefill128_q8),
            (true, KvType::Q4_0) => ("flash_prefill64_q4", f.flash_prefill64_q4),
            (false, KvType::Q4_0) => ("flash_prefill128_q4", f.flash_prefill128_q4),
        }
    }

    /// The quantizer of new cache rows for a quantized cache type (None for f16).
    fn kv_quant(&self, t: KvType) -> Option<(&'static str, sys::CUfunction)> {
        match t {
            KvType::F16 => None,
            KvType::Q8_0 => Some(("kv_quant_q8", self.f.kv_quant_q8)),
            KvType::Q4_0 => Some(("kv_quant_q4", self.f.kv_quant_q4)),
        }
    }

    /// The f16 converter of a quantized cache's rows (None for f16).
    fn kv_to_f16(&self, t: KvType) -> Option<(&'static str, sys::CUfunction)> {
        match t {
            KvType::F16 => None,
            KvType::Q8_0 => Some(("kv_to_f16_q8", self.f.kv_to_f16_q8)),
            KvType::Q4_0 => Some(("kv_to_f16_q4", self.f.kv_to_f16_q4)),
        }
    }

    /// The dp4a batch kernels (kernels/batch.cu) for a batch of `b` rows: activation rows in
    /// tiles of 1, 2, 4 or 8, each size its own kernel with its own registers.
    /// `MENS_CUDA_DP4A_TILE=N` caps the tile (for measurements: 8 rows as two tiles of 4).
    fn dp4a_tile(b: usize) -> usize {
        static CAP: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        let cap = *CAP.get_or_init(|| match std::env::var("MENS_CUDA_DP4A_TILE").as_deref() {
            Ok("1") => 0,
            Ok("2") => 1,
            Ok("4") => 2,
            _ => 3,
        });
        let t = match b {
            0..=1 => 0,
            2 => 1,
            3..=4 => 2,
            _ => 3,
        };
        t.min(cap)
    }
    /// 1 when every matrix in `segs` (empty ones aside) is Q4_K, 2 when Q6_K, 3 and 4 when they
    /// are repacked ([`repack`]), 5 when Q5_0R, 6 when Q8_0R, else 0: a kernel of one type has its
    /// own registers (the 7B's verify of 8 tokens 5.6 against 6.3 ms with the kernel for any types;
    /// docs/benchmarks.md, session 25).
    fn one_type(segs: &[&Seg]) -> usize {
        let mut types = segs.iter().filter(|s| s.rows > 0).map(|s| s.ty as u32);
        let Some(t) = types.next() else { return 0 };
        if types.any(|u| u != t) {
            return 0;
        }
        match kind(t) {
            Kind::Q4K => 1,
            Kind::Q6K => 2,
            Kind::Q4KR => 3,
            Kind::Q6KR => 4,
            Kind::Q5_0R => 5,
            Kind::Q8_0R => 6,
            _ => 0,
        }
    }
    /// Whether `rows` activation rows go through the int8 tensor-core kernels (kernels/mmq.cu:
    /// the dp4a kernels' bits, 8 rows a tile) for Q4_K and Q6_K matrices: from
    /// `MENS_CUDA_MQ_FROM=N` rows; never by default (measured no faster than dp4a on the H200:
    /// docs/benchmarks.md, session 26).
    fn mq(rows: usize) -> bool {
        static FROM: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        rows >= *FROM.get_or_init(|| {
            std::env::var("MENS_CUDA_MQ_FROM")
                .ok()
                .and_then(|v| v.parse().ok())
                .filter(|&n: &usize| n > 0)
                .unwrap_or(usize::MAX)
        })
    }
    /// Whether one matrix (`seg`, `cols` wide) runs in decode with two warps a row (`matvec2`,
    /// 64 streams a row) and so in the batch kernels in the same order: when its rows leave the
    /// GPU under-filled at a warp a row (up to 16 a multiprocessor: the 1.5B's and 0.5B's
    /// ffn_down) and each lane still has two chunks or more. H200: 1.5B decode +2.8–3.0%, 0.5B
    /// +0.6–1.4%; forced on the 7B's ffn_down (3584 rows: two waves) −2.4% (docs/benchmarks.md,
    /// session 34).
    /// `MENS_CUDA_SPLIT=0` / `1` forces it either way.
    pub(crate) fn split_rows(&self, seg: &Seg, cols: usize) -> bool {
        static FORCE: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
        let force = *FORCE.get_or_init(|| match std::env::var("MENS_CUDA_SPLIT").as_deref() {
            Ok("0") => Some(false),
            Ok("1") => Some(true),
            _ => None,
        });
        force.unwrap_or(seg.rows as usize <= 16 * self.sms && cols / 32 >= 128)
    }
    /// The batch matmul of one matrix in `split_rows`' order (dp4a; launched with `MODE_SPLIT` in
    /// its mode): the kernel, its grid and its block.
    fn matmul_q8_split(
        &self,
        tile: usize,
        seg: &Seg,
    ) -> Result<(sys::CUfunction, (u32, u32), u32)> {
        let (k, _, block) = self.matmul_q8_with(tile, &[seg], false)?;
        Ok((k, ((seg.rows as usize).div_ceil(4) as u32, 1), block))
    }
    /// The batch matmul for `rows` activation rows (`tile`: the dp4a tile it would use) over the
    /// stacked matrices `segs`: the kernel, its grid and its block size.
    fn matmul_q8(
        &self,
        tile: usize,
        rows: usize,
        segs: &[&Seg],
    ) -> Result<(sys::CUfunction, (u32, u32), u32)> {
        self.matmul_q8_with(tile, segs, Self::mq(rows))
    }
    /// The same with the int8 tensor-core kernels (`mq`, where the matrices allow) or not.
    fn matmul_q8_with(
        &self,
        tile: usize,
        segs: &[&Seg],
        mq: bool,
    ) -> Result<(sys::CUfunction, (u32, u32), u32)> {
        let f = self.fb()?;
        let n: usize = segs.iter().map(|s| s.rows.max(0) as usize).sum();
        let ty = Self::one_type(segs);
        if (1..=2).contains(&ty) && mq {
            let k = [f.matmul_mq_q4k, f.matmul_mq_q6k][ty - 1];
            // Tiles of 16 rows; four a block when there are many (the block's staged
            // activations serve them all), else one (every SM busy).
            let tiles = n.div_ceil(16);
            let blocks = if tiles > 1056 {
                tiles.div_ceil(4)
            } else {
                tiles
            };
            return Ok((k, (blocks as u32, 1), 256));
        }
        let k = [
            [f.matmul_q8_1, f.matmul_q8_2, f.matmul_q8_4, f.matmul_q8_8],
            [
                f.matmul_q8_1_q4k,
                f.matmul_q8_2_q4k,
                f.matmul_q8_4_q4k,
                f.matmul_q8_8_q4k,
            ],
            [
                f.matmul_q8_1_q6k,
                f.matmul_q8_2_q6k,
                f.matmul_q8_4_q6k,
                f.matmul_q8_8_q6k,
            ],
            [
                f.matmul_q8_1_q4kr,
                f.matmul_q8_2_q4kr,
                f.matmul_q8_4_q4kr,
                f.matmul_q8_8_q4kr,
            ],
            [
                f.matmul_q8_1_q6kr,
                f.matmul_q8_2_q6kr,
                f.matmul_q8_4_q6kr,
                f.matmul_q8_8_q6kr,
            ],
            [
                f.matmul_q8_1_q5_0r,
                f.matmul_q8_2_q5_0r,
                f.matmul_q8_4_q5_0r,
                f.matmul_q8_8_q5_0r,
            ],
            [
                f.matmul_q8_1_q8_0r,
                f.matmul_q8_2_q8_0r,
                f.matmul_q8_4_q8_0r,
                f.matmul_q8_8_q8_0r,
            ],
        ];
        Ok((k[ty][Self::dp4a_tile(tile)], (n.div_ceil(8) as u32, 1), 128))
    }
    /// The batch gate/up kernel for `b` activation rows (grid `f / 32`, 256 threads either way).
    fn glu_q8_b(&self, b: usize, gate: &Seg, up: &Seg) -> Result<sys::CUfunction> {
        self.glu_q8_b_with(b, gate, up, Self::mq(b))
    }
    /// The same with the int8 tensor-core kernels (`mq`, where the matrices allow) or not.
    fn glu_q8_b_with(&self, b: usize, gate: &Seg, up: &Seg, mq: bool) -> Result<sys::CUfunction> {
        let f = self.fb()?;
        let ty = Self::one_type(&[gate, up]);
        if (1..=2).contains(&ty) && mq {
            return Ok([f.glu_mq_q4k, f.glu_mq_q6k][ty - 1]);
        }
        let k = [
            [f.glu_q8_b_1, f.glu_q8_b_2, f.glu_q8_b_4, f.glu_q8_b_8],
            [
                f.glu_q8_b_1_q4k,
                f.glu_q8_b_2_q4k,
                f.glu_q8_b_4_q4k,
                f.glu_q8_b_8_q4k,
            ],
            [
                f.glu_q8_b_1_q6k,
                f.glu_q8_b_2_q6k,
                f.glu_q8_b_4_q6k,
                f.glu_q8_b_8_q6k,
            ],
            [
                f.glu_q8_b_1_q4kr,
                f.glu_q8_b_2_q4kr,
                f.glu_q8_b_4_q4kr,
                f.glu_q8_b_8_q4kr,
            ],
            [
                f.glu_q8_b_1_q6kr,
                f.glu_q8_b_2_q6kr,
                f.glu_q8_b_4_q6kr,
                f.glu_q8_b_8_q6kr,
            ],
            [
                f.glu_q8_b_1_q5_0r,
                f.glu_q8_b_2_q5_0r,
                f.glu_q8_b_4_q5_0r,
                f.glu_q8_b_8_q5_0r,
            ],
            [
                f.glu_q8_b_1_q8_0r,
                f.glu_q8_b_2_q8_0r,
                f.glu_q8_b_4_q8_0r,
                f.glu_q8_b_8_q8_0r,
            ],
        ];
        Ok(k[ty][Self::dp4a_tile(b)])
    }
    fn qkv_rope_b(&self, b: usize) -> Result<sys::CUfunction> {
        let f = self.fb()?;
        Ok([
            f.qkv_rope_b_1,
            f.qkv_rope_b_2,
            f.qkv_rope_b_4,
            f.qkv_rope_b_8,
        ][Self::dp4a_tile(b)])
    }
    /// The f16 tensor-core matmul for `b` activation rows (one kernel per tile count).
    fn matmul_h16(&self, b: usize) -> Result<sys::CUfunction> {
        let f = self.fb()?;
        Ok(match b {
            0..=8 => f.matmul_h16_1,
            9..=16 => f.matmul_h16_2,
            17..=32 => f.matmul_h16_4,
            _ => f.matmul_h16_8,
        })
    }

    fn launch(
        &self,
        name: &'static str,
        f: sys::CUfunction,
        grid: (u32, u32),
        block: u32,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        use std::sync::atomic::Ordering::Relaxed;
        if self.in_graph.load(Relaxed) && omitted(name) {
            return Ok(());
        }
        if self.pdl.load(Relaxed) {
            // SAFETY: the attribute value is a plain int; the union is zeroed first.
            let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id =
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let config = sys::CUlaunchConfig {
                gridDimX: grid.0,
                gridDimY: grid.1,
                gridDimZ: 1,
                blockDimX: block,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: 0,
                hStream: self.stream,
                attrs: &mut attr,
                numAttrs: 1,
            };
            unsafe {
                sys::cuLaunchKernelEx(&config, f, args.as_mut_ptr(), std::ptr::null_mut()).result()
            }
            .map_err(|e| err("kernel launch", e))?;
        } else {
            unsafe {
                drv::launch_kernel(f, (grid.0, grid.1, 1), (block, 1, 1), 0, self.stream, args)
            }
            .map_err(|e| err("kernel launch", e))?;
        }
        self.mark(name)
    }

    /// When profiling, an event after the work just queued (a launch or a cuBLAS call).
    fn mark(&self, name: &'static str) -> Result<()> {
        let bytes = self.moving.swap(0, std::sync::atomic::Ordering::Relaxed);
        if let Some(events) = self.prof.lock().unwrap().as_mut() {
            let e = drv::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
                .map_err(|e| err("event", e))?;
            unsafe { drv::event::record(e, self.stream) }.map_err(|e| err("event", e))?;
            events.push((name, e, bytes));
        }
        Ok(())
    }

    /// The next launch reads and writes `bytes` of device memory (for the profile's GB/s).
    fn moves(&self, bytes: u64) {
        self.moving
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// Device-to-device copy bandwidth, GB/s of bytes read plus written: the best of 10 copies
    /// of 1 GiB (what a decode step's bytes are measured against).
    pub fn copy_bandwidth(&self) -> Result<f64> {
        self.bind()?;
        let n = 1usize << 30;
        let (a, b) = (self.alloc(n)?, self.alloc(n)?);
        let (e0, e1) = (
            drv::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
                .map_err(|e| err("event", e))?,
            drv::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
                .map_err(|e| err("event", e))?,
        );
        let best = (0..11).try_fold(f64::MAX, |best, i| {
            unsafe {
                drv::event::record(e0, self.stream).map_err(|e| err("event", e))?;
                drv::memcpy_dtod_async(b.ptr, a.ptr, n, self.stream).map_err(|e| err("copy", e))?;
                drv::event::record(e1, self.stream).map_err(|e| err("event", e))?;
            }
            self.sync()?;
            let ms = unsafe { drv::event::elapsed(e0, e1) }.map_err(|e| err("event", e))? as f64;
            // The first copy warms up.
            Ok::<f64, Error>(if i > 0 { best.min(ms) } else { best })
        });
        // The events go on every path, errors included.
        unsafe {
            let _ = drv::event::destroy(e0);
            let _ = drv::event::destroy(e1);
        }
        Ok(2.0 * n as f64 / (best? * 1e-3) / 1e9)
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        let _ = self.bind();
        unsafe {
            let _ = blas::destroy_handle(self.blas);
            let _ = drv::free_sync(self.blas_ws);
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
arg_ptrs!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10, L 11, M 12, N 13);
arg_ptrs!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10, L 11, M 12, N 13, O 14);
arg_ptrs!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10, L 11, M 12, N 13, O 14, P 15);
arg_ptrs!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10, L 11, M 12, N 13, O 14, P 15, Q 16);
arg_ptrs!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10, L 11, M 12, N 13, O 14, P 15, Q 16, R 17, S 18);
arg_ptrs!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10, L 11, M 12, N 13, O 14, P 15, Q 16, R 17, S 18, T 19);
arg_ptrs!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10, L 11, M 12, N 13, O 14, P 15, Q 16, R 17, S 18, T 19, U 20);
arg_ptrs!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10, L 11, M 12, N 13, O 14, P 15, Q 16, R 17, S 18, T 19, U 20, V 21, W 22);
arg_ptrs!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10, L 11, M 12, N 13, O 14, P 15, Q 16, R 17, S 18, T 19, U 20, V 21, W 22, X 23);

/// The batch matmul kernels' mode bits (kernels/batch.cu, `matmul_q8_t`): add to the output
/// instead of storing, and sum each row in `matvec2`'s 64 streams (grid from `matmul_q8_split`).
const MODE_ADD: i32 = 1;
const MODE_SPLIT: i32 = 2;

/// `launch!(dev, kernel, grid, block; args...)`: the argument values must have the kernel's C
/// types (u64 for pointers, i32 for int, f32 for float, `Seg` for a matrix).
macro_rules! launch {
    ($dev:expr, [$nf:expr], $grid:expr, $block:expr; $($a:expr),+ $(,)?) => {{
        let mut vals = ($($a,)+);
        let mut p = ArgPtrs::ptrs(&mut vals);
        let (name, f) = $nf;
        $dev.launch(name, f, $grid, $block, &mut p)
    }};
    ($dev:expr, ($f:expr) as $name:literal, $grid:expr, $block:expr; $($a:expr),+ $(,)?) => {{
        let mut vals = ($($a,)+);
        let mut p = ArgPtrs::ptrs(&mut vals);
        $dev.launch($name, $f, $grid, $block, &mut p)
    }};
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

/// A weight matrix as the kernels see it (the kernels' `Seg`).
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
    fn bytes(&self) -> u64 {
        self.rows as u64 * self.row_bytes
    }
}

/// Grid of `rmsnorm_q8` for `rows` rows of `dim` values: a block for every 32 chunks of a row
/// (one chunk a warp).
fn norm_grid(rows: usize, dim: usize) -> (u32, u32) {
    (rows as u32, (dim / 32).div_ceil(32).max(1) as u32)
}

/// A deferred norm's sums: copies a row, and groups a copy (NP_REPS, NP_MAX in kernels/common.cuh).
const NP_REPS: usize = 32;
const NP_MAX: usize = 128;
/// Whether the decode step and the batched step (dp4a) defer this model's norms (kernels/common.cuh,
/// parts_lane): the O and ffn_down matvecs make the next norm's input, so there are no norm
/// kernels but the first and the last. H200 decode at depth 0 / 512: 7B 550 / 517 -> 585 / 550
/// tokens/s, 1.5B +1% and 0.5B +4.5% over split ffn_down rows (which it replaces: `split_rows`
/// is not asked then); docs/benchmarks.md, session 41. Where dims are a multiple of 32 up to 4096
/// and no layer has a Q/K norm; not with a fused norm, nor with `MENS_CUDA_NORM_DEFER=0` or
/// `MENS_CUDA_SPLIT=1`.
pub(crate) fn norms_deferred(m: &GpuModel) -> bool {
    norms_deferred_with(
        m.config.dim,
        // (The deferred kernels have no Q/K norm, nor experts: `qk_norm` covers both.)
        m.layers
            .iter()
            .any(|l| l.qk_norm.is_some() || l.router.is_some()),
        std::env::var("MENS_CUDA_NORM_DEFER").ok().as_deref(),
        std::env::var("MENS_CUDA_SPLIT").ok().as_deref(),
    )
}
fn norms_deferred_with(
    dim: usize,
    qk_norm: bool,
    setting: Option<&str>,
    split: Option<&str>,
) -> bool {
    setting != Some("0")
        && split != Some("1")
        && !fused_norm(dim)
        && dim.is_multiple_of(32)
        && dim / 32 <= NP_MAX
        && !qk_norm
}

/// Dims up to which a decode kernel can normalise its own input (NORM_MAXD in kernels/matvec.cu).
const NORM_MAXD: usize = 4096;
/// Dims up to which it does by default: none. On the H200 the fused norm paid on the 0.5B (896:
/// +1.2% over the norm kernels, session 30) until the kernels loaded their first weights before
/// `pdl_wait()` and let the next kernel launch at their tail (PDL_EARLY in kernels/common.cuh),
/// which only the kernels without a norm to make do: since then the norm kernels are faster on
/// the 0.5B too (1836-1839 / 1694-1696 tokens/s against 1705-1707 / 1601-1602 at depth 0 / 512),
/// as on the 1.5B (−9% fused) and the 7B; docs/benchmarks.md, sessions 30 and 37.
const NORM_FUSE_DEFAULT_MAX: usize = 0;

/// Whether decode's Q/K/V and gate/up kernels normalise the residual themselves (norm_q8_block
/// in kernels/matvec.cu: rmsnorm_q8's bits, so two kernels a layer fewer): for dims that are
/// multiples of 128 (its chunks by groups of 8 threads in whole warps), up to
/// NORM_FUSE_DEFAULT_MAX; `MENS_CUDA_NORM_FUSE=1` up to NORM_MAXD, `=0` never.
fn fused_norm(dim: usize) -> bool {
    fused_norm_with(dim, std::env::var("MENS_CUDA_NORM_FUSE").ok().as_deref())
}
fn fused_norm_with(dim: usize, setting: Option<&str>) -> bool {
    let max = match setting {
        Some("0") => 0,
        Some("1") => NORM_MAXD,
        _ => NORM_FUSE_DEFAULT_MAX,
    };
    dim <= max && dim.is_multiple_of(128)
}

/// Whether decode's LM head runs two rows a warp (`matvec_pair`: the same bits as `matvec`);
/// `MENS_CUDA_HEAD_PAIR=0` runs one, for measurements.
fn head_pair() -> bool {
    std::env::var("MENS_CUDA_HEAD_PAIR").as_deref() != Ok("0")
}
/// Whether decode's O projection does too (`matvec_pair_add`, 8 rows a block): where its blocks
/// still fill the SMs (H200: 1.5B, 192 blocks, +1.1-1.7%; 7B level; the 0.5B's 112 blocks on
/// 132 SMs 3% slower; docs/benchmarks.md, session 38). `MENS_CUDA_PAIR_O=0|1` sets it.
fn pair_o(dim: usize, sms: usize) -> bool {
    pair_o_with(dim, sms, std::env::var("MENS_CUDA_PAIR_O").ok().as_deref())
}
fn pair_o_with(dim: usize, sms: usize, setting: Option<&str>) -> bool {
    match setting {
        Some("0") => false,
        Some("1") => true,
        _ => dim.div_ceil(8) >= sms,
    }
}

/// Blocks a KV head's query heads are spread over in decode attention (`attn_decode_t`: the same
/// bits whatever the count), for a step of `rows` sequences: a block a query head for one or two
/// (a shorter chain a block: H200 decode +5-7% at depth 0 and +6-11% at 512 on the synthetic 7B,
/// 1.5B and 0.5B, docs/benchmarks.md session 37), one block a KV head for more (their blocks
/// already fill the GPU: a verify of 4 or 8 was slower with a block a head). A quantized cache
/// takes 1 (one block stores the new row the others read). `MENS_CUDA_ATTN_HG=n` sets the count
/// (1 to g), for measurements.
pub(crate) fn attn_head_groups(n_head: usize, n_kv_head: usize, kv: KvType, rows: usize) -> usize {
    attn_head_groups_with(
        n_head / n_kv_head.max(1),
        kv,
        rows,
        std::env::var("MENS_CUDA_ATTN_HG").ok().as_deref(),
    )
}
fn attn_head_groups_with(g: usize, kv: KvType, rows: usize, setting: Option<&str>) -> usize {
    if kv != KvType::F16 {
        return 1;
    }
    let n = match setting.and_then(|v| v.parse().ok()) {
        Some(n) => n,
        None if rows <= 2 => g,
        None => 1,
    };
    n.clamp(1, g.max(1))
}

/// Blocks a KV head group of the single-sequence decode attention takes (the grid's height): a
/// block per 64-key split up to about eight blocks an SM over the whole grid, each block taking
/// every `workers`-th split beyond. The graph is recorded once for the whole context, so the grid
/// of a block per split of the context it had before launched tens of thousands of blocks that
/// found no keys at a 32k context: the 7B decoded 450 tokens/s there against 548 now and at a
/// 641-token context. Eight an SM against four: 7B at depth 16384 +6%, elsewhere level or better;
/// 0.5B −5% at depth 4096, +4% at 16384 (H200, docs/benchmarks.md, session 40). The bits do not
/// depend on it (each split is computed alone, the splits combined in order).
/// `MENS_CUDA_ATTN_WORKERS=N` sets it (0: a block per split).
pub(crate) fn decode_attn_workers(ctx: usize, blocks_per_split: usize, sms: usize) -> usize {
    decode_attn_workers_with(
        ctx,
        blocks_per_split,
        sms,
        std::env::var("MENS_CUDA_ATTN_WORKERS").ok().as_deref(),
    )
}
fn decode_attn_workers_with(
    ctx: usize,
    blocks_per_split: usize,
    sms: usize,
    setting: Option<&str>,
) -> usize {
    let splits = ctx.div_ceil(SPLIT).max(1);
    match setting.and_then(|v| v.parse::<usize>().ok()) {
        Some(0) => splits,
        Some(n) => n.min(splits),
        None => (8 * sms).div_ceil(blocks_per_split.max(1)).clamp(1, splits),
    }
}

/// For measuring only: whether `MENS_CUDA_OMIT` (comma-separated parts of kernel names, e.g.
/// `rmsnorm,attn_decode`) leaves this kernel out of the decode graph. The step's output is then
/// wrong; its time, against the whole step's, is what the left-out kernels cost inside the graph.
fn omitted(name: &str) -> bool {
    std::env::var("MENS_CUDA_OMIT").is_ok_and(|v| {
        v.split(',')
            .map(str::trim)
            .any(|p| !p.is_empty() && name.contains(p))
    })
}

/// Whether a decode gate/up grid of `blocks` blocks of `threads` takes the kernel with registers
/// for five blocks an SM: where four an SM would leave a second, partial wave and five would not.
fn five_glu_blocks(blocks: usize, threads: u32, sms: usize) -> bool {
    threads == 256 && blocks > 4 * sms && blocks <= 5 * sms
}

/// Threads of a decode gate/up block (32 rows a block) for `blocks` blocks: `MENS_CUDA_GLU_WARPS`
/// warps (1, 2, 4, 8, 16 or 32), each taking 32 / warps row pairs; the same arithmetic for every
/// choice. Default: 8 where the five-blocks kernel then applies (the 7B: one wave; +6% over 32
/// warps on the H200, 4 warps −17%), else 16 (with the early loads and the late trigger, the
/// 0.5B +4.4% and the 1.5B +0.3-0.9% over 8; docs/benchmarks.md, sessions 30 and 37).
fn glu_threads(blocks: usize, sms: usize) -> u32 {
    glu_threads_with(
        blocks,
        sms,
        std::env::var("MENS_CUDA_GLU_WARPS").ok().as_deref(),
    )
}
fn glu_threads_with(blocks: usize, sms: usize, setting: Option<&str>) -> u32 {
    let default = if five_glu_blocks(blocks, 256, sms) {
        8
    } else {
        16
    };
    let w = setting
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|w| w.is_power_of_two() && *w <= 32)
        .unwrap_or(default);
    32 * w
}

/// Which decode kernels run a row pair a half-warp (the same bits; `row_dot2_half_t` in
/// kernels/matvec.cu): the LM head, and gate/up and Q/K/V where `half_saves`. H200
/// (docs/benchmarks.md, session 39): 1.5B decode +7%, the 7B's +1.3% (its head 134 -> 116 us);
/// where the saving is smaller they lost (the 7B's gate/up 7%, its Q/K/V; O everywhere).
/// `MENS_CUDA_HALF` (a comma-separated list of `glu`, `head`, `qkv`; empty or `none`: none) sets
/// the parts instead, for measurements.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Half {
    /// None: where `half_saves`; Some: everywhere the kernel fits, or nowhere.
    pub glu: Option<bool>,
    pub head: bool,
    pub qkv: Option<bool>,
}
pub(crate) fn half() -> Half {
    half_with(std::env::var("MENS_CUDA_HALF").ok().as_deref())
}
fn half_with(setting: Option<&str>) -> Half {
    let Some(v) = setting else {
        return Half {
            glu: None,
            head: true,
            qkv: None,
        };
    };
    let has = |p: &str| v.split(',').any(|x| x.trim() == p);
    Half {
        glu: Some(has("glu")),
        head: has("head"),
        qkv: Some(has("qkv")),
    }
}
/// Whether rows of `nchunks` chunks lose a quarter or more of a warp's chain of passes when a
/// half-warp takes each pair: ceil(n / 16) passes for two pairs against 2 ceil(n / 32) (48
/// chunks, the 1.5B: 3 against 4; 112, the 7B: 7 against 8, not enough).
fn half_saves(nchunks: usize) -> bool {
    4 * nchunks.div_ceil(16) <= 6 * nchunks.div_ceil(32)
}

/// Bytes of `n` values as q8 activations (int8 values, a float2 a block of 32).
fn q8_bytes(n: usize) -> u64 {
    (n + n / 32 * 8) as u64
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

/// Whether Q4_K, Q6_K, Q5_0 and Q8_0 matrices are uploaded in the GPU layouts of [`repack`] (default; same
/// bits; `MENS_CUDA_REPACK=0` keeps the GGUF layout, for measurements).
fn repack_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MENS_CUDA_REPACK").as_deref() != Ok("0"))
}

impl Mat {
    pub fn upload(dev: &Device, t: &QTensor) -> Result<Mat> {
        Self::upload_as(dev, t, repack_on())
    }

    /// Upload `t`, in the GPU layout where it has one and `gpu_layout` asks for it.
    pub fn upload_as(dev: &Device, t: &QTensor, gpu_layout: bool) -> Result<Mat> {
        if !SUPPORTED.contains(&t.ttype) {
            return Err(Error::Model(format!(
                "tensor type {} is not supported by the CUDA backend",
                t.ttype.name()
            )));
        }
        if !t.cols.is_multiple_of(32) {
            return Err(Error::Model(format!(
                "the CUDA backend needs rows of a multiple of 32 values, got {}",
                t.cols
            )));
        }
        let (buf, row_bytes, ty) = match gpu_layout.then(|| repack::repack(t)).flatten() {
            Some(r) => (dev.upload(&r.data)?, r.row_bytes, r.ty),
            None => (dev.upload(t.data())?, t.row_bytes(), t.ttype.id()),
        };
        let seg = Seg {
            w: buf.ptr,
            row_bytes: row_bytes as u64,
            ty: ty as i32,
            rows: t.rows as i32,
        };
        Ok(Mat {
            _buf: buf,
            seg,
            cols: t.cols,
        })
    }
}

mod batch;
mod model;
mod moe;
mod session;
#[doc(hidden)]
pub mod testing;

pub use batch::{
    batch_bytes, f16_copy_bytes, f16_copy_reserve, full_pool, page_bytes, pool_fit, sequence_pages,
    BatchKernels, CudaBatch, PAGE, VERIFY_ROWS,
};
pub use model::GpuModel;
pub use session::{session_bytes, CudaSession, DeviceSampling};

#[cfg(test)]
mod tests {
    use super::{
        attn_head_groups_with, decode_attn_workers_with, five_glu_blocks, fused_norm_with,
        half_saves, half_with, norms_deferred_with, pair_o_with, repack, Device, Seg,
    };
    use crate::gguf::TensorType;
    use crate::model::KvType;

    /// The decode kernels with the Q5_0R and Q8_0R cases go to any set of matrices with one of
    /// those layouts (the others fall to no case of the plain kernels' switch), and only there.
    #[test]
    fn small_layouts_take_the_r_kernels() {
        let seg = |ty: u32, rows: i32| Seg {
            ty: ty as i32,
            rows,
            ..Seg::NONE
        };
        let (q5r, q8r, q4kr) = (
            seg(repack::Q5_0R, 896),
            seg(repack::Q8_0R, 128),
            seg(repack::Q4_KR, 1536),
        );
        assert!(Device::small_layouts(&[&q5r]) && Device::small_layouts(&[&q4kr, &q4kr, &q8r]));
        assert!(!Device::small_layouts(&[
            &q4kr,
            &seg(repack::Q6_KR, 256),
            &Seg::NONE
        ]));
        let gguf = seg(TensorType::Q5_0.id(), 896);
        assert!(!Device::small_layouts(&[
            &gguf,
            &seg(TensorType::Q8_0.id(), 128)
        ]));
        assert!(!Device::small_layouts(&[&seg(repack::Q8_0R, 0)]));
    }

    /// The decode kernels normalise their own input only on request (MENS_CUDA_NORM_FUSE=1), up to
    /// what their shared memory holds, never on a width their warps do not tile.
    #[test]
    fn norms_deferred_by_shape_and_setting() {
        for d in [896, 1536, 3584, 4096] {
            assert!(norms_deferred_with(d, false, None, None), "{d}");
        }
        assert!(
            !norms_deferred_with(4128, false, None, None)
                && !norms_deferred_with(900, false, None, None)
        );
        assert!(!norms_deferred_with(3584, true, None, None), "a Q/K norm");
        assert!(!norms_deferred_with(3584, false, Some("0"), None));
        assert!(!norms_deferred_with(3584, false, None, Some("1")));
        assert!(norms_deferred_with(3584, false, Some("1"), Some("0")));
    }
    #[test]
    fn fused_norm_by_width_and_setting() {
        assert!(!fused_norm_with(896, None) && !fused_norm_with(640, Some("")));
        assert!(fused_norm_with(896, Some("1")) && fused_norm_with(640, Some("1")));
        assert!(!fused_norm_with(1536, None) && !fused_norm_with(3584, None));
        assert!(fused_norm_with(1536, Some("1")) && fused_norm_with(4096, Some("1")));
        assert!(!fused_norm_with(5120, Some("1")) && !fused_norm_with(896, Some("0")));
        assert!(!fused_norm_with(960, None) && !fused_norm_with(2880, Some("1")));
    }

    /// The half-warp kernels: the head, and gate/up and Q/K/V by the saving rule by default (the
    /// 1.5B's 1536 columns yes; the 7B's 3584, the 0.5B's 896 and wider rows no); a list sets
    /// exactly the parts it names.
    #[test]
    fn half_warp_parts_by_default_and_by_setting() {
        let d = half_with(None);
        assert_eq!((d.glu, d.head, d.qkv), (None, true, None));
        let s = half_with(Some("glu, qkv"));
        assert_eq!((s.glu, s.head, s.qkv), (Some(true), false, Some(true)));
        for off in ["", "none"] {
            let n = half_with(Some(off));
            assert_eq!((n.glu, n.head, n.qkv), (Some(false), false, Some(false)));
        }
        assert!(half_saves(1536 / 32) && half_saves(1280 / 32));
        for cols in [896, 768, 1792, 2560, 3584, 4608, 18944] {
            assert!(!half_saves(cols / 32), "{cols}");
        }
    }

    #[test]
    fn o_projection_pairs_rows_where_its_blocks_fill_the_gpu() {
        // H200, 132 SMs: the 0.5B's 896 rows (112 blocks) keep a row a warp; the 1.5B's 1536
        // and the 7B's 3584 take two; a setting overrides.
        assert!(!pair_o_with(896, 132, None));
        assert!(pair_o_with(1536, 132, None));
        assert!(pair_o_with(3584, 132, None));
        assert!(pair_o_with(896, 132, Some("1")));
        assert!(!pair_o_with(3584, 132, Some("0")));
    }

    /// Gate/up blocks of 8 warps where the five-blocks kernel then takes the grid in one wave, else
    /// 16.
    #[test]
    fn glu_threads_by_grid() {
        use super::glu_threads_with as t;
        assert_eq!(t(18944 / 32, 132, None), 256); // the 7B
        assert_eq!(t(8960 / 32, 132, None), 512); // the 1.5B
        assert_eq!(t(4864 / 32, 132, Some("x")), 512); // the 0.5B
        assert_eq!(t(4864 / 32, 132, Some("4")), 128);
        assert_eq!(t(4864 / 32, 132, Some("3")), 512); // not a power of two: the default
    }

    /// Head groups: a block a query head for one or two rows, one a KV head for more; the
    /// setting wins, bounded by a KV head's query heads; 1 on a quantized cache.
    #[test]
    fn attn_head_groups_bounded() {
        assert_eq!(attn_head_groups_with(7, KvType::F16, 1, None), 7);
        assert_eq!(attn_head_groups_with(6, KvType::F16, 2, None), 6);
        assert_eq!(attn_head_groups_with(7, KvType::F16, 8, None), 1);
        assert_eq!(attn_head_groups_with(7, KvType::F16, 1, Some("2")), 2);
        assert_eq!(attn_head_groups_with(7, KvType::F16, 8, Some("64")), 7);
        assert_eq!(attn_head_groups_with(7, KvType::F16, 1, Some("0")), 1);
        assert_eq!(attn_head_groups_with(6, KvType::Q8_0, 1, None), 1);
        assert_eq!(attn_head_groups_with(7, KvType::F16, 1, Some("x")), 7);
    }

    /// The decode attention's grid: a block a split while the grid stays within about eight blocks
    /// an SM, never more blocks than splits, at least one; a setting of n (0: a block a split).
    #[test]
    fn decode_attention_workers_bounded() {
        let w = |ctx, bps| decode_attn_workers_with(ctx, bps, 132, None);
        // The 7B: 4 KV heads of 7 query heads, a block each.
        assert_eq!(w(641, 28), 11);
        assert_eq!(w(32768, 28), 38);
        assert_eq!(w(64, 28), 1);
        assert_eq!(w(1, 1000), 1);
        assert_eq!(w(32768, 0), 512);
        assert_eq!(decode_attn_workers_with(32768, 28, 132, Some("0")), 512);
        assert_eq!(decode_attn_workers_with(32768, 28, 132, Some("76")), 76);
        assert_eq!(decode_attn_workers_with(641, 28, 132, Some("76")), 11);
        assert_eq!(decode_attn_workers_with(32768, 28, 132, Some("x")), 38);
    }

    /// The five-blocks gate/up kernel goes only where four blocks an SM leave a partial second
    /// wave and five do not, in blocks of 256 threads (its launch bound).
    #[test]
    fn five_glu_blocks_only_where_it_saves_a_wave() {
        let sms = 132;
        assert!(five_glu_blocks(18944 / 32, 256, sms)); // the 7B: 592 blocks
        assert!(!five_glu_blocks(8960 / 32, 256, sms)); // the 1.5B: 280
        assert!(!five_glu_blocks(4864 / 32, 256, sms)); // the 0.5B
        assert!(!five_glu_blocks(18944 / 32, 1024, sms)); // over its launch bound
        assert!(!five_glu_blocks(27648 / 32, 256, sms)); // several waves either way
        assert!(!five_glu_blocks(4 * sms, 256, sms) && five_glu_blocks(4 * sms + 1, 256, sms));
    }
}
