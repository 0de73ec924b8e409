cd /tmp/cc/work
export ANTHROPIC_BASE_URL=http://127.0.0.1:8178 ANTHROPIC_AUTH_TOKEN=sk-local ANTHROPIC_MODEL=qwen2.5-coder-0.5b ANTHROPIC_SMALL_FAST_MODEL=qwen2.5-coder-0.5b CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1
s=$(date +%s.%N); timeout 900 claude -p "Reply with the word hello." --output-format json > /tmp/cc/c1.json 2>>/tmp/cc/err.txt; e=$(date +%s.%N)
echo "first | wall $(python3 -c "print(round($e-$s,1))") s" >> /tmp/cc/times3.txt
s=$(date +%s.%N); timeout 900 claude -p --continue "Now reply with the word goodbye." --output-format json > /tmp/cc/c2.json 2>>/tmp/cc/err.txt; e=$(date +%s.%N)
echo "continue | wall $(python3 -c "print(round($e-$s,1))") s" >> /tmp/cc/times3.txt
echo done >> /tmp/cc/times3.txt
