"""EVALB, the field's bracket scorer (Sekine and Collins 1997), with its COLLINS.prm.

Every parsing paper's F1, the paper's Table 4 included, is EVALB's output with the
parameter file COLLINS.prm. This is a reimplementation of evalb.c's scoring (not a
copy), checked rule by rule against hand-made trees in tests/unit/test_evalb*.py:

- a preterminal whose tag is a DELETE_LABEL (COLLINS.prm: `TOP -NONE- , : `` '' .`) is
  removed with its word, each tree by its own tags: punctuation and traces do not count;
- every other bracket's label is cut at its first `-` or `=` (function tags, indices;
  evalb.c's `modify_label`), and brackets then labelled with a DELETE_LABEL (`TOP`) or
  spanning no word (they held only deleted words) are not counted;
- a gold bracket matches one not yet matched test bracket with the same span and the
  same label, EQ_LABEL pairs counting as the same (COLLINS.prm: ADVP = PRT); n gold and
  m test brackets of one span and label match min(n, m) times (unary chains);
- a sentence whose test tree has no word is *skipped*, one whose words differ from the
  gold ones in number or spelling is an *error*; both are left out of every figure except
  the sentence counts, as EVALB does (it also stops after 10 errors; this never stops);
- its length, for the cut-off (CUTOFF_LEN 40), is the gold tree's number of words whose
  tag is not a DELETE_LABEL_FOR_LENGTH (`-NONE-`): punctuation counts;
- recall = matched / gold brackets, precision = matched / test brackets, F1 their
  harmonic mean, complete match = sentences with recall and precision 100%, crossing =
  test brackets that cross some gold bracket, tagging accuracy = words whose test tag
  equals the gold one (after deletion), over all sentences and those <= the cut-off.

One extension, for parsers that predict no POS tags (the paper's, after Vinyals et al.):
a test tag `XX` borrows the gold tag of the word at its position (traces aside) before
anything is deleted, so punctuation is removed from both trees alike, as it would be
with a tagger that is always right; those borrowed tags are not scored, and tagging
accuracy is None when no test word carried a tag of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nmt_cli.trees.tree import PLACEHOLDER_TAG, Tree

TRACE = "-NONE-"


@dataclass(frozen=True)
class EvalbParams:
    """The settings of an EVALB parameter file; `COLLINS` is COLLINS.prm."""

    cutoff_len: int = 40
    labeled: bool = True
    delete_labels: frozenset[str] = frozenset({"TOP", TRACE, ",", ":", "``", "''", "."})
    delete_labels_for_length: frozenset[str] = frozenset({TRACE})
    equal_labels: tuple[tuple[str, str], ...] = (("ADVP", "PRT"),)

    def __post_init__(self) -> None:
        if self.cutoff_len < 0:
            raise ValueError(f"cutoff_len must be >= 0, got {self.cutoff_len}")

    def same_label(self, a: str, b: str) -> bool:
        """evalb.c's `label_comp`: equal, or an EQ_LABEL pair in either order."""
        return a == b or (a, b) in self.equal_labels or (b, a) in self.equal_labels


COLLINS = EvalbParams()


@dataclass(frozen=True)
class _Bracket:
    start: int
    end: int
    label: str


@dataclass(frozen=True)
class _Read:
    """What evalb.c's `read_line` gathers from one tree."""

    words: list[str]
    tags: list[str]
    own_tags: list[bool]  # False where the tag was borrowed from the gold tree
    brackets: list[_Bracket]  # counted ones: labels cut, deleted and empty ones left out
    length: int  # words whose tag is not a DELETE_LABEL_FOR_LENGTH


def _cut_label(label: str) -> str:
    """evalb.c's `modify_label`: the label up to its first '-' or '='."""
    for i, char in enumerate(label):
        if char in "-=":
            return label[:i]
    return label


def _read(tree: Tree, params: EvalbParams, borrowed: list[str] | None = None) -> _Read:
    words: list[str] = []
    tags: list[str] = []
    own: list[bool] = []
    brackets: list[_Bracket] = []
    length = 0
    position = 0  # preterminals seen, traces aside: where a borrowed tag comes from
    stack: list[tuple[Tree, int] | Tree] = [tree]  # a (tree, start) pair closes that tree
    while stack:
        item = stack.pop()
        if isinstance(item, tuple):
            node, start = item
            label = _cut_label(node.label)
            deleted = any(params.same_label(label, d) for d in params.delete_labels)
            if start != len(words) and not deleted:
                brackets.append(_Bracket(start, len(words), label))
            continue
        if item.is_preterminal:
            tag, tagged = item.label, True
            if item.label != TRACE:
                if borrowed is not None and tag == PLACEHOLDER_TAG:
                    tag, tagged = borrowed[position], False
                position += 1
            if tag not in params.delete_labels_for_length:
                length += 1
            if tag not in params.delete_labels:
                words.append(str(item.children[0]))
                tags.append(tag)
                own.append(tagged)
            continue
        stack.append((item, len(words)))
        stack.extend(reversed([c for c in item.children if isinstance(c, Tree)]))
    return _Read(words, tags, own, brackets, length)


@dataclass(frozen=True)
class SentenceScore:
    """One sentence as evalb.c's per-sentence line reports it."""

    length: int  # gold words, traces aside: what the cut-off compares
    status: str  # "ok", "error" (words differ) or "skip" (no test word)
    gold_brackets: int = 0
    test_brackets: int = 0
    matched: int = 0
    crossing: int = 0
    words: int = 0
    tagged: int = 0  # words whose test tag was its own (not borrowed)
    correct_tags: int = 0
    error: str = ""


def score_sentence(gold: Tree, test: Tree | None, params: EvalbParams = COLLINS) -> SentenceScore:
    """One sentence scored as evalb.c's `calc_result` scores it (plus the borrowing of
    `XX` tags described in the module's docstring)."""
    g = _read(gold, params)
    if test is None:
        return SentenceScore(g.length, "skip")
    gold_tags = [tag for tag, _ in gold.preterminals() if tag != TRACE]
    test_count = sum(1 for tag, _ in test.preterminals() if tag != TRACE)
    t = _read(test, params, gold_tags if test_count == len(gold_tags) else None)
    if not t.words:
        return SentenceScore(g.length, "skip")
    if len(g.words) != len(t.words):
        return SentenceScore(
            g.length, "error", error=f"length unmatch ({len(g.words)}|{len(t.words)})"
        )
    for a, b in zip(g.words, t.words, strict=True):
        if a != b:
            return SentenceScore(g.length, "error", error=f"words unmatch ({a}|{b})")
    by_span: dict[tuple[int, int], list[_Bracket]] = {}  # unmatched test brackets, in order
    for tb in t.brackets:
        by_span.setdefault((tb.start, tb.end), []).append(tb)
    matched = 0
    for gb in g.brackets:
        candidates = by_span.get((gb.start, gb.end), [])
        for j, tb in enumerate(candidates):
            if not params.labeled or params.same_label(gb.label, tb.label):
                del candidates[j]
                matched += 1
                break
    crossing = sum(
        1
        for tb in t.brackets
        if any(
            gb.start < tb.start < gb.end < tb.end or tb.start < gb.start < tb.end < gb.end
            for gb in g.brackets
        )
    )
    scored = [i for i, own in enumerate(t.own_tags) if own]
    correct = sum(1 for i in scored if params.same_label(g.tags[i], t.tags[i]))
    return SentenceScore(
        g.length, "ok", len(g.brackets), len(t.brackets), matched, crossing,
        len(g.words), len(scored), correct,
    )  # fmt: skip


@dataclass(frozen=True)
class EvalbSummary:
    """One of the two blocks of EVALB's `=== Summary ===` (percentages, as it prints)."""

    sentences: int
    error_sentences: int
    skip_sentences: int
    valid_sentences: int
    recall: float
    precision: float
    f1: float
    complete_match: float
    average_crossing: float
    no_crossing: float
    two_or_less_crossing: float
    tagging_accuracy: float | None  # None when no test word carried its own tag
    gold_brackets: int
    test_brackets: int
    matched_brackets: int


@dataclass
class _Totals:
    sentences: int = 0
    errors: int = 0
    skips: int = 0
    gold: int = 0
    test: int = 0
    matched: int = 0
    complete: int = 0
    crossing: int = 0
    no_crossing: int = 0
    two_or_less: int = 0
    tagged: int = 0
    correct_tags: int = 0
    words: int = 0

    def add(self, s: SentenceScore) -> None:
        self.sentences += 1
        if s.status != "ok":
            self.errors += s.status == "error"
            self.skips += s.status == "skip"
            return
        self.gold += s.gold_brackets
        self.test += s.test_brackets
        self.matched += s.matched
        self.complete += s.gold_brackets == s.test_brackets == s.matched
        self.crossing += s.crossing
        self.no_crossing += s.crossing == 0
        self.two_or_less += s.crossing <= 2
        self.tagged += s.tagged
        self.correct_tags += s.correct_tags
        self.words += s.words

    def summary(self) -> EvalbSummary:
        valid = self.sentences - self.errors - self.skips
        recall = 100.0 * self.matched / self.gold if self.gold else 0.0
        precision = 100.0 * self.matched / self.test if self.test else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return EvalbSummary(
            self.sentences, self.errors, self.skips, valid, recall, precision, f1,
            100.0 * self.complete / valid if valid else 0.0,
            self.crossing / valid if valid else 0.0,
            100.0 * self.no_crossing / valid if valid else 0.0,
            100.0 * self.two_or_less / valid if valid else 0.0,
            100.0 * self.correct_tags / self.tagged if self.tagged else None,
            self.gold, self.test, self.matched,
        )  # fmt: skip


@dataclass(frozen=True)
class EvalbResult:
    """EVALB's summary over all sentences and over those within the cut-off length."""

    all: EvalbSummary
    short: EvalbSummary  # length <= cutoff_len
    cutoff_len: int
    sentences: list[SentenceScore] = field(repr=False)


def evalb(pairs: list[tuple[Tree, Tree | None]], params: EvalbParams = COLLINS) -> EvalbResult:
    """Score (gold, test) trees, one pair a sentence, as `evalb -p COLLINS.prm` does."""
    every, short = _Totals(), _Totals()
    scores = [score_sentence(gold, test, params) for gold, test in pairs]
    for s in scores:
        every.add(s)
        if s.length <= params.cutoff_len:
            short.add(s)
    return EvalbResult(every.summary(), short.summary(), params.cutoff_len, scores)
