//! A corpus of malformed GGUF files, generated here: every one must be rejected with a GGUF error
//! that names the field, never a panic; and the regression inputs found by fuzzing
//! (`fuzz/regressions/`) must load or fail cleanly.

use mens::gguf::{Array, Gguf, TensorType, Value, Writer};
use mens::synth::{synth_model, SynthSpec};

/// A small valid file: 2 key-values, 2 tensors. Returns the bytes and the offsets of its fields.
struct Sample {
    bytes: Vec<u8>,
    kv0_key_len: usize,
    kv0_type: usize,
    kv1_type: usize,
    kv1_count: usize,
    t0: usize,
    t1: usize,
}

fn sample() -> Sample {
    let mut w = Writer::new();
    w.kv("general.architecture", Value::String("llama".into()));
    w.kv("list", Value::Array(Array::Ints(vec![1, 2, 3])));
    w.tensor("a", &[32, 2], TensorType::F32, vec![0u8; 256]);
    w.tensor("b", &[64], TensorType::Q8_0, vec![0u8; 68]);
    let bytes = w.to_bytes();
    // Layout: magic 4, version 4, n_tensors 8, n_kv 8, then key-values, then tensor infos.
    let kv0_key_len = 24;
    let kv0_type = kv0_key_len + 8 + "general.architecture".len();
    let kv1 = kv0_type + 4 + 8 + "llama".len();
    let kv1_type = kv1 + 8 + "list".len();
    let kv1_count = kv1_type + 4 + 4;
    let t0 = kv1_count + 8 + 3 * 4;
    let t1 = t0 + 8 + 1 + 4 + 2 * 8 + 4 + 8;
    Sample {
        bytes,
        kv0_key_len,
        kv0_type,
        kv1_type,
        kv1_count,
        t0,
        t1,
    }
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Parses `bytes` in a guard against panics; returns the error text of an expected GGUF error.
fn rejected(bytes: Vec<u8>, what: &str) -> String {
    let r = std::panic::catch_unwind(|| Gguf::from_bytes(bytes));
    match r {
        Err(_) => panic!("{what}: the reader panicked"),
        Ok(Ok(_)) => panic!("{what}: a malformed file was accepted"),
        Ok(Err(e)) => {
            assert!(
                matches!(e, mens::Error::Gguf { .. }),
                "{what}: wrong error kind: {e}"
            );
            e.to_string()
        }
    }
}

#[test]
fn the_sample_is_valid_and_its_layout_is_known() {
    let s = sample();
    let g = Gguf::from_bytes(s.bytes.clone()).unwrap();
    assert_eq!(g.tensors.len(), 2);
    assert_eq!(
        u64::from_le_bytes(
            s.bytes[s.kv0_key_len..s.kv0_key_len + 8]
                .try_into()
                .unwrap()
        ),
        20
    );
    assert_eq!(
        u32::from_le_bytes(s.bytes[s.kv0_type..s.kv0_type + 4].try_into().unwrap()),
        8
    );
    assert_eq!(
        u32::from_le_bytes(s.bytes[s.kv1_type..s.kv1_type + 4].try_into().unwrap()),
        9
    );
    assert_eq!(
        u64::from_le_bytes(s.bytes[s.kv1_count..s.kv1_count + 8].try_into().unwrap()),
        3
    );
    assert_eq!(&s.bytes[s.t0 + 8..s.t0 + 9], b"a");
    assert_eq!(&s.bytes[s.t1 + 8..s.t1 + 9], b"b");
}

#[test]
fn each_header_field_corrupted_in_turn() {
    let s = sample();
    let t0_dims = s.t0 + 8 + 1 + 4;
    let t0_type = t0_dims + 16;
    let t0_offset = t0_type + 4;
    let t1_offset = s.t1 + 8 + 1 + 4 + 8 + 4;
    #[allow(clippy::type_complexity)]
    let cases: Vec<(&str, Box<dyn Fn(&mut Vec<u8>)>, &str)> = vec![
        ("magic", Box::new(|b| b[0] = b'X'), "magic"),
        ("version 1", Box::new(|b| put_u32(b, 4, 1)), "version"),
        ("version 4", Box::new(|b| put_u32(b, 4, 4)), "version"),
        (
            "tensor count huge",
            Box::new(|b| put_u64(b, 8, u64::MAX)),
            "tensor_count",
        ),
        (
            "tensor count beyond the file",
            Box::new(|b| put_u64(b, 8, 60_000)),
            "tensor_count",
        ),
        ("tensor count + 1", Box::new(|b| put_u64(b, 8, 3)), "tensor"),
        (
            "kv count huge",
            Box::new(|b| put_u64(b, 16, 1 << 40)),
            "metadata_kv_count",
        ),
        ("kv count + 1", Box::new(|b| put_u64(b, 16, 3)), ""),
        (
            "key length huge",
            Box::new(|b| put_u64(b, 24, u64::MAX / 2)),
            "metadata key",
        ),
        (
            "key length past the end",
            Box::new(|b| put_u64(b, 24, 1 << 20)),
            "metadata key",
        ),
        (
            "unknown value type",
            Box::new(move |b| put_u32(b, s.kv0_type, 13)),
            "unknown value type",
        ),
        (
            "string value length huge",
            Box::new(move |b| put_u64(b, s.kv0_type + 4, u64::MAX)),
            "general.architecture",
        ),
        (
            "array of unknown type",
            Box::new(move |b| put_u32(b, s.kv1_type + 4, 77)),
            "unknown array element type",
        ),
        (
            "nested array",
            Box::new(move |b| put_u32(b, s.kv1_type + 4, 9)),
            "nested arrays",
        ),
        (
            "array count huge",
            Box::new(move |b| put_u64(b, s.kv1_count, u64::MAX)),
            "list",
        ),
        (
            "array count past the end",
            Box::new(move |b| put_u64(b, s.kv1_count, 1 << 30)),
            "list",
        ),
        (
            "tensor name length huge",
            Box::new(move |b| put_u64(b, s.t0, u64::MAX)),
            "tensor name",
        ),
        (
            "n_dims 0",
            Box::new(move |b| put_u32(b, s.t0 + 9, 0)),
            "n_dims",
        ),
        (
            "n_dims 5",
            Box::new(move |b| put_u32(b, s.t0 + 9, 5)),
            "n_dims",
        ),
        (
            "dimension 0",
            Box::new(move |b| put_u64(b, t0_dims, 0)),
            "dimension",
        ),
        (
            "dimensions overflow",
            Box::new(move |b| {
                put_u64(b, t0_dims, 1 << 40);
                put_u64(b, t0_dims + 8, 1 << 40);
            }),
            "overflows",
        ),
        (
            "element count past the file",
            Box::new(move |b| put_u64(b, t0_dims + 8, 1 << 30)),
            "outside the",
        ),
        (
            "row not whole blocks",
            Box::new(move |b| put_u64(b, s.t1 + 8 + 1 + 4, 48)),
            "block size",
        ),
        (
            "unknown tensor type",
            Box::new(move |b| put_u32(b, t0_type, 99)),
            "unknown or unsupported tensor type",
        ),
        (
            "misaligned offset",
            Box::new(move |b| put_u64(b, t0_offset, 4)),
            "alignment",
        ),
        (
            "offset past the end",
            Box::new(move |b| put_u64(b, t1_offset, 1 << 32)),
            "outside the",
        ),
        (
            "offset overflow",
            Box::new(move |b| put_u64(b, t1_offset, u64::MAX - 31)),
            "outside the",
        ),
        (
            "overlapping tensors",
            Box::new(move |b| put_u64(b, t1_offset, 128)),
            "overlaps",
        ),
        (
            "duplicate tensor name",
            Box::new(move |b| b[s.t1 + 8] = b'a'),
            "duplicate tensor name",
        ),
    ];
    for (what, mutate, want) in cases {
        let mut b = s.bytes.clone();
        mutate(&mut b);
        let e = rejected(b, what);
        assert!(e.contains(want), "{what}: expected {want:?} in: {e}");
        assert!(e.contains("byte offset"), "{what}: no offset in: {e}");
    }
}

#[test]
fn duplicate_keys_and_bad_alignment() {
    let mut w = Writer::new();
    w.kv("k", Value::U32(1)).kv("k", Value::U32(2));
    let e = rejected(w.to_bytes(), "duplicate key");
    assert!(e.contains("duplicate metadata key"), "{e}");
    for (a, v) in [
        ("0", Value::U32(0)),
        ("3", Value::U32(3)),
        ("string", Value::String("32".into())),
        ("huge", Value::U64(1 << 40)),
    ] {
        let mut w = Writer::new();
        w.kv("general.alignment", v);
        let e = rejected(w.to_bytes(), a);
        assert!(e.contains("general.alignment"), "alignment {a}: {e}");
    }
}

#[test]
fn truncations_at_many_offsets() {
    let bytes = synth_model(&SynthSpec::tiny_qwen2());
    let n = bytes.len();
    let mut cuts: Vec<usize> = (0..64).collect();
    cuts.extend((64..n).step_by(97));
    cuts.push(n - 1);
    for cut in cuts {
        rejected(bytes[..cut].to_vec(), &format!("cut at {cut} of {n}"));
    }
}

#[test]
fn fuzz_regressions_load_or_fail_cleanly() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions");
    let (mut n, mut rejects) = (0, 0);
    for e in std::fs::read_dir(&dir)
        .expect("fuzz/regressions exists")
        .flatten()
    {
        let bytes = std::fs::read(e.path()).unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        let r = std::panic::catch_unwind(|| mens::load_untrusted(&bytes));
        assert!(r.is_ok(), "{name}: panicked");
        // The malformed-file cases (`cargo run --release --example regressions`) must be refused.
        if name.starts_with("reject-") {
            assert!(r.unwrap().is_err(), "{name}: loaded");
            rejects += 1;
        }
        n += 1;
    }
    eprintln!("{n} fuzz regression inputs replayed, {rejects} of them refused as they must be");
    assert!(n > 0 && rejects >= 11, "{n} inputs, {rejects} refusals");
}

/// Size-like hyperparameters must match the tensors they describe (a RoPE dimension of 1000 with a
/// head size of 64 loaded and ran before; llama.cpp refuses such a file).
#[test]
fn hyperparameters_that_contradict_the_tensors() {
    for (key, v) in [
        ("qwen2.rope.dimension_count", 1000u32),
        ("qwen2.rope.dimension_count", 32),
        ("qwen2.attention.value_length", 128),
        ("qwen2.vocab_size", 7),
    ] {
        let mut g = Gguf::from_bytes(synth_model(&SynthSpec::tiny_qwen2())).unwrap();
        g.metadata.insert(key.into(), Value::U32(v));
        let e = mens::model::Config::from_gguf(&g).unwrap_err().to_string();
        assert!(e.contains(key), "{key} = {v}: {e}");
    }
    // The real values load.
    let mut g = Gguf::from_bytes(synth_model(&SynthSpec::tiny_qwen2())).unwrap();
    g.metadata
        .insert("qwen2.rope.dimension_count".into(), Value::U32(64));
    mens::model::Config::from_gguf(&g).unwrap();
}

/// RoPE scaling: linear is applied (positions × 1/factor), a factor out of range and YaRN are
/// refused by name, and a sliding-window pattern of the wrong length is refused.
#[test]
fn rope_scaling_and_window_metadata() {
    let with = |kvs: &[(&str, Value)]| {
        let mut g = Gguf::from_bytes(synth_model(&SynthSpec::tiny_gemma3())).unwrap();
        for (k, v) in kvs {
            g.metadata.insert(k.to_string(), v.clone());
        }
        mens::model::Config::from_gguf(&g)
    };
    let s = |x: &str| Value::String(x.into());
    let c = with(&[
        ("gemma3.rope.scaling.type", s("linear")),
        ("gemma3.rope.scaling.factor", Value::F32(8.0)),
    ])
    .unwrap();
    assert_eq!(c.rope_scale, 0.125);
    assert_eq!(with(&[]).unwrap().rope_scale, 1.0);
    let e = with(&[("gemma3.rope.scaling.type", s("yarn"))])
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"yarn\" is not supported"), "{e}");
    let e = with(&[
        ("gemma3.rope.scaling.type", s("linear")),
        ("gemma3.rope.scaling.factor", Value::F32(0.0)),
    ])
    .unwrap_err()
    .to_string();
    assert!(e.contains("rope.scaling.factor"), "{e}");
    let e = with(&[(
        "gemma3.attention.sliding_window_pattern",
        Value::Array(Array::Bools(vec![true; 3])),
    )])
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("sliding_window_pattern has 3 entries for 6 layers"),
        "{e}"
    );
    // The tiny model's window: layers 0–4 local, 5 global.
    let c = with(&[]).unwrap();
    let w: Vec<usize> = (0..6).map(|l| c.window(l)).collect();
    assert_eq!(w, [8, 8, 8, 8, 8, usize::MAX]);
}
