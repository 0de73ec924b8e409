# Two independent Claude Code sessions (different first messages) against one server: $1 = port, $2 = tag.
cd /tmp/cc/work
export ANTHROPIC_BASE_URL=http://127.0.0.1:$1 ANTHROPIC_AUTH_TOKEN=sk-local ANTHROPIC_MODEL=qwen2.5-coder-0.5b ANTHROPIC_SMALL_FAST_MODEL=qwen2.5-coder-0.5b CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1
shift 1; tag=$1; shift 1
for q in "$@"; do
  s=$(date +%s.%N); timeout 900 claude -p "$q" --output-format json > /tmp/cc/$tag-$(echo $q | tr -dc a-z | head -c 12).json 2>>/tmp/cc/err.txt; e=$(date +%s.%N)
  echo "$tag | $q | wall $(python3 -c "print(round($e-$s,1))") s" >> /tmp/cc/sessions.txt
done
