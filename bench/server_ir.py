"""``python -m bench.server_ir``: redis-server's instructions per flow execution, counted by callgrind.

On a shared 2-core machine redis-server's CPU per execution (``INFO cpu`` or ``/proc``) swings by
a third from run to run; the instructions it executes do not (the same within ~1 %). Each run
starts redis-server under ``valgrind --tool=callgrind`` with counting off, a flow worker of the
checkout (``--flows bench.flowdefs``, ``--concurrency``) draining 20 warm-up starts, then counts
only while ``--executions`` 3-step starts queued at once drain; the total over the executions is
the figure. ``--baseline DIR`` measures another checkout the same way (its ``plaita``, this
checkout's ``bench``), so the two figures compare the server work of the two versions.

The window also holds the server's timers (``serverCron``, a few % at these lengths) and the
status indexes are small (a few hundred entries, as on a fresh queue), so read the figures side
by side, not as an absolute cost.

    python -m bench.server_ir [--baseline DIR] [--executions 500] [--steps async] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, WorkerProcess, client_for, wait_for
from bench.flowcurve import COMPLETED, FLOW_IDS, _fill, _source_dir
from tests.support.redis_server import free_port, redis_server_binary

WARM = 20
STREAM = "bench:server_ir:queue"


def _callgrind_total(folder: Path) -> int:
    """The largest ``totals:`` of the callgrind dumps in ``folder`` (the counted window's)."""
    totals = [
        int(line.split()[1])
        for dump in folder.glob("cg.out*")
        for line in dump.read_text().splitlines()
        if line.startswith(("totals:", "summary:"))
    ]
    if not totals:
        raise RuntimeError(f"bench server_ir: no callgrind totals in {folder}")
    return max(totals)


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True, timeout=60)


def _drain(url: str, cwd: Path, flow_id: str, executions: int, concurrency: int, server_pid: int) -> None:
    client = client_for(url, socket_timeout_s=60)
    client.xgroup_create(STREAM, "plaita-workers", id="0", mkstream=True)
    args = ["--no-registry", "--flows", "bench.flowdefs", "--concurrency", str(concurrency)]
    env = {"PYTHONPATH": str(cwd)}
    with WorkerProcess(url, stream=STREAM, group="plaita-workers", extra_args=args, env=env, cwd=cwd) as worker:
        worker.wait_state("READING", timeout_s=120)
        _fill(client, STREAM, flow_id, WARM)  # scripts loaded, connections made
        if not wait_for(lambda: int(client.zcard(COMPLETED)) >= WARM, 300):
            raise RuntimeError(f"bench server_ir: warm-up not done: {worker.stderr_tail()}")
        time.sleep(0.5)  # its acks out
        _control(server_pid, "-i", "on")
        pipe = client.pipeline(transaction=True)
        for i in range(executions):
            body = {"type": "start", "flow_id": flow_id, "execution_id": f"ir-{i}", "params": {}}
            pipe.xadd(STREAM, {"payload": json.dumps(body), "schema_version": "1"})
        pipe.execute()
        if not wait_for(lambda: int(client.zcard(COMPLETED)) >= WARM + executions, 900):
            raise RuntimeError(f"bench server_ir: not drained: {worker.stderr_tail()}")
        time.sleep(0.5)
        _control(server_pid, "-i", "off")
        _control(server_pid, "-d")
    client.close()


def measure(cwd: Path, flow_id: str, executions: int, concurrency: int) -> float:
    """redis-server instructions per execution of one drain."""
    folder = Path(tempfile.mkdtemp(prefix="plaita-server-ir-"))
    port = free_port()
    argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={folder / 'cg.out'}"]
    argv += [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    server = subprocess.Popen([*argv, "--dir", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}"
    try:
        ping = client_for(url, socket_timeout_s=5)
        if not wait_for(lambda: _answers(ping), 120, poll_s=0.1):
            raise RuntimeError("bench server_ir: redis-server under valgrind did not start")
        ping.close()
        _drain(url, cwd, flow_id, executions, concurrency, server.pid)
    finally:
        server.terminate()
        server.wait(120)
    return _callgrind_total(folder) / executions


def _answers(client: object) -> bool:
    try:
        return bool(client.ping())  # type: ignore[attr-defined]
    except Exception:  # not up yet
        return False


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.server_ir", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--baseline", help="a checkout of the plaita to compare with (its plaita/ is used)")
    p.add_argument("--executions", type=int, default=500, help="counted executions (default 500)")
    p.add_argument("--steps", choices=sorted(FLOW_IDS), default="async", help="the flow's steps (default async)")
    p.add_argument("--concurrency", type=int, default=64, help="the worker's --concurrency (default 64)")
    a = p.parse_args(argv)
    if a.executions < 10 or a.concurrency < 1:
        p.error("--executions >= 10 and --concurrency >= 1 please")
    if a.baseline and not (Path(a.baseline) / "plaita").is_dir():
        p.error(f"--baseline {a.baseline}: no plaita/ there")
    sides = [("baseline", _source_dir(Path(a.baseline)))] if a.baseline else []
    sides.append(("this checkout", ROOT))
    figures = {name: measure(cwd, FLOW_IDS[a.steps], a.executions, a.concurrency) for name, cwd in sides}
    print(f"redis-server instructions per 3-step execution ({a.steps} steps, c{a.concurrency}, callgrind):")
    for name, figure in figures.items():
        print(f"  {name:<14} {figure:>12,.0f}")
    if a.baseline:
        print(f"  ratio          {figures['this checkout'] / figures['baseline']:12.2f}")


if __name__ == "__main__":
    main()
