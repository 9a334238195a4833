"""A researcher's own evaluation set, as the ``eval.custom`` section names it (no torch, no data read)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ROLES: dict[str, tuple[str, ...]] = {
    "sts": ("sentence1", "sentence2", "score"),
    "retrieval": ("query", "relevant"),
    "classification": ("text", "label"),
}
CORPUS_ROLES = ("id", "text")
NAME = re.compile(r"^[a-z][a-z0-9_]{0,40}$")
KS = (1, 5, 10)


class CustomTask(BaseModel):
    """One named evaluation set."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    type: Literal["sts", "retrieval", "classification"]
    path: str = Field(
        description="file (.csv .tsv .jsonl .json .parquet), folder, save_to_disk folder or hub id owner/name: "
        "the pairs (sts), the queries (retrieval) or the labelled texts (classification)"
    )
    corpus: str | None = Field(None, description="retrieval: the corpus, rows of (id, text)")
    config: str | None = Field(None, description="a hub data set's configuration")
    split: str = Field("test", description="the split of a hub data set or a saved DatasetDict")
    revision: str | None = None
    columns: dict[str, str] | None = Field(
        None,
        description="roles read from the data's columns, {role: column}: sts sentence1/sentence2/score, "
        "retrieval query/relevant (an id, a list of ids, or ids joined by |) and corpus id/text, "
        "classification text/label; unmapped roles are read from same-named columns",
    )

    @field_validator("path", "corpus")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        """A local file or folder made absolute: trials run in other folders. Missing ones are said by
        ``study validate`` (``source_problems``)."""
        from clsr.data.external import absolute_local

        return absolute_local(value)

    @model_validator(mode="after")
    def _corpus_for_retrieval(self) -> CustomTask:
        if (self.type == "retrieval") != (self.corpus is not None):
            raise ValueError("corpus: a retrieval task needs one (rows of id, text); other types take none")
        allowed = ROLES[self.type] + (CORPUS_ROLES if self.type == "retrieval" else ())
        if unknown := sorted(set(self.columns or {}) - set(allowed)):
            raise ValueError(
                f"columns: unknown role(s) {unknown} for a {self.type} task; allowed: {', '.join(allowed)}"
            )
        return self


def text_roles(roles: tuple[str, ...]) -> list[str]:
    """The roles that hold text to embed (not scores, labels or ids)."""
    return [r for r in roles if r in ("sentence1", "sentence2", "query", "text")]


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise ValueError(
            f"custom task name {name!r}: lower-case letters, digits and _, starting with a letter"
        )
    return name
