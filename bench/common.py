"""Helpers shared by mado's benchmark scripts."""
import os, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sh(*args, env=None, cwd=None):
    """Runs a command; exits with its stderr if it fails; returns stdout."""
    r = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{r.stderr}")
    return r.stdout


def settle():
    """Flush dirty pages and drop the page cache before a timed run, so one
    run's writeback does not land in the next one's time."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass  # not root: flushing alone still removes most of the skew
