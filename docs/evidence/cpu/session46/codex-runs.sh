# Two codex exec sessions against one server: $1 = CODEX_HOME (its config.toml names the server), $2 = tag.
cd WORKDIR
for q in "Reply with the word hello." "Reply with the word goodbye."; do
  s=$(date +%s.%N); CODEX_HOME=$1 MENS_KEY=sk-local timeout 900 codex exec --skip-git-repo-check "$q" < /dev/null > /tmp/cc/codex-$2-$(echo $q | tr -dc a-z | tail -c 8).txt 2>&1; rc=$?; e=$(date +%s.%N)
  echo "$2 | $q | rc $rc | wall $(python3 -c "print(round($e-$s,1))") s" >> /tmp/cc/codex-times.txt
done
