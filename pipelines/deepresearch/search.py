"""BM25 search over a DeepResearch corpus (bm25s, Lucene scoring): the backend of the `search` tool."""

from __future__ import annotations

import re

import bm25s
import numpy as np

from pipelines.deepresearch.corpus import Document

STOPWORDS = frozenset(
    """a an and are as at be but by did do does for from had has have he her his how i if in
into is it its me my no not of on or our she so that the their them then there these they this those to
us was we were what when where which who whom whose why will with you your""".split()
)


def tokenize(text: str) -> list[str]:
    """Lowercased alphanumeric words of `text`, stopwords removed."""
    return [w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in STOPWORDS]


class SearchIndex:
    """A BM25 index over the documents' titles and texts."""

    def __init__(self, docs: list[Document]):
        self.docs = list(docs)
        self.bm25 = bm25s.BM25()
        if self.docs:
            self.bm25.index([tokenize(f"{d.title} {d.text}") for d in self.docs], show_progress=False)

    def search(self, query: str, k: int) -> list[Document]:
        """The top-`k` documents by BM25 score, ties in corpus order. Only documents sharing a word with
        the query are returned, so an empty or stopword-only query gives []."""
        ids = self.bm25.get_tokens_ids(tokenize(query)) if self.docs else []
        if not ids or k <= 0:
            return []
        scores = self.bm25.get_scores(ids)
        return [self.docs[i] for i in np.argsort(-scores, kind="stable")[:k] if scores[i] > 0]
