//! The machine probe (one function per OS, returning a plain `Machine`) and the pure memory-budget
//! arithmetic, tested with injected machines.
//!
//! The rule (from the Apple Silicon seed, applied on every backend): at most 75% of the memory the
//! model can use goes to model + KV cache + buffers, and at least 2048 MiB stay free for the system.

use crate::cpu::{session_bytes, SessionOptions};
use crate::error::{Error, Result};
use crate::model::{KvType, Model};
use serde::Serialize;

pub const MIB: u64 = 1 << 20;
/// Memory always left to the operating system and other programs.
pub const HEADROOM: u64 = 2048 * MIB;
/// Room for the CUDA context and cuBLAS workspace on a GPU (not counted in device free memory).
pub const CUDA_MARGIN: u64 = 512 * MIB;
/// What the process needs beside weights and session buffers: the tokenizer's tables (~50 MiB for a
/// 150k vocabulary), code, stacks, allocator slack.
pub const RUNTIME_MARGIN: u64 = 96 * MIB;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Gpu {
    pub name: String,
    /// "cuda" or "metal".
    pub api: String,
    pub total: u64,
    pub free: u64,
    /// Metal's `recommendedMaxWorkingSetSize`.
    pub working_set_limit: Option<u64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Machine {
    pub os: String,
    pub cpu: String,
    pub physical_cores: usize,
    pub logical_cores: usize,
    /// SIMD features the kernels use that this CPU has.
    pub simd: Vec<String>,
    pub total_ram: u64,
    pub available_ram: u64,
    /// A cgroup memory limit below the RAM (containers).
    pub cgroup_limit: Option<u64>,
    /// Apple Silicon: CPU and GPU share one memory.
    pub unified_memory: bool,
    pub gpus: Vec<Gpu>,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Cpu,
    Cuda,
    Metal,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Budget {
    pub backend: Backend,
    /// Bytes mens may use for model + KV cache + buffers.
    pub bytes: u64,
    /// The memory the budget was taken from (RAM, cgroup limit, device memory).
    pub base: u64,
    pub how: String,
}

/// 75% of x, exact for every u64 (no overflow).
pub fn three_quarters(x: u64) -> u64 {
    x / 4 * 3 + (x % 4) * 3 / 4
}

fn mib(x: u64) -> String {
    format!("{} MiB", x / MIB)
}

/// The budget for `backend` on machine `m`: pure arithmetic.
pub fn budget(m: &Machine, backend: Backend) -> Result<Budget> {
    match backend {
        Backend::Cuda => {
            let g = m
                .gpus
                .iter()
                .find(|g| g.api == "cuda")
                .ok_or_else(|| Error::Memory("no CUDA device was found".into()))?;
            let bytes = g.free.saturating_sub(CUDA_MARGIN);
            if bytes == 0 {
                return Err(Error::Memory(format!(
                    "{} has {} free, less than the {} kept for the CUDA context and workspace",
                    g.name,
                    mib(g.free),
                    mib(CUDA_MARGIN)
                )));
            }
            Ok(Budget {
                backend,
                bytes,
                base: g.free,
                how: format!(
                    "{}: {} free at start − {} for the CUDA context and workspace",
                    g.name,
                    mib(g.free),
                    mib(CUDA_MARGIN)
                ),
            })
        }
        Backend::Cpu | Backend::Metal => {
            if m.total_ram == 0 {
                return Err(Error::Memory("the machine reports no memory".into()));
            }
            let (base, source) = match m.cgroup_limit {
                Some(c) if c < m.total_ram => (c, "cgroup memory limit"),
                _ => (
                    m.total_ram,
                    if m.unified_memory {
                        "unified memory (hw.memsize)"
                    } else {
                        "RAM"
                    },
                ),
            };
            let mut bytes = three_quarters(base);
            let mut how = format!("75% of {} {source}", mib(base));
            if backend == Backend::Metal {
                if let Some(ws) = m
                    .gpus
                    .iter()
                    .find(|g| g.api == "metal")
                    .and_then(|g| g.working_set_limit)
                {
                    if ws < bytes {
                        bytes = ws;
                        how = format!(
                            "Metal recommendedMaxWorkingSetSize {} (below 75% of {})",
                            mib(ws),
                            mib(base)
                        );
                    }
                }
            }
            if base - bytes < HEADROOM {
                if base <= HEADROOM {
                    return Err(Error::Memory(format!(
                        "{} of {source} leaves nothing once {} are kept free for the system",
                        mib(base),
                        mib(HEADROOM)
                    )));
                }
                bytes = base - HEADROOM;
                how = format!(
                    "{} {source} − {} kept free for the system (75% would leave less)",
                    mib(base),
                    mib(HEADROOM)
                );
            }
            Ok(Budget {
                backend,
                bytes,
                base,
                how,
            })
        }
    }
}

/// What a model with a session of `options` needs, in bytes.
#[derive(Debug, Clone, Serialize)]
pub struct Estimate {
    /// The mapped file (every page of it is touched).
    pub weights: u64,
    pub kv_cache: u64,
    /// Activations, quantized inputs, logits, RoPE table.
    pub buffers: u64,
    pub runtime: u64,
}

impl Estimate {
    pub fn total(&self) -> u64 {
        self.weights + self.kv_cache + self.buffers + self.runtime
    }
}

pub fn estimate(model: &Model, options: &SessionOptions) -> Estimate {
    estimate_slots(model, options, 1)
}

/// As [`estimate`] for `slots` sequences sharing one set of buffers (the server's batch).
pub fn estimate_slots(model: &Model, options: &SessionOptions, slots: usize) -> Estimate {
    let kv = model
        .config
        .kv_bytes_per_token_as(options.cache_k, options.cache_v)
        * options.ctx as u64;
    Estimate {
        weights: model.gguf.file_len(),
        kv_cache: kv * slots as u64,
        buffers: session_bytes(model, options) - kv,
        runtime: RUNTIME_MARGIN,
    }
}

/// Choose the context: the requested one if it fits the budget, else the largest that fits (up to the
/// model's trained context). Errors name the numbers and what would fit.
pub fn fit_context(
    model: &Model,
    budget: &Budget,
    requested: Option<usize>,
    batch: usize,
) -> Result<SessionOptions> {
    fit_context_slots(model, budget, requested, batch, 1, Default::default())
}

/// As [`fit_context`] for `slots` sequences of that context each (the server's `--parallel`), the KV
/// cache storing K and V as `cache`.
pub fn fit_context_slots(
    model: &Model,
    budget: &Budget,
    requested: Option<usize>,
    batch: usize,
    slots: usize,
    cache: (KvType, KvType),
) -> Result<SessionOptions> {
    let estimate = |m: &Model, o: &SessionOptions| estimate_slots(m, o, slots);
    let train = model.config.train_ctx;
    let opts = |ctx: usize| SessionOptions {
        ctx,
        batch: batch.min(ctx),
        logit_rows: 16,
        cache_k: cache.0,
        cache_v: cache.1,
    };
    let small = estimate(model, &opts(16.min(train)));
    if small.total() > budget.bytes {
        return Err(Error::Memory(format!(
            "the model needs {} (file {} + buffers {} + runtime {}) but the budget is {} ({}); use a smaller model or quantization, or --memory-budget",
            mib(small.total()),
            mib(small.weights),
            mib(small.buffers),
            mib(small.runtime),
            mib(budget.bytes),
            budget.how
        )));
    }
    // Largest context that fits (the estimate grows monotonically with ctx).
    let lo = 16.min(train);
    let max_fit = crate::load::largest_fit(lo, train, |c| {
        estimate(model, &opts(c)).total() <= budget.bytes
    })
    .unwrap_or(lo);
    match requested {
        Some(ctx) => {
            let e = estimate(model, &opts(ctx));
            if e.total() > budget.bytes {
                return Err(Error::Memory(format!(
                    "a context of {ctx} tokens{} needs {} (model {} + KV cache {} + buffers {} + runtime {}) but the budget is {} ({}); a context of up to {max_fit} tokens fits",
                    if slots > 1 { format!(" for each of {slots} slots") } else { String::new() },
                    mib(e.total()),
                    mib(e.weights),
                    mib(e.kv_cache),
                    mib(e.buffers),
                    mib(e.runtime),
                    mib(budget.bytes),
                    budget.how
                )));
            }
            Ok(opts(ctx))
        }
        None => Ok(opts(max_fit)),
    }
}

/// Parse a size such as `3G`, `512M`, `1.5GiB`, `2048` (bytes).
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| Error::InvalidArgument(format!("invalid size {s:?}")))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1u64,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => {
            return Err(Error::InvalidArgument(format!(
                "invalid size unit in {s:?}"
            )))
        }
    };
    let bytes = v * mult as f64;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 / 2.0 {
        return Err(Error::InvalidArgument(format!(
            "size {s:?} is out of range"
        )));
    }
    Ok(bytes as u64)
}

/// Peak resident memory of this process (Linux: VmHWM), in bytes.
pub fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: u64 = s
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

fn simd_features() -> Vec<String> {
    let mut v = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        for (name, on) in [
            ("avx2", is_x86_feature_detected!("avx2")),
            ("fma", is_x86_feature_detected!("fma")),
            ("f16c", is_x86_feature_detected!("f16c")),
            ("avx512f", is_x86_feature_detected!("avx512f")),
            ("avx512vnni", is_x86_feature_detected!("avx512vnni")),
        ] {
            if on {
                v.push(name.to_string());
            }
        }
    }
    #[cfg(target_arch = "aarch64")]
    v.push("neon".to_string());
    v
}

/// Probe this machine.
pub fn probe() -> Machine {
    use sysinfo::{CpuRefreshKind, RefreshKind, System};
    let mut sys =
        System::new_with_specifics(RefreshKind::nothing().with_cpu(CpuRefreshKind::nothing()));
    sys.refresh_memory();
    let cpu = sys
        .cpus()
        .first()
        .map(|c| c.brand().trim().to_string())
        .unwrap_or_default();
    let logical = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mut m = Machine {
        os: format!(
            "{} {}",
            System::name().unwrap_or_else(|| std::env::consts::OS.into()),
            System::os_version().unwrap_or_default()
        ),
        cpu,
        physical_cores: System::physical_core_count().unwrap_or(logical),
        logical_cores: logical,
        simd: simd_features(),
        total_ram: sys.total_memory(),
        available_ram: sys.available_memory(),
        cgroup_limit: sys
            .cgroup_limits()
            .map(|c| c.total_memory)
            .filter(|&c| c > 0 && c < sys.total_memory()),
        unified_memory: false,
        gpus: Vec::new(),
    };
    os::adjust(&mut m);
    m.gpus.extend(nvidia_gpus());
    m
}

/// NVIDIA GPUs as the driver reports them (`nvidia-smi`), with total and free memory. Used until a
/// CUDA build queries the driver API itself; absent tool or driver → no GPUs.
fn nvidia_gpus() -> Vec<Gpu> {
    let out = std::process::Command::new("nvidia-smi")
        .args([
            "--query-gpu=name,memory.total,memory.free",
            "--format=csv,noheader,nounits",
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => parse_nvidia_smi(&String::from_utf8_lossy(&o.stdout)),
        _ => Vec::new(),
    }
}

/// Lines of `name, total MiB, free MiB`.
fn parse_nvidia_smi(text: &str) -> Vec<Gpu> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            let (total, free) = (
                f.get(1)?.parse::<u64>().ok()?,
                f.get(2)?.parse::<u64>().ok()?,
            );
            Some(Gpu {
                name: f[0].to_string(),
                api: "cuda".into(),
                total: total * MIB,
                free: free * MIB,
                working_set_limit: None,
            })
        })
        .take(64)
        .collect()
}

#[cfg(target_os = "macos")]
mod os {
    /// Apple: total memory from `sysctl hw.memsize`; on Apple Silicon CPU and GPU share it.
    pub fn adjust(m: &mut super::Machine) {
        let mut size: u64 = 0;
        let mut len = std::mem::size_of::<u64>();
        let name = c"hw.memsize";
        // SAFETY: sysctlbyname writes at most `len` bytes into `size`.
        let rc = unsafe {
            libc::sysctlbyname(
                name.as_ptr(),
                &mut size as *mut u64 as *mut libc::c_void,
                &mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        if rc == 0 && size > 0 {
            m.total_ram = size;
        }
        m.unified_memory = cfg!(target_arch = "aarch64");
    }
}

#[cfg(not(target_os = "macos"))]
mod os {
    pub fn adjust(_m: &mut super::Machine) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    const GB: u64 = 1 << 30;

    fn mac(gb: u64) -> Machine {
        Machine {
            os: "macOS".into(),
            cpu: "Apple M".into(),
            physical_cores: 8,
            logical_cores: 8,
            simd: vec!["neon".into()],
            total_ram: gb * GB,
            available_ram: gb * GB / 2,
            cgroup_limit: None,
            unified_memory: true,
            gpus: vec![Gpu {
                name: "Apple GPU".into(),
                api: "metal".into(),
                total: gb * GB,
                free: gb * GB,
                working_set_limit: None,
            }],
        }
    }

    #[test]
    fn three_quarters_never_overflows() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let edges = [
            0,
            1,
            2,
            3,
            4,
            5,
            u64::MAX,
            u64::MAX - 1,
            u64::MAX / 4 * 3,
            1 << 63,
        ];
        for x in edges
            .into_iter()
            .chain((0..200_000).map(|_| rng.gen::<u64>()))
        {
            let q = three_quarters(x);
            assert_eq!(q as u128, x as u128 * 3 / 4, "x = {x}");
        }
    }

    #[test]
    fn apple_machines_keep_headroom() {
        for gb in [8, 16, 32, 64, 128, 192] {
            let m = mac(gb);
            let b = budget(&m, Backend::Metal).unwrap();
            assert!(b.bytes > 0);
            assert!(b.bytes <= three_quarters(m.total_ram), "{gb} GB: over 75%");
            assert!(
                m.total_ram - b.bytes >= HEADROOM,
                "{gb} GB: headroom {}",
                m.total_ram - b.bytes
            );
        }
        // 8 GB: 75% = 6 GB leaves exactly 2 GB.
        assert_eq!(budget(&mac(8), Backend::Metal).unwrap().bytes, 6 * GB);
    }

    #[test]
    fn metal_working_set_limit_caps_the_budget() {
        let mut m = mac(64);
        m.gpus[0].working_set_limit = Some(40 * GB);
        let b = budget(&m, Backend::Metal).unwrap();
        assert_eq!(b.bytes, 40 * GB);
        assert!(b.how.contains("recommendedMaxWorkingSetSize"));
    }

    #[test]
    fn small_machines() {
        // 4 GB: 75% = 3 GB would leave 1 GB, so the budget is 4 − 2 = 2 GB.
        let b = budget(&mac(4), Backend::Metal).unwrap();
        assert_eq!(b.bytes, 2 * GB);
        // 2 GB: nothing is left.
        let e = budget(&mac(2), Backend::Cpu).unwrap_err();
        assert!(e.to_string().contains("leaves nothing"), "{e}");
        let mut zero = mac(8);
        zero.total_ram = 0;
        assert!(budget(&zero, Backend::Cpu).is_err());
    }

    #[test]
    fn cgroup_limit_is_the_base_in_a_container() {
        let mut m = mac(64);
        m.unified_memory = false;
        m.cgroup_limit = Some(16 * GB);
        let b = budget(&m, Backend::Cpu).unwrap();
        assert_eq!(b.base, 16 * GB);
        assert_eq!(b.bytes, 12 * GB);
        assert!(b.how.contains("cgroup"));
    }

    #[test]
    fn cuda_budget_is_free_memory_minus_margin() {
        let mut m = mac(64);
        m.gpus = vec![Gpu {
            name: "NVIDIA H200".into(),
            api: "cuda".into(),
            total: 141 * GB,
            free: 139 * GB,
            working_set_limit: None,
        }];
        let b = budget(&m, Backend::Cuda).unwrap();
        assert_eq!(b.bytes, 139 * GB - CUDA_MARGIN);
        m.gpus.clear();
        assert!(budget(&m, Backend::Cuda)
            .unwrap_err()
            .to_string()
            .contains("no CUDA device"));
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("3G").unwrap(), 3 * GB);
        assert_eq!(parse_size("512M").unwrap(), 512 * MIB);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 * GB / 2);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        for bad in ["", "G", "-1G", "3X", "1e400G", "0"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn nvidia_smi_lines_parse() {
        let g = parse_nvidia_smi(
            "NVIDIA H200, 143771, 142500\nbad line\nNVIDIA H100 80GB HBM3, 81559, 81000\n",
        );
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].name, "NVIDIA H200");
        assert_eq!(g[0].total, 143771 * MIB);
        assert_eq!(g[1].free, 81000 * MIB);
        assert!(parse_nvidia_smi("").is_empty());
    }

    #[test]
    fn probe_reports_this_machine() {
        let m = probe();
        assert!(m.total_ram > 0 && m.logical_cores > 0);
        assert!(m.available_ram <= m.total_ram);
    }
}
