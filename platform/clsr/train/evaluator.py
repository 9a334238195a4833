"""Scoring a trial's model on rank 0: the dev scores during training and the final test scores
(``clsr.eval.suite``, the suite ``platform eval`` runs too); the ranks share the transfer tasks."""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Any

from torch import nn

from clsr.config.trial import TrialConfig
from clsr.data.faq import FAQData, load_faq
from clsr.data.sources import resolve_data_dir
from clsr.data.tasks import split_eval_tasks
from clsr.eval.faq import dev_map
from clsr.eval.sts import evaluate_sts
from clsr.eval.suite import SuiteSettings, SuiteTasks, evaluate_suite
from clsr.eval.transfer import TransferScore, evaluate_transfer, shares
from clsr.methods.base import Method
from clsr.runtime.distributed import broadcast_, gather_or_raise, patient_group
from clsr.tracking.run_logger import RunLogger
from clsr.train.checkpoint import trained_state, unwrap

DEV_SPLIT = "dev"


class Evaluator:
    """Dev scores during training and the final test scores, computed on rank 0; the ranks of a
    multi-worker trial share its final transfer tasks (``shared_transfer``)."""

    def __init__(self, trial: TrialConfig, method: Method, pipeline: Any):
        self.cfg = trial.eval
        self.data_dir = trial.data.data_dir
        self.method = method
        self.pipeline = pipeline  # the tokenizer or word table the method encodes text with
        self.trial = trial
        self._faq_data: FAQData | None = None  # the trained FAQ set, read once per trial for its dev scores

    def artifacts(self, model: nn.Module, stage: str, logger: RunLogger) -> None:
        """The method's own files for the MLflow run ("start": untrained model, "final": best)."""
        if logger.active:
            self.method.log_artifacts(stage, self.embedder(model), logger, self.trial)

    def embedder(self, model: nn.Module):
        """Scores in the precision the trial trains in (``trainer.precision``)."""
        return self.method.make_embedder(
            unwrap(model), self.pipeline, self.cfg.batch_size, self.trial.trainer.precision
        )

    def dev(self, model: nn.Module) -> dict[str, float]:
        sts = [task for task in self.cfg.dev_tasks if task != "faq"]
        cap = self.cfg.sts_max_pairs
        scores = evaluate_sts(self.embedder(model), sts, DEV_SPLIT, self.data_dir, cap) if sts else {}
        metrics = {f"dev_{task}": s.all for task, s in scores.items()}
        if "faq" in self.cfg.dev_tasks:  # MAP of the trained FAQ set's dev queries (RCL Table 2)
            if self._faq_data is None:
                self._faq_data = load_faq(self.trial.data.faq_set(), resolve_data_dir(self.data_dir))
            caps = {"max_queries": self.cfg.faq_max_queries, "max_items": self.cfg.faq_max_items}
            metrics["dev_faq"] = dev_map(self._faq_data, self.trial.data.fold, self.embedder(model), **caps)
        return metrics

    def log_model(self, model: nn.Module, logger: RunLogger) -> None:
        """The best model as the run's ``model/`` artifacts, in a format users load without clsr."""
        with tempfile.TemporaryDirectory(prefix="clsr-model-") as folder:
            try:
                self.method.export_model(unwrap(model), self.pipeline, self.trial, Path(folder) / "model")
                logger.log_artifacts(Path(folder) / "model", "model")
            except Exception as err:  # the scores stand; a trial is not lost over its export
                warnings.warn(f"the trained model could not be logged: {err!r}", stacklevel=2)
                logger.set_tags({"clsr.model_error": repr(err)[:5000]})

    def transfer_tasks(self) -> list[str]:
        return split_eval_tasks(self.cfg.builtin_tasks())[1]

    def shares_transfer(self, world_size: int) -> bool:
        """Whether the ranks share the final transfer tasks (the same answer on every rank)."""
        return world_size > 1 and len(self.transfer_tasks()) > 1

    def transfer(self, model: nn.Module, tasks: list[str]) -> dict[str, TransferScore]:
        return evaluate_transfer(
            self.embedder(model),
            tasks,
            self.data_dir,
            mode=self.cfg.transfer_mode,
            max_examples=self.cfg.transfer_max_examples,
            classifier=self.cfg.transfer_classifier,
            device=self.transfer_device(model),
        )

    def transfer_device(self, model: nn.Module) -> str | None:
        """The GPU that ``transfer_device: auto`` fits on: the model's, when it is on one."""
        if self.cfg.transfer_device != "auto":
            return None
        device = next(model.parameters()).device
        return str(device) if device.type == "cuda" else None

    def shared_transfer(self, model: nn.Module, session) -> dict[str, TransferScore]:
        """Every rank takes rank 0's weights (the best ones, loaded there) and scores its share of the
        transfer tasks (split by their fit cost) on its own device and CPUs; the scores are gathered on
        every rank. SentEval's classifier fits are CPU-bound, so on one GPU node the ranks' CPUs fit in
        parallel, and each rank embeds its tasks' sentences on its own GPU."""
        broadcast_(trained_state(unwrap(model)).values())
        tasks = self.transfer_tasks()
        mine = shares(tasks, session.world_size)[session.rank]
        # the ranks wait for the slowest share: longer than the default group's timeout allows
        with patient_group() as group:
            parts = gather_or_raise(lambda: self.transfer(model, mine) if mine else {}, group)
        gathered = {task: score for part in parts for task, score in part.items()}
        return {task: gathered[task] for task in tasks}

    def final(self, model: nn.Module, transfer: dict[str, TransferScore] | None = None) -> dict[str, float]:
        """The test scores; ``transfer``: the transfer scores when the ranks computed them together."""
        sts, transfer_tasks, faq = split_eval_tasks(self.cfg.builtin_tasks())
        tasks = SuiteTasks(sts, transfer_tasks, faq, self.cfg.custom_tasks())
        # a trial trained on an FAQ set scores that set's test fold
        faq_set = self.trial.data.faq_set() if faq else None
        settings = self.suite_settings(model, (faq_set, self.trial.data.fold) if faq_set else None)
        return evaluate_suite(self.embedder(model), tasks, settings, transfer=transfer)

    def suite_settings(self, model: nn.Module, faq_test_fold: tuple[str, int] | None) -> SuiteSettings:
        """The trial's ``eval`` caps and fits for the final evaluation."""
        return SuiteSettings(
            data_dir=self.data_dir,
            sts_max_pairs=self.cfg.sts_max_pairs,
            transfer_mode=self.cfg.transfer_mode,
            transfer_classifier=self.cfg.transfer_classifier,
            transfer_max_examples=self.cfg.transfer_max_examples,
            device=self.transfer_device(model),
            faq_max_queries=self.cfg.faq_max_queries,
            faq_max_items=self.cfg.faq_max_items,
            faq_test_fold=faq_test_fold,
            alignment_uniformity=self.cfg.alignment_uniformity,
            truncate_dims=tuple(self.cfg.truncate_dims),
        )


def dev_scores(metrics: dict[str, float]) -> dict[str, float]:
    """The dev-set scores of one evaluation (``dev_<task>``), kept for the step that was selected."""
    return {key: float(value) for key, value in metrics.items() if key.startswith("dev_")}
