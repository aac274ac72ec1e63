"""A single-node Slurm cluster on loopback for the ``slurm`` tests: munged, slurmctld and slurmd
from Debian's ``slurm-wlm``, each with its own key, socket, ports, state and logs in a temporary
folder (nothing of the system's configuration is used or changed), stopped afterwards."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "sacct")


def missing() -> list[str]:
    return [d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _which(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


@contextlib.contextmanager
def single_node_slurm(folder: Path, cpus: int = 2, timeout_s: float = 60.0):
    """Start the cluster; yield the environment (``SLURM_CONF``) its clients need."""
    folder.mkdir(parents=True, exist_ok=True)
    key, sock = folder / "munge.key", folder / "munge.sock"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    procs = []
    munged = [_which("munged"), "--foreground", "--force", f"--key-file={key}", f"--socket={sock}",
              f"--pid-file={folder / 'munged.pid'}", f"--log-file={folder / 'munged.log'}",
              f"--seed-file={folder / 'munged.seed'}"]
    host = socket.gethostname().split(".")[0]
    for d in ("state", "spool"):
        (folder / d).mkdir(exist_ok=True)
    conf = folder / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=lenstest", f"SlurmctldHost={host}(127.0.0.1)", "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", f"AuthInfo=socket={sock}", "CredType=cred/munge",
        f"StateSaveLocation={folder / 'state'}", f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}", f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}", f"SlurmdLogFile={folder / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none", "ReturnToService=2",
        "SchedulerType=sched/builtin", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none", "SlurmctldTimeout=30", "SlurmdTimeout=30", "InactiveLimit=0",
        "KillWait=5", "MinJobAge=300",
        f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""]))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    try:
        procs.append(subprocess.Popen(munged, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait(lambda: sock.exists(), timeout_s, "munged", folder / "munged.log")
        for daemon in ("slurmctld", "slurmd"):
            procs.append(subprocess.Popen([_which(daemon), "-D", "-f", str(conf)], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        def node_idle() -> bool:
            out = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True)
            return out.returncode == 0 and out.stdout.strip() in ("idle", "mix")

        _wait(node_idle, timeout_s, "slurmd", folder / "slurmd.log")
        yield env
    finally:
        _cancel_jobs(env if procs else None)  # no job step (srun, slurmstepd) outlives the cluster
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def _cancel_jobs(env: dict | None, timeout_s: float = 30.0) -> None:
    """Cancel every job of this cluster and wait until none is left (before its daemons stop)."""
    if env is None or shutil.which("scancel") is None:
        return
    subprocess.run(["scancel", "--full", "--user", str(os.getuid())], env=env, capture_output=True, timeout=30)

    def none_left() -> bool:
        out = subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True, timeout=30)
        return out.returncode != 0 or not out.stdout.strip()

    deadline = time.time() + timeout_s
    while time.time() < deadline and not none_left():
        time.sleep(0.5)


def _wait(ready, timeout_s: float, what: str, log: Path) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if ready():
            return
        time.sleep(0.5)
    tail = log.read_text()[-2000:] if log.exists() else "(no log)"
    raise RuntimeError(f"{what} did not come up in {timeout_s:.0f} s; its log ends:\n{tail}")
