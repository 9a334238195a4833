"""GPU and CPU utilisation of a trial: MLflow's system metrics on the trial's run, plus a summary.

MLflow's ``SystemMetricsMonitor`` samples the machine of rank 0 every ``interval_s`` seconds in a
thread and logs ``system/cpu_utilization_percentage``, ``system/system_memory_usage_megabytes``, disk
and network figures and, where NVML answers (``nvidia-ml-py``), ``system/gpu_<i>_utilization_percentage``
and ``system/gpu_<i>_memory_usage_megabytes`` for every GPU of that machine (MLflow draws them as charts
on the run page). ``summary`` reduces them to one number per trial for the study report, counting only
the GPUs this process was given (``CUDA_VISIBLE_DEVICES``): trials that share a GPU through fractional
resources see the whole card's utilisation, which is what tells whether the card is kept busy.
"""

from __future__ import annotations

import logging
import os
import statistics
from typing import Any

from mlflow.tracking import MlflowClient

PREFIX = "system/"


def visible_gpu_indices(gpu_count_logged: int) -> list[int]:
    """NVML indices of this process's GPUs: ``CUDA_VISIBLE_DEVICES`` when it lists indices, else all."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    if all(item.strip().isdigit() for item in listed) and listed != [""]:
        return [int(item) for item in listed]
    return list(range(gpu_count_logged))


class SystemMetrics:
    """Samples the machine into the MLflow run ``run_id`` from ``start`` until ``stop``."""

    def __init__(self, uri: str, run_id: str, interval_s: float):
        self.uri, self.run_id, self.interval_s = uri, run_id, interval_s
        self.monitor: Any = None

    def start(self) -> None:
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
        except ImportError as err:  # psutil missing: the trial still runs, without system metrics
            logging.getLogger(__name__).warning("no system metrics (%s): pip install psutil", err)
            return
        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # no start/stop chatter
        self.monitor = SystemMetricsMonitor(
            self.run_id, sampling_interval=self.interval_s, resume_logging=True, tracking_uri=self.uri
        )
        self.monitor.start()

    def stop(self) -> dict[str, float]:
        """Stop sampling and return the trial's means: ``trial_cpu_utilization_mean`` and, with GPUs,
        ``trial_gpu_utilization_mean`` and ``trial_gpu_memory_peak_mb`` over this process's GPUs."""
        if self.monitor is None:
            return {}
        self.monitor.finish()
        self.monitor = None
        try:
            return summarise(MlflowClient(self.uri), self.run_id)
        except Exception as err:  # the tracking server is down: the samples stand, the means are left out
            logging.getLogger(__name__).warning("no utilisation means for this trial (%s)", err)
            return {}


def summarise(client: MlflowClient, run_id: str) -> dict[str, float]:
    logged = client.get_run(run_id).data.metrics
    gpus = sorted(
        int(k.split("_")[1]) for k in logged if k.startswith(f"{PREFIX}gpu_") and "_utilization_" in k
    )

    def history(name: str) -> list[float]:
        return (
            [m.value for m in client.get_metric_history(run_id, PREFIX + name)]
            if PREFIX + name in logged
            else []
        )

    out: dict[str, float] = {}
    if cpu := history("cpu_utilization_percentage"):
        out["trial_cpu_utilization_mean"] = statistics.fmean(cpu)
    mine = [i for i in visible_gpu_indices(len(gpus)) if i in gpus]
    utilisation = [v for i in mine for v in history(f"gpu_{i}_utilization_percentage")]
    if utilisation:
        out["trial_gpu_utilization_mean"] = statistics.fmean(utilisation)
        memory = [v for i in mine for v in history(f"gpu_{i}_memory_usage_megabytes")]
        out["trial_gpu_memory_peak_mb"] = max(memory, default=0.0)
    return out
