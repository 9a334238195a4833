"""The ranks of a multi-worker trial share its final transfer evaluation: two real gloo processes.

Each rank takes rank 0's weights (the best ones are loaded on rank 0 only), scores every second task,
and every rank ends with every task's score in the configured order; an error on one rank is raised on
both, so no rank is left waiting in the collective.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

RANK = textwrap.dedent(
    """
    import json, os, sys
    import torch, torch.distributed as dist
    from clsr.eval.transfer import TransferScore
    from clsr.config.trial import TrialConfig
    from clsr.train.evaluator import Evaluator

    rank, fail_on = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(10.0 if rank == 0 else -1.0)  # rank 0 holds the best weights
    trial = TrialConfig.model_validate({
        "model": {"name": "minilm"}, "method": {"name": "simcse_unsup"},
        "eval": {"dev_tasks": [], "tasks": ["mr", "cr", "subj", "trec", "mrpc"]},
    })
    evaluator = Evaluator(trial, method=None, pipeline=None)

    def transfer(model, tasks):  # instead of SentEval: a score that shows whose weights it saw, and where
        if fail_on in tasks:
            raise ValueError(f"no {fail_on} data on this node")
        seen = float(model.weight.sum())
        return {t: TransferScore(task=t, acc=seen + rank / 10, devacc=0.0, chosen_c=[1.0], sizes={}) for t in tasks}

    evaluator.transfer = transfer

    class Session:
        rank, world_size = rank, 2

    assert evaluator.shares_transfer(2) and not evaluator.shares_transfer(1)
    try:
        scores = evaluator.shared_transfer(model, Session())
        print(json.dumps({t: s.acc for t, s in scores.items()}))
    except ValueError as err:
        print(json.dumps({"error": str(err)}))
    dist.barrier()  # as Ray Train ends its workers: no rank leaves with the group's threads still up
    dist.destroy_process_group()
    """
)


def run_ranks(fail_on: str = "") -> list[dict]:
    with socket.socket() as probe:  # a free loopback port for the process group's store
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(r), fail_on], env=env, stdout=subprocess.PIPE, text=True
        )
        for r in (0, 1)
    ]
    outputs = [proc.communicate(timeout=120)[0] for proc in ranks]
    assert [proc.returncode for proc in ranks] == [0, 0], outputs
    return [json.loads(out.strip().splitlines()[-1]) for out in outputs]


def test_ranks_share_the_transfer_tasks_with_rank_0s_weights():
    zero, one = run_ranks()
    assert zero == one  # every rank has every score
    # tasks in the configured order; rank 0 scored mr, trec, mrpc and rank 1 subj, cr (shares by fit
    # cost), both with rank 0's weights (2 × 10.0): rank 1's own (-1.0 each) were overwritten
    assert list(zero) == ["mr", "cr", "subj", "trec", "mrpc"]
    assert zero == {"mr": 20.0, "cr": 20.1, "subj": 20.1, "trec": 20.0, "mrpc": 20.0}


def test_an_error_on_one_rank_is_raised_on_every_rank():
    zero, one = run_ranks(fail_on="cr")  # rank 1's task
    assert zero == one == {"error": "no cr data on this node"}


def test_shares_balance_the_fit_cost():
    from clsr.data.transfer import TRANSFER_TASKS
    from clsr.eval.transfer import shares

    assert shares(["mr", "cr", "subj", "trec", "mrpc"], 2) == [["mr", "trec", "mrpc"], ["cr", "subj"]]
    # the seven tasks over two ranks: 5,580 against 6,861 thousand row-fits (round robin: mr, subj,
    # sst2, mrpc = 7,451 against cr, mpqa, trec = 4,990)
    two = shares(TRANSFER_TASKS, 2)
    assert two == [["mr", "cr", "sst2", "trec", "mrpc"], ["subj", "mpqa"]]
    assert shares(["mr"], 3) == [["mr"], [], []]  # a rank with nothing to score still takes part


def test_an_error_that_does_not_pickle_keeps_its_kind():
    from clsr.runtime.distributed import _builtin_like

    class Unpicklable(ValueError):
        def __reduce__(self):
            raise TypeError("no")

    wrapped = _builtin_like(Unpicklable("bad value"))
    assert type(wrapped) is ValueError and "Unpicklable: bad value" in str(wrapped)
