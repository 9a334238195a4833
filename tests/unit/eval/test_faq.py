"""FAQ retrieval (methods.md §6.5): metrics by hand, the three loaders, folds, task names, CLI."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from pydantic import ValidationError

from clsr.config.trial import EvalConfig
from clsr.data.faq import FAQ_TASKS, FAQData, fold_split, load_faq, read_cough, read_faqir
from clsr.data.faq import training_rows as faq_training_rows
from clsr.data.sources import DataUnavailableError
from clsr.data.tasks import split_eval_tasks
from clsr.eval.faq import (
    cosine_matrix,
    evaluate_faq,
    faq_folds,
    faq_summary_metrics,
    format_faq_table,
    relevant_ranks,
    retrieval_metrics,
)
from clsr.eval.transfer import split_tasks

# --- metrics on a hand-made ranking ----------------------------------------------------------------

# Four queries against a collection of six items. Ranking = descending similarity; equal
# similarities keep collection order (the lower index ranks first).
SIMILARITY = np.array(
    [
        [0.9, 0.1, 0.8, 0.3, 0.2, 0.0],  # order 0 2 3 4 1 5
        [0.5, 0.5, 0.5, 0.9, 0.1, 0.5],  # ties: order 3 0 1 2 5 4
        [0.2, 0.7, 0.7, 0.1, 0.9, 0.3],  # tie 1/2: order 4 1 2 5 0 3
        [0.9, 0.8, 0.7, 0.6, 0.5, 0.4],  # order 0 1 2 3 4 5
    ]
)
RELEVANT = [(2, 4), (1, 5), (0, 2, 4), (3,)]


def test_metrics_on_a_hand_made_ranking() -> None:
    ranks = relevant_ranks(SIMILARITY, RELEVANT)
    assert [r.tolist() for r in ranks] == [[2, 4], [3, 5], [1, 3, 5], [4]]
    # AP = mean over the relevant items of (number of relevant up to it) / (its rank)
    ap = [
        (1 / 2 + 2 / 4) / 2,  # 0.5
        (1 / 3 + 2 / 5) / 2,  # 0.3667: the two ties before item 1 rank first (0) or after it (2)
        (1 / 1 + 2 / 3 + 3 / 5) / 3,  # 0.7556
        1 / 4,
    ]
    values = retrieval_metrics(SIMILARITY, RELEVANT)
    np.testing.assert_allclose(values["ap"], ap)
    # Acc@k: any relevant item among the first k (first relevant ranks are 2, 3, 1, 4)
    assert values["top1"].tolist() == [0, 0, 1, 0]
    assert values["top3"].tolist() == [1, 1, 1, 0]
    assert values["top5"].tolist() == [1, 1, 1, 1]
    assert float(values["ap"].mean()) == pytest.approx((0.5 + 11 / 30 + 34 / 45 + 0.25) / 4)


def test_ties_follow_collection_order_and_cosine_ignores_length() -> None:
    # items 0 and 2 are the same text (same vector): the relevant one ranks 1st or 2nd by position
    items = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    query = np.array([[3.0, 0.0]])
    sim = cosine_matrix(query, items)
    np.testing.assert_allclose(sim, [[1.0, 0.0, 1.0]])
    assert relevant_ranks(sim, [(2,)])[0].tolist() == [2]
    assert relevant_ranks(sim, [(0,)])[0].tolist() == [1]
    np.testing.assert_array_equal(cosine_matrix(np.zeros((1, 2)), items), [[0.0, 0.0, 0.0]])


def test_folds_are_seeded_partitions() -> None:
    folds = faq_folds(12, 5, seed=3)
    assert sorted(len(f) for f in folds) == [2, 2, 2, 3, 3]
    assert sorted(np.concatenate(folds).tolist()) == list(range(12))
    assert all(np.all(np.diff(f) > 0) for f in folds)
    assert [f.tolist() for f in folds] == [f.tolist() for f in faq_folds(12, 5, seed=3)]
    assert [f.tolist() for f in folds] != [f.tolist() for f in faq_folds(12, 5, seed=4)]
    assert len(faq_folds(3, 5)) == 3  # fewer queries than folds: one query per fold


# --- a tiny StackFAQ-format folder and a keyword embedder -------------------------------------------

TINY_STACKFAQ = """<root>
<qapair>
<rephr>
How do I cross out text on github?
</rephr>
<rephr>
*
</rephr>
<rephr>
github strikethrough markdown
</rephr>
<question>
Strikethrough with GitHub Markdown
</question>
<answer>
   Use ~~tildes~~ around the words on github.
</answer>
<answer>
   The &lt;del&gt; tag works on github too.
</answer>
</qapair>
<qapair>
<rephr>
remove my facebook account
</rephr>
<rephr>
deleting facebook for good
</rephr>
<question>
How do I delete my Facebook account?
</question>
<answer>
   Go to the facebook help page and ask for deletion.
</answer>
</qapair>
<qapair>
<rephr>
python package install
</rephr>
<question>
How to install a Python package?
</question>
<answer>
   Use pip: pip install name.
</answer>
</qapair>
</root>
"""
KEYWORDS = ("github", "facebook", "python")


def keyword_embedder(calls: list[list[str]] | None = None):
    def embed(texts):
        if calls is not None:
            calls.append(list(texts))
        return np.array([[t.lower().count(k) for k in KEYWORDS] for t in texts], dtype=float)

    return embed


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("faq")
    (root / "faq" / "stackfaq").mkdir(parents=True)
    (root / "faq" / "stackfaq" / "stackExchange-FAQ.xml").write_text(TINY_STACKFAQ, encoding="utf-8")
    return root


def test_tiny_stackfaq_scores_and_embeds_each_text_once(tiny_root: Path) -> None:
    data = load_faq("stackfaq", tiny_root)
    assert data.queries[0] == "How do I cross out text on github?"
    assert data.relevant == [(0, 1), (0, 1), (2,), (2,), (3,)]
    assert data.dropped["placeholder_queries"] == 1 and data.dropped["empty_queries"] == 0
    assert data.candidates()[1] == "Strikethrough with GitHub Markdown The <del> tag works on github too."
    calls: list[list[str]] = []
    scores = evaluate_faq(keyword_embedder(calls), ["stackfaq"], tiny_root, folds=5, seed=1)
    score = scores["stackfaq"]
    assert (score.top1, score.top3, score.top5, score.map) == (100.0, 100.0, 100.0, 100.0)
    assert (score.queries, score.candidates, len(score.folds)) == (5, 4, 5)
    assert len(calls) == 1 and len(calls[0]) == len(set(calls[0])) == 5 + 4
    # by question only, the two github items are one text, embedded once, tied, both relevant
    by_question = evaluate_faq(keyword_embedder(calls), "stackfaq", tiny_root, candidate="question")
    assert by_question["stackfaq"].map == 100.0 and len(calls[1]) == 5 + 3
    capped = evaluate_faq(keyword_embedder(), "stackfaq", tiny_root, max_queries=2)["stackfaq"]
    assert capped.queries == 2 and capped.candidates == 4 and len(capped.folds) == 2

    metrics = faq_summary_metrics(scores)
    assert metrics == {f"test_stackfaq_{k}": 100.0 for k in ("top1", "top3", "top5", "map")}
    header, rule, row = format_faq_table(scores).splitlines()
    assert header.split(" | ")[1:] == [" Acc@1", " Acc@3", " Acc@5", "   MAP"]
    assert row.startswith("StackFAQ") and row.endswith("100.00")


def test_fold_mean_and_a_miss(tiny_root: Path) -> None:
    # an embedder blind to "facebook": its two queries are zero vectors, every item ties at cosine 0
    # and the facebook item (position 2) ranks 3rd; AP = 1/3
    def embed(texts):
        return np.array([[t.lower().count("github"), t.lower().count("python")] for t in texts], dtype=float)

    score = evaluate_faq(embed, "stackfaq", tiny_root, folds=1)["stackfaq"]
    assert score.top1 == pytest.approx(100 * 3 / 5) and score.top3 == 100.0
    assert score.map == pytest.approx(100 * (3 + 2 / 3) / 5)
    folded = evaluate_faq(embed, "stackfaq", tiny_root, folds=5, seed=2)["stackfaq"]
    assert folded.map == pytest.approx(np.mean([f["map"] for f in folded.folds]))
    assert folded.map == pytest.approx(score.map)  # one query per fold: same mean


def test_missing_files_give_clear_errors(tiny_root: Path, data_dir: Path) -> None:
    with pytest.raises(DataUnavailableError) as err:
        load_faq("cough", data_dir)
    message = str(err.value)
    assert "FAQ_Bank_eval.csv" in message and "Annotated_Relevance_Set.csv" in message
    assert "User_Query_Bank" not in message.split("It needs")[0]  # that one is present
    assert "github.com/sunlab-osu/covid-faq" in message
    with pytest.raises(DataUnavailableError, match=r"faq/faqir/FAQIRv1\.0\.xml"):
        load_faq("faqir", tiny_root)
    with pytest.raises(DataUnavailableError, match="no Hugging Face hub copy"):
        load_faq("stackfaq", None)
    with pytest.raises(DataUnavailableError, match="FAQ_Bank_eval.csv"):  # named explicitly: required
        evaluate_faq(keyword_embedder(), ["stackfaq", "cough"], tiny_root)
    with pytest.warns(UserWarning, match="skips (faqir|cough)") as caught:  # the group: skip the missing
        scores = evaluate_faq(keyword_embedder(), ["faq"], tiny_root)
    assert list(scores) == ["stackfaq"] and len(caught) == 2
    with pytest.raises(ValueError, match="allowed: faq, stackfaq, faqir, cough"):
        evaluate_faq(keyword_embedder(), ["faqs"], tiny_root)


# --- the real StackFAQ ------------------------------------------------------------------------------


def test_stackfaq_loader_on_the_real_file(data_dir: Path) -> None:
    data = load_faq("stackfaq", data_dir)
    assert len(data.queries) == 1249 and len(set(data.queries)) == 1249  # 1,375 <rephr> − 125 "*" − 1 empty
    assert len(data.answers) == 719 and len(set(data.questions)) == 125
    assert data.dropped == {
        "placeholder_queries": 125,
        "empty_queries": 1,
        "judgements_outside_collection": 0,
    }
    assert data.queries[0] == "How to make font strikethrough on github."
    assert data.relevant[0] == (0, 1) and data.answers[0] == "Use ~~tildes around the words~~."
    assert sum(len(r) for r in data.relevant) == 7184  # each query: every answer of its thread


# --- FAQIR and COUGH on hand-made files in the released formats -------------------------------------

FAQIR_XML = """<?xml version="1.0" encoding="utf-8"?>
<IRSet xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xmlns:xsd="http://www.w3.org/2001/XMLSchema">
  <queries>
    <Query>
      <Author>mladen</Author>
      <infneed>Inf. potreba -- naljepnica</infneed>
      <original>How do I get a sticker off of a car window?</original>
      <exWords><string>sticker</string><string>window</string></exWords>
      <QueryGroupID>0</QueryGroupID>
      <QueryID>0</QueryID>
      <QueryString>How can I remove a   sticker from my window?</QueryString>
      <Fold>0</Fold>
    </Query>
    <Query>
      <original>temp</original>
      <QueryGroupID>0</QueryGroupID>
      <QueryID>1</QueryID>
      <QueryString>Stickers stuck on the glass table, advice?</QueryString>
    </Query>
    <Query>
      <QueryGroupID>1</QueryGroupID>
      <QueryID>2</QueryID>
      <QueryString>lawn mower maintenance</QueryString>
    </Query>
    <Query>
      <QueryGroupID>2</QueryGroupID>
      <QueryID>3</QueryID>
      <QueryString>a query whose group has no relevant pair</QueryString>
    </Query>
  </queries>
  <KB>
    <Pairs>
      <qaPair><Id>8656</Id><Question>How to remove tree sap from car?</Question><Answer>Use a commercial product.</Answer><Categories><string>Car</string></Categories></qaPair>
      <qaPair><Id>40807</Id><Question>Sticker off a car window?</Question><Answer>Goo Gone works well.</Answer></qaPair>
      <qaPair><Id>120493</Id><Question>How to maintain a lawn mower?</Question><Answer>Change the oil.</Answer></qaPair>
      <qaPair><Id>62732</Id><Question>How to fix vertical blinds?</Question><Answer>Follow the link.</Answer></qaPair>
    </Pairs>
  </KB>
  <relCandidates>
    <IRCandidateList>
      <grpId>0</grpId>
      <candidates>
        <IRCandidate><Id>40807</Id><Annotations>
          <Annotation><Val>4</Val><Annotator>a</Annotator><AnnotationTime>2015-10-10T17:22:33</AnnotationTime></Annotation>
          <Annotation><Val>1</Val><Annotator>b</Annotator><AnnotationTime>2015-10-12T11:24:47</AnnotationTime></Annotation>
        </Annotations></IRCandidate>
        <IRCandidate><Id>8656</Id><Annotations><Annotation><Val>2</Val><Annotator>a</Annotator></Annotation></Annotations></IRCandidate>
        <IRCandidate><Id>99999</Id><Annotations><Annotation><Val>1</Val></Annotation></Annotations></IRCandidate>
      </candidates>
    </IRCandidateList>
    <IRCandidateList>
      <grpId>1</grpId>
      <candidates>
        <IRCandidate><Id>120493</Id><Annotations><Annotation><Val>1</Val></Annotation></Annotations></IRCandidate>
        <IRCandidate><Id>62732</Id><Annotations><Annotation><Val>3</Val></Annotation></Annotations></IRCandidate>
      </candidates>
    </IRCandidateList>
    <IRCandidateList>
      <grpId>2</grpId>
      <candidates>
        <IRCandidate><Id>62732</Id><Annotations><Annotation><Val>4</Val></Annotation></Annotations></IRCandidate>
      </candidates>
    </IRCandidateList>
  </relCandidates>
</IRSet>
"""


def test_faqir_loader_on_a_hand_made_file(tmp_path: Path) -> None:
    (tmp_path / "faq" / "faqir").mkdir(parents=True)
    path = tmp_path / "faq" / "faqir" / "FAQIRv1.0.xml"
    path.write_text(FAQIR_XML, encoding="utf-8")
    data = load_faq("faqir", tmp_path)
    assert data.item_ids == ["8656", "40807", "120493", "62732"]
    assert data.questions[1] == "Sticker off a car window?" and data.answers[2] == "Change the oil."
    assert data.query_ids == ["0", "1", "2"]  # query 3's group has nothing relevant: dropped
    assert data.queries[0] == "How can I remove a sticker from my window?"
    # group 0: 40807 (one annotator said 1) for both of its queries; 99999 is not in the collection
    assert data.relevant == [(1,), (1,), (2,)]
    assert data.dropped == {
        "empty_queries": 0,
        "judgements_outside_collection": 2,
        "queries_without_relevant": 1,
    }
    useful = read_faqir(path, max_level=2)  # "useful" counts too: 8656 joins group 0
    assert useful.relevant == [(0, 1), (0, 1), (2,)]
    with pytest.raises(ValueError, match="max_level"):
        read_faqir(path, max_level=0)


def test_cough_loader_on_hand_made_files(tmp_path: Path) -> None:
    bank = tmp_path / "FAQ_Bank_eval.csv"
    bank.write_text(
        "index,source,url,question,question_ML_mark,answer,answer_ML_mark,language,type\n"
        '0,CDC_FAQ,u0,How does COVID-19 spread?,,"Mainly person to person,\nthrough droplets.",,en,Question\n'
        "1,WHO,u1,Should I wear a mask?,,Yes.,,en,Question\n"
        "2,WHO,u2,How long to isolate?,,For 14 days.,,en,Question\n",
        encoding="utf-8",
    )
    queries = tmp_path / "User_Query_Bank.csv"
    queries.write_text(
        'index,query\n0,How is COVID-19 spread?\n2,"Masks: yes, or no?"\n3,unanswered\n', encoding="utf-8"
    )
    relevance = tmp_path / "Annotated_Relevance_Set.csv"
    relevance.write_text(
        "Query_index,Query,FAQ_index,FAQ_Q,Label (mean score > 3 as positive)\n"
        "0,How is COVID-19 spread?,0,How does COVID-19 spread?,positive\n"
        "0,How is COVID-19 spread?,2,How long to isolate?,negative\n"
        "0,How is COVID-19 spread?,7,not in the eval bank,positive\n"
        "1,a removed query,1,Should I wear a mask?,positive\n"
        '2,"Masks: yes, or no?",1,Should I wear a mask?,positive\n'
        "3,unanswered,2,How long to isolate?,negative\n",
        encoding="utf-8",
    )
    data = read_cough(bank, queries, relevance)
    assert data.item_ids == ["0", "1", "2"]
    assert data.answers[0] == "Mainly person to person, through droplets."
    assert data.query_ids == ["0", "2"] and data.queries[1] == "Masks: yes, or no?"
    assert data.relevant == [(0,), (1,)]
    assert data.dropped == {
        "judgements_of_unknown_queries": 1,
        "judgements_outside_collection": 1,
        "queries_without_relevant": 1,
    }
    assert data.candidates("question_answer")[1] == "Should I wear a mask? Yes."


# --- task names, config, training loop, CLI ---------------------------------------------------------


def test_task_names_and_eval_config() -> None:
    assert split_eval_tasks("sts16,faq,stackfaq,faq, mr") == (["sts16"], ["mr"], ["faq", "stackfaq"])
    assert split_eval_tasks(["cough"]) == ([], [], ["cough"])
    assert split_tasks(["sts16", "mr"]) == (["sts16"], ["mr"])  # the two-list form still works
    with pytest.raises(ValueError, match="evaluate_faq"):
        split_tasks(["faq"])
    assert EvalConfig(tasks=["faq"]).tasks == ["faq"]
    EvalConfig(tasks=["sts", "faq"])
    EvalConfig(tasks=list(FAQ_TASKS))
    with pytest.raises(ValidationError, match="unknown evaluation task 'faqs'.*faq.*stackfaq, faqir, cough"):
        EvalConfig(tasks=["faqs"])


def test_final_evaluation_of_the_training_loop_runs_faq(tiny_root: Path) -> None:
    from clsr.train.evaluator import Evaluator

    cfg = EvalConfig(tasks=["stackfaq"], alignment_uniformity=False, dev_tasks=[])
    from clsr.config.trial import DataConfig

    trial = SimpleNamespace(
        eval=cfg, data=DataConfig(data_dir=str(tiny_root)), trainer=SimpleNamespace(precision="auto")
    )
    method = SimpleNamespace(make_embedder=lambda model, pipeline, batch_size, precision: keyword_embedder())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a named data set that is present: no skip warning
        metrics = Evaluator(trial, method, pipeline=None).final(model=object())
    assert metrics == {f"test_stackfaq_{k}": 100.0 for k in ("top1", "top3", "top5", "map")}

    # trained on StackFAQ's fold 2: its dev MAP picks the checkpoint, its test fold is scored
    trial.eval = EvalConfig(
        tasks=["stackfaq"], alignment_uniformity=False, dev_tasks=["faq"], select_on="faq"
    )
    trial.data = DataConfig(train="faq:stackfaq", fold=2, data_dir=str(tiny_root))
    evaluator = Evaluator(trial, method, pipeline=None)
    assert evaluator.dev(model=object()) == {"dev_faq": 100.0}
    assert evaluator.final(model=object())["test_stackfaq_map"] == 100.0


def test_cli_eval_faq(tiny_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from clsr.cli import main

    assert main(["eval", "--model", "minilm", "--tasks", "stackfaq,nope"]) == 2
    assert "allowed: sts, transfer, faq" in capsys.readouterr().err
    assert main(["eval", "--model", "minilm", "--tasks", "faq", "--max-queries", "0"]) == 2
    argv = ["eval", "--model", "minilm", "--tasks", "stackfaq", "--data-dir", str(tiny_root)]
    assert main([*argv, "--max-queries", "3"]) == 0
    out = capsys.readouterr().out
    assert "FAQ retrieval × 100" in out and "mean over 3 query folds, at most 3 queries" in out
    assert "Acc@1 |  Acc@3 |  Acc@5 |    MAP" in out and "\nStackFAQ" in out
    assert "stackfaq: 3 queries, 4 FAQ items" in out


# --- training on an FAQ set: RCL Table 2's 5-fold protocol ------------------------------------------


def _threads(n_threads: int = 10) -> FAQData:
    """n threads, each with 2 paraphrased queries and 2 answers (items 2t, 2t+1): relevant = both."""
    return FAQData(
        "stackfaq",
        [f"{t}-{r}" for t in range(n_threads) for r in range(2)],
        [f"query {r} of thread {t}" for t in range(n_threads) for r in range(2)],
        [(2 * t, 2 * t + 1) for t in range(n_threads) for _ in range(2)],
        [f"{t}-{a}" for t in range(n_threads) for a in range(2)],
        [f"question {t}" for t in range(n_threads) for _ in range(2)],
        [f"answer {a} of thread {t}" for t in range(n_threads) for a in range(2)],
    )


def test_fold_split_is_a_query_level_5_fold_split_with_dev_from_the_training_folds() -> None:
    data = _threads()  # 20 queries: folds of 4; the other 16 give ceil(1.6) = 2 dev, 14 train
    splits = [fold_split(len(data), f) for f in range(5)]
    tests = np.concatenate([s.test for s in splits])
    assert sorted(tests.tolist()) == list(range(20))  # every query in exactly one test fold
    for s in splits:
        assert (len(s.train), len(s.dev), len(s.test)) == (14, 2, 4)
        assert (
            not set(s.train) & set(s.test) and not set(s.dev) & set(s.test) and not set(s.train) & set(s.dev)
        )
        assert sorted([*s.train, *s.dev, *s.test]) == list(range(20))
    assert [s.test.tolist() for s in splits] == [f.tolist() for f in faq_folds(20, 5)]  # = evaluation's folds
    assert fold_split(20, 3).dev.tolist() == splits[3].dev.tolist()  # seeded
    with pytest.raises(ValueError, match="data.fold must be 0"):
        fold_split(20, 5)

    rows = faq_training_rows(data, np.array([0, 5]))  # query 5 is thread 2's second query
    assert rows == [
        {"anchor": "query 0 of thread 0", "positive": "question 0 answer 0 of thread 0"},
        {"anchor": "query 0 of thread 0", "positive": "question 0 answer 1 of thread 0"},
        {"anchor": "query 1 of thread 2", "positive": "question 2 answer 0 of thread 2"},
        {"anchor": "query 1 of thread 2", "positive": "question 2 answer 1 of thread 2"},
    ]  # every answer of a thread stays a positive


def test_an_faq_fold_trial_scores_its_test_fold_and_selects_on_dev_map(tiny_root: Path) -> None:
    from clsr.config.trial import DataConfig
    from clsr.eval.faq import dev_map

    assert DataConfig(train="faq:stackfaq", fold=4).faq_set() == "stackfaq"
    for bad in (
        {"train": "faq:stackfaq"},
        {"train": "nli_triplets", "fold": 0},
        {"train": "faq:x", "fold": 0},
    ):
        with pytest.raises(ValidationError, match="data"):
            DataConfig(**bad)

    # the facebook-blind embedder of test_fold_mean_and_a_miss: the facebook queries (2, 3) have AP 1/3
    def embed(texts):
        return np.array([[t.lower().count("github"), t.lower().count("python")] for t in texts], dtype=float)

    data = load_faq("stackfaq", tiny_root)  # 5 queries: one per fold, 1 dev query out of the other 4
    for fold in range(5):
        split = fold_split(5, fold)
        (query,) = split.test
        score = evaluate_faq(embed, "stackfaq", tiny_root, test_fold=("stackfaq", fold))["stackfaq"]
        assert score.queries == 1 and score.map == pytest.approx(100 / 3 if query in (2, 3) else 100.0)
        (dev,) = split.dev
        assert dev_map(data, fold, embed) == pytest.approx(100 / 3 if dev in (2, 3) else 100.0)


def test_an_faq_fold_gives_pairs_so_a_method_needing_negatives_is_refused_at_validation() -> None:
    from clsr.config.trial import TrialConfig

    doc = {
        "data": {"train": "faq:stackfaq", "fold": 0},
        "eval": {"dev_tasks": ["faq"], "select_on": "faq", "tasks": ["stackfaq"]},
    }
    with pytest.raises(
        ValidationError, match="'faq:stackfaq' lacks columns \\['negative'\\].*hard_negatives: false"
    ):
        TrialConfig.model_validate(doc | {"method": {"name": "rcl", "phis": []}})
    trial = TrialConfig.model_validate(doc | {"method": {"name": "rcl", "phis": [], "hard_negatives": False}})
    assert trial.data.faq_set() == "stackfaq" and trial.data.fold == 0


def test_the_smoke_caps_cut_the_dev_map_too(data_dir: Path) -> None:
    """A smoke run's dev MAP embeds the capped queries and items only (each dev evaluation of an FAQ trial
    embedded the whole collection: 80 s on one CPU thread with MiniLM)."""
    from clsr.eval.faq import dev_map, score_faq, select_queries, subsample_items, subsample_queries

    data = load_faq("stackfaq", data_dir)
    embedded: list[int] = []

    def embed(texts):
        embedded.append(len(texts))
        return np.array([[len(t), t.count(" "), t.count("e")] for t in texts], dtype=float)

    capped = dev_map(data, 0, embed, max_queries=5, max_items=12)
    dev = select_queries(data, fold_split(len(data), 0).dev)
    small = subsample_items(subsample_queries(dev, 5), 12)  # every answer relevant to the 5 queries stays
    assert len(small) == 5 and embedded == [len({*small.queries, *small.candidates("question_answer")})]
    assert capped == score_faq(small, embed, folds=1).map
    assert dev_map(data, 0, embed) == score_faq(dev, embed, folds=1).map  # no caps: the whole collection
    assert embedded[0] < embedded[2] / 4  # the uncapped dev MAP


def test_an_faq_trials_data_identity_is_the_hash_of_its_test_fold_and_the_collection(tiny_root: Path) -> None:
    """Issue 55: the set as scored (the trained fold's test query, every FAQ item), hashed as docs/data.md
    says: one JSON line per row."""
    import hashlib
    import json

    from clsr.data.identity.sources import faq_identity
    from clsr.eval.faq import scored_sets

    data = load_faq("stackfaq", tiny_root)
    (query,) = fold_split(5, 2).test
    found = faq_identity(
        "stackfaq", scored_sets("stackfaq", tiny_root, test_fold=("stackfaq", 2))["stackfaq"], tiny_root
    )
    rows = [
        [
            "query",
            data.query_ids[query],
            data.queries[query],
            [data.item_ids[i] for i in data.relevant[query]],
        ]
    ]
    rows += [["item", *item] for item in zip(data.item_ids, data.questions, data.answers, strict=True)]
    lines = "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in rows)
    assert (found.sha256, found.rows) == (hashlib.sha256(lines.encode()).hexdigest(), 1 + 4)
    assert found.params()["data.stackfaq.source"] == f"local:{tiny_root} (faq:stackfaq)"
