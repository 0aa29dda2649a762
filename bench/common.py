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


def release_mado():
    """Builds the release binary and returns its path."""
    sh("cargo", "build", "-q", "--release", "-p", "mado", cwd=ROOT)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/mado-build/target"))
    return os.path.join(target, "release", "mado")


def clean_env(home, remote):
    """The environment for a hermetic mado: its own HOME and remote."""
    env = dict(os.environ, HOME=home, MADO_REMOTE_ADDR=remote)
    for k in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "MADO_CACHE_DIR", "MADO_CONFIG"):
        env.pop(k, None)
    return env
