"""Operating a job: ``python -m bench operate [--steps N] [--skip-dashboard]``.

1. ``liveput status`` latency on a 10,000-step job's store. The store is a real etcd written
   the way a job writes it, faster than training would: every step is voted and committed
   (``protocol.vote_commit``) and recorded in the ledger (``protocol.record_step``) by the
   real protocol code, an instance heartbeats, checkpoints complete every 100 steps
   (``Checkpointer``'s marking), and a real :class:`Coordinator` (recovered on that store,
   time from a manual clock, 0.25 s per step) observes every 10 steps and prunes as on a long
   job, while the real :class:`StatusRecorder` writes ``status/*``. Then: the status read
   in-process (``read_status``, what the CLI and the dashboard do), and the whole
   ``liveput status --json`` command (Python start and imports included).
2. Dashboard update lag: a real launched job (tiny-gpt on the emulated provider) with its
   dashboard open in headless Chromium; each time the page shows a new step, the lag is the
   time it appears minus the ``committed_unix_s`` of that step's ledger record.

Targets: status read p95 under 100 ms, the command under 5 s; dashboard lag median under 2 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_READ_P95_S = 0.1
TARGET_CLI_S = 5.0
TARGET_LAG_S = 2.0


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def write_job_store(store, steps: int, profile=None, series_points: int = 240) -> None:  # noqa: ANN001
    """A ``steps``-step job's store, written through the runtime's own code (see above);
    ``profile``: the job's (default: measured now, as a launched job does)."""
    from liveput.models.jobs import resolve_job
    from liveput.operate.recorder import RecorderConfig, StatusRecorder
    from liveput.runtime import keys, protocol
    from liveput.runtime.checkpoint import Checkpointer
    from liveput.runtime.clock import ManualClock
    from liveput.runtime.coordinator import Coordinator, CoordinatorConfig
    from liveput.runtime.launch import JobSpec, job_profile, publish_spec

    job = resolve_job("tiny-gpt")
    publish_spec(store, JobSpec("tiny-gpt", tempfile.mkdtemp(prefix="bench-operate-ckpt-")))
    profile = profile or job_profile(store, "tiny-gpt")
    store.set(keys.member(0), json.dumps({"host": "127.0.0.1", "market": "spot"}).encode())
    plan = protocol.RuntimePlan(
        generation=0,
        epoch=0,
        start_step=0,
        end_step=steps,
        data_parallel=1,
        pipeline_stages=1,
        boundaries=[0, job.num_layers],
        slots={0: (0, 0)},
        hosts={0: "127.0.0.1"},
        kind="none",
    )
    protocol.publish_plan(store, plan)
    store.set(keys.event(0), json.dumps({"reason": "start", "kind": "none"}).encode())
    clock = ManualClock()
    coordinator = Coordinator(
        store,
        profile,
        CoordinatorConfig(num_steps=steps, num_micro_batches=job.num_micro_batches, capacity=4),
        clock=clock,
    )
    recorder = StatusRecorder(
        store,
        RecorderConfig(
            job="bench",
            num_steps=steps,
            global_batch_size=job.global_batch_size,
            spot_usd_per_hour=0.9,
            on_demand_usd_per_hour=3.06,
            series_points=series_points,
        ),
    )
    checkpointer = Checkpointer(store, tempfile.mkdtemp(prefix="bench-operate-ckpt-"))
    started = time.monotonic()
    for step in range(steps):
        protocol.vote_commit(store, 0, step, 1)
        protocol.record_step(
            store,
            0,
            protocol.LedgerRecord(
                step=step,
                generation=0,
                first_sample=step * job.global_batch_size,
                num_samples=job.global_batch_size,
                loss=5.0 / (1 + step / 1000),
                data_parallel=1,
                pipeline_stages=1,
                committed_unix_s=time.time(),
            ),
        )
        store.add(keys.heartbeat(0), 1)
        if step % 100 == 99:
            store.add(keys.checkpoint_layers(0, step), job.num_layers)
            checkpointer._mark_latest(0, step)
        clock.advance(0.25)
        if step % 10 == 9 or step == steps - 1:
            coordinator.observe()
            coordinator.available = [0]
            coordinator._prune()
            recorder.record(coordinator, clock.now_s())
        if step % 1000 == 999:
            print(f"  wrote {step + 1} steps ({time.monotonic() - started:.0f} s)", flush=True)
    checkpointer.close()


def status_latency(steps: int) -> dict:
    from liveput.operate.recorder import read_status
    from liveput.ports import free_port_pair
    from liveput.runtime.store import open_store
    from liveput.runtime.store.etcd_server import EtcdConfig, LocalEtcd

    with tempfile.TemporaryDirectory(prefix="bench-operate-") as scratch:
        etcd = LocalEtcd(
            EtcdConfig(Path(scratch) / "etcd", client_port=free_port_pair(), die_with_parent=True)
        )
        etcd.start()
        try:
            token_file = Path(scratch) / "token"
            token_file.write_text("bench-token\n")
            with open_store(etcd.url, token="bench-token") as store:
                write_job_store(store, steps)
                keys = len(store.inner.get_prefix(""))
                reads = []
                for _ in range(200):
                    begun = time.perf_counter()
                    status = read_status(store)
                    reads.append(time.perf_counter() - begun)
                assert status["step"] == steps, status["step"]
            commands = []
            for _ in range(5):
                begun = time.perf_counter()
                done = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "liveput.cli.main",
                        "status",
                        "--store",
                        etcd.url,
                        "--token-file",
                        str(token_file),
                        "--json",
                    ],
                    capture_output=True,
                    text=True,
                )
                commands.append(time.perf_counter() - begun)
                assert done.returncode == 0, done.stderr
                assert json.loads(done.stdout)["step"] == steps
        finally:
            etcd.stop()
    return {
        "steps": steps,
        "store_keys": keys,
        "read_median_ms": round(1000 * statistics.median(reads), 2),
        "read_p95_ms": round(1000 * _quantile(reads, 0.95), 2),
        "command_median_s": round(statistics.median(commands), 3),
        "command_max_s": round(max(commands), 3),
    }


def dashboard_lag(samples: int = 30) -> dict:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    from liveput.runtime import keys
    from liveput.runtime.store import open_store

    with tempfile.TemporaryDirectory(prefix="bench-operate-") as scratch:
        job_file = Path(scratch) / "job.yaml"
        job_file.write_text(
            f"name: lag\nmodel: tiny-gpt\nsteps: 400\nstate_dir: {scratch}/state\n"
            "linger_s: 0\nprovider: {workers: 2, time_scale: 1}\n"
            "checkpoint: {every: 50}\ndashboard: {port: 0}\n"
        )
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "liveput.cli.main",
                "launch",
                str(job_file),
                "--detach",
                "--json",
            ],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        place = json.loads(done.stdout)
        token = Path(place["token_file"]).read_text().strip()
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
            options.add_argument(flag)
        browser = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        lags: list[float] = []
        seen: list[tuple[int, float]] = []
        try:
            browser.get(place["dashboard"])
            last = -1
            deadline = time.monotonic() + 240
            while len(seen) < samples and time.monotonic() < deadline:
                text = browser.execute_script("return document.getElementById('step').textContent;")
                now = time.time()
                if "/" in text:
                    shown = int(text.split("/")[0])
                    if shown != last and shown > 0 and last >= 0:
                        seen.append((shown, now))
                    last = shown
                time.sleep(0.02)
        finally:
            browser.quit()
            with open_store(place["store"], token=token) as store:
                committed = {}
                for key, raw in store.get_prefix(keys.LEDGER.prefix).items():
                    committed[int(key.rsplit("/", 1)[1])] = json.loads(raw)["committed_unix_s"]
                store.set(keys.job_stop(), b"1")
        for shown, at in seen:
            if shown - 1 in committed:
                lags.append(at - committed[shown - 1])
    return {
        "samples": len(lags),
        "lag_median_s": round(statistics.median(lags), 3),
        "lag_p95_s": round(_quantile(lags, 0.95), 3),
        "lag_max_s": round(max(lags), 3),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench operate", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--steps", type=int, default=10_000, help="steps of the job's store")
    parser.add_argument("--skip-dashboard", action="store_true", help="status latency only")
    args = parser.parse_args([] if argv is None else argv)
    status = status_latency(args.steps)
    print(
        f"status on a {status['steps']:,}-step job's store ({status['store_keys']} keys): "
        f"read median {status['read_median_ms']} ms, p95 {status['read_p95_ms']} ms "
        f"(target < {TARGET_READ_P95_S * 1000:g} ms: ratio "
        f"{status['read_p95_ms'] / 1000 / TARGET_READ_P95_S:.2f}); `liveput status --json` "
        f"median {status['command_median_s']} s, max {status['command_max_s']} s "
        f"(target < {TARGET_CLI_S:g} s: ratio {status['command_median_s'] / TARGET_CLI_S:.2f})",
        flush=True,
    )
    if not args.skip_dashboard:
        lag = dashboard_lag()
        print(
            f"dashboard update lag over {lag['samples']} steps: median {lag['lag_median_s']} s, "
            f"p95 {lag['lag_p95_s']} s, max {lag['lag_max_s']} s (target median < "
            f"{TARGET_LAG_S:g} s: ratio {lag['lag_median_s'] / TARGET_LAG_S:.2f})",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
