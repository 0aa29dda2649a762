#!/bin/bash
# Memory of a workspace mount daemon: a whole-tree walk, the kernel forgetting,
# and a 100k-file churn (create and unlink 10 x 10,000 files). Usage:
#   bench/workspace-memory.sh REPO   (a git repository of thousands of files)
set -u
MADO=$HOME/.cache/mado-build/target/debug/mado
R=/tmp/memrun; fusermount3 -uz $R/mnt 2>/dev/null; rm -rf $R; mkdir -p $R/mnt $R/home
export HOME=$R/home MADO_REMOTE_ADDR=file://$R/store
$MADO init >/dev/null; $MADO import-git "${1:?usage: bench/workspace-memory.sh REPO}" >/dev/null
$MADO ws create m --from main --mount $R/mnt >/dev/null
pid=$($MADO stats $R/mnt --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
show() { echo "$1: rss $(grep VmRSS /proc/$pid/status | awk '{print $2/1024 " MiB"}'), nodes $($MADO stats $R/mnt --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["nodes_in_memory"])')"; }
show "mounted"
grep -r zzzqqq $R/mnt >/dev/null; show "after grep -r over 14.7k files"
sync; echo 2 > /proc/sys/vm/drop_caches; sleep 1; show "after drop_caches"
mkdir $R/mnt/churn
t0=$(date +%s.%N)
python3 - "$R/mnt/churn" <<'PY'
import os, sys
d = sys.argv[1]
for b in range(10):
    names = []
    for i in range(10000):
        p = os.path.join(d, "f%d_%d" % (b, i))
        with open(p, "w") as f:
            f.write("x")
        names.append(p)
    for p in names:
        os.unlink(p)
PY
t1=$(date +%s.%N); echo "100k create+unlink: $(echo "$t1 - $t0" | bc) s"
show "after 100k-file churn"
sync; echo 2 > /proc/sys/vm/drop_caches; sleep 1; show "after drop_caches"
ls $R/home/.cache/mado/workspaces/*/upper | wc -l
$MADO umount $R/mnt
